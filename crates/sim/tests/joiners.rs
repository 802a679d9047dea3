//! Joiners that enter the simulated network through the node's own start-up machine: the
//! stage they choose, the θ₀ they borrow, one trace per seed.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model};

/// Nodes told their stages (`placed[i]` for node i), on the stand-in, settling for 2 s.
fn sim(seed: u64, stages: usize, placed: &[usize]) -> Sim {
    let mut s = settings(tiny_model(), stages, 1);
    s.settle_ms = 2_000;
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for (i, stage) in placed.iter().enumerate() {
        sim.add_node(*stage, Duration::from_millis(10 * i as u64));
    }
    sim
}

fn warnings(sim: &Sim, i: usize) -> Vec<String> {
    sim.events(i)
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Warning { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn joiners_fill_the_emptiest_stage() {
    // Two replicas of stage 0, one each of stages 1 and 2.
    let mut sim = sim(3, 3, &[0, 0, 1, 2]);
    let joiners: Vec<usize> = [1, 5, 9]
        .iter()
        .map(|s| sim.add_joiner(Duration::from_secs(*s)))
        .collect();
    // A joiner listens for the settle period before it runs.
    sim.run_until(Duration::from_millis(2_900));
    assert!(!sim.is_up(joiners[0]));
    sim.run_until(Duration::from_secs(3));
    assert!(sim.is_up(joiners[0]));
    sim.run_until(Duration::from_secs(20));
    let chosen: Vec<usize> = joiners
        .iter()
        .map(|&j| sim.core(j).expect("joiner up").stage())
        .collect();
    // Replicas [2, 1, 1] → stage 1 (ties go to the earlier stage); [2, 2, 1] → 2; [2, 2, 2] → 0.
    assert_eq!(chosen, vec![1, 2, 0]);
}

#[test]
fn a_late_joiner_borrows_its_stages_theta() {
    let mut sim = sim(4, 2, &[0, 0, 1]);
    sim.run_until(Duration::from_secs(30));
    let round = sim.core(2).unwrap().sync_round();
    assert!(round > 0, "stage 1 never synchronised");
    let j = sim.add_joiner(Duration::from_secs(30));
    sim.run_until(Duration::from_secs(32));
    let core = sim.core(j).expect("joiner up");
    assert_eq!(core.stage(), 1);
    // It starts at the stage's θ₀, not at round 0; the simulated engines keep their own
    // moments, which the machine reports.
    assert!(core.sync_round() >= round);
    let warned = warnings(&sim, j);
    assert!(
        warned
            .iter()
            .any(|w| w.contains("starting AdamW from zero")),
        "{warned:?}"
    );
    assert!(
        !warned.iter().any(|w| w.contains("starting from scratch")),
        "{warned:?}"
    );
}

#[test]
fn joiners_keep_one_seed_one_trace() {
    let run = |seed| {
        let mut sim = sim(seed, 2, &[0, 1]);
        sim.add_joiner(Duration::from_secs(1));
        sim.add_joiner(Duration::from_secs(15));
        sim.run_until(Duration::from_secs(25));
        sim.trace_hash()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}
