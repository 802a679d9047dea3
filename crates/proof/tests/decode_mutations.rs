//! Valid encodings, mutated, through every byte decoder of this crate: decoding and
//! verification return Ok or Err, never panic and never allocate out of proportion to the
//! input. Two paths: mutated wire bytes (the signature then almost always fails, which tests
//! the envelope framing), and mutated payloads signed again by the prover, which carries the
//! mutants past the signature into the proof decoder, the plausibility checks and receipts.

use neuroshard_mutate::{Mutation, TrackingAlloc, apply, largest_allocation, mutations};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::proof::ReceiptBody;
use neuroshard_proof::{
    Canonical, Identity, Proof, ProofVerifier, PublicKey, ReceiptKind, Signature, Signed,
    SignedProof,
};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

const T0: u64 = 1_800_000_000_000;

/// The largest buffers any decoder here may allocate beyond a copy of its input: 256 shard
/// entries and 16 receipts, with room for error messages and hash sets.
const FIXED_BUDGET: usize = 64 * 1024;

struct Setup {
    prover: Identity,
    neighbour: Identity,
}

fn setup() -> Setup {
    Setup {
        prover: test_identity(1),
        neighbour: test_identity(2),
    }
}

fn sample(s: &Setup, training: bool) -> Proof {
    if training {
        training_proof(&s.prover, &s.neighbour, 7, T0)
    } else {
        uptime_proof(&s.prover, 7, T0)
    }
}

fn verifier(s: &Setup) -> ProofVerifier {
    let mut v = ProofVerifier::new();
    v.add_known_node(s.neighbour.public_key());
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Mutated wire bytes: an accepted mutant can only be the original proof (the signature
    /// covers the payload and the signer).
    #[test]
    fn mutated_wire_proofs(training in any::<bool>(), m in mutations()) {
        let s = setup();
        let proof = sample(&s, training);
        let wire = proof.sign(&s.prover).to_bytes();
        let bad = apply(&wire, &m);
        let mut v = verifier(&s);
        let (result, largest) = largest_allocation(|| v.verify_bytes(&bad, T0));
        prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(accepted) = result {
            prop_assert_eq!(accepted.proof(), &proof);
        }
    }

    /// Mutated payloads, signed again: whatever decodes re-encodes to the same bytes
    /// (canonical form), and the verifier's checks never panic on the decoded values.
    #[test]
    fn mutated_payloads_signed_again(training in any::<bool>(), m in mutations()) {
        let s = setup();
        let payload = apply(&sample(&s, training).to_canonical_bytes(), &m);
        let signed = SignedProof::from_parts(
            payload.clone(),
            s.prover.public_key(),
            s.prover.sign(&payload),
        );
        let (decoded, largest) = largest_allocation(|| Proof::from_canonical_bytes(&payload));
        prop_assert!(largest <= payload.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(p) = &decoded {
            prop_assert_eq!(p.to_canonical_bytes(), payload.clone());
        }
        let mut v = verifier(&s);
        let (checked, largest) = largest_allocation(|| {
            let content = v.check_content(&signed, T0).map(|p| p.hash());
            let full = v.verify(&signed, T0).map(|p| p.hash());
            (content, full)
        });
        prop_assert!(largest <= 2 * payload.len() + FIXED_BUDGET, "{largest} bytes");
        // The full pipeline is stricter than the content check, never looser.
        if checked.1.is_ok() {
            prop_assert!(checked.0.is_ok());
        }
        // Round trip through the wire form.
        let wire = signed.to_bytes();
        prop_assert_eq!(SignedProof::from_bytes(&wire).map(|e| e.to_bytes()), Ok(wire));
    }

    /// Receipt bodies: decode, and what decodes is canonical.
    #[test]
    fn mutated_receipt_bodies(m in mutations()) {
        let s = setup();
        let body = ReceiptBody {
            network: [5; 32],
            prover: s.prover.node_id(),
            round: 3,
            kind: ReceiptKind::Gradients,
            hash: [9; 32],
        };
        let bad = apply(&body.to_canonical_bytes(), &m);
        if let Ok(b) = ReceiptBody::from_canonical_bytes(&bad) {
            prop_assert_eq!(b.to_canonical_bytes(), bad);
        }
    }

    /// Keys and signatures from mutated bytes: parsing and verification return errors.
    #[test]
    fn mutated_keys_and_signatures(m in mutations(), on_key in any::<bool>()) {
        let s = setup();
        let msg = b"neuroshard mutation test";
        let key = s.prover.public_key().to_bytes();
        let sig = s.prover.sign(msg).to_bytes();
        let (key, sig) = if on_key {
            (apply(&key, &m), sig.to_vec())
        } else {
            (key.to_vec(), apply(&sig, &m))
        };
        let verdict = PublicKey::from_bytes(&key)
            .and_then(|k| Signature::from_bytes(&sig).map(|sig| (k, sig)))
            .and_then(|(k, sig)| k.verify(msg, &sig));
        if verdict.is_ok() {
            prop_assert_eq!(key, s.prover.public_key().to_bytes().to_vec());
            prop_assert_eq!(sig, s.prover.sign(msg).to_bytes().to_vec());
        }
    }
}

/// Envelope framing of another payload type, with length fields at their edges.
#[test]
fn envelope_length_fields_at_the_edges() {
    let s = setup();
    let wire = Signed::sign(&s.prover, &uptime_proof(&s.prover, 1, T0)).to_bytes();
    for value in [0, 1, 0x7fff_ffff, 0xffff_ffff, (1 << 20) + 1] {
        let bad = apply(
            &wire,
            &[Mutation::SetInt {
                at: 0,
                width: 4,
                value,
            }],
        );
        let (result, largest) = largest_allocation(|| SignedProof::from_bytes(&bad));
        assert!(result.is_err(), "length {value} accepted");
        assert!(
            largest <= 2 * wire.len(),
            "{largest} bytes for length {value}"
        );
    }
}
