//! Holding account ops that arrived before their predecessor.
//!
//! Gossip does not preserve order, so nonce `n + 1` can arrive before `n`. Such an op is
//! verified (signature, signer) and parked here, keyed by `(account, nonce)`. When the op at
//! the account's `next_nonce` is applied, the ledger drains consecutive nonces from here.
//!
//! Bounds keep a flood from exhausting memory: at most [`MAX_NONCE_GAP`] ahead of the
//! account's next nonce, [`MAX_PENDING_PER_ACCOUNT`] per account and [`MAX_PENDING_TOTAL`]
//! overall; beyond them the op is refused and the sender must resend later. When the whole
//! queue is full, the account holding the most parked ops gives up its furthest one to an
//! account holding fewer: fresh keys that each park their share cannot shut honest accounts
//! (which wait for one or two ops) out for good. For one
//! `(account, nonce)` the first op to arrive is kept; a second, different op at the same slot
//! is the signer equivocating and is refused. The queue lives in memory only: nothing in it
//! was acknowledged as applied, and peers re-gossip it after a restart.

use std::collections::{BTreeMap, HashMap};

use neuroshard_proof::NodeId;

use crate::ops::VerifiedOp;

/// Furthest a parked op may be ahead of the account's next nonce.
pub const MAX_NONCE_GAP: u64 = 64;
/// Most parked ops per account.
pub const MAX_PENDING_PER_ACCOUNT: usize = 32;
/// Most parked ops overall.
pub const MAX_PENDING_TOTAL: usize = 100_000;

/// Why an op could not be parked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PendingError {
    #[error("nonce {got} is more than {MAX_NONCE_GAP} ahead of the next nonce {next}")]
    GapTooLarge { next: u64, got: u64 },
    #[error("account already has {MAX_PENDING_PER_ACCOUNT} ops waiting")]
    AccountFull,
    #[error("pending queue holds {MAX_PENDING_TOTAL} ops")]
    QueueFull,
    #[error("a different op already waits at this nonce")]
    Conflict,
}

/// What parking an op did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    Queued,
    /// The same op (same hash) was already waiting.
    AlreadyQueued,
}

#[derive(Debug, Clone)]
pub struct PendingOps {
    ops: BTreeMap<(NodeId, u64), VerifiedOp>,
    per_account: HashMap<NodeId, usize>,
    capacity: usize,
}

impl Default for PendingOps {
    fn default() -> Self {
        Self::with_capacity(MAX_PENDING_TOTAL)
    }
}

impl PendingOps {
    /// A queue of at most `capacity` ops overall (the ledger uses [`MAX_PENDING_TOTAL`]).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            ops: BTreeMap::new(),
            per_account: HashMap::new(),
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn park(&mut self, next_nonce: u64, op: VerifiedOp) -> Result<Parked, PendingError> {
        let key = (op.op().account, op.op().nonce);
        if let Some(existing) = self.ops.get(&key) {
            return if existing.hash() == op.hash() {
                Ok(Parked::AlreadyQueued)
            } else {
                Err(PendingError::Conflict)
            };
        }
        if key.1 - next_nonce > MAX_NONCE_GAP {
            return Err(PendingError::GapTooLarge {
                next: next_nonce,
                got: key.1,
            });
        }
        let count = self.per_account.get(&key.0).copied().unwrap_or(0);
        if count >= MAX_PENDING_PER_ACCOUNT {
            return Err(PendingError::AccountFull);
        }
        if self.ops.len() >= self.capacity {
            let fullest = self
                .per_account
                .iter()
                .max_by_key(|(a, n)| (**n, **a))
                .map(|(a, n)| (*a, *n));
            match fullest {
                Some((account, n)) if n > count + 1 => {
                    let furthest = self
                        .ops
                        .range((account, 0)..=(account, u64::MAX))
                        .next_back()
                        .map(|(&(_, nonce), _)| nonce);
                    if let Some(nonce) = furthest {
                        self.take(account, nonce);
                    }
                }
                _ => return Err(PendingError::QueueFull),
            }
        }
        self.ops.insert(key, op);
        self.per_account.insert(key.0, count + 1);
        Ok(Parked::Queued)
    }

    /// Removes and returns the op waiting at exactly `(account, nonce)`.
    pub fn take(&mut self, account: NodeId, nonce: u64) -> Option<VerifiedOp> {
        let op = self.ops.remove(&(account, nonce))?;
        if let Some(c) = self.per_account.get_mut(&account) {
            *c -= 1;
            if *c == 0 {
                self.per_account.remove(&account);
            }
        }
        Some(op)
    }

    /// Drops ops at nonces the account has already passed (they can never apply).
    pub fn discard_below(&mut self, account: NodeId, next_nonce: u64) {
        let stale: Vec<u64> = self
            .ops
            .range((account, 0)..(account, next_nonce))
            .map(|(&(_, n), _)| n)
            .collect();
        for n in stale {
            self.take(account, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{AccountOp, Action, verify_op};
    use neuroshard_proof::fixtures::test_identity;

    fn op(seed: u64, nonce: u64) -> VerifiedOp {
        let id = test_identity(seed);
        let signed = AccountOp {
            network: [0; 32],
            account: id.node_id(),
            nonce,
            timestamp_ms: 1,
            action: Action::Burn { amount: 1 },
        }
        .sign(&id);
        verify_op(&signed).expect("fixture op verifies")
    }

    /// Fresh keys fill the queue with their share each; an honest account waiting for one op
    /// still gets its op parked, at the cost of the fullest account's furthest op.
    #[test]
    fn a_full_queue_makes_room_for_an_account_with_fewer_ops() {
        let mut q = PendingOps::with_capacity(8);
        for seed in 0..2 {
            for nonce in 1..=4 {
                assert_eq!(q.park(0, op(100 + seed, nonce)), Ok(Parked::Queued));
            }
        }
        assert_eq!(q.len(), 8);
        assert_eq!(q.park(0, op(7, 1)), Ok(Parked::Queued));
        assert_eq!(q.len(), 8);
        assert!(q.take(test_identity(7).node_id(), 1).is_some());
        // An attacker account as full as the fullest cannot take a slot from another.
        let mut q = PendingOps::with_capacity(2);
        assert_eq!(q.park(0, op(1, 1)), Ok(Parked::Queued));
        assert_eq!(q.park(0, op(2, 1)), Ok(Parked::Queued));
        assert_eq!(q.park(0, op(3, 1)), Err(PendingError::QueueFull));
    }
}
