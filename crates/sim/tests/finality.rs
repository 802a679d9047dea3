//! Ledger finality in simulated networks of real node cores: every node finalizes the same
//! epochs with the same state; a crashed quarter of the committee does not stop it; half of
//! it halts finality without losing an item; a late joiner follows from certificates.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{
    EngineCosts, EngineKind, Factory, LinkModel, Sim, UNIX_START_MS, settings, tiny_model,
};

/// 2 stages × 2 replicas on the stand-in, epochs every `epoch_ms`, drivers stopping after
/// `steps` (so the last proofs settle).
fn network(seed: u64, epoch_ms: u64, steps: u64) -> Sim {
    network_of(4, seed, epoch_ms, steps)
}

/// `n` nodes alternating over 2 stages (each waits for 2 replicas of its stage).
fn network_of(n: usize, seed: u64, epoch_ms: u64, steps: u64) -> Sim {
    network_spaced(n, seed, epoch_ms, steps, 10)
}

/// The same, node i starting `gap_ms` × i in.
fn network_spaced(n: usize, seed: u64, epoch_ms: u64, steps: u64, gap_ms: u64) -> Sim {
    let mut s = settings(tiny_model(), 2, 2);
    s.steps = steps;
    s.epoch_ms = epoch_ms;
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    // No spare keys for joiners: an offline key's stake counts against the quorum (a late
    // joiner follows finality unstaked, as an observer).
    sim.set_spare_keys(0);
    for i in 0..n {
        sim.add_node(i % 2, Duration::from_millis(gap_ms * i as u64));
    }
    sim
}

/// Node `i`'s finalized epochs: (epoch, state hash, latency ms, node time ms).
fn finalized(sim: &Sim, i: usize) -> Vec<(u64, String, Option<f64>, u64)> {
    sim.events(i)
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Finalized {
                epoch,
                state_hash,
                latency_ms,
                time_ms,
                ..
            } => Some((*epoch, state_hash.clone(), *latency_ms, *time_ms)),
            _ => None,
        })
        .collect()
}

/// Every pair of nodes holds one state at every epoch both finalized.
fn assert_agree(sim: &Sim, nodes: &[usize]) {
    for &a in nodes {
        for &b in nodes {
            for (e, h, ..) in finalized(sim, a) {
                if let Some((_, g, ..)) = finalized(sim, b).into_iter().find(|x| x.0 == e) {
                    assert_eq!(h, g, "nodes {a} and {b} differ at epoch {e}");
                }
            }
        }
    }
}

#[test]
fn four_nodes_finalize_one_history_and_a_crashed_member_does_not_stop_it() {
    let mut sim = network(11, 2_000, 120);
    sim.crash_at(3, Duration::from_secs(30));
    sim.run_until(Duration::from_secs(90));
    assert_agree(&sim, &[0, 1, 2, 3]);
    for i in 0..3 {
        let f = finalized(&sim, i);
        let after_crash = f.iter().filter(|x| x.3 > UNIX_START_MS + 31_000).count();
        assert!(f.len() >= 20, "node {i} finalized {} epochs", f.len());
        assert!(after_crash > 0, "node {i}: finality stopped at the crash");
        let core = sim.core(i).unwrap();
        let (epoch, state, pending) = core.finality_head().unwrap();
        assert_eq!(epoch, f.last().unwrap().0);
        assert_eq!(hex::encode(state), f.last().unwrap().1);
        // Proofs became final: the finalized state pays what the live one paid, once
        // nothing waits.
        let fin = core.finalized_state().unwrap();
        assert!(fin.proof_count() > 0, "node {i}: no proof is final");
        assert_eq!(pending, 0, "node {i}: items still wait");
        assert_eq!(fin.proof_count(), core.economy().proof_count(), "node {i}");
    }
}

/// Validators that start 2.5 s apart (as `swarm` starts its processes) with short epochs: the
/// first to run waits, saying so on the finality topic, until more than two thirds of the
/// committee does. Alone, it timed its rounds out, each longer than the last, and the first
/// epoch came 5 to 8 s after the third validator started (6.7 s on average over 6 seeds); now
/// 0.8 s, or 4.8 s where the first proposer is the one still missing (a propose timeout).
#[test]
fn the_first_epoch_waits_for_the_committee_and_finalizes_soon_after_it_runs() {
    let mut firsts = Vec::new();
    for seed in 1..=6 {
        let mut sim = network_spaced(4, seed, 500, 0, 2_500);
        sim.run_until(Duration::from_secs(20));
        // The third validator starts at 5 s: two thirds of the power run from then on.
        for i in 0..3 {
            let first = finalized(&sim, i).first().map(|f| f.3 - UNIX_START_MS);
            assert!(
                first.is_some_and(|t| t <= 11_000),
                "seed {seed}: node {i} first finalized at {first:?} ms"
            );
            firsts.extend(first);
        }
        assert_agree(&sim, &[0, 1, 2, 3]);
    }
    let mean = firsts.iter().sum::<u64>() / firsts.len() as u64;
    assert!(
        mean <= 8_500,
        "the first epoch came {mean} ms in on average"
    );
}

/// Seven validators split 3 | 4 by a partition: neither side holds two thirds, so neither
/// finalizes anything of its own; healed, they go on as one history.
#[test]
fn a_partition_of_seven_halts_both_sides_and_heals_into_one_history() {
    let mut sim = network_of(7, 15, 2_000, 100);
    sim.run_until(Duration::from_secs(20));
    let before: Vec<u64> = (0..7)
        .map(|i| sim.core(i).unwrap().finality_head().unwrap().0)
        .collect();
    sim.partitions.isolate(&[0, 1, 2], 1);
    sim.run_until(Duration::from_secs(45));
    let cut: Vec<u64> = (0..7)
        .map(|i| sim.core(i).unwrap().finality_head().unwrap().0)
        .collect();
    // At most the epoch in flight when the cut came finalizes on either side.
    let top = before.iter().max().copied().unwrap_or(0);
    assert!(cut.iter().all(|e| *e <= top + 1), "{before:?} → {cut:?}");
    sim.partitions.heal();
    sim.run_until(Duration::from_secs(90));
    assert_agree(&sim, &(0..7).collect::<Vec<_>>());
    let after: Vec<u64> = (0..7)
        .map(|i| sim.core(i).unwrap().finality_head().unwrap().0)
        .collect();
    for (i, e) in after.iter().enumerate() {
        assert!(
            *e >= top + 10,
            "node {i} at epoch {e} after the heal ({cut:?})"
        );
    }
}

/// Half the committee down: no epoch finalizes while it is gone, training goes on, and once
/// it is back (from what its database kept) finality resumes and every item becomes final.
#[test]
fn half_the_committee_down_halts_finality_and_loses_nothing() {
    let mut sim = network(12, 2_000, 150);
    for i in [2, 3] {
        sim.crash_at(i, Duration::from_secs(20));
        sim.restart_at(i, Duration::from_secs(45));
    }
    sim.run_until(Duration::from_secs(130));
    assert_agree(&sim, &[0, 1, 2, 3]);
    let during = |i| {
        finalized(&sim, i)
            .iter()
            .filter(|x| (UNIX_START_MS + 23_000..UNIX_START_MS + 45_000).contains(&x.3))
            .count()
    };
    assert_eq!((during(0), during(1)), (0, 0), "finalized without a quorum");
    let steps = |i| {
        sim.events(i)
            .iter()
            .filter(|e| matches!(e, NodeEvent::Step { time_ms, .. } if (UNIX_START_MS + 23_000..UNIX_START_MS + 45_000).contains(time_ms)))
            .count()
    };
    assert!(steps(0) > 0, "training stopped with finality");
    let heads: Vec<_> = (0..4)
        .map(|i| sim.core(i).unwrap().finality_head().unwrap())
        .collect();
    for (i, (epoch, state, pending)) in heads.iter().enumerate() {
        assert!(*epoch > 15, "node {i} stayed at epoch {epoch}");
        assert_eq!(*pending, 0, "node {i}: items still wait");
        assert_eq!(*state, heads[0].1, "node {i}");
        let core = sim.core(i).unwrap();
        assert_eq!(
            core.finalized_state().unwrap().proof_count(),
            core.economy().proof_count(),
            "node {i}: a proof never became final"
        );
    }
}

/// A node that joins late (unstaked: an observer) checks the certified history from the
/// genesis committee on and reaches the committee's state, without any of it being decided
/// while it listened.
#[test]
fn a_late_joiner_follows_the_finalized_history_from_certificates() {
    let mut sim = network(13, 2_000, 0);
    let joiner = sim.add_joiner(Duration::from_secs(40));
    sim.run_until(Duration::from_secs(70));
    let f = finalized(&sim, joiner);
    let fetched = f.iter().filter(|x| x.2.is_none()).count();
    assert!(fetched >= 10, "the joiner fetched {fetched} epochs");
    assert_eq!(
        f[0].0, 1,
        "the joiner checked the history from the genesis on"
    );
    assert_agree(&sim, &[0, 1, joiner]);
    let (mine, theirs) = (
        sim.core(joiner).unwrap().finality_head().unwrap(),
        sim.core(0).unwrap().finality_head().unwrap(),
    );
    assert!(
        mine.0 + 1 >= theirs.0,
        "joiner at {} of {}",
        mine.0,
        theirs.0
    );
}

/// A validator that signs two prevotes for one round: every honest node sees the evidence,
/// an epoch holds its slash, and the finalized state takes half its stake, on every node.
#[test]
fn a_double_signing_validator_is_slashed_in_the_finalized_state() {
    use neuroshard_finality::context::Sig;
    use neuroshard_finality::{ConsensusWire, context::ValueId};
    use neuroshard_node::core::Transmit;
    use neuroshard_node::finality::FinalityGossip;
    use neuroshard_node::records::Topic;
    use neuroshard_proof::Canonical;
    use std::sync::{Arc, Mutex};

    let mut sim = network(14, 2_000, 0);
    // Node 3's second prevote, for another value, of the first round of epoch 3 it votes in:
    // forged as its honest one leaves, sent right after it.
    let forged: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let out = forged.clone();
    let me = sim.identity(3).clone();
    sim.set_tamper(
        3,
        Box::new(move |t| {
            if let Transmit::Publish {
                topic: Topic::Finality,
                data,
            } = &t
                && let Ok(FinalityGossip::Consensus(bytes)) =
                    FinalityGossip::from_canonical_bytes(data)
                && let Ok(ConsensusWire::Vote(v)) = ConsensusWire::from_canonical_bytes(&bytes)
                && v.message.epoch.0 == 3
                && matches!(v.message.kind, malachite_types::VoteType::Prevote)
                && out.lock().unwrap().is_empty()
            {
                let mut other = v.message.clone();
                other.value = malachite_types::NilOrVal::Val(ValueId([0xAB; 32]));
                let sig = Sig(me.sign(&other.to_canonical_bytes()).0);
                let wire = ConsensusWire::Vote(malachite_types::SignedMessage::new(other, sig));
                out.lock().unwrap().push(
                    FinalityGossip::Consensus(wire.to_canonical_bytes()).to_canonical_bytes(),
                );
            }
            Some(t)
        }),
    );
    let offender = sim.node_id(3);
    let mut sent = 0;
    for ms in 0..12_000u64 {
        sim.run_until(Duration::from_millis(ms));
        if sent == 0
            && let Some(data) = forged.lock().unwrap().first().cloned()
        {
            sim.transmit_as(
                3,
                Transmit::Publish {
                    topic: Topic::Finality,
                    data,
                },
            );
            sent += 1;
        }
    }
    sim.run_until(Duration::from_secs(60));
    assert_eq!(sent, 1);
    assert_agree(&sim, &[0, 1, 2, 3]);
    let stakes: Vec<u64> = (0..4)
        .map(|i| {
            let fin = sim.core(i).unwrap().finalized_state().unwrap();
            fin.account(&offender).stake
        })
        .collect();
    let honest = sim
        .core(0)
        .unwrap()
        .finalized_state()
        .unwrap()
        .account(&sim.node_id(0))
        .stake;
    for (i, s) in stakes.iter().enumerate() {
        assert_eq!(*s, honest / 2, "node {i} holds the offender at stake {s}");
    }
    let slashed = (0..4).all(|i| {
        let fin = sim.core(i).unwrap().finalized_state().unwrap();
        fin.has_slash(&offender, neuroshard_node::finality::EQUIVOCATION_NONCE + 3)
    });
    assert!(slashed, "no finalized slash of epoch 3's double signing");
}
