//! Equivocation, shown to each half of the network another way:
//! - a node that signs two different proofs for one round: every ledger settles it alike
//!   (neither proof paid, stake slashed), whatever order the proofs reached it in, and no
//!   honest node is touched;
//! - a replica that signs two offers of each DiLoCo round: its stage still ends every round on
//!   one θ₀.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use neuroshard_node::core::Transmit;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::records::Topic;
use neuroshard_node::sync::{SyncMsg, SyncOffer};
use neuroshard_proof::{Canonical, Proof, Signed, SignedProof};
use neuroshard_sim::{EngineKind, Sim, network, settings, tiny_model};

const CHEAT: usize = 1;

/// The proof the cheat withheld, with its topic.
type Held = Arc<Mutex<Option<(Topic, Vec<u8>)>>>;

/// 2 stages × 3 replicas on the stand-in; node 1 (stage 1) withholds its first proof, which the
/// test then splits.
fn cheating_network(seed: u64) -> (Sim, Held) {
    let mut s = settings(tiny_model(), 2, 3);
    s.steps = 80;
    let mut sim = network(seed, s, 3, EngineKind::StandIn);
    // No offline founders: finality runs, and training is paid as it settles rounds.
    sim.set_spare_keys(0);
    let held = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&held);
    sim.set_tamper(
        CHEAT,
        Box::new(move |t| match t {
            Transmit::Publish {
                topic: topic @ Topic::Proof(_),
                data,
            } => {
                let mut held = slot.lock().unwrap();
                if held.is_none() {
                    *held = Some((topic, data));
                    return None;
                }
                Some(Transmit::Publish { topic, data })
            }
            other => Some(other),
        }),
    );
    (sim, held)
}

/// A second proof of the same round: same work, half the tokens, the next nonce.
fn twin(wire: &[u8], sim: &Sim) -> Vec<u8> {
    let signed = SignedProof::from_bytes(wire).expect("the cheat's own proof");
    let mut proof = Proof::from_canonical_bytes(signed.payload_bytes()).expect("decodes");
    proof.nonce += 1;
    proof.tokens = (proof.tokens / 2).max(1);
    proof.sign(sim.identity(CHEAT)).to_bytes()
}

#[test]
fn an_equivocation_split_across_the_network_is_settled_alike_on_every_ledger() {
    let (mut sim, held) = cheating_network(11);
    let mut at = Duration::from_secs(5);
    let (topic, first) = loop {
        sim.run_until(at);
        if let Some(h) = held.lock().unwrap().clone() {
            break h;
        }
        at += Duration::from_secs(5);
        assert!(
            at < Duration::from_secs(120),
            "the cheat never proved a round"
        );
    };
    let second = twin(&first, &sim);
    let stake_before = sim
        .core(0)
        .unwrap()
        .economy()
        .ledger()
        .account(&sim.node_id(CHEAT))
        .stake;
    // Half the network sees one proof, the other half the other; the cheat holds the first.
    for j in 0..sim.len() {
        let wire = if j % 2 == 0 { &first } else { &second };
        if j != CHEAT {
            sim.gossip_to(CHEAT, j, &topic, wire.clone());
        }
    }
    sim.run_until(at + Duration::from_secs(150));

    let cheat = sim.node_id(CHEAT);
    let hashes: std::collections::BTreeSet<_> = (0..sim.len())
        .map(|i| sim.core(i).expect("every node runs").economy().state_hash())
        .collect();
    assert_eq!(hashes.len(), 1, "ledgers split over the equivocation");
    let ledger = sim.core(0).unwrap().economy().ledger();
    let stake = ledger.account(&cheat).stake;
    assert!(
        stake * 2 <= stake_before,
        "stake {stake_before} → {stake}: not slashed"
    );
    for i in (0..sim.len()).filter(|i| *i != CHEAT) {
        let id = sim.node_id(i);
        assert_eq!(
            ledger.account(&id).stake,
            stake_before,
            "honest node {i} lost stake"
        );
        assert!(ledger.account(&id).balance > 0, "honest node {i} unpaid");
    }
}

/// The cheat (stage 1, co-replicas 3 and 5) signs two offers of each round against one θ₀:
/// its genuine one, shown to node 3, and one carrying its pseudo-gradient of the round before
/// (which it still serves), shown to node 5. Each honest replica aggregates what it saw.
/// Outcomes name the offers they used, so the replica whose outcome loses asks the winner's
/// announcer for the offer it lacks, recomputes the winning outcome and takes it: every round
/// ends on one θ₀ on both honest replicas. (Before outcomes named offers, each failed to
/// recompute the other's outcome and the stage stayed split.)
#[test]
fn a_replica_showing_each_co_replica_another_offer_cannot_split_its_stage() {
    let mut s = settings(tiny_model(), 2, 3);
    s.steps = 80;
    let mut sim = network(5, s, 3, EngineKind::StandIn);
    let stash: Arc<Mutex<Vec<SyncOffer>>> = Arc::default();
    let slot = Arc::clone(&stash);
    sim.set_tamper(
        CHEAT,
        Box::new(move |t| match t {
            Transmit::Publish {
                topic: Topic::Sync(stage),
                data,
            } => match Signed::<SyncMsg>::from_bytes(&data).and_then(|s| s.verify()) {
                Ok(SyncMsg::Offer(o)) => {
                    slot.lock().unwrap().push(o);
                    None
                }
                _ => Some(Transmit::Publish {
                    topic: Topic::Sync(stage),
                    data,
                }),
            },
            other => Some(other),
        }),
    );
    let topic = Topic::Sync(1);
    let mut previous: Option<SyncOffer> = None;
    let mut split = 0;
    let mut at = Duration::ZERO;
    while at < Duration::from_secs(60) {
        at += Duration::from_millis(50);
        sim.run_until(at);
        let offers: Vec<SyncOffer> = std::mem::take(&mut *stash.lock().unwrap());
        for genuine in offers {
            let other = match &previous {
                Some(p) => {
                    split += 1;
                    genuine.recommitted(sim.identity(CHEAT), p.blob, p.bytes)
                }
                None => genuine.clone(),
            };
            let sign =
                |o: &SyncOffer| Signed::sign(sim.identity(CHEAT), &SyncMsg::Offer(o.clone()));
            let (to_3, to_5) = (sign(&genuine).to_bytes(), sign(&other).to_bytes());
            sim.gossip_to(CHEAT, 3, &topic, to_3);
            sim.gossip_to(CHEAT, 5, &topic, to_5);
            previous = Some(genuine);
        }
    }
    assert!(split >= 4, "the cheat split only {split} rounds");
    // The last outcome each honest replica reached for each round.
    let mut last: std::collections::BTreeMap<u64, std::collections::BTreeMap<usize, String>> =
        Default::default();
    for i in [3, 5] {
        for e in sim.events(i) {
            if let NodeEvent::Sync { round, theta, .. } | NodeEvent::Adopted { round, theta, .. } =
                e
            {
                last.entry(*round).or_default().insert(i, theta.clone());
            }
        }
    }
    let both: Vec<_> = last.iter().filter(|(_, t)| t.len() == 2).collect();
    assert!(both.len() >= 4, "only {} rounds on both", both.len());
    for (round, thetas) in both {
        let distinct: std::collections::BTreeSet<&String> = thetas.values().collect();
        assert_eq!(distinct.len(), 1, "round {round} split: {thetas:?}");
    }
}
