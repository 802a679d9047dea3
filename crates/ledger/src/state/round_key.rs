//! Training proofs are paid once per (node, stage, round): the key that names it.

use neuroshard_proof::{Hash32, LayerRange, NodeId, Proof};

/// The (node, stage, round) a training proof is paid for, hashed. The stage is named by the
/// layers it holds, which are fixed per stage in a network.
pub fn round_key(proof: &Proof) -> Hash32 {
    round_key_of(&proof.node_id, proof.layers, proof.round)
}

/// The round key of `node`'s training proof of `round` for `layers`.
pub fn round_key_of(node: &NodeId, layers: LayerRange, round: u64) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/round-key/v1");
    h.update(&node.0);
    h.update(&layers.start.to_le_bytes());
    h.update(&layers.end.to_le_bytes());
    h.update(&round.to_le_bytes());
    *h.finalize().as_bytes()
}
