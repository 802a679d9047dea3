//! Challenge seeds from finalized ledger epochs (issue 15 on issue 19's finality).
//!
//! A job commitment names the last epoch its worker saw finalized; its challenges are drawn
//! from the hash of epoch `epoch + BEACON_LAG`, which did not exist when it was signed and
//! which every node holds once final. The stage's θ₀ seeded them before: a worker that offered
//! last could try offers until its cheated jobs went unpicked, and nodes of other stages could
//! not check the seed a fraud report claimed. What waits for a beacon (audits, evidence
//! requests, fraud reports) goes on when an epoch is finalized; evidence is kept until every
//! job of a round has had its beacon for an epoch.
//!
//! An auditor learns a worker's jobs from the worker's list, which the worker writes once it
//! can compute the draw: a cheater would leave out its challenged jobs. So the receiver of a
//! job's output, which holds the commitment the worker signed to send it, hands each
//! challenged one to its auditor too (`AuditRequest::Notice`).

use std::time::Instant;

use neuroshard_audit::{
    ChallengeSeed, JobCommitment, SignedJob, auditor_for, is_challenged, verify_job,
};
use neuroshard_proof::{Hash32, NodeId};

use super::audit::{Committed, EngineFor, KEEP_ROUNDS};
use super::{EngineJob, NodeCore, Pending, Token, Transmit};
use crate::wire::{AuditAnswer, AuditRequest};
use neuroshard_proof::Canonical;

/// Evidence requests a worker holds for beacons it lacks, at most.
const MAX_DEFERRED: usize = 256;
/// Received jobs' commitments a receiver keeps for their beacon, at most (oldest dropped):
/// a few rounds of a stage's traffic.
const MAX_NOTICED: usize = 8192;
/// Epochs past our finalized one that a commitment an auditor examines may name: it was
/// signed at least two rounds before, when the network was no further than that.
pub(super) const MAX_EPOCHS_AHEAD: u64 = 2;
/// How many epochs before ours a commitment's receiver accepts (a worker may lag).
pub(super) const MAX_EPOCHS_BEHIND: u64 = 2;
/// How long after a job's beacon epoch is final here its evidence is kept at least (past an
/// epoch): its auditor may finalize it later, audits of many jobs wait their turn, and a
/// demand the committee takes up to `jury::DEMAND_WINDOW` after its own finalization must
/// find the evidence still here (the worker then keeps it for the jurors).
pub(super) const EVIDENCE_GRACE: std::time::Duration = std::time::Duration::from_secs(40);
/// Finalization times remembered (for `EVIDENCE_GRACE`).
const MAX_FINAL_TIMES: usize = 4096;

impl NodeCore {
    /// Our finalized epoch, when `epoch` is more than `MAX_EPOCHS_BEHIND` before it: a
    /// commitment signed there could have been signed knowing its beacon, hence whether it
    /// is audited.
    pub(super) fn long_final(&self, epoch: u64) -> Option<u64> {
        let head = self.finalized_epoch();
        (epoch.saturating_add(MAX_EPOCHS_BEHIND) < head).then_some(head)
    }

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

    /// When epoch `epoch` was finalized here (None: before this node ran, or caught up on
    /// several at once).
    pub(super) fn final_time(&self, epoch: u64) -> Option<Instant> {
        self.audit
            .final_times
            .iter()
            .rev()
            .find(|(e, _)| *e == epoch)
            .map(|(_, t)| *t)
    }

    /// An epoch was finalized: what waited for its beacon goes on.
    pub(super) fn on_new_beacon(&mut self, now: Instant) {
        let head = self.finalized_epoch();
        self.audit.final_times.push_back((head, now));
        while self.audit.final_times.len() > MAX_FINAL_TIMES {
            self.audit.final_times.pop_front();
        }
        // Each is decided now or waits again.
        for w in std::mem::take(&mut self.audit.awaiting).into_values() {
            self.consider_challenge(w, now);
        }
        for (from, token, req) in std::mem::take(&mut self.audit.deferred) {
            self.on_audit_request(from, token, req, now);
        }
        self.send_notices();
        self.retry_held_reports(now);
        self.retry_held_demands(now);
        self.retry_held_fees();
        self.forget_audited(now);
    }

    /// A job's output we accepted: its commitment waits for its beacon here.
    pub(super) fn keep_for_notice(&mut self, job: SignedJob, c: JobCommitment) {
        if self.audit_rate().per_million == 0 {
            return;
        }
        if self.audit.noticed.len() >= MAX_NOTICED {
            self.audit.noticed.pop_front();
        }
        self.audit
            .noticed
            .push_back(Committed { job, commitment: c });
    }

    /// Hands each received job whose beacon is now final, and which it challenges, to the
    /// auditor it names.
    fn send_notices(&mut self) {
        let rate = self.audit_rate();
        let mut kept = std::collections::VecDeque::new();
        for noticed in std::mem::take(&mut self.audit.noticed) {
            let c = noticed.commitment;
            let Some((seed, _)) = self.job_seed(&c) else {
                if !self.beacon_lost(&c) {
                    kept.push_back(noticed);
                }
                continue;
            };
            let key = c.key();
            if !is_challenged(&seed, &key, rate) {
                continue;
            }
            let validators: Vec<NodeId> = self.economy.ledger().ever_registered(c.stage).collect();
            let Some(auditor) = auditor_for(&seed, &key, c.worker, &validators) else {
                continue;
            };
            if auditor == self.me {
                continue;
            }
            let token = self.token();
            self.requests.insert(token, Pending::AuditNotice);
            self.transmits.push_back(Transmit::Request {
                to: auditor,
                token,
                data: AuditRequest::Notice(noticed.job).to_canonical_bytes(),
            });
        }
        self.audit.noticed = kept;
    }

    /// A neighbour stage's replica hands us a job of a co-replica's it received: audited as
    /// if the worker had listed it (the seed decides whether it is ours to audit).
    pub(super) fn on_audit_notice(
        &mut self,
        from: NodeId,
        token: Token,
        job: SignedJob,
        now: Instant,
    ) {
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let ledger = self.economy.ledger();
        let neighbour = self
            .pipeline
            .layouts()
            .near(self.stage)
            .into_iter()
            .filter(|s| *s != self.stage)
            .filter_map(|s| u16::try_from(s).ok())
            .any(|s| ledger.is_registered(&from, s));
        let answer = |why: Option<&str>| match why {
            Some(why) => AuditAnswer::Refused(why.into()),
            None => AuditAnswer::List(Vec::new()),
        };
        // Who may send one first: a stranger costs no signature check.
        if !neighbour {
            let data = answer(Some("not a registered replica of a neighbouring stage"));
            let data = data.to_canonical_bytes();
            self.transmits.push_back(Transmit::Respond { token, data });
            return;
        }
        let Ok(c) = verify_job(&job) else {
            self.penalize(from, "an audit notice with a forged commitment");
            return;
        };
        let ours = c.network == self.network
            && c.stage == stage
            && c.worker != self.me
            && self
                .economy
                .ledger()
                .ever_registered(stage)
                .any(|v| v == c.worker);
        let data = answer((!ours).then_some("not a job of this stage")).to_canonical_bytes();
        self.transmits.push_back(Transmit::Respond { token, data });
        let key = c.key();
        if ours && !self.audit.known(&key) && self.audit_rate().per_million > 0 {
            self.consider_challenge(Committed { job, commitment: c }, now);
        }
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

    /// The first round kept whose jobs' beacons an auditor may still be waiting for: a job's
    /// beacon epoch is after the latest epoch final here for an epoch and `EVIDENCE_GRACE`.
    fn first_round_awaiting_audit(&self, now: Instant) -> Option<u64> {
        let head = self
            .audit
            .final_times
            .iter()
            .rev()
            .find(|(_, at)| now.saturating_duration_since(*at) >= EVIDENCE_GRACE)
            .map_or(0, |(e, _)| *e)
            .min(self.finalized_epoch().saturating_sub(1));
        let kept_from = self.audit.kept_from;
        self.job_log
            .iter()
            .filter(|l| l.commitment.round >= kept_from)
            .filter(|l| l.commitment.beacon_epoch().is_some_and(|b| b > head))
            .map(|l| l.commitment.round)
            .min()
    }

    /// No audit of this node's jobs can come any more: every job's beacon has been final for
    /// an epoch and the grace period, and no demand keeps a round for the jurors. (What a
    /// mover waits for before its restart empties its job log.)
    pub(super) fn audits_over(&mut self, now: Instant) -> bool {
        let none_challenged = self.audit_rate().per_million == 0;
        (none_challenged || self.first_round_awaiting_audit(now).is_none())
            && self.audit.juries.kept_from(now).is_none()
    }

    /// Drops the evidence and served weights of rounds no audit needs any more: rounds at
    /// least `KEEP_ROUNDS` behind the current one whose jobs' beacons were final here an
    /// epoch and `EVIDENCE_GRACE` ago (their auditors had that long to ask).
    pub(super) fn forget_audited(&mut self, now: Instant) {
        let round = self.rounds.syncer.round();
        let kept_from = self.audit.kept_from;
        let waiting = self.first_round_awaiting_audit(now);
        let last = round.saturating_sub(KEEP_ROUNDS);
        // Rounds with a demanded job stay while the committee's jurors may ask.
        let demanded = self.audit.juries.kept_from(now);
        let keep_from = [waiting, demanded]
            .into_iter()
            .flatten()
            .fold(last, u64::min)
            .max(kept_from);
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
