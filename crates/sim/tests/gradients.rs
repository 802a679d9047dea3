//! A staked replica of the last stage that sends its upstream stage gradients flipped and
//! scaled by 10⁴ (and commits to them): finite and within the codec's limits. Trained in, they
//! take over AdamW's moments upstream, and the drivers' loss ended at 3.53 against 1.32 clean
//! (+167%; the flip alone, at honest size, +1.1%). The norm bound on what a stage takes from
//! peers (`pipeline/norms.rs`) refuses them and sends the micro-batch elsewhere at once.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{
    Cheat, EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model,
};

const STAGES: usize = 2;
/// A replica of the last stage (nodes alternate stages).
const LIAR: usize = 1;

fn run(lie: bool) -> Sim {
    let mut s = settings(tiny_model(), STAGES, 3);
    s.steps = 120;
    let factory = Factory::new(s.clone(), EngineKind::Real);
    let cheats = factory.cheats.clone();
    let mut sim = Sim::new(
        3,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for i in 0..STAGES * 3 {
        sim.add_node(i % STAGES, Duration::from_millis(10 * i as u64));
    }
    if lie {
        cheats
            .lock()
            .unwrap()
            .insert(sim.node_id(LIAR), Cheat::ScaledGradient);
    }
    sim.run_until(Duration::from_secs(90));
    sim
}

/// The drivers' mean training loss over their last 20 steps, and how many steps they took.
fn tail_loss(sim: &Sim) -> (f32, usize) {
    let mut tails = Vec::new();
    let mut steps = usize::MAX;
    for d in (0..sim.len()).filter(|i| i % STAGES == 0) {
        let l: Vec<f32> = sim
            .events(d)
            .iter()
            .filter_map(|e| match e {
                NodeEvent::Step { loss: Some(l), .. } => Some(*l),
                _ => None,
            })
            .collect();
        steps = steps.min(l.len());
        let tail = &l[l.len().saturating_sub(20)..];
        tails.push(tail.iter().sum::<f32>() / tail.len().max(1) as f32);
    }
    (tails.iter().sum::<f32>() / tails.len() as f32, steps)
}

/// Fails without the bound: the attacked run's loss is 2.7 times the clean one.
#[test]
fn gradients_flipped_and_scaled_by_a_downstream_replica_are_refused_and_learning_goes_on() {
    let (clean, clean_steps) = tail_loss(&run(false));
    let sim = run(true);
    let (attacked, steps) = tail_loss(&sim);
    assert!(clean_steps >= 100 && steps >= 100, "{clean_steps} {steps}");
    assert!(
        attacked <= clean * 1.03,
        "attacked {attacked} against clean {clean}"
    );
    // The drivers refused the liar's gradients and said why.
    let refused = (0..sim.len())
        .filter(|i| i % STAGES == 0)
        .flat_map(|i| sim.events(i))
        .filter(|e| matches!(e, NodeEvent::Dropped { reason, .. } if reason.contains("norm")))
        .count();
    assert!(refused > 0);
}
