use proptest::prelude::*;

use super::*;
use crate::fixtures::{test_identity, training_proof};

fn arb_hash() -> impl Strategy<Value = Hash32> {
    any::<[u8; 32]>()
}

fn arb_receipt() -> impl Strategy<Value = Receipt> {
    (any::<bool>(), any::<u64>(), arb_hash(), any::<[u8; 32]>()).prop_map(
        |(grad, seed, hash, sig_half)| {
            let mut sig = [0u8; 64];
            sig[..32].copy_from_slice(&sig_half);
            sig[32..].copy_from_slice(&hash);
            Receipt {
                kind: if grad {
                    ReceiptKind::Gradients
                } else {
                    ReceiptKind::Activations
                },
                signer: test_identity(seed % 8).public_key(),
                hash,
                signature: Signature(sig),
            }
        },
    )
}

prop_compose! {
    fn arb_proof()(
        seed in 0u64..8,
        kind in 0usize..4,
        ints in any::<[u64; 7]>(),
        layers in any::<(u32, u32)>(),
        roles in 0u8..4,
        hw in 0u8..3,
        shards in prop::collection::vec((any::<u64>(), arb_hash()), 0..5),
        hashes in any::<[[u8; 32]; 5]>(),
        receipts in prop::collection::vec(arb_receipt(), 0..4),
    ) -> Proof {
        let id = test_identity(seed);
        Proof {
            network: hashes[0],
            node_id: id.node_id(),
            public_key: id.public_key(),
            kind: ProofKind::ALL[kind],
            round: ints[0],
            timestamp_ms: ints[1],
            nonce: ints[2],
            layers: LayerRange { start: layers.0, end: layers.1 },
            roles: Roles(roles),
            hardware: HardwareClass::from_u8(hw).unwrap_or(HardwareClass::Cpu),
            tokens: ints[3],
            batches: ints[4],
            shards: shards
                .into_iter()
                .map(|(shard_id, batch_token_hash)| ShardWork { shard_id, batch_token_hash })
                .collect(),
            input_activation_hash: hashes[0],
            output_activation_hash: hashes[1],
            model_hash_before: hashes[2],
            model_hash_after: hashes[3],
            pseudo_gradient_hash: hashes[4],
            loss_micros: ints[5],
            claimed_duration_ms: ints[6],
            receipts,
        }
    }
}

proptest! {
    #[test]
    fn canonical_roundtrip(proof in arb_proof()) {
        let bytes = proof.to_canonical_bytes();
        prop_assert_eq!(Proof::from_canonical_bytes(&bytes), Ok(proof.clone()));
        // Deterministic: encoding the decoded value gives the same bytes.
        prop_assert_eq!(proof.to_canonical_bytes(), bytes);
    }

    #[test]
    fn any_truncation_fails_to_decode(proof in arb_proof(), cut in any::<prop::sample::Index>()) {
        let bytes = proof.to_canonical_bytes();
        let cut = cut.index(bytes.len());
        prop_assert!(Proof::from_canonical_bytes(&bytes[..cut]).is_err());
    }

    #[test]
    fn any_flipped_byte_breaks_the_signature(
        proof in arb_proof(),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let id = test_identity(proof.public_key.to_bytes()[1] as u64);
        let signed = proof.sign(&id);
        let mut payload = signed.payload_bytes().to_vec();
        let i = at.index(payload.len());
        payload[i] ^= mask;
        let forged = SignedProof::from_parts(payload, signed.signer(), signed.signature());
        prop_assert!(forged.verify().is_err());
    }
}

#[test]
fn every_field_is_covered_by_the_signature() {
    let prover = test_identity(1);
    let neighbour = test_identity(2);
    let proof = training_proof(&prover, &neighbour, 5, 1_000_000);
    let signed = proof.sign(&prover);
    assert_eq!(signed.verify(), Ok(proof.clone()));
    // Flip one bit in every byte of the signed encoding, one at a time.
    for i in 0..signed.payload_bytes().len() {
        let mut payload = signed.payload_bytes().to_vec();
        payload[i] ^= 0x80;
        let forged = SignedProof::from_parts(payload, signed.signer(), signed.signature());
        assert!(forged.verify().is_err(), "byte {i} is not covered");
    }
}

#[test]
fn other_versions_are_refused() {
    let prover = test_identity(1);
    let proof = training_proof(&prover, &test_identity(2), 1, 0);
    let mut bytes = proof.to_canonical_bytes();
    let at = 4 + <Proof as Canonical>::DOMAIN.len();
    bytes[at] = 1;
    assert_eq!(
        Proof::from_canonical_bytes(&bytes),
        Err(CodecError::Version {
            got: 1,
            supported: PROOF_VERSION
        })
    );
}

#[test]
fn unknown_enum_values_and_role_bits_are_refused() {
    assert!(ProofKind::from_u8(4).is_err());
    assert!(HardwareClass::from_u8(3).is_err());
    assert!(ReceiptKind::from_u8(2).is_err());
    assert!(Roles::from_bits(4).is_err());
    assert_eq!(
        Roles::from_bits(3),
        Ok(Roles::EMBEDDING.with(Roles::LM_HEAD))
    );
}

#[test]
fn a_receipt_is_bound_to_network_prover_and_round() {
    let prover = test_identity(1);
    let neighbour = test_identity(2);
    let r = Receipt::sign(
        &neighbour,
        [3; 32],
        prover.node_id(),
        7,
        ReceiptKind::Activations,
        [1; 32],
    );
    let ok = neighbour
        .public_key()
        .verify(&r.signed_bytes([3; 32], prover.node_id(), 7), &r.signature);
    assert_eq!(ok, Ok(()));
    let other_round = neighbour
        .public_key()
        .verify(&r.signed_bytes([3; 32], prover.node_id(), 8), &r.signature);
    assert!(other_round.is_err());
    let other_network = neighbour
        .public_key()
        .verify(&r.signed_bytes([4; 32], prover.node_id(), 7), &r.signature);
    assert!(other_network.is_err());
}
