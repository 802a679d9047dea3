//! Challenge seeds from finalized ledger epochs (issue 15 on issue 19's finality).
//!
//! A job commitment names the last epoch its worker saw finalized; its challenges are drawn
//! from the hash of epoch `epoch + BEACON_LAG`, which did not exist when it was signed and
//! which every node holds once final. The stage's θ₀ seeded them before: a worker that offered
//! last could try offers until its cheated jobs went unpicked, and nodes of other stages could
//! not check the seed a fraud report claimed. What waits for a beacon (audits, evidence
//! requests, fraud reports) goes on when an epoch is finalized; evidence is kept until every
//! job of a round has had its beacon for an epoch.

use std::time::Instant;

use neuroshard_audit::{ChallengeSeed, JobCommitment};
use neuroshard_proof::{Hash32, NodeId};

use super::audit::{EngineFor, KEEP_ROUNDS};
use super::{EngineJob, NodeCore, Token, Transmit};
use crate::wire::{AuditAnswer, AuditRequest};
use neuroshard_proof::Canonical;

/// Evidence requests a worker holds for beacons it lacks, at most.
const MAX_DEFERRED: usize = 256;
/// Epochs past our finalized one that a commitment an auditor examines may name: it was
/// signed at least two rounds before, when the network was no further than that.
pub(super) const MAX_EPOCHS_AHEAD: u64 = 2;
/// How many epochs before ours a commitment's receiver accepts (a worker may lag).
pub(super) const MAX_EPOCHS_BEHIND: u64 = 2;

impl NodeCore {
    /// The last epoch finalized here (0 before the first).
    pub(super) fn finalized_epoch(&self) -> u64 {
        #[cfg(test)]
        if let Some((&e, _)) = self.audit.test_beacons.last_key_value() {
            return e;
        }
        self.finality.as_ref().map_or(0, |f| f.head().epoch)
    }

    /// The hash of finalized epoch `epoch`, if final here and still held.
    pub(super) fn beacon(&self, epoch: u64) -> Option<Hash32> {
        #[cfg(test)]
        if let Some(b) = self.audit.test_beacons.get(&epoch) {
            return Some(*b);
        }
        self.finality.as_ref()?.beacon(epoch)
    }

    /// The seed of `c`'s challenges and the beacon it comes from, once final here.
    pub(super) fn job_seed(&self, c: &JobCommitment) -> Option<(ChallengeSeed, Hash32)> {
        let beacon = self.beacon(c.beacon_epoch()?)?;
        let seed = ChallengeSeed::from_beacon(self.network, c.stage, c.round, beacon);
        Some((seed, beacon))
    }

    /// Whether `c`'s beacon will never be known here: its epoch is final but no longer held.
    pub(super) fn beacon_lost(&self, c: &JobCommitment) -> bool {
        match c.beacon_epoch() {
            None => true,
            Some(e) => e <= self.finalized_epoch() && self.beacon(e).is_none(),
        }
    }

    /// An epoch was finalized: what waited for its beacon goes on.
    pub(super) fn on_new_beacon(&mut self, now: Instant) {
        let ready: Vec<_> = self
            .audit
            .awaiting
            .iter()
            .filter(|(_, w)| {
                self.job_seed(&w.commitment).is_some() || self.beacon_lost(&w.commitment)
            })
            .map(|(k, _)| *k)
            .collect();
        for key in ready {
            if let Some(w) = self.audit.awaiting.remove(&key) {
                self.consider_challenge(w, now);
            }
        }
        for (from, token, req) in std::mem::take(&mut self.audit.deferred) {
            self.on_audit_request(from, token, req);
        }
        self.retry_held_reports(now);
        self.forget_audited();
    }

    pub(super) fn defer_evidence_request(&mut self, from: NodeId, token: Token, req: AuditRequest) {
        if self.audit.deferred.len() >= MAX_DEFERRED {
            let data = AuditAnswer::Refused("too many requests waiting for an epoch".into())
                .to_canonical_bytes();
            self.transmits.push_back(Transmit::Respond { token, data });
            return;
        }
        self.audit.deferred.push((from, token, req));
    }

    /// Drops the evidence and served weights of rounds no audit needs any more: rounds at
    /// least `KEEP_ROUNDS` behind the current one whose jobs' beacons are final for an epoch
    /// (an auditor had that long to ask).
    pub(super) fn forget_audited(&mut self) {
        let round = self.rounds.syncer.round();
        let head = self.finalized_epoch();
        let kept_from = self.audit.kept_from;
        // The first round kept whose jobs' beacons an auditor may still be waiting for.
        let waiting = self
            .job_log
            .iter()
            .filter(|l| l.commitment.round >= kept_from)
            .filter(|l| l.commitment.beacon_epoch().is_some_and(|b| b >= head))
            .map(|l| l.commitment.round)
            .min();
        let last = round.saturating_sub(KEEP_ROUNDS);
        let keep_from = waiting.map_or(last, |w| w.min(last)).max(kept_from);
        if keep_from == kept_from {
            return;
        }
        self.audit.kept_from = keep_from;
        let stale: Vec<u64> = self
            .audit
            .offered
            .range(..keep_from)
            .map(|(r, _)| *r)
            .collect();
        for r in stale {
            for hash in self.audit.offered.remove(&r).unwrap_or_default() {
                // A verdict's weights stay served after the round's audits are over.
                if !self.economy.keeps_verdict_weights(&hash) {
                    self.transmits.push_back(Transmit::WithdrawBlob { hash });
                }
            }
        }
        self.audit.taken.retain(|(_, r), _| *r >= keep_from);
        // What only the rounds no longer audited need goes (a job may run at the weights of
        // the step before its round: a weight lag of 1).
        if let Some((_, &first)) = self.audit.round_start.range(keep_from..).next() {
            self.audit.round_start.retain(|r, _| *r >= keep_from);
            let before = first.saturating_sub(1);
            let t = self.engine(EngineJob::ForgetEvidence { before });
            self.audit.engine.insert(t, EngineFor::Forget);
        }
    }
}
