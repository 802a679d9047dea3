//! Epochs of the ledger (ledger finality, issue 19): the items an epoch holds, applied in one
//! canonical order onto the last finalized state, so that every node that holds the same
//! items reaches the same state, and the hash of the epoch's contents, which the finality
//! committee signs beside that state.
//!
//! Live ledgers apply items as they arrive, and where two items conflict (a second proof
//! for a round, an op at a nonce taken) arrival order decides. Within an epoch the order is
//! fixed instead: by kind (ops, then proofs, then slashes, then verdicts: stake changes
//! first, so every proof of the epoch is paid on the same stakes), then by id. An item the
//! rules refuse is left out of the state, the same way on every node, and listed.

use neuroshard_proof::{Hash32, VerifiedProof};

use crate::ops::{VerifiedOp, VerifiedSlash};
use crate::state::{LedgerError, LedgerState, Outcome};
use crate::verdict::VerifiedVerdict;

/// One item an epoch can hold.
#[derive(Debug, Clone)]
pub enum EpochItem {
    Op(VerifiedOp),
    Proof(VerifiedProof),
    Slash(VerifiedSlash),
    Verdict(VerifiedVerdict),
}

impl EpochItem {
    /// Its rank in the canonical order, then its id.
    fn key(&self) -> (u8, Hash32) {
        match self {
            Self::Op(o) => (0, o.hash()),
            Self::Proof(p) => (1, p.hash()),
            Self::Slash(s) => (2, s.evidence_hash),
            Self::Verdict(v) => (3, v.job),
        }
    }

    /// The id the epoch's contents name it by (its kind's hash).
    pub fn id(&self) -> Hash32 {
        self.key().1
    }

    /// The signed time that places it in an epoch's window.
    pub fn timestamp_ms(&self) -> u64 {
        match self {
            Self::Op(o) => o.op().timestamp_ms,
            Self::Proof(p) => p.proof().timestamp_ms,
            Self::Slash(s) => s.timestamp_ms,
            Self::Verdict(v) => v.timestamp_ms,
        }
    }
}

/// What applying an epoch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochApplied {
    /// BLAKE3 over the items' (kind, id) in canonical order: what the epoch's value names.
    pub contents: Hash32,
    /// The state hash after the epoch.
    pub state: Hash32,
    /// Items applied (or duplicates of what an earlier epoch applied), by id.
    pub applied: usize,
    /// Items the rules refused, with the reason: left out, identically on every node.
    pub refused: Vec<(Hash32, LedgerError)>,
}

/// Applies `items` (any order; a repeated item counts once) onto `state` in the canonical
/// order. `state` is the last finalized state, or a copy of it when computing a proposal.
pub fn apply_epoch(state: &mut LedgerState, mut items: Vec<EpochItem>) -> EpochApplied {
    items.sort_by_key(EpochItem::key);
    items.dedup_by_key(|i| i.key());
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger/epoch-contents/v1");
    h.update(&(items.len() as u64).to_le_bytes());
    let mut applied = 0;
    let mut refused = Vec::new();
    for item in items {
        let (kind, id) = item.key();
        h.update(&[kind]);
        h.update(&id);
        let result = match item {
            EpochItem::Op(o) => state.apply_op(o),
            EpochItem::Proof(p) => state.apply_proof(&p),
            EpochItem::Slash(s) => state.apply_slash(&s),
            EpochItem::Verdict(v) => state.apply_verdict(&v),
        };
        match result {
            Ok(Outcome::Applied(_) | Outcome::Duplicate) => applied += 1,
            // An op ahead of its predecessor waits in the pending queue, which is part of the
            // state every node reaches alike: counted as applied when it does.
            Ok(Outcome::Queued) => {}
            Err(e) => refused.push((id, e)),
        }
    }
    EpochApplied {
        contents: *h.finalize().as_bytes(),
        state: state.state_hash(),
        applied,
        refused,
    }
}

#[cfg(test)]
mod tests;
