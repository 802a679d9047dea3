//! ByzFL attacks from omniscient Sybil replicas (`neuroshard_sim::byzantine`) on the real
//! engine, measured by the validation loss of the honest replicas' agreed model. One seed and
//! one attack each, to stay fast; `neuroshard bench byzantine` runs the full table.

use neuroshard_aggregate::Attack;
use neuroshard_sim::byzfl::{Scenario, run};

/// One Sybil among three replicas of a stage sends the honest mean scaled by −1000 every
/// round, after seeing it. The defaults (trimmed mean with f fitted to the inputs, norm
/// bound) stay within 5% of the clean run; a plain mean without the bound ends on a model
/// no better than uniform (ln 32 = 3.47).
#[test]
fn a_scaling_sybil_among_three_replicas_is_harmless_by_default_and_ruins_a_plain_mean() {
    let defaults = Scenario::new(2, 3).with_sybils(1, 1);
    let naive = Scenario {
        aggregator: "mean".into(),
        norm_bound: 0.0,
        ..defaults.clone()
    };
    let attack = Attack::Scale(1000.0);
    let clean = run(&defaults, Attack::None, 1).unwrap();
    let robust = run(&defaults, attack, 1).unwrap();
    let plain = run(&naive, attack, 1).unwrap();
    eprintln!(
        "clean {}, defaults under attack {}, plain mean under attack {}",
        clean.validation_loss, robust.validation_loss, plain.validation_loss
    );
    assert!(robust.rounds_attacked >= 10, "{robust:?}");
    assert!(
        robust.validation_loss <= clean.validation_loss * 1.05,
        "defaults {} vs clean {}",
        robust.validation_loss,
        clean.validation_loss
    );
    assert!(
        plain.validation_loss > 3.0 * clean.validation_loss,
        "plain mean {} vs clean {}",
        plain.validation_loss,
        clean.validation_loss
    );
}
