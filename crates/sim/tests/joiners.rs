//! Joiners that enter the simulated network through the node's own start-up machine: the
//! stage they choose, the θ₀ they borrow (and the θ records they refuse), one trace per seed.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use neuroshard_node::core::Transmit;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::sync::{ThetaRecord, theta_key};
use neuroshard_proof::Signed;
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

/// The latest outer-state blob and θ record a node offered and published.
type Published = Rc<RefCell<(Vec<u8>, Option<ThetaRecord>)>>;

/// Stage 1 of a network whose stage 0 is fuller (nodes 0–3 serve stage 0, 4–6 stage 1), so a
/// joiner takes stage 1. Node 6, a staked replica there, withholds its θ records and at 29 s
/// publishes a forged one: with `made_up`, two rounds ahead of its stage, naming an outer
/// state of that round with made-up weights (its θ₀ negated) that it serves; without, its honest
/// record relabelled round u64::MAX. Returns the simulation at 32 s with a joiner started at
/// 30 s, the joiner's index, and the stage's round at 29 s.
fn join_beside_a_forger(made_up: bool) -> (Sim, usize, u64) {
    const FORGER: usize = 6;
    let mut sim = sim(9, 2, &[0, 0, 0, 0, 1, 1, 1]);
    let theta_key_1 = theta_key(&sim.network().id, 1);
    let published: Published = Rc::default();
    let tap = published.clone();
    let key = theta_key_1.clone();
    sim.set_tamper(
        FORGER,
        Box::new(move |t| match t {
            Transmit::OfferBlob { data, hash } if data.starts_with(b"NSOUTER1") => {
                tap.borrow_mut().0 = data.to_vec();
                Some(Transmit::OfferBlob { data, hash })
            }
            Transmit::PutRecord { key: k, value } if k == key => {
                let honest = Signed::<ThetaRecord>::from_bytes(&value).and_then(|s| s.verify());
                tap.borrow_mut().1 = Some(honest.expect("the forger's own record"));
                None
            }
            other => Some(other),
        }),
    );
    sim.run_until(Duration::from_secs(29));
    let round = sim.core(4).unwrap().sync_round();
    assert!(round > 1, "stage 1 never synchronised");
    let (outer, honest) = published.borrow().clone();
    let honest = honest.expect("the forger published a θ record");
    let forged = if made_up {
        // Magic, round, length, flag, then θ₀ as f32s: two rounds ahead of the stage (one
        // may close while the joiner settles), weights negated.
        let mut bytes = outer;
        bytes[8..16].copy_from_slice(&(round + 2).to_le_bytes());
        let n = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
        for x in bytes[25..25 + 4 * n].chunks_exact_mut(4) {
            let v = -f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            x.copy_from_slice(&v.to_le_bytes());
        }
        let hash = *blake3::hash(&bytes).as_bytes();
        let data = bytes.into();
        sim.transmit_as(FORGER, Transmit::OfferBlob { hash, data });
        ThetaRecord {
            round: round + 2,
            theta: hash,
            ..honest
        }
    } else {
        ThetaRecord {
            round: u64::MAX,
            ..honest
        }
    };
    let value = Signed::sign(sim.identity(FORGER), &forged).to_bytes();
    sim.transmit_as(
        FORGER,
        Transmit::PutRecord {
            key: theta_key_1,
            value,
        },
    );
    let j = sim.add_joiner(Duration::from_secs(30));
    sim.run_until(Duration::from_secs(32));
    (sim, j, round)
}

/// A staked replica publishes θ records no stage ever reached: one at round u64::MAX (whose
/// `round + 1` once wrapped), and one a round ahead of its stage naming made-up weights it
/// serves as a well-formed outer state of that round (a joiner that took the latest round
/// would train from them). The joiner takes the state the stage's two honest publishers
/// name, and nothing panics.
#[test]
fn a_joiner_takes_neither_a_round_u64_max_nor_a_made_up_later_theta_record() {
    for (what, made_up) in [("round u64::MAX", false), ("a made-up later state", true)] {
        let (sim, j, round) = join_beside_a_forger(made_up);
        let core = sim
            .core(j)
            .unwrap_or_else(|| panic!("{what}: the joiner did not start"));
        assert_eq!(core.stage(), 1, "{what}");
        let joined = sim.joined(j).expect("the joiner took a state");
        assert!(
            [4, 5].map(|i| sim.node_id(i)).contains(&joined.peer),
            "{what}: the joiner took the forger's state at round {}",
            joined.round
        );
        // The stage may have closed a round while the joiner settled.
        assert!(
            (round..=round + 2).contains(&joined.round),
            "{what}: took round {} where the stage was at {round}",
            joined.round
        );
    }
}
