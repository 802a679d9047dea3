//! Validator fees on the node (issue 15: "registered validators earn fees from the emission
//! for audits done").
//!
//! A worker signs, with every evidence answer, that it served the job's evidence to the
//! asker (`neuroshard_audit::Served`). An auditor whose audit ran to its end (the job
//! replayed, whatever the replay found) claims its fee: the worker's commitment and that
//! statement (`AuditFeeClaim`), gossiped network-wide in batches. The finality committee's
//! validators put claims in epochs; each admits a claim only where the job's beacon assigned
//! the job to the auditor the claim pays and the worker was paid for the round
//! (`Economy::judge_fee`), so a proposer cannot slip in a fee for a friend. Every node's live
//! ledger applies the fees a finalized epoch holds: the auditor is paid 5% of the round
//! reward once per (auditor, worker, stage, round).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use neuroshard_audit::AuditFeeClaim;
use neuroshard_ledger::{EpochItem, VerifiedAuditFee};
use neuroshard_proof::{Canonical, Hash32, NodeId, Signed};

use super::audit::Open;
use super::{NodeCore, Transmit};
use crate::events::NodeEvent;
use crate::finality::ItemWire;
use crate::recent::RecentSet;
use crate::records::Topic;
use crate::wire::{FeeClaims, MAX_FEE_CLAIMS};

/// Least time between two batches of claims one auditor sends.
pub(super) const FEE_CLAIMS_EVERY: Duration = Duration::from_secs(2);
/// Claims an auditor waits to send, at most.
const MAX_FEE_OUTBOX: usize = 1024;
/// Claims a committee member holds for a later epoch (the beacon or the worker's training
/// proof is not final here yet), at most; and for how many finalized epochs each.
const MAX_HELD_FEES: usize = 1024;
const HOLD_EPOCHS: u64 = 32;
/// Fee claims a committee member remembers having taken (each is taken once).
const MAX_TAKEN: usize = 16_384;

#[derive(Debug, Default)]
pub(super) struct FeeState {
    outbox: super::paced::PacedOutbox<AuditFeeClaim>,
    /// (claim, its bytes, the finalized epoch it was first held at).
    pub(super) held: VecDeque<(VerifiedAuditFee, Vec<u8>, u64)>,
    taken: RecentSet<Hash32, MAX_TAKEN>,
}

impl NodeCore {
    /// Our audit ran to its end: the fee for it is claimed with the next batch.
    pub(super) fn claim_fee(&mut self, open: &Open, now: Instant) {
        let Some(served) = open.served.clone() else {
            return;
        };
        let claim = AuditFeeClaim {
            job: open.job.clone(),
            served,
        };
        self.audit.fees.outbox.push(claim, MAX_FEE_OUTBOX);
        self.flush_fee_claims(now);
    }

    /// Sends the claims waiting, at most `MAX_FEE_CLAIMS` a batch and a batch a
    /// `FEE_CLAIMS_EVERY`, and takes them here as every committee member does.
    pub(super) fn flush_fee_claims(&mut self, now: Instant) {
        let Some(claims) = self
            .audit
            .fees
            .outbox
            .take(now, FEE_CLAIMS_EVERY, MAX_FEE_CLAIMS)
        else {
            return;
        };
        let batch = FeeClaims {
            network: self.network,
            claims,
        };
        self.transmits.push_back(Transmit::Publish {
            topic: Topic::Ops,
            data: Signed::sign(&self.identity, &batch).to_bytes(),
        });
        for claim in batch.claims {
            if let Ok(fee) = VerifiedAuditFee::from_claim(&claim) {
                self.take_fee(fee, claim.to_canonical_bytes(), None);
            }
        }
    }

    /// When the next batch of claims is due.
    pub(super) fn fee_timeout(&self) -> Option<Instant> {
        self.audit.fees.outbox.due(self.last_now, FEE_CLAIMS_EVERY)
    }

    /// Gossiped fee claims (false: the bytes are not claims).
    pub(super) fn on_fee_claims_gossip(&mut self, from: NodeId, data: &[u8]) -> bool {
        // An envelope's payload may be any type's: the claims' domain tells them apart.
        let Ok(signed) = Signed::<FeeClaims>::from_bytes(data) else {
            return false;
        };
        if FeeClaims::from_canonical_bytes(signed.payload_bytes()).is_err() {
            return false;
        }
        let batch = match signed.verify() {
            Ok(b) if signed.signer().node_id() == from => b,
            _ => {
                self.penalize(from, "fee claims not signed by their sender");
                return true;
            }
        };
        // Only the committee's validators take claims; the rest only relay them (the
        // transport checked the batch's signature and whom its claims pay), so they spend no
        // signature checks on each claim of every auditor of the network.
        let me = self.me;
        if batch.network != self.network || !self.is_juror(&me) {
            return true;
        }
        for claim in batch.claims {
            match VerifiedAuditFee::from_claim(&claim) {
                Ok(fee) if fee.auditor == from => {
                    self.take_fee(fee, claim.to_canonical_bytes(), None);
                }
                // The transport forwards claims only from the auditor they pay; a claim
                // without the worker's signatures is forged.
                _ => {
                    self.penalize(from, "a forged fee claim");
                    return true;
                }
            }
        }
        true
    }

    /// A committee member puts a claim its finalized state admits in the next epochs'
    /// bodies; one that may be admitted later (the beacon or the worker's training proof is
    /// not final here yet) is held (`since`: the epoch it was first held at), the rest
    /// dropped. Other nodes only relay claims.
    fn take_fee(&mut self, fee: VerifiedAuditFee, bytes: Vec<u8>, since: Option<u64>) {
        let me = self.me;
        if !self.is_juror(&me) || self.audit.fees.taken.contains(&fee.key()) {
            return;
        }
        let Some(finality) = self.finality.as_mut() else {
            return;
        };
        match self.economy.judge_fee(finality.finalized_state(), &fee) {
            Ok(()) => {
                self.audit.fees.taken.insert(fee.key());
                finality.add_item(EpochItem::AuditFee(fee), ItemWire::AuditFee(bytes));
            }
            Err(e) if e.may_change() => {
                let f = &mut self.audit.fees;
                if f.held.len() < MAX_HELD_FEES {
                    f.held
                        .push_back((fee, bytes, since.unwrap_or(finality.head().epoch)));
                }
            }
            Err(_) => {}
        }
    }

    /// An epoch was finalized: held claims are judged again (each for `HOLD_EPOCHS`).
    pub(super) fn retry_held_fees(&mut self) {
        let head = self.finalized_epoch();
        for (fee, bytes, since) in std::mem::take(&mut self.audit.fees.held) {
            if head <= since.saturating_add(HOLD_EPOCHS) {
                self.take_fee(fee, bytes, Some(since));
            }
        }
    }

    /// Fees an epoch finalized: the live ledger applies them.
    pub(super) fn apply_finalized_fees(&mut self, link: &crate::finality::ChainLink, now: Instant) {
        for item in &link.body.items {
            let ItemWire::AuditFee(bytes) = item else {
                continue;
            };
            let fee = match AuditFeeClaim::from_canonical_bytes(bytes)
                .map_err(|e| e.to_string())
                .and_then(|c| VerifiedAuditFee::from_claim(&c).map_err(|e| e.to_string()))
            {
                Ok(fee) => fee,
                Err(e) => {
                    self.warn(format!("a finalized fee claim: {e}"), now);
                    continue;
                }
            };
            match self.economy.apply_audit_fee(&fee) {
                Ok(true) => {
                    let time_ms = self.unix_ms(now);
                    self.events.push_back(NodeEvent::Ledger {
                        applied: hex::encode(fee.claim_hash),
                        reward: self.economy.ledger().audit_fee(),
                        kind: Some("audit fee".into()),
                        state_hash: hex::encode(self.economy.state_hash()),
                        time_ms,
                    });
                }
                Ok(false) => {}
                Err(e) => self.warn(format!("a finalized fee: {e}"), now),
            }
        }
    }
}
