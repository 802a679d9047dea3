//! Receipts anyone can sign (a pseudo-gradient's hash is public) cannot crowd out the ones
//! that back a proof; a round is proved once.

use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Receipt, ReceiptKind};

use super::tests::{NET, T, decode, economy, grad, prove, registered, work};
use super::*;
use crate::economy::ProofOutcome;

/// A receipt for `prover`'s pseudo-gradient `hash` of `round`, by a fresh unregistered key.
fn stranger(seed: u64, prover: NodeId, round: u64, hash: Hash32) -> Receipt {
    Receipt::sign(
        &test_identity(1_000 + seed),
        NET,
        prover,
        round,
        ReceiptKind::Gradients,
        hash,
    )
}

#[test]
fn receipts_of_unregistered_keys_make_room_for_a_registered_one() {
    let (mut a, mut b) = (economy(64), economy(65));
    registered(&mut [&mut a, &mut b]);
    a.record_round(work(&a, 1));
    let hash = grad(&a, 1);
    for i in 0..RECEIPTS_PER_ROUND as u64 {
        assert!(matches!(
            a.on_receipt(1, stranger(i, a.node_id(), 1, hash)),
            Ok(true)
        ));
    }
    // The round is full of strangers' receipts; the co-replica's still gets in and backs a
    // proof.
    let real = b.receipt_for(a.node_id(), 1, hash);
    assert!(matches!(a.on_receipt(1, real), Ok(true)));
    assert!(matches!(a.poll_proof(T), Some(Ok(_))), "no proof");
}

#[test]
fn receipts_for_rounds_far_ahead_do_not_shut_the_early_buffer() {
    let (mut a, mut b) = (economy(66), economy(67));
    registered(&mut [&mut a, &mut b]);
    for i in 0..MAX_EARLY_RECEIPTS as u64 {
        let far = 1 << 40;
        assert!(matches!(
            a.on_receipt(far, stranger(i, a.node_id(), far, [3; 32])),
            Ok(true)
        ));
    }
    // The next round's receipt arrives before we recorded the round: it is kept, and backs
    // the proof once the round is recorded.
    let early = b.receipt_for(a.node_id(), 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, early), Ok(true)));
    a.record_round(work(&a, 1));
    assert!(matches!(a.poll_proof(T), Some(Ok(_))), "no proof");
}

/// An honest node never equivocates: a round its ledger already holds a proof of (its own,
/// from before a restart that lost what it had in memory) is not proved again, so it is
/// never slashed for doing the same work twice.
#[test]
fn a_round_already_proved_is_never_proved_again() {
    // `restarted` is `a` after a restart (same key, same ledger contents).
    let (mut a, mut b, mut restarted) = (economy(62), economy(63), economy(62));
    registered(&mut [&mut a, &mut b, &mut restarted]);
    let first = prove(&mut a, &b, 1, T);
    assert!(matches!(
        b.on_proof(&first, T),
        ProofOutcome::Applied { .. }
    ));
    // `a` restarts: its ledger (on disk) holds its proof, what it had in memory is gone, and
    // the same round's work and receipt come back.
    assert!(matches!(
        restarted.on_proof(&first, T),
        ProofOutcome::Applied { .. }
    ));
    restarted.record_round(work(&restarted, 1));
    let receipt = b.receipt_for(restarted.node_id(), 1, grad(&restarted, 1));
    assert!(matches!(restarted.on_receipt(1, receipt), Ok(true)));
    assert!(
        restarted.poll_proof(T + 1_000).is_none(),
        "round 1 proved twice"
    );
    assert_eq!(super::tests::claimed(&restarted, &a.node_id()), 1);
}

/// Receipt reuse: a co-replica's genuine receipt of `a`'s round 1, put into a claim of
/// another round, into `a`'s claim with another pseudo-gradient, or into another key's claim,
/// backs none of them: a receipt signs (network, prover, round, hash), and the ledger refuses
/// the claim instead of counting it.
#[test]
fn a_receipt_backs_only_the_prover_round_and_gradient_it_was_signed_for() {
    let (mut a, mut b, mut c) = (economy(76), economy(77), economy(78));
    registered(&mut [&mut a, &mut b, &mut c]);
    let genuine = decode(&prove(&mut a, &b, 1, T));
    let receipt = genuine.receipts[0];
    let resign = |p: &neuroshard_proof::Proof, seed: u64| p.sign(&test_identity(seed)).to_bytes();

    let mut other_round = genuine.clone();
    other_round.round = 2;
    other_round.nonce += 1;
    other_round.receipts = vec![receipt];
    let mut other_gradient = genuine.clone();
    other_gradient.round = 3;
    other_gradient.nonce += 2;
    other_gradient.pseudo_gradient_hash = [9; 32];
    other_gradient.receipts = vec![receipt];
    let mut other_prover = genuine.clone();
    other_prover.node_id = c.node_id();
    other_prover.public_key = c.public_key();
    other_prover.receipts = vec![receipt];
    for (what, wire) in [
        ("another round", resign(&other_round, 76)),
        ("another gradient", resign(&other_gradient, 76)),
        ("another prover", resign(&other_prover, 78)),
    ] {
        assert!(
            matches!(b.on_proof(&wire, T), ProofOutcome::Rejected(_)),
            "a reused receipt backed {what}"
        );
    }
    for who in [a.node_id(), c.node_id()] {
        assert_eq!(super::tests::claimed(&b, &who), 0);
    }
}
