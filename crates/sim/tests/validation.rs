//! The validation loss through a simulated 2-stage network of real engines: after every
//! DiLoCo round each driver scores the same held-out windows through the pipeline, and the
//! curve falls as the network learns.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{real_network, serving_model, settings};

const STAGES: usize = 2;

#[test]
fn drivers_measure_a_falling_validation_loss_once_per_round() {
    let mut s = settings(serving_model(2), STAGES, 2);
    s.seq = 8;
    s.sync.every = 4;
    s.eval_windows = 4;
    let mut sim = real_network(3, s, 2);
    sim.run_until(Duration::from_secs(40));
    let mut curves = Vec::new();
    for driver in (0..sim.len()).step_by(STAGES) {
        let points: Vec<(u64, f64, u64, usize)> = sim
            .events(driver)
            .iter()
            .filter_map(|e| match e {
                NodeEvent::Validation {
                    round,
                    loss,
                    tokens,
                    windows,
                    ..
                } => Some((*round, *loss, *tokens, *windows)),
                _ => None,
            })
            .collect();
        assert!(points.len() >= 4, "driver {driver}: {points:?}");
        assert!(
            points.windows(2).all(|w| w[0].0 < w[1].0),
            "one evaluation per round: {points:?}"
        );
        assert!(
            points
                .iter()
                .all(|p| p.1.is_finite() && p.2 == 32 && p.3 == 4),
            "{points:?}"
        );
        let (first, last) = (points[0].1, points[points.len() - 1].1);
        // Untrained, the loss is about ln(vocab); the pattern is learnable.
        assert!((first - 32f64.ln()).abs() < 0.5, "{points:?}");
        assert!(last < first - 0.3, "the curve does not fall: {points:?}");
        curves.push(points);
    }
    // Replicas hold the same θ₀, so the two drivers' scores agree bit for bit, except in
    // rounds one of them scored while a stage was still moving to the next θ₀.
    let same = curves[0]
        .iter()
        .filter(|a| curves[1].iter().any(|b| b.0 == a.0 && b.1 == a.1))
        .count();
    assert!(same * 4 >= curves[0].len() * 3, "{curves:?}");
    // Non-drivers never evaluate.
    for node in (1..sim.len()).step_by(STAGES) {
        assert!(
            !sim.events(node)
                .iter()
                .any(|e| matches!(e, NodeEvent::Validation { .. }))
        );
    }
}
