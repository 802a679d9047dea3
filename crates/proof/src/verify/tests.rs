use super::*;
use crate::fixtures::{test_identity, training_proof, uptime_proof};
use crate::identity::Identity;
use crate::keys::Signature;
use crate::plausibility::{CPU_LIMITS, HISTORY_MIN_SAMPLES};
use crate::proof::{Receipt, ReceiptKind};

const NOW: u64 = 1_800_000_000_000;

struct Setup {
    prover: Identity,
    neighbour: Identity,
    verifier: ProofVerifier,
}

fn setup() -> Setup {
    let prover = test_identity(10);
    let neighbour = test_identity(11);
    let mut verifier = ProofVerifier::new();
    verifier.add_known_node(neighbour.public_key());
    Setup {
        prover,
        neighbour,
        verifier,
    }
}

/// Re-signs a modified proof so only the targeted check can fail.
fn resign(s: &Setup, proof: &Proof) -> SignedProof {
    proof.sign(&s.prover)
}

#[test]
fn valid_training_proof_is_accepted_and_bound_to_its_hash() {
    let mut s = setup();
    let signed = training_proof(&s.prover, &s.neighbour, 1, NOW).sign(&s.prover);
    let ok = s.verifier.verify_bytes(&signed.to_bytes(), NOW);
    assert!(matches!(ok, Ok(ref v) if v.hash() == signed.payload_hash()));
}

#[test]
fn garbage_is_a_format_error() {
    let mut s = setup();
    assert!(matches!(
        s.verifier.verify_bytes(b"not a proof", NOW),
        Err(VerifyError::Format(_))
    ));
}

#[test]
fn wrong_version_is_rejected() {
    let mut s = setup();
    let proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    let mut payload = proof.to_canonical_bytes();
    payload[4 + <Proof as Canonical>::DOMAIN.len()] = 9;
    let sig = s.prover.sign(&payload);
    let signed = SignedProof::from_parts(payload, s.prover.public_key(), sig);
    assert_eq!(
        s.verifier.verify(&signed, NOW),
        Err(VerifyError::Version {
            got: 9,
            supported: crate::PROOF_VERSION
        })
    );
}

#[test]
fn malleated_signature_replay_is_rejected() {
    let mut s = setup();
    let signed = training_proof(&s.prover, &s.neighbour, 1, NOW).sign(&s.prover);
    assert!(s.verifier.verify(&signed, NOW).is_ok());
    let twin = SignedProof::from_parts(
        signed.payload_bytes().to_vec(),
        signed.signer(),
        signed.signature().malleate(),
    );
    assert_eq!(s.verifier.verify(&twin, NOW), Err(VerifyError::HighS));
    // Even a verifier that never saw the original refuses the twin.
    let mut fresh = setup();
    assert_eq!(fresh.verifier.verify(&twin, NOW), Err(VerifyError::HighS));
}

#[test]
fn field_flipped_after_signing_is_rejected() {
    let mut s = setup();
    let mut proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    let signed = proof.sign(&s.prover);
    proof.tokens *= 2;
    let forged = SignedProof::from_parts(
        proof.to_canonical_bytes(),
        signed.signer(),
        signed.signature(),
    );
    assert_eq!(
        s.verifier.verify(&forged, NOW),
        Err(VerifyError::Signature(SignatureError::Mismatch))
    );
}

#[test]
fn signature_by_another_key_is_rejected() {
    let mut s = setup();
    let proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    let wrong = test_identity(99).sign(&proof.to_canonical_bytes());
    let forged = SignedProof::from_parts(proof.to_canonical_bytes(), s.prover.public_key(), wrong);
    assert_eq!(
        s.verifier.verify(&forged, NOW),
        Err(VerifyError::Signature(SignatureError::Mismatch))
    );
    let zero = SignedProof::from_parts(
        proof.to_canonical_bytes(),
        s.prover.public_key(),
        Signature([0; 64]),
    );
    assert_eq!(
        s.verifier.verify(&zero, NOW),
        Err(VerifyError::Signature(SignatureError::Malformed))
    );
}

/// Garbage signatures under fresh keys cost the verifier a decompression each but cache
/// nothing, so they cannot flush the keys of nodes that sign for real; a valid signature's key
/// is cached.
#[test]
fn only_keys_of_valid_signatures_are_cached() {
    let mut s = setup();
    for seed in 200..210 {
        let liar = test_identity(seed);
        let proof = training_proof(&liar, &s.neighbour, 1, NOW);
        let wrong = test_identity(99).sign(&proof.to_canonical_bytes());
        let forged = SignedProof::from_parts(proof.to_canonical_bytes(), liar.public_key(), wrong);
        assert!(s.verifier.verify(&forged, NOW).is_err());
    }
    assert_eq!(s.verifier.cached_keys(), 0);
    let signed = training_proof(&s.prover, &s.neighbour, 1, NOW).sign(&s.prover);
    assert!(s.verifier.verify(&signed, NOW).is_ok());
    // The prover's key and its receipt signer's.
    assert_eq!(s.verifier.cached_keys(), 2);
}

#[test]
fn proof_signed_by_someone_else_than_its_key_is_rejected() {
    let mut s = setup();
    let proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    let thief = test_identity(50);
    assert_eq!(
        s.verifier.verify(&proof.sign(&thief), NOW),
        Err(VerifyError::KeyMismatch)
    );
    let mut wrong_id = proof.clone();
    wrong_id.node_id = thief.node_id();
    assert_eq!(
        s.verifier.verify(&resign(&s, &wrong_id), NOW),
        Err(VerifyError::KeyMismatch)
    );
}

#[test]
fn stale_and_future_timestamps_are_rejected() {
    let mut s = setup();
    let stale = training_proof(&s.prover, &s.neighbour, 1, NOW - MAX_CLOCK_SKEW_MS - 1);
    assert!(matches!(
        s.verifier.verify(&resign(&s, &stale), NOW),
        Err(VerifyError::Stale { .. })
    ));
    let future = training_proof(&s.prover, &s.neighbour, 2, NOW + MAX_CLOCK_SKEW_MS + 1);
    assert!(matches!(
        s.verifier.verify(&resign(&s, &future), NOW),
        Err(VerifyError::Future { .. })
    ));
    let edge = training_proof(&s.prover, &s.neighbour, 3, NOW + MAX_CLOCK_SKEW_MS);
    assert!(s.verifier.verify(&resign(&s, &edge), NOW).is_ok());
}

#[test]
fn replays_by_hash_and_by_nonce_are_rejected() {
    let mut s = setup();
    let signed = training_proof(&s.prover, &s.neighbour, 1, NOW).sign(&s.prover);
    assert!(s.verifier.verify(&signed, NOW).is_ok());
    assert_eq!(
        s.verifier.verify(&signed, NOW + 1),
        Err(VerifyError::Replay(ReplayKind::ProofHash))
    );
    let mut same_nonce = training_proof(&s.prover, &s.neighbour, 1, NOW + 5);
    same_nonce.loss_micros += 1;
    assert_eq!(
        s.verifier.verify(&resign(&s, &same_nonce), NOW + 5),
        Err(VerifyError::Replay(ReplayKind::Nonce))
    );
    // After the original expires from memory its nonce stays refused via the floor.
    let later = NOW + MAX_CLOCK_SKEW_MS + 10_000;
    let mut old_nonce = training_proof(&s.prover, &s.neighbour, 1, later);
    old_nonce.loss_micros += 2;
    assert_eq!(
        s.verifier.verify(&resign(&s, &old_nonce), later),
        Err(VerifyError::Replay(ReplayKind::NonceBelowFloor))
    );
}

#[test]
fn the_121st_proof_in_an_hour_is_rejected() {
    let mut s = setup();
    for i in 0..MAX_PROOFS_PER_WINDOW as u64 {
        let t = NOW + i * 20_000;
        let r = s
            .verifier
            .verify(&uptime_proof(&s.prover, i, t).sign(&s.prover), t);
        assert!(r.is_ok(), "proof {i}: {r:?}");
    }
    let t = NOW + 120 * 20_000;
    let extra = uptime_proof(&s.prover, 120, t).sign(&s.prover);
    assert_eq!(
        s.verifier.verify(&extra, t),
        Err(VerifyError::Rate { count: 120 })
    );
    // The window slides: an hour after the first proof there is room again.
    let t = NOW + RATE_WINDOW_MS + 1;
    let next = uptime_proof(&s.prover, 121, t).sign(&s.prover);
    assert!(s.verifier.verify(&next, t).is_ok());
}

#[test]
fn implausible_token_rate_is_rejected() {
    let mut s = setup();
    let mut proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    proof.hardware = crate::HardwareClass::Cpu;
    proof.tokens = CPU_LIMITS.max_layer_tokens_per_sec * 10 + 8; // 10 s over 4 layers: 4x over
    assert!(matches!(
        s.verifier.verify(&resign(&s, &proof), NOW),
        Err(VerifyError::Implausible(
            PlausibilityError::TokenRate { .. }
        ))
    ));
}

#[test]
fn implausible_batch_rate_duration_and_shape_are_rejected() {
    let mut s = setup();
    let mut fast = training_proof(&s.prover, &s.neighbour, 1, NOW);
    fast.hardware = crate::HardwareClass::Cpu;
    fast.batches = (CPU_LIMITS.max_batches_per_sec + 1) * 10;
    fast.tokens = fast.batches;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &fast), NOW),
        Err(VerifyError::Implausible(
            PlausibilityError::BatchRate { .. }
        ))
    ));
    let mut instant = training_proof(&s.prover, &s.neighbour, 2, NOW);
    instant.claimed_duration_ms = 0;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &instant), NOW),
        Err(VerifyError::Implausible(PlausibilityError::Duration { .. }))
    ));
    let mut no_shard = training_proof(&s.prover, &s.neighbour, 3, NOW);
    no_shard.shards.clear();
    assert!(matches!(
        s.verifier.verify(&resign(&s, &no_shard), NOW),
        Err(VerifyError::Implausible(
            PlausibilityError::Inconsistent { .. }
        ))
    ));
    let mut no_layers = training_proof(&s.prover, &s.neighbour, 4, NOW);
    no_layers.layers.end = no_layers.layers.start;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &no_layers), NOW),
        Err(VerifyError::Implausible(PlausibilityError::Layers { .. }))
    ));
}

#[test]
fn rate_far_above_own_history_is_rejected() {
    let mut s = setup();
    for i in 0..u64::from(HISTORY_MIN_SAMPLES) {
        let t = NOW + i * 1_000;
        let p = training_proof(&s.prover, &s.neighbour, i, t);
        assert!(s.verifier.verify(&p.sign(&s.prover), t).is_ok());
    }
    let t = NOW + 100_000;
    let mut burst = training_proof(&s.prover, &s.neighbour, 100, t);
    burst.tokens *= 5;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &burst), t),
        Err(VerifyError::Implausible(
            PlausibilityError::AboveHistory { .. }
        ))
    ));
}

#[test]
fn claiming_more_uptime_than_the_hour_holds_is_rejected() {
    let mut s = setup();
    let mut t = NOW;
    for i in 0..3u64 {
        let mut p = uptime_proof(&s.prover, i, t);
        p.claimed_duration_ms = 1_200_000;
        assert!(s.verifier.verify(&resign(&s, &p), t).is_ok());
        t += 1_000;
    }
    let mut p = uptime_proof(&s.prover, 3, t);
    p.claimed_duration_ms = 400_000;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &p), t),
        Err(VerifyError::Implausible(
            PlausibilityError::CumulativeDuration { .. }
        ))
    ));
}

#[test]
fn receipt_failures_each_have_their_own_error() {
    let mut s = setup();
    let stranger = test_identity(77);

    let mut missing = training_proof(&s.prover, &s.neighbour, 1, NOW);
    missing.receipts.clear();
    assert!(matches!(
        s.verifier.verify(&resign(&s, &missing), NOW),
        Err(VerifyError::Receipt(ReceiptError::Missing { .. }))
    ));

    let mut unknown = training_proof(&s.prover, &stranger, 2, NOW);
    unknown.nonce = 2;
    assert!(matches!(
        s.verifier.verify(&resign(&s, &unknown), NOW),
        Err(VerifyError::Receipt(ReceiptError::UnknownSigner { .. }))
    ));

    let wrong_hash = with_untallied_work_receipt(&s, 3);
    assert!(matches!(
        s.verifier.verify(&resign(&s, &wrong_hash), NOW),
        Err(VerifyError::Receipt(ReceiptError::HashMismatch { .. }))
    ));

    let mut bad_sig = training_proof(&s.prover, &s.neighbour, 4, NOW);
    bad_sig.round += 1; // the neighbour signed a different round
    assert!(matches!(
        s.verifier.verify(&resign(&s, &bad_sig), NOW),
        Err(VerifyError::Receipt(ReceiptError::Signature { .. }))
    ));

    let mut dup = training_proof(&s.prover, &s.neighbour, 5, NOW);
    let again = dup.receipts[0];
    dup.receipts.push(again);
    assert!(matches!(
        s.verifier.verify(&resign(&s, &dup), NOW),
        Err(VerifyError::Receipt(ReceiptError::DuplicateSigner { .. }))
    ));

    let mut own = training_proof(&s.prover, &s.neighbour, 6, NOW);
    own.receipts = vec![Receipt::sign(
        &s.prover,
        own.network,
        own.node_id,
        own.round,
        ReceiptKind::Activations,
        crate::fixtures::work_tally(8),
    )];
    assert!(matches!(
        s.verifier.verify(&resign(&s, &own), NOW),
        Err(VerifyError::Receipt(ReceiptError::SelfSigned { .. }))
    ));

    // None of the rejected proofs consumed a nonce: nonce 1 is still usable.
    let good = training_proof(&s.prover, &s.neighbour, 1, NOW);
    assert!(s.verifier.verify(&resign(&s, &good), NOW).is_ok());
}

#[test]
fn check_content_accepts_old_proofs_and_remembers_nothing() {
    let mut s = setup();
    let day_old = NOW - 24 * 60 * 60 * 1000;
    let signed = training_proof(&s.prover, &s.neighbour, 1, day_old).sign(&s.prover);
    let first = s.verifier.check_content(&signed, NOW);
    assert!(matches!(first, Ok(ref v) if v.hash() == signed.payload_hash()));
    // No replay or rate memory: the same proof passes again (the ledger dedups it).
    assert_eq!(s.verifier.check_content(&signed, NOW), first);
    // The arrival-dependent pipeline refuses the same bytes as stale.
    assert!(matches!(
        s.verifier.verify(&signed, NOW),
        Err(VerifyError::Stale { .. })
    ));
}

#[test]
fn check_content_refuses_future_timestamps_beyond_the_skew() {
    let mut s = setup();
    let edge = training_proof(&s.prover, &s.neighbour, 1, NOW + MAX_CLOCK_SKEW_MS);
    assert!(s.verifier.check_content(&resign(&s, &edge), NOW).is_ok());
    let future = training_proof(&s.prover, &s.neighbour, 2, NOW + MAX_CLOCK_SKEW_MS + 1);
    assert_eq!(
        s.verifier.check_content(&resign(&s, &future), NOW),
        Err(VerifyError::Future {
            timestamp_ms: NOW + MAX_CLOCK_SKEW_MS + 1,
            ahead_ms: MAX_CLOCK_SKEW_MS + 1
        })
    );
}

#[test]
fn check_content_refuses_bad_receipts() {
    let mut s = setup();
    let stranger = test_identity(78);
    // Whether a signer may vouch is ledger state, checked by the caller; the full path
    // still refuses signers it does not know.
    let unknown = training_proof(&s.prover, &stranger, 1, NOW);
    assert!(s.verifier.check_content(&resign(&s, &unknown), NOW).is_ok());
    assert!(matches!(
        s.verifier.check(&resign(&s, &unknown), NOW),
        Err(VerifyError::Receipt(ReceiptError::UnknownSigner { signer, .. }))
            if signer == stranger.public_key()
    ));

    let wrong_hash = with_untallied_work_receipt(&s, 2);
    assert!(matches!(
        s.verifier.check_content(&resign(&s, &wrong_hash), NOW),
        Err(VerifyError::Receipt(ReceiptError::HashMismatch { .. }))
    ));
    let mut missing = training_proof(&s.prover, &s.neighbour, 3, NOW);
    missing.receipts.clear();
    assert!(matches!(
        s.verifier.check_content(&resign(&s, &missing), NOW),
        Err(VerifyError::Receipt(ReceiptError::Missing { .. }))
    ));
    let mut other_round = training_proof(&s.prover, &s.neighbour, 4, NOW);
    other_round.round += 1;
    assert!(matches!(
        s.verifier.check_content(&resign(&s, &other_round), NOW),
        Err(VerifyError::Receipt(ReceiptError::Signature { .. }))
    ));
}

#[test]
fn check_content_refuses_forged_signatures_and_implausible_work() {
    let mut s = setup();
    let mut proof = training_proof(&s.prover, &s.neighbour, 1, NOW);
    let signed = proof.sign(&s.prover);
    proof.batches *= 2;
    let forged = SignedProof::from_parts(
        proof.to_canonical_bytes(),
        signed.signer(),
        signed.signature(),
    );
    assert_eq!(
        s.verifier.check_content(&forged, NOW),
        Err(VerifyError::Signature(SignatureError::Mismatch))
    );
    let twin = SignedProof::from_parts(
        signed.payload_bytes().to_vec(),
        signed.signer(),
        signed.signature().malleate(),
    );
    assert_eq!(
        s.verifier.check_content(&twin, NOW),
        Err(VerifyError::HighS)
    );
    let thief = test_identity(51);
    assert_eq!(
        s.verifier.check_content(
            &training_proof(&s.prover, &s.neighbour, 2, NOW).sign(&thief),
            NOW
        ),
        Err(VerifyError::KeyMismatch)
    );
    let mut instant = training_proof(&s.prover, &s.neighbour, 3, NOW);
    instant.claimed_duration_ms = 0;
    assert!(matches!(
        s.verifier.check_content(&resign(&s, &instant), NOW),
        Err(VerifyError::Implausible(PlausibilityError::Duration { .. }))
    ));
}

/// A training proof (nonce `nonce`) whose work receipt's hash is not a tally of jobs.
fn with_untallied_work_receipt(s: &Setup, nonce: u64) -> crate::proof::Proof {
    let mut p = training_proof(&s.prover, &s.neighbour, nonce, NOW);
    p.receipts = vec![Receipt::sign(
        &s.neighbour,
        p.network,
        p.node_id,
        p.round,
        ReceiptKind::Activations,
        [0xee; 32],
    )];
    p
}
