//! Double signing in consensus, slashed through the ledger like other fraud: two conflicting
//! messages one validator signed for one (epoch, round, step) become a slash item of an
//! epoch. Every node checks them against the validator's key in the finalized state, so the
//! evidence convicts nobody but its signer.

use neuroshard_finality::{Committee, ConsensusWire, Validator, verify_equivocation};
use neuroshard_ledger::VerifiedSlash;
use neuroshard_proof::{Canonical, Hash32, NodeId, PublicKey};

/// Slash nonces of consensus equivocation: `EQUIVOCATION_NONCE + epoch`, apart from the
/// nonces proofs use (one slash per validator and epoch).
pub const EQUIVOCATION_NONCE: u64 = 1 << 63;

/// The slash two conflicting consensus messages (`ConsensusWire` bytes) prove, paid to
/// `reporter`.
pub fn equivocation_slash(
    reporter: NodeId,
    first: &[u8],
    second: &[u8],
    key_of: &dyn Fn(&NodeId) -> Option<PublicKey>,
) -> Result<VerifiedSlash, String> {
    let a = ConsensusWire::from_canonical_bytes(first).map_err(|e| e.to_string())?;
    let b = ConsensusWire::from_canonical_bytes(second).map_err(|e| e.to_string())?;
    let who = a.signer().ok_or("evidence is two votes or two proposals")?;
    let key = key_of(&who).ok_or_else(|| format!("no key of validator {who} is known"))?;
    let committee = Committee::new(vec![Validator::new(key, 1)]);
    let offender = verify_equivocation(&a, &b, &committee).map_err(|e| e.to_string())?;
    if offender == reporter {
        return Err("a validator cannot report itself".into());
    }
    Ok(VerifiedSlash {
        offender,
        nonce: EQUIVOCATION_NONCE.saturating_add(a.epoch()),
        reporter,
        evidence_hash: evidence_hash(&a.to_canonical_bytes(), &b.to_canonical_bytes()),
        // Evidence carries no time anyone signed for it: the entries show none.
        timestamp_ms: 0,
    })
}

/// Order-independent: the same two messages either way round are one piece of evidence.
fn evidence_hash(a: &[u8], b: &[u8]) -> Hash32 {
    let (ha, hb) = (blake3::hash(a), blake3::hash(b));
    let (lo, hi) = if ha.as_bytes() <= hb.as_bytes() {
        (ha, hb)
    } else {
        (hb, ha)
    };
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/consensus-equivocation/v1");
    h.update(lo.as_bytes());
    h.update(hi.as_bytes());
    *h.finalize().as_bytes()
}
