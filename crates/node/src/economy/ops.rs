//! Signed account ops (register, stake, unstake, transfer, burn) on the wire: verified,
//! applied in per-account nonce order, persisted, and served to peers by anti-entropy. A
//! registration may be what parked proofs wait for, so applying one retries them.

use std::collections::BTreeSet;

use neuroshard_ledger::{OP_MAX_CLOCK_SKEW_MS, Outcome, Record, VerifiedOp, decode_op};

use super::{Economy, EconomyError, LedgerWrite, ProofOutcome, SyncSummary};

impl Economy {
    /// Verifies and applies an op from the network. Never panics on any input. An op may be
    /// old (anti-entropy delivers history) but not from the future: its signed time decides
    /// when a stake unlocks, so a post-dated unstake would unlock early.
    pub fn on_op(&mut self, wire: &[u8], now_ms: u64) -> (ProofOutcome, SyncSummary) {
        let verified = match decode_op(wire).map_err(|e| e.to_string()) {
            Ok(v) => v,
            Err(reason) => return (ProofOutcome::Rejected(reason), SyncSummary::default()),
        };
        let op = *verified.op();
        if op.timestamp_ms > now_ms.saturating_add(OP_MAX_CLOCK_SKEW_MS) {
            let reason = format!("op time {} is ahead of {now_ms}", op.timestamp_ms);
            return (ProofOutcome::Rejected(reason), SyncSummary::default());
        }
        match self.apply_op(verified) {
            Ok(Some(retried)) => (
                ProofOutcome::Applied {
                    node: op.account,
                    reward: 0,
                },
                retried,
            ),
            Ok(None) => (ProofOutcome::Duplicate, SyncSummary::default()),
            Err(e) => (
                ProofOutcome::Rejected(e.to_string()),
                SyncSummary::default(),
            ),
        }
    }

    /// Applies an audit verdict this node reached by replaying the job itself, and queues it
    /// for the store. False: a verdict about this job was applied already.
    pub fn apply_verdict(
        &mut self,
        verdict: &neuroshard_ledger::VerifiedVerdict,
    ) -> Result<bool, EconomyError> {
        match self.ledger.apply_verdict(verdict)? {
            Outcome::Applied(changes) => {
                self.epoch_feed.settled(*verdict);
                self.epoch_feed.push(
                    neuroshard_ledger::EpochItem::Verdict(*verdict),
                    crate::finality::ItemWire::Verdict(*verdict),
                );
                self.writes.push_back(LedgerWrite::of(changes));
                Ok(true)
            }
            Outcome::Duplicate | Outcome::Queued => Ok(false),
        }
    }

    /// Applies a verified op (and any waiting successors it unblocks) and queues it for the
    /// store, which applies the same sequence. `Ok(None)`: already applied or waiting for its
    /// predecessor. Otherwise what retrying the proofs parked on these accounts gave.
    pub(super) fn apply_op(&mut self, op: VerifiedOp) -> Result<Option<SyncSummary>, EconomyError> {
        match self.ledger.apply_op(op)? {
            Outcome::Duplicate => Ok(None),
            // Stored once it applies, with the predecessor that unblocks it.
            Outcome::Queued => Ok(None),
            Outcome::Applied(changes) => {
                self.writes.push_back(LedgerWrite::of(changes.clone()));
                let mut accounts = BTreeSet::new();
                for record in changes.records {
                    if let Record::Op {
                        account,
                        nonce,
                        wire,
                        ..
                    } = record
                    {
                        if let Ok(op) = decode_op(&wire) {
                            self.epoch_feed.push(
                                neuroshard_ledger::EpochItem::Op(op),
                                crate::finality::ItemWire::Op(wire.clone()),
                            );
                        }
                        self.op_ids
                            .insert(super::antientropy::op_id(&wire), (account, nonce));
                        self.op_wires.insert((account, nonce), wire);
                        self.sync.recent_op(account, nonce);
                        self.sync.dirty = true;
                        accounts.insert(account);
                    }
                }
                Ok(Some(self.retry_parked(&accounts)))
            }
        }
    }
}
