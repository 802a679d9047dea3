//! Refusals to serve evidence, judged by the committee (verification by recomputation,
//! issue 15).
//!
//! A refusal cannot be shown to a third party: "it did not answer me" is all an auditor has.
//! So when the worker of a job the beacon assigned to an auditor does not serve evidence the
//! job replays on, the auditor gossips a signed [`AuditDemand`], and every validator of the
//! ledger committee that hears it becomes a juror: it asks the worker for the job's evidence
//! itself (a worker serves challenged jobs' evidence to committee members), a few times,
//! and replays the job. A juror that got no evidence, or evidence on which the job does not
//! replay in its determinism class, holds the worker guilty: it proposes and votes for a
//! verdict (the worker loses what a replay verdict takes, the auditor is paid). One that
//! got evidence the job replays on refuses that verdict. A verdict enters the finalized
//! ledger only with more than two thirds of the committee's power behind it, and every
//! node's live ledger applies what finality settled, so an honest worker (which serves the
//! honest majority of jurors) is never slashed by a demand, and a worker that refuses
//! everyone is slashed on every ledger.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_audit::{JobCommitment, JobKey, SignedJob, auditor_for, is_challenged, verify_job};
use neuroshard_ledger::VerifiedVerdict;
use neuroshard_proof::{Canonical, NodeId, Signed};

use super::audit::{End, Open};
use super::{NodeCore, Transmit};
use crate::events::NodeEvent;
use crate::recent::RecentSet;
use crate::records::Topic;
use crate::wire::{AuditDemand, MAX_DEMAND_JOBS};

/// Times a juror asks the worker before it holds the evidence unserved.
pub(super) const JURY_ATTEMPTS: u8 = 3;
/// Time between a juror's attempts.
pub(super) const JURY_RETRY: Duration = Duration::from_secs(10);
/// Demanded jobs a juror judges at once, at most (each is a fetch of the job's evidence and
/// weights and a replay); more wait their turn.
pub(super) const MAX_JURIES: usize = 64;
/// Demanded jobs a node remembers judging (each is judged once).
const MAX_JUDGED: usize = 16_384;
/// How long a worker keeps the evidence of a round one of its jobs was demanded in, past
/// the usual retention: the jurors' attempts and their transfers.
pub(super) const DEMAND_KEEP: Duration = Duration::from_secs(120);
/// Rounds a worker keeps for demands at most (a flood of demands cannot pin every round).
const MAX_KEPT_FOR_DEMANDS: usize = 16;
/// How far ahead of this node's clock a demand may be signed.
const MAX_DEMAND_SKEW_MS: u64 = 60_000;
/// How long after a job's beacon epoch was finalized here a juror takes a demand about it.
/// A worker keeps a job's evidence `beacon::EVIDENCE_GRACE` (40 s) past an epoch after the
/// same finalization, so a timely demand finds it (and keeps it for the jurors); a late one
/// (an auditor that waited until the evidence was gone, or replays an old demand) could
/// slash an honest worker, so it is not taken.
pub(super) const DEMAND_WINDOW: Duration = Duration::from_secs(25);
/// How long an audit waits for the worker's evidence before its auditor demands it in the
/// open (a silent worker would otherwise run the request's timeout past `DEMAND_WINDOW`);
/// an honest worker that is merely slow serves the jurors too, and nothing is slashed.
pub(super) const DEMAND_AFTER: Duration = Duration::from_secs(12);
/// Demanded jobs held while their beacon epoch is not final here yet, at most.
const MAX_HELD_DEMANDS: usize = 1024;
/// Demanded jobs waiting for a juror's slot, at most.
const MAX_JURY_QUEUE: usize = 4096;
/// Jobs an auditor waits to demand, at most (32 go out a second).
const MAX_OUTBOX: usize = 1024;
/// Least time between two demands one auditor sends.
pub(super) const DEMAND_EVERY: Duration = Duration::from_secs(1);

/// A juror's check of one demand.
#[derive(Debug, Clone, Copy)]
pub(super) struct Jury {
    pub(super) auditor: NodeId,
    pub(super) timestamp_ms: u64,
    /// The verdict's evidence (the demand and the job), alike for every juror.
    pub(super) evidence_hash: [u8; 32],
    pub(super) attempts: u8,
    /// When the next attempt goes out (None: asked, or waiting its turn).
    pub(super) retry_at: Option<Instant>,
}

/// What a node keeps about demands: the jobs it judged, and the rounds it keeps evidence of
/// for jurors (as a worker).
#[derive(Debug, Default)]
pub(super) struct JuryState {
    judged: RecentSet<JobKey, MAX_JUDGED>,
    /// Round → until when its evidence is kept for jurors.
    pub(super) kept: BTreeMap<u64, Instant>,
    /// Demanded jobs whose beacon epoch is not final here yet.
    held: VecDeque<Demanded>,
    /// Demanded jobs waiting for a juror's slot.
    queue: VecDeque<Demanded>,
    /// Our jobs to demand, and when we last sent a demand.
    outbox: super::paced::PacedOutbox<SignedJob>,
}

/// One job of a demand, checked for its signature.
#[derive(Debug, Clone)]
pub(super) struct Demanded {
    auditor: NodeId,
    job: SignedJob,
    commitment: JobCommitment,
    /// What the verdict names as its evidence: the demand and the job.
    evidence_hash: [u8; 32],
    timestamp_ms: u64,
}

impl JuryState {
    /// The first round kept for jurors at `now`, dropping the expired ones.
    pub(super) fn kept_from(&mut self, now: Instant) -> Option<u64> {
        self.kept.retain(|_, until| *until > now);
        self.kept.keys().next().copied()
    }
}

impl NodeCore {
    /// Whether `node` is a validator of the committee of this node's finalized ledger.
    pub(super) fn is_juror(&self, node: &NodeId) -> bool {
        #[cfg(test)]
        if !self.audit.test_committee.is_empty() {
            return self.audit.test_committee.contains(node);
        }
        self.finality
            .as_ref()
            .is_some_and(|f| f.head().committee.get(node).is_some())
    }

    /// Our audit of `job` got no evidence it replays on: the committee is asked to judge (in
    /// the next demand this node sends).
    pub(super) fn demand_evidence(&mut self, job: &SignedJob, now: Instant) {
        self.queue_demand(job.clone());
        self.flush_demands(now);
    }

    fn queue_demand(&mut self, job: SignedJob) {
        self.audit.juries.outbox.push(job, MAX_OUTBOX);
    }

    /// Sends the jobs waiting to be demanded, at most `MAX_DEMAND_JOBS` in one demand and
    /// one demand a `DEMAND_EVERY`.
    fn flush_demands(&mut self, now: Instant) {
        let Some(jobs) = self
            .audit
            .juries
            .outbox
            .take(now, DEMAND_EVERY, MAX_DEMAND_JOBS)
        else {
            return;
        };
        let demand = AuditDemand {
            network: self.network,
            jobs,
            timestamp_ms: self.unix_ms(now),
        };
        let data = Signed::sign(&self.identity, &demand).to_bytes();
        self.transmits.push_back(Transmit::Publish {
            topic: Topic::Ops,
            data,
        });
        let me = self.me;
        self.on_demand(me, &demand, now);
    }

    /// A gossiped demand (false: the bytes are not one).
    pub(super) fn on_demand_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) -> bool {
        // An envelope's payload may be any type's (ops are signed too): the demand's domain
        // tells it apart.
        let Ok(signed) = Signed::<AuditDemand>::from_bytes(data) else {
            return false;
        };
        if AuditDemand::from_canonical_bytes(signed.payload_bytes()).is_err() {
            return false;
        }
        match signed.verify() {
            Ok(demand) if signed.signer().node_id() == from => self.on_demand(from, &demand, now),
            _ => self.penalize(from, "an audit demand not signed by its sender"),
        }
        true
    }

    /// A demand by `auditor`: each job is checked to be a challenged job of this network that
    /// the beacon assigned to it, then judged if this node sits on the committee.
    fn on_demand(&mut self, auditor: NodeId, demand: &AuditDemand, now: Instant) {
        if demand.network != self.network
            || demand.timestamp_ms > self.unix_ms(now).saturating_add(MAX_DEMAND_SKEW_MS)
        {
            return;
        }
        let hash = blake3::hash(&demand.to_canonical_bytes());
        for job in &demand.jobs {
            let c = match verify_job(job) {
                Ok(c) if c.network == self.network => c,
                _ => return self.penalize(auditor, "an audit demand with a forged commitment"),
            };
            // Each job's verdict names the demand and the job, alike for every juror.
            let mut h = blake3::Hasher::new();
            h.update(hash.as_bytes());
            h.update(&c.key().0);
            let demanded = Demanded {
                auditor,
                job: job.clone(),
                commitment: c,
                evidence_hash: *h.finalize().as_bytes(),
                timestamp_ms: demand.timestamp_ms,
            };
            self.on_demanded_job(demanded, now);
        }
    }

    fn on_demanded_job(&mut self, d: Demanded, now: Instant) {
        let c = d.commitment;
        let key = c.key();
        // A node that does not hold the beacon yet cannot tell who the auditor is: the
        // demand waits for it.
        let Some((seed, _)) = self.job_seed(&c) else {
            if !self.beacon_lost(&c) && self.audit.juries.held.len() < MAX_HELD_DEMANDS {
                self.audit.juries.held.push_back(d);
            }
            return;
        };
        // Only a timely demand: the evidence is kept a bounded time.
        let timely = c
            .beacon_epoch()
            .and_then(|e| self.final_time(e))
            .is_some_and(|t| now.saturating_duration_since(t) <= DEMAND_WINDOW);
        if !timely {
            return;
        }
        let validators: Vec<NodeId> = self.economy.ledger().ever_registered(c.stage).collect();
        if !is_challenged(&seed, &key, self.audit_rate())
            || auditor_for(&seed, &key, c.worker, &validators) != Some(d.auditor)
        {
            // Not the assigned auditor: nobody's jurors fetch anything for it. (Not
            // penalised: a node that saw fewer registrations draws other auditors.)
            return;
        }
        if c.worker == self.me {
            // Ours: the jurors will ask, so the round's evidence stays a while.
            if self.audit.juries.kept.len() < MAX_KEPT_FOR_DEMANDS
                || self.audit.juries.kept.contains_key(&c.round)
            {
                self.audit.juries.kept.insert(c.round, now + DEMAND_KEEP);
            }
            return;
        }
        let me = self.me;
        if !self.is_juror(&me)
            || self.economy.ledger().has_verdict(&key.0)
            || self.audit.open.contains_key(&key)
            || self.audit.juries.queue.len() >= MAX_JURY_QUEUE
            || !self.audit.juries.judged.insert(key)
        {
            return;
        }
        self.audit.juries.queue.push_back(d);
        self.start_juries(now);
    }

    /// Starts judging queued demands while fewer than `MAX_JURIES` are in progress.
    fn start_juries(&mut self, now: Instant) {
        let mut running = self
            .audit
            .open
            .values()
            .filter(|o| o.jury.is_some())
            .count();
        while running < MAX_JURIES {
            let Some(d) = self.audit.juries.queue.pop_front() else {
                return;
            };
            let key = d.commitment.key();
            if self.audit.open.contains_key(&key) || self.economy.ledger().has_verdict(&key.0) {
                continue;
            }
            let jury = Jury {
                auditor: d.auditor,
                timestamp_ms: d.timestamp_ms,
                evidence_hash: d.evidence_hash,
                attempts: 1,
                retry_at: None,
            };
            self.audit.open.insert(
                key,
                Open {
                    job: d.job,
                    commitment: d.commitment,
                    inputs: None,
                    weights: None,
                    asked: false,
                    opened: now,
                    jury: Some(jury),
                    served: None,
                },
            );
            running += 1;
            self.ask_evidence(d.commitment.worker);
        }
    }

    /// Demands that waited for their beacon epoch, now final here.
    pub(super) fn retry_held_demands(&mut self, now: Instant) {
        for d in std::mem::take(&mut self.audit.juries.held) {
            self.on_demanded_job(d, now);
        }
    }

    /// Our audits still without the worker's evidence `DEMAND_AFTER` after they opened end
    /// refused, and the committee is asked to judge them. The audit does not go on beside
    /// the jury: a job demanded and also convicted by our replay would carry two verdicts of
    /// different evidence, and ledgers that applied one or the other would differ.
    fn demand_overdue(&mut self, now: Instant) {
        let overdue: Vec<JobKey> = self
            .audit
            .open
            .iter()
            .filter(|(_, o)| o.jury.is_none() && o.weights.is_none())
            .filter(|(_, o)| now.saturating_duration_since(o.opened) >= DEMAND_AFTER)
            .map(|(k, _)| *k)
            .collect();
        let mut workers = Vec::new();
        for key in overdue {
            let Some(open) = self.audit.open.remove(&key) else {
                continue;
            };
            let why = format!("refused: no evidence within {} s", DEMAND_AFTER.as_secs());
            self.audit_event(&open.commitment, key, why, now);
            workers.push(open.commitment.worker);
            self.queue_demand(open.job);
        }
        self.flush_demands(now);
        workers.dedup();
        for worker in workers {
            self.ask_evidence(worker);
        }
    }

    /// A juror's attempt got no evidence: true if it tries again later.
    pub(super) fn retry_jury(&mut self, key: JobKey, now: Instant) -> bool {
        let Some(open) = self.audit.open.get_mut(&key) else {
            return false;
        };
        let Some(jury) = open.jury.as_mut() else {
            return false;
        };
        if jury.attempts >= JURY_ATTEMPTS {
            return false;
        }
        jury.attempts += 1;
        jury.retry_at = Some(now + JURY_RETRY);
        open.asked = false;
        open.inputs = None;
        let worker = open.commitment.worker;
        self.ask_evidence(worker);
        true
    }

    /// Jurors whose next attempt is due ask again; overdue audits are demanded.
    pub(super) fn poll_juries(&mut self, now: Instant) {
        self.demand_overdue(now);
        self.flush_demands(now);
        self.start_juries(now);
        let mut due = Vec::new();
        for open in self.audit.open.values_mut() {
            if let Some(j) = open.jury.as_mut()
                && j.retry_at.is_some_and(|t| t <= now)
            {
                j.retry_at = None;
                due.push(open.commitment.worker);
            }
        }
        due.dedup();
        for worker in due {
            self.ask_evidence(worker);
        }
    }

    /// When a juror's next attempt, an audit's demand, or the next demand out is due.
    pub(super) fn jury_timeout(&self) -> Option<Instant> {
        let j = &self.audit.juries;
        let flush = j.outbox.due(self.last_now, DEMAND_EVERY);
        self.audit
            .open
            .values()
            .filter_map(|o| match o.jury {
                Some(j) => j.retry_at,
                None if o.weights.is_none() => Some(o.opened + DEMAND_AFTER),
                None => None,
            })
            .chain(flush)
            .min()
    }

    /// A juror's check ended: a verdict to propose and vote for, or one to refuse.
    pub(super) fn jury_decided(&mut self, open: &Open, end: &End, now: Instant) {
        let Some(jury) = open.jury else { return };
        let c = open.commitment;
        let key = c.key();
        // A replay in another determinism class cannot convict (issue 15: another class
        // only escalates); the worker served, so the demand fails here. Tokens that are not
        // the genesis text they name convict in any class.
        let unserved = match end {
            End::Passed | End::Escalated => false,
            End::Guilty => self.job_log.class().job_bits_comparable(&c.class),
            End::NotTheText(_) | End::Refused(_) => true,
        };
        let time_ms = self.unix_ms(now);
        if unserved {
            self.economy.jury_found(
                VerifiedVerdict {
                    job: key.0,
                    offender: c.worker,
                    beneficiary: jury.auditor,
                    evidence_hash: jury.evidence_hash,
                    timestamp_ms: jury.timestamp_ms,
                },
                time_ms,
            );
        } else {
            self.economy.jury_cleared(key.0);
        }
        self.start_juries(now);
        self.events.push_back(NodeEvent::Jury {
            stage: usize::from(c.stage),
            round: c.round,
            worker: c.worker.to_string(),
            auditor: jury.auditor.to_string(),
            job: hex::encode(key.0),
            guilty: unserved,
            outcome: end.to_string(),
            time_ms,
        });
    }

    /// Verdicts an epoch finalized: the live ledger applies those it has not (a juror's
    /// verdict is applied only here; a replay verdict a node missed, likewise).
    pub(super) fn apply_finalized_verdicts(
        &mut self,
        link: &crate::finality::ChainLink,
        now: Instant,
    ) {
        for item in &link.body.items {
            let crate::finality::ItemWire::Verdict(v) = item else {
                continue;
            };
            match self.economy.apply_verdict(v) {
                Ok(true) => {
                    let time_ms = self.unix_ms(now);
                    self.events.push_back(NodeEvent::Ledger {
                        applied: hex::encode(v.job),
                        reward: 0,
                        kind: Some("verdict: finalized".into()),
                        state_hash: hex::encode(self.economy.state_hash()),
                        time_ms,
                    });
                }
                Ok(false) => {}
                Err(e) => self.warn(format!("a finalized verdict: {e}"), now),
            }
        }
    }
}
