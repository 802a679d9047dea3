//! What a key without stake can do to a simulated network: it runs, trains and sends, but it
//! cannot register for a stage, so nothing it offers, vouches for or claims counts.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model};

/// 2 stages × 3 replicas on the stand-in (nodes alternate stages), with `aggregator` and no
/// norm bound, whose drivers stop after `steps` and whose `attacker` sends `attack`.
fn network(seed: u64, aggregator: &str, steps: u64, attacker: usize, attack: &str) -> Sim {
    let (stages, n) = (2, 6);
    // An unstaked node never counts as a live replica: wait for the two staked ones.
    let mut s = settings(tiny_model(), stages, 2);
    s.sync.aggregator = aggregator.into();
    s.sync.norm_bound = 0.0;
    s.steps = steps;
    let mut factory = Factory::new(s.clone(), EngineKind::StandIn);
    factory.attack = attack.into();
    let attackers = factory.attackers.clone();
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for i in 0..n {
        sim.add_node(i % stages, Duration::from_millis(10 * i as u64));
    }
    attackers.lock().unwrap().insert(sim.node_id(attacker));
    sim
}

/// Plain mean (no robustness to hide behind), node 5 (a replica of stage 1) sending its
/// pseudo-gradient scaled ×1000; the drivers stop, so the last proofs settle before the
/// ledgers are compared.
fn run(staked: bool) -> Sim {
    let mut sim = network(5, "mean", 100, 5, "scale:1000");
    if !staked {
        sim.without_stake(5);
    }
    // No offline founders: finality runs and settles the rounds honest nodes are paid for.
    sim.set_spare_keys(0);
    sim.run_until(Duration::from_secs(120));
    sim
}

fn rounds_of(sim: &Sim, i: usize) -> usize {
    sim.events(i)
        .iter()
        .filter(|e| matches!(e, NodeEvent::Sync { .. }))
        .count()
}

/// With stake, the scaled offer enters the mean and throws stage 1 far from its target (the
/// control: the attack is real). Without stake the same node cannot register: its offers
/// wait for a registration that never comes, stage 1 trains as if it were not there, and its
/// proofs and the receipts it signs mint nothing.
#[test]
fn a_replica_without_stake_moves_no_theta_and_earns_nothing() {
    let distance = |sim: &Sim| {
        [1usize, 3]
            .iter()
            .filter_map(|&i| sim.engine(i).and_then(|e| e.distance()))
            .fold(0f32, f32::max)
    };
    let staked = run(true);
    let sybil = run(false);
    let (hurt, clean) = (distance(&staked), distance(&sybil));
    eprintln!("stage 1 distance: staked attacker {hurt}, unstaked attacker {clean}");
    assert!(rounds_of(&sybil, 1) >= 3, "stage 1 kept its rounds");
    assert!(clean < 0.1, "the unstaked attacker moved stage 1: {clean}");
    assert!(
        hurt.is_nan() || hurt > clean * 10.0,
        "the staked attacker should wreck the mean: {hurt} vs {clean}"
    );
    let attacker = sybil.node_id(5);
    for i in 0..5 {
        let core = sybil.core(i).expect("honest node runs");
        let ledger = core.economy().ledger();
        assert!(!ledger.was_registered(&attacker, 1), "node {i}");
        assert_eq!(core.economy().balance(&attacker), 0, "node {i}");
        // Honest nodes were paid on the same rounds the attacker sat in.
        assert!(core.economy().own_balance() > 0, "node {i} earned nothing");
    }
    // The honest nodes agree on the ledger.
    let hashes: std::collections::BTreeSet<_> = (0..5)
        .filter_map(|i| sybil.core(i).map(|c| c.economy().state_hash()))
        .collect();
    assert_eq!(hashes.len(), 1);
}

/// A driver whose key holds no stake sends its micro-batches to stage 1 like any driver, but
/// stage 1 answers "busy" until a registration that never comes: none of its data is trained
/// in, so it never completes a step, while the staked drivers train on.
#[test]
fn a_driver_without_stake_gets_no_data_trained_in() {
    let (stages, n) = (2, 6);
    // The unstaked node never counts as a live replica: wait for the two staked ones.
    let mut s = settings(tiny_model(), stages, 2);
    s.steps = 60;
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(
        6,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for i in 0..n {
        sim.add_node(i % stages, Duration::from_millis(10 * i as u64));
    }
    sim.without_stake(4);
    sim.run_until(Duration::from_secs(60));
    let steps = |i: usize| {
        sim.events(i)
            .iter()
            .filter(|e| matches!(e, NodeEvent::Step { .. }))
            .count()
    };
    assert_eq!(steps(4), 0, "the unstaked driver's data was trained in");
    assert!(
        steps(0) >= 30 && steps(2) >= 30,
        "{} {}",
        steps(0),
        steps(2)
    );
    let refused = (0..n)
        .filter(|i| i % stages == 1)
        .flat_map(|i| sim.events(i))
        .filter(
            |e| matches!(e, NodeEvent::Dropped { reason, .. } if reason.contains("not registered")),
        )
        .count();
    assert!(refused > 0);
    // Never registered, it is not a driver whose registration lapsed: it keeps driving (its
    // stake may yet come) and reports no end.
    assert!(
        !sim.events(4)
            .iter()
            .any(|e| matches!(e, NodeEvent::Finished { .. })),
        "the unstaked driver stopped"
    );
}
