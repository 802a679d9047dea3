//! Two staked replicas of one stage receipting each other's claims of rounds the stage never
//! ran. Before the round lead every ledger paid them for every such round the founding's time
//! bound allowed (four a second); now no ledger, live or finalized, pays a round more than
//! the lead past what the stage's other replicas reached.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use neuroshard_ledger::round_key_of;
use neuroshard_node::core::Transmit;
use neuroshard_node::records::Topic;
use neuroshard_proof::{Canonical, Proof, Receipt, ReceiptKind, SignedProof};
use neuroshard_sim::{EngineKind, Sim, network, settings, tiny_model};

/// Stage 0 of 2 × 5 holds nodes 0, 2, 4, 6 and 8: the Sybils are 2 and 4.
const SYBIL: usize = 2;
const ACCOMPLICE: usize = 4;

/// Claims of rounds `first..first + 200` (every tenth) by the Sybil, each receipted by its
/// accomplice, modelled on the Sybil's latest genuine proof.
fn forged_claims(sim: &Sim, genuine: &[u8], first: u64) -> Vec<(u64, Vec<u8>)> {
    let signed = SignedProof::from_bytes(genuine).expect("the Sybil's own proof");
    let template = Proof::from_canonical_bytes(signed.payload_bytes()).expect("decodes");
    (0..20)
        .map(|k| {
            let round = first + 10 * k;
            let mut p = template.clone();
            p.round = round;
            p.nonce = template.nonce + 1 + k;
            // A minute on (within the clock skew nodes allow), so that the founding's time
            // bound, four rounds a second, allows every claim.
            p.timestamp_ms = template.timestamp_ms + 60_000;
            p.pseudo_gradient_hash = *blake3::hash(&round.to_le_bytes()).as_bytes();
            p.receipts = vec![Receipt::sign(
                sim.identity(ACCOMPLICE),
                p.network,
                p.node_id,
                round,
                ReceiptKind::Gradients,
                p.pseudo_gradient_hash,
            )];
            (round, p.sign(sim.identity(SYBIL)).to_bytes())
        })
        .collect()
}

/// Runs the attack under `round_lead`: the rounds of the claims each node's live ledger and
/// finalized state paid, and every node's live state hash.
fn attack(round_lead: u64) -> (Vec<BTreeSet<u64>>, Vec<BTreeSet<u64>>, BTreeSet<String>) {
    let mut s = settings(tiny_model(), 2, 5);
    s.steps = 60;
    let mut sim = network(17, s, 5, EngineKind::StandIn);
    sim.set_round_lead(round_lead);
    // No offline founders: the ten nodes are the whole finality committee.
    sim.set_spare_keys(0);
    let latest: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let slot = Arc::clone(&latest);
    sim.set_tamper(
        SYBIL,
        Box::new(move |t| {
            if let Transmit::Publish {
                topic: Topic::Proof(_),
                data,
            } = &t
            {
                *slot.lock().unwrap() = Some(data.clone());
            }
            Some(t)
        }),
    );
    sim.run_until(Duration::from_secs(30));
    let genuine = latest
        .lock()
        .unwrap()
        .clone()
        .expect("the Sybil proved a round");
    let template = Proof::from_canonical_bytes(
        SignedProof::from_bytes(&genuine)
            .expect("signed")
            .payload_bytes(),
    )
    .expect("decodes");
    let claims = forged_claims(&sim, &genuine, template.round + 20);
    for (_, wire) in &claims {
        for j in (0..sim.len()).filter(|j| *j != SYBIL) {
            sim.gossip_to(SYBIL, j, &Topic::Proof(0), wire.clone());
        }
    }
    sim.run_until(Duration::from_secs(100));
    let sybil = sim.node_id(SYBIL);
    let paid = |state: &neuroshard_ledger::LedgerState| -> BTreeSet<u64> {
        claims
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| state.round_claimed(&round_key_of(&sybil, template.layers, *r)))
            .collect()
    };
    let nodes: Vec<_> = (0..sim.len())
        .map(|i| sim.core(i).expect("every node runs"))
        .collect();
    let live = nodes.iter().map(|c| paid(c.economy().ledger())).collect();
    let fin = nodes
        .iter()
        .map(|c| {
            let state = c.finalized_state().expect("finality runs");
            assert!(state.proof_count() > 50, "finality stalled");
            paid(state)
        })
        .collect();
    let hashes = nodes
        .iter()
        .map(|c| hex::encode(c.economy().state_hash()))
        .collect();
    (live, fin, hashes)
}

#[test]
fn two_staked_replicas_are_not_paid_for_rounds_their_stage_never_ran() {
    let (live, fin, hashes) = attack(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD);
    for (i, (l, f)) in live.iter().zip(&fin).enumerate() {
        assert!(l.is_empty(), "node {i}'s live ledger paid rounds {l:?}");
        assert!(f.is_empty(), "node {i}'s finalized state paid rounds {f:?}");
    }
    assert_eq!(hashes.len(), 1, "live ledgers differ: {hashes:?}");

    // Without the round lead every ledger pays every claim.
    let (live, fin, _) = attack(0);
    for (i, (l, f)) in live.iter().zip(&fin).enumerate() {
        assert_eq!(l.len(), 20, "node {i}: without the lead, paid {l:?}");
        assert_eq!(f.len(), 20, "node {i}: without the lead, finalized {f:?}");
    }
}
