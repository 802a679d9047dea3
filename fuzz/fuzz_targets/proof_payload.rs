//! A proof payload signed by the prover, so the input reaches the proof decoder, the
//! plausibility checks and the receipts instead of stopping at the signature.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::{ALICE, T0, signed_by, verifier};
use neuroshard_proof::proof::ReceiptBody;
use neuroshard_proof::{Canonical, Proof, SignedProof};

fuzz_target!(|data: &[u8]| {
    if let Ok(proof) = Proof::from_canonical_bytes(data) {
        // One byte form per value.
        assert_eq!(proof.to_canonical_bytes(), data);
    }
    if let Ok(body) = ReceiptBody::from_canonical_bytes(data) {
        assert_eq!(body.to_canonical_bytes(), data);
    }
    let signed: SignedProof = signed_by(&ALICE, data);
    let mut v = verifier();
    let content = v.check_content(&signed, T0).is_ok();
    let full = v.verify(&signed, T0).is_ok();
    // The full pipeline is never looser than the content check.
    assert!(content || !full);
});
