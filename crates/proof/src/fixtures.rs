//! Builders for realistic proofs, shared by tests, benchmarks and tooling (e.g. the CLI's
//! test-vector output). Nothing here is used on the verification path.

use rand::SeedableRng;

use crate::identity::Identity;
use crate::proof::{
    HardwareClass, LayerRange, Proof, ProofKind, Receipt, ReceiptKind, Roles, ShardWork,
};

/// A deterministic identity for tests and benchmarks (never for real nodes).
pub fn test_identity(seed: u64) -> Identity {
    Identity::generate_with(&mut rand_chacha::ChaCha20Rng::seed_from_u64(seed))
}

/// The network id the fixtures' proofs name.
pub const TEST_NETWORK: [u8; 32] = [0; 32];

fn h(tag: &str, nonce: u64) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(tag.as_bytes());
    hasher.update(&nonce.to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// A plausible training proof by `prover` for round `nonce`: 8 batches of 2048 tokens over layers 4..8 in 10 s
/// on a consumer GPU, with an activation receipt signed by `neighbour`.
pub fn training_proof(
    prover: &Identity,
    neighbour: &Identity,
    nonce: u64,
    timestamp_ms: u64,
) -> Proof {
    let mut proof = Proof {
        network: TEST_NETWORK,
        node_id: prover.node_id(),
        public_key: prover.public_key(),
        kind: ProofKind::Training,
        round: nonce,
        timestamp_ms,
        nonce,
        layers: LayerRange { start: 4, end: 8 },
        roles: Roles::NONE,
        hardware: HardwareClass::ConsumerGpu,
        tokens: 8 * 2048,
        batches: 8,
        shards: vec![ShardWork {
            shard_id: nonce % 97,
            batch_token_hash: h("batch", nonce),
        }],
        input_activation_hash: h("in", nonce),
        output_activation_hash: h("out", nonce),
        model_hash_before: h("before", nonce / 10),
        model_hash_after: h("after", nonce / 10),
        pseudo_gradient_hash: h("grad", nonce),
        loss_micros: 3_250_000,
        claimed_duration_ms: 10_000,
        receipts: Vec::new(),
    };
    proof.receipts.push(Receipt::sign(
        neighbour,
        proof.network,
        proof.node_id,
        proof.round,
        ReceiptKind::Activations,
        work_tally(8),
    ));
    proof
}

/// A plausible uptime proof (no receipts; cheapest to verify).
pub fn uptime_proof(prover: &Identity, nonce: u64, timestamp_ms: u64) -> Proof {
    Proof {
        network: TEST_NETWORK,
        node_id: prover.node_id(),
        public_key: prover.public_key(),
        kind: ProofKind::Uptime,
        round: nonce / 10,
        timestamp_ms,
        nonce,
        layers: LayerRange { start: 0, end: 0 },
        roles: Roles::NONE,
        hardware: HardwareClass::Cpu,
        tokens: 0,
        batches: 0,
        shards: Vec::new(),
        input_activation_hash: [0; 32],
        output_activation_hash: [0; 32],
        model_hash_before: h("before", nonce / 10),
        model_hash_after: h("after", nonce / 10),
        pseudo_gradient_hash: [0; 32],
        loss_micros: 0,
        claimed_duration_ms: 25_000,
        receipts: Vec::new(),
    }
}

/// A tally of the made-up jobs `range` (job i's key is BLAKE3 of i): ranges that overlap
/// share jobs, as one output sent to several receivers does.
pub fn tally_of(range: std::ops::Range<u64>) -> crate::WorkTally {
    let keys: Vec<crate::Hash32> = range
        .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
        .collect();
    crate::WorkTally::of_keys(&keys)
}

/// The receipt hash of a tally of `jobs` made-up jobs ([`tally_of`] from 0).
pub fn work_tally(jobs: u32) -> crate::Hash32 {
    tally_of(0..u64::from(jobs)).to_hash()
}
