//! The live ledger pays training only as finality settled it.

use neuroshard_ledger::{EpochItem, LedgerState, SETTLE_EPOCHS};
use neuroshard_proof::fixtures::test_identity;

use super::LedgerStore;
use super::settle::Followed;
use super::tests::{T, config, genesis, prove, registered, rules};
use super::*;

/// The epoch items of proofs `wires`.
fn items(wires: &[Vec<u8>]) -> Vec<EpochItem> {
    let mut verifier = ProofVerifier::new();
    wires
        .iter()
        .map(|w| {
            let signed = SignedProof::from_bytes(w).expect("signed");
            EpochItem::Proof(verifier.check_content(&signed, T).expect("verifies"))
        })
        .collect()
}

/// What a finalized state holds after epochs holding `wires`, then long enough to settle.
fn finalized(base: &LedgerState, wires: &[Vec<u8>]) -> LedgerState {
    let items = items(wires);
    let mut state = base.clone();
    assert!(
        neuroshard_ledger::apply_epoch(&mut state, items)
            .refused
            .is_empty()
    );
    for _ in 0..SETTLE_EPOCHS {
        neuroshard_ledger::apply_epoch(&mut state, Vec::new());
    }
    state
}

/// A node saw three replicas' proofs of round 1; finality held two of them when the round
/// settled. The node pays those two half the round's reward each and the third nothing,
/// whatever it saw first, persists it, and pays nothing twice.
#[test]
fn a_node_pays_the_shares_finality_settled_and_keeps_them_across_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ledger.db");
    let me = test_identity(74).node_id();
    let (mut store, snapshot) = LedgerStore::open(&path, &me, &genesis()).expect("store");
    let mut x = Economy::resume(test_identity(74), config(), snapshot);
    let (mut a, mut b, mut c) = (
        super::tests::economy(71),
        super::tests::economy(72),
        super::tests::economy(73),
    );
    let mut d = super::tests::economy(75);
    registered(&mut [&mut a, &mut b, &mut c, &mut d, &mut x]);
    let base = x.ledger().clone();
    let pa = prove(&mut a, &b, 1, T);
    let pb = prove(&mut b, &a, 1, T);
    let pc = prove(&mut c, &a, 1, T);
    for w in [&pc, &pa, &pb] {
        assert!(matches!(x.on_proof(w, T), ProofOutcome::Applied { .. }));
    }
    assert_eq!(
        x.balance(&a.node_id()),
        0,
        "nothing paid before finality settles"
    );
    let fin = finalized(&base, &[pa, pb]);
    let half = rules().round_reward / 2;
    assert_eq!(
        x.follow_settlements(&fin).expect("follow"),
        Followed {
            rounds: 1,
            paid: 2 * half,
            own: 0
        }
    );
    assert_eq!(x.balance(&a.node_id()), half);
    assert_eq!(x.balance(&b.node_id()), half);
    assert_eq!(x.balance(&c.node_id()), 0, "its proof was not final");
    assert_eq!(
        x.follow_settlements(&fin).expect("again"),
        Followed::default()
    );
    let batch: Vec<LedgerWrite> = std::iter::from_fn(|| x.poll_write()).collect();
    store.write_batch(&batch).expect("write");
    drop(store);
    let (_, reopened) = LedgerStore::open(&path, &me, &genesis()).expect("reopen");
    assert_eq!(reopened.state.state_hash(), x.state_hash());
    let mut again = Economy::resume(test_identity(74), config(), reopened);
    assert_eq!(again.balance(&a.node_id()), half);
    assert_eq!(
        again.follow_settlements(&fin).expect("after"),
        Followed::default()
    );
    // A claim of the settled round, made now, is recorded and never paid.
    let late = prove(&mut d, &a, 1, T);
    assert!(matches!(
        again.on_proof(&late, T),
        ProofOutcome::Applied { .. }
    ));
    assert!(again.ledger().pot(config().layout[0].0, 1).is_empty());
    assert_eq!(again.balance(&d.node_id()), 0);
}

/// A node that catches up on many epochs at once pays every round they settled, in order,
/// not only the latest the finalized state keeps for inspection.
#[test]
fn a_long_catch_up_pays_every_settled_round() {
    let (mut a, mut b) = (super::tests::economy(81), super::tests::economy(82));
    let (mut x, mut y) = (super::tests::economy(83), super::tests::economy(84));
    registered(&mut [&mut a, &mut b, &mut x, &mut y]);
    let base = x.ledger().clone();
    let rounds = neuroshard_ledger::state::SETTLEMENTS_KEPT as u64 + 20;
    let wires: Vec<Vec<u8>> = (1..=rounds)
        .flat_map(|r| [prove(&mut a, &b, r, T), prove(&mut b, &a, r, T)])
        .collect();
    for w in &wires {
        x.on_proof(w, T);
        y.on_proof(w, T);
    }
    let items = items(&wires);
    let mut fin = base;
    let mut settled = neuroshard_ledger::apply_epoch(&mut fin, items).settled;
    for _ in 0..SETTLE_EPOCHS {
        settled.extend(neuroshard_ledger::apply_epoch(&mut fin, Vec::new()).settled);
    }
    assert_eq!(settled.len() as u64, rounds);
    let half = rules().round_reward / 2;
    let paid = x.apply_settlements(&settled).expect("apply");
    assert_eq!(paid.rounds as u64, rounds);
    assert_eq!(x.balance(&a.node_id()), rounds * half);
    // The finalized state keeps only the latest for inspection: following it alone would
    // have missed the oldest.
    let kept = y.follow_settlements(&fin).expect("follow");
    assert_eq!(kept.rounds, neuroshard_ledger::state::SETTLEMENTS_KEPT);
    assert!(y.balance(&a.node_id()) < x.balance(&a.node_id()));
    // Applying them again pays nothing twice.
    assert_eq!(
        x.apply_settlements(&settled).expect("again"),
        Followed::default()
    );
}

/// Finality settled a proof this node never held (its live ledger held it back, or never got
/// it): the node pays the share at once, and keeps the proof's bytes when they arrive, so
/// anti-entropy stops fetching a proof its ledger already counts.
#[test]
fn a_settled_proof_the_node_lacked_is_paid_and_its_bytes_kept_when_they_come() {
    let (mut a, mut b) = (super::tests::economy(76), super::tests::economy(77));
    let mut x = super::tests::economy(78);
    registered(&mut [&mut a, &mut b, &mut x]);
    let base = x.ledger().clone();
    let pa = prove(&mut a, &b, 1, T);
    let pb = prove(&mut b, &a, 1, T);
    assert!(matches!(x.on_proof(&pa, T), ProofOutcome::Applied { .. }));
    let fin = finalized(&base, &[pa, pb.clone()]);
    let hash = SignedProof::from_bytes(&pb).expect("signed").payload_hash();
    assert_eq!(x.follow_settlements(&fin).expect("follow").rounds, 1);
    assert_eq!(x.balance(&b.node_id()), rules().round_reward / 2);
    assert!(!x.proof_hashes().expect("hashes").contains(&hash));
    assert_eq!(x.on_proof(&pb, T), ProofOutcome::Duplicate);
    assert!(
        x.proof_hashes().expect("hashes").contains(&hash),
        "its bytes are kept"
    );
}
