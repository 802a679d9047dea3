//! Helpers shared by the ledger's integration tests.

use neuroshard_ledger::{AccountOp, Action, VerifiedOp, verify_op};
use neuroshard_proof::{Identity, Proof, ProofVerifier, VerifiedProof};

pub const T0: u64 = 1_800_000_000_000;

/// Signs and verifies `proof` with a fresh verifier at the proof's own timestamp.
pub fn verified(proof: &Proof, prover: &Identity, neighbour: &Identity) -> VerifiedProof {
    let mut v = ProofVerifier::new();
    v.add_known_node(neighbour.public_key());
    match v.verify(&proof.sign(prover), proof.timestamp_ms) {
        Ok(p) => p,
        Err(e) => panic!("fixture proof must verify: {e}"),
    }
}

pub fn op(id: &Identity, nonce: u64, timestamp_ms: u64, action: Action) -> VerifiedOp {
    let signed = AccountOp {
        network: [0; 32],
        account: id.node_id(),
        nonce,
        timestamp_ms,
        action,
    }
    .sign(id);
    match verify_op(&signed) {
        Ok(o) => o,
        Err(e) => panic!("fixture op must verify: {e}"),
    }
}
