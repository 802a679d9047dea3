//! A growing network: nodes joining over time (10 → 60 → 120) trigger the upgrades the growth
//! rule predicts, in the finalized ledger state, and every node reports the same version,
//! layout and epoch for each; a replica moves to each new stage (it drains, stops and starts
//! again there) and the drivers then train the grown version; training and finality go on
//! throughout.

use std::collections::BTreeMap;
use std::time::Duration;

use neuroshard_growth::{Architecture, Capacity, Claim, Decision, GrowthPolicy, Shape, decide};
use neuroshard_node::events::NodeEvent;
use neuroshard_node::settings::CapacityClaim;
use neuroshard_sim::{EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model};

const GIB: u64 = 1 << 30;
const TFLOPS: u64 = 1_000_000_000_000;
const FOUNDERS: usize = 10;
const NODES: usize = 120;
const STAGES: usize = 3;

/// The default rule (every 50 joins, ≥ 30% larger, at most 2×), a one-day compute horizon.
fn policy() -> GrowthPolicy {
    let mut p = GrowthPolicy::depth(64);
    p.scaler.horizon_s = 86_400;
    p
}

/// When node `i` starts: 10 founders at once, 50 joiners from 15 s one every 0.6 s, 60 more
/// from 60 s likewise.
fn start_of(i: usize) -> Duration {
    let ms = match i {
        i if i < FOUNDERS => 10 * i as u64,
        i if i < 60 => 15_000 + 600 * (i - FOUNDERS) as u64,
        i => 60_000 + 600 * (i - 60) as u64,
    };
    Duration::from_millis(ms)
}

/// 120 nodes over 3 stages of the tiny model on the stand-in, every node announcing 2 GiB
/// and 1 TFLOP/s. The founders hold the genesis's founder stake, the joiners the minimum, so
/// the first committee's quorum is the founders' while the joiners are still offline.
fn network(seed: u64) -> Sim {
    let mut s = settings(tiny_model(), STAGES, 2);
    s.epoch_ms = 1_000;
    s.growth = Some(policy());
    s.capacity = CapacityClaim {
        memory_bytes: 2 * GIB,
        flops_per_s: TFLOPS,
    };
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    sim.set_spare_keys(0);
    // Scale runs keep only what they read.
    sim.keep_events(|e| {
        matches!(
            e,
            NodeEvent::Architecture { .. }
                | NodeEvent::Finalized { .. }
                | NodeEvent::Moving { .. }
                | NodeEvent::Drained { .. }
                | NodeEvent::Driving { .. }
        )
    });
    for i in 0..NODES {
        sim.add_node(i % STAGES, start_of(i));
        if i >= FOUNDERS {
            sim.set_stake(i, neuroshard_ledger::rules::DEFAULT_MIN_STAKE);
        }
    }
    sim
}

/// One reported upgrade: (epoch, version, layers, stages, joins, counted).
type Reported = (u64, u32, u64, Vec<(u16, u64)>, u64, u64);

/// Each once: a mover reports its ledger's upgrades again after its restart.
fn upgrades(sim: &Sim, i: usize) -> Vec<Reported> {
    let mut seen = std::collections::BTreeSet::new();
    sim.events(i)
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Architecture {
                epoch,
                version,
                layers,
                stages,
                joins,
                counted,
                ..
            } => Some((*epoch, *version, *layers, stages.clone(), *joins, *counted)),
            _ => None,
        })
        .filter(|r| seen.insert(r.1))
        .collect()
}

/// What the rule decides at `joins` for `counted` nodes announcing what every node here does.
fn predicted(current: &Shape, joins: u64, counted: u64) -> Decision {
    let claims: Vec<Claim> = (0..counted)
        .map(|i| Claim {
            node: {
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&i.to_le_bytes());
                id
            },
            memory_bytes: 2 * GIB,
            flops_per_s: TFLOPS,
        })
        .collect();
    let p = policy();
    let capacity = Capacity::count(&claims, |_| true, &p.limits);
    decide(current, joins, &capacity, &p.scaler, &p.rule).expect("valid policy")
}

#[test]
fn nodes_joining_over_time_trigger_the_predicted_upgrades_and_every_node_agrees() {
    let mut sim = network(11);
    sim.run_until(Duration::from_secs(110));

    // Every node reports the same upgrades: epoch, version, layout, joins and claims counted
    // (a joiner from the finalized history it fetched).
    let reference = upgrades(&sim, 0);
    eprintln!("upgrade trace (epoch, version, layers, layout, joins, counted): {reference:?}");
    for i in 0..NODES {
        assert!(sim.is_up(i), "node {i} is down");
        assert_eq!(upgrades(&sim, i), reference, "node {i}");
    }

    // Two evaluation points were reached (50 and 100 joins), each an upgrade the rule
    // predicts from the shape before it and the registered capacity at that epoch.
    let mut shape = neuroshard_node::network::shape_of(&tiny_model());
    let mut arch = Architecture::genesis(shape, &[1, 1, 1]).expect("genesis layout");
    let joins: Vec<u64> = reference.iter().map(|r| r.4).collect();
    assert_eq!(joins, vec![50, 100], "{reference:?}");
    for (epoch, version, layers, stages, joins, counted) in &reference {
        // Every registered node had announced by then (both ops leave in one heartbeat).
        assert!(
            *counted >= *joins,
            "epoch {epoch}: {counted} counted of {joins}"
        );
        let Decision::Upgrade(target) = predicted(&shape, *joins, *counted) else {
            panic!("the rule keeps the model at {joins} joins");
        };
        assert_eq!(target.shape.layers, *layers);
        arch = arch.grown(&target).expect("the layout grows");
        let layout: Vec<(u16, u64)> = arch.stages.iter().map(|s| (s.id, s.layers)).collect();
        assert_eq!((arch.version, &layout), (*version, stages));
        shape = target.shape;
    }
    // The existing stages kept their ids and blocks at both ends of the pipeline.
    assert_eq!(reference[1].3.first(), Some(&(0, 1)));
    assert_eq!(reference[1].3.last(), Some(&(2, 1)));

    // The finalized states agree at every epoch any two nodes finalized.
    let mut states: BTreeMap<u64, String> = BTreeMap::new();
    for i in 0..NODES {
        for e in sim.events(i) {
            if let NodeEvent::Finalized {
                epoch, state_hash, ..
            } = e
            {
                let first = states.entry(*epoch).or_insert_with(|| state_hash.clone());
                assert_eq!(first, state_hash, "node {i}, epoch {epoch}");
            }
        }
    }
    // Each new stage got a replica: a node of a stage with others drained, left, and runs
    // it now; the drivers moved to the newest version once its stages were held.
    for (v, new_stage) in [(1u32, 3usize), (2, 4)] {
        let movers: Vec<usize> = (0..NODES)
            .filter(|&i| {
                sim.events(i).iter().any(|e| {
                    matches!(e, NodeEvent::Drained { to, complete: true, .. } if *to == new_stage)
                })
            })
            .collect();
        eprintln!("v{v}: stage {new_stage} moved to by {movers:?}");

        assert!(!movers.is_empty(), "nobody moved to stage {new_stage}");
        for &m in &movers {
            let core = sim.core(m).expect("the mover runs again");
            assert_eq!(core.stage(), new_stage);
            assert!(
                core.steps_done() > 0,
                "node {m} trained in stage {new_stage}"
            );
        }
        let drivers = (0..NODES)
            .filter(|&i| {
                sim.events(i)
                    .iter()
                    .any(|e| matches!(e, NodeEvent::Driving { version, .. } if *version == v))
            })
            .count();
        eprintln!("v{v}: {drivers} drivers trained it");
        assert!(drivers > 0, "no driver trained version {v}");
    }

    // Finality kept going through the joins, and training did.
    assert!(states.len() > 60, "{} epochs finalized", states.len());
    for i in 0..FOUNDERS {
        let core = sim.core(i).expect("founder up");
        assert!(
            core.sync_round() > 5,
            "node {i} round {}",
            core.sync_round()
        );
        assert_eq!(core.architecture(), Some(&arch), "node {i}");
    }
}
