//! Job commitments in the running pipeline (verification by recomputation, issue 15).
//!
//! For every forward and backward pass its engine runs, a replica signs a
//! [`JobCommitment`]: the weights, input and upstream hashes the engine attests, and the hash
//! of the tensor it sends on, as its receiver unpacks it. The commitment travels with the
//! tensor ([`PipeRequest`]); the receiver refuses a tensor its sender did not commit to, and
//! countersigns the hash it received ([`PipeAnswer`]), which the worker keeps. The log of a
//! replica's commitments is what its round commitment chains and what auditors sample.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use neuroshard_audit::{
    CommitError, Countersign, DeterminismClass, JobCommitment, JobKind, NO_HASH, SignedJob,
    countersign, verify_countersigned, verify_job,
};
use neuroshard_proof::{NodeId, Receipt, Signed};

use super::{JobHashes, NodeCore};
use crate::pipeline::{JobDone, Refusal};
use crate::wire::{MicroBatchId, Msg, PipeRequest};

/// Commitments a replica keeps at most (oldest dropped): a round of H steps × m
/// micro-batches signs 2·H·m, so this holds the last rounds of any sensible schedule.
pub const MAX_LOGGED_JOBS: usize = 4096;
/// Finished jobs whose output waits to be sent, at most (a forgotten micro-batch's never is).
const MAX_AWAITING: usize = 256;
/// Receivers remembered per job: a failover tries a few replicas, never many.
const MAX_TAKERS: usize = 8;

type JobId = (MicroBatchId, JobKind);

/// One of this replica's commitments.
#[derive(Debug, Clone)]
pub struct Logged {
    pub job: SignedJob,
    pub commitment: JobCommitment,
    /// The receiver's acknowledgement of exactly the committed output (none for a job that
    /// sends nothing, or until its receiver answered).
    pub countersign: Option<Signed<Countersign>>,
}

/// This replica's commitments, in the order it signed them.
#[derive(Debug)]
pub struct JobLog {
    class: DeterminismClass,
    awaiting: VecDeque<(JobId, JobHashes)>,
    signed: BTreeMap<JobId, Logged>,
    order: VecDeque<JobId>,
    /// The receivers that countersigned each logged job's output (a failover sends it to
    /// more than one).
    takers: BTreeMap<JobId, BTreeSet<NodeId>>,
    /// Jobs that ran again, with the receivers that had countersigned their earlier output and
    /// the round it named: those receivers counted the job there, and count it in no other.
    recomputed: BTreeMap<JobId, (BTreeSet<NodeId>, u64)>,
}

impl JobLog {
    pub fn new(class: DeterminismClass) -> Self {
        Self {
            class,
            awaiting: VecDeque::new(),
            signed: BTreeMap::new(),
            order: VecDeque::new(),
            takers: BTreeMap::new(),
            recomputed: BTreeMap::new(),
        }
    }

    /// Signed commitments of `round`, in the order they were signed.
    pub fn round(&self, round: u64) -> Vec<&Logged> {
        self.order
            .iter()
            .filter_map(|id| self.signed.get(id))
            .filter(|l| l.commitment.round == round)
            .collect()
    }

    /// The class this replica's commitments name.
    pub fn class(&self) -> DeterminismClass {
        self.class
    }

    /// Every commitment held, in the order signed.
    pub fn iter(&self) -> impl Iterator<Item = &Logged> {
        self.order.iter().filter_map(|id| self.signed.get(id))
    }

    pub fn len(&self) -> usize {
        self.signed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.signed.is_empty()
    }

    /// A job that ran again (recomputed after a failure) is committed afresh.
    fn forget(&mut self, id: &JobId) {
        let Some(old) = self.signed.remove(id) else {
            return;
        };
        self.order.retain(|o| o != id);
        match self.takers.remove(id) {
            Some(takers) => {
                if self.recomputed.len() >= MAX_LOGGED_JOBS {
                    self.recomputed.pop_first();
                }
                self.recomputed.insert(*id, (takers, old.commitment.round));
            }
            None => {
                self.recomputed.remove(id);
            }
        }
    }

    /// `by` countersigned job `id`'s output (checked by the caller).
    fn taken_by(&mut self, id: &JobId, by: NodeId) {
        if self.signed.contains_key(id) {
            let takers = self.takers.entry(*id).or_default();
            if takers.len() < MAX_TAKERS {
                takers.insert(by);
            }
        }
    }

    /// Whether `to` took an earlier output of job `id` that named another round than
    /// `round`: it counts a job once, in the first round named, so it owes no tally for this.
    pub fn counted_before(&self, id: &JobId, to: NodeId, round: u64) -> bool {
        self.recomputed
            .get(id)
            .is_some_and(|(by, r)| by.contains(&to) && *r != round)
    }

    fn log(&mut self, id: JobId, logged: Logged) {
        if self.signed.insert(id, logged).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_LOGGED_JOBS {
            if let Some(old) = self.order.pop_front() {
                self.signed.remove(&old);
                self.takers.remove(&old);
            }
        }
    }
}

/// Why a pipeline request's commitment was refused.
#[derive(Debug, thiserror::Error)]
pub enum CommitRefusal {
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("the commitment is signed by {worker}, the message came from {from}")]
    NotTheSender { worker: NodeId, from: NodeId },
    #[error("the commitment is for another network")]
    OtherNetwork,
    #[error("the commitment names stage {got}, the sender's is {want}")]
    OtherStage { got: u16, want: u16 },
    #[error("the commitment is for another micro-batch or job kind")]
    OtherJob,
    #[error(transparent)]
    Payload(#[from] Refusal),
    #[error("the message carries no tensor a job produced")]
    NoOutput,
    #[error("the commitment names epoch {got}, more than two before ours ({head})")]
    StaleEpoch { got: u64, head: u64 },
}

impl CommitRefusal {
    /// Whether the sender is to blame: a stale epoch may be an honest sender's lag.
    pub fn blames_sender(&self) -> bool {
        !matches!(self, Self::StaleEpoch { .. })
    }
}

pub(super) fn job_kind(msg: &Msg) -> JobKind {
    match msg {
        Msg::Forward { .. } => JobKind::Forward,
        Msg::Backward { .. } => JobKind::Backward,
    }
}

impl NodeCore {
    /// This replica's signed job commitments.
    pub fn job_log(&self) -> &JobLog {
        &self.job_log
    }

    /// The engine's hashes of a finished job: a job that sends nothing (the embedding
    /// stage's backward pass) is committed at once, the others when their output is sent.
    pub(super) fn note_job_hashes(&mut self, done: &JobDone, hashes: JobHashes) {
        let id = match done {
            JobDone::Forward { mb, .. } => (*mb, JobKind::Forward),
            JobDone::Backward {
                mb,
                input_grad: None,
                ..
            } => {
                let id = (*mb, JobKind::Backward);
                self.job_log.forget(&id);
                let logged = self.sign_job(id, hashes, NO_HASH);
                self.job_log.log(id, logged);
                return;
            }
            JobDone::Backward { mb, .. } => (*mb, JobKind::Backward),
            _ => return,
        };
        let log = &mut self.job_log;
        log.forget(&id);
        log.awaiting.retain(|(a, _)| *a != id);
        log.awaiting.push_back((id, hashes));
        while log.awaiting.len() > MAX_AWAITING {
            log.awaiting.pop_front();
        }
    }

    fn sign_job(&self, (mb, kind): JobId, h: JobHashes, output_hash: [u8; 32]) -> Logged {
        let commitment = JobCommitment {
            network: self.network,
            worker: self.me,
            stage: u16::try_from(self.stage).unwrap_or(u16::MAX),
            round: self.rounds.syncer.round(),
            step: h.step,
            micro_batch: mb.into(),
            kind,
            class: self.job_log.class,
            weights_hash: h.weights,
            input_hash: h.input,
            upstream_hash: h.upstream,
            output_hash,
            grads_hash: h.grads,
            epoch: self.finalized_epoch(),
        };
        Logged {
            job: commitment.sign(&self.identity),
            commitment,
            countersign: None,
        }
    }

    /// Signs our offer of `round` (blob `blob`) as a job and logs it with the jobs of the round
    /// before, whose list auditors ask for: the round its jobs carry. None when `round` is
    /// not the one after ours (the syncer then refuses the offer anyway).
    pub(super) fn sign_offer(
        &mut self,
        round: u64,
        blob: [u8; 32],
        h: &crate::compute::OfferHashes,
    ) -> Option<SignedJob> {
        let jobs_round = round.checked_sub(1)?;
        let jobs: Vec<[u8; 32]> = self
            .job_log
            .round(jobs_round)
            .into_iter()
            .filter(|l| l.commitment.kind != JobKind::Offer)
            .map(|l| l.job.payload_hash())
            .collect();
        let claims = neuroshard_audit::OfferClaims {
            step: h.step,
            class: self.job_log.class,
            weights: h.weights,
            outer: h.outer,
            blob,
            round_state: neuroshard_audit::round_state_hash(&h.outer, &h.adamw, &jobs),
            epoch: self.finalized_epoch(),
        };
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let commitment = JobCommitment::offer(self.network, self.me, stage, jobs_round, claims);
        let id = (commitment.micro_batch.into(), JobKind::Offer);
        let logged = Logged {
            job: commitment.sign(&self.identity),
            commitment,
            countersign: None,
        };
        let job = logged.job.clone();
        self.job_log.forget(&id);
        self.job_log.log(id, logged);
        Some(job)
    }

    /// The commitment that travels with `msg`: signed when the job's output is first sent,
    /// the same one when it is sent again (a retry, another replica, a repeated answer).
    pub(super) fn commitment_for(&mut self, msg: &Msg) -> Result<SignedJob, CommitRefusal> {
        let id = (msg.mb(), job_kind(msg));
        let head = self.finalized_epoch();
        if let Some(l) = self.job_log.signed.get(&id) {
            if self.long_final(l.commitment.epoch).is_none() {
                return Ok(l.job.clone());
            }
            // Sent again after its epoch went stale: the same job, committed at ours (its
            // receiver would refuse the old one).
            let commitment = JobCommitment {
                epoch: head,
                ..l.commitment
            };
            let logged = Logged {
                job: commitment.sign(&self.identity),
                commitment,
                countersign: None,
            };
            let job = logged.job.clone();
            self.job_log.signed.insert(id, logged);
            return Ok(job);
        }
        let output = self
            .pipeline
            .payload_hash(msg)?
            .ok_or(CommitRefusal::NoOutput)?;
        let log = &mut self.job_log;
        let at = log.awaiting.iter().position(|(a, _)| *a == id);
        let Some((_, hashes)) = at.and_then(|i| log.awaiting.remove(i)) else {
            return Err(CommitRefusal::OtherJob);
        };
        let logged = self.sign_job(id, hashes, output);
        let job = logged.job.clone();
        self.job_log.log(id, logged);
        Ok(job)
    }

    /// A request's commitment, checked against the message and the sender: signed by the
    /// sender, for our network, the sender's stage, this micro-batch and kind, and naming as
    /// output exactly the tensor that arrived. Returns our countersignature and the commitment.
    pub(super) fn check_commitment(
        &self,
        from: NodeId,
        req: &PipeRequest,
    ) -> Result<(Signed<Countersign>, JobCommitment), CommitRefusal> {
        let c = verify_job(&req.job)?;
        if c.worker != from {
            return Err(CommitRefusal::NotTheSender {
                worker: c.worker,
                from,
            });
        }
        if c.network != self.network {
            return Err(CommitRefusal::OtherNetwork);
        }
        // An epoch long final would let the worker know its challenges before it signed.
        if let Some(head) = self.long_final(c.epoch) {
            return Err(CommitRefusal::StaleEpoch { got: c.epoch, head });
        }
        let want = self
            .pipeline
            .sender_stage(&req.msg)
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(u16::MAX);
        if c.stage != want {
            return Err(CommitRefusal::OtherStage { got: c.stage, want });
        }
        if c.micro_batch != req.msg.mb().into() || c.kind != job_kind(&req.msg) {
            return Err(CommitRefusal::OtherJob);
        }
        let received = self
            .pipeline
            .payload_hash(&req.msg)?
            .ok_or(CommitRefusal::NoOutput)?;
        Ok((countersign(&self.identity, &req.job, received)?, c))
    }

    /// The receiver's answer to our request: its countersignature must acknowledge exactly
    /// our commitment, signed by the replica we sent to. A receiver that accepts without one,
    /// or with another, is penalised: the worker then holds no proof of delivery.
    pub(super) fn on_countersign(
        &mut self,
        to: NodeId,
        msg: (MicroBatchId, JobKind),
        (cs, tally): (Option<Signed<Countersign>>, Option<Receipt>),
        now: Instant,
    ) {
        let Some(logged) = self.job_log.signed.get_mut(&msg) else {
            return;
        };
        let round = logged.commitment.round;
        let checked = cs.ok_or(CommitRefusal::OtherJob).and_then(|cs| {
            let (_, signer) = verify_countersigned(&logged.job, &cs)?;
            if signer != to {
                return Err(CommitRefusal::NotTheSender {
                    worker: signer,
                    from: to,
                });
            }
            Ok(cs)
        });
        match checked {
            Ok(cs) => {
                logged.countersign = Some(cs);
                self.job_log.taken_by(&msg, to);
            }
            Err(e) => {
                let reason = format!("accepted our output without countersigning it: {e}");
                self.penalize(to, reason.clone());
                self.warn(format!("{to}: {reason}"), now);
                return;
            }
        }
        // Its tally of our jobs of the round, which our proof of the round needs.
        let kept = match tally {
            Some(t) => self
                .economy
                .on_work_tally(to, round, t)
                .map_err(|e| e.to_string()),
            // It took this job's output before, under the round that named: no penalty.
            None if self.job_log.counted_before(&msg, to, round) => Ok(()),
            None => Err("no work tally".to_string()),
        };
        if let Err(e) = kept {
            let reason = format!("accepted our output without a valid work tally: {e}");
            self.penalize(to, reason.clone());
            self.warn(format!("{to}: {reason}"), now);
        }
    }
}

#[cfg(test)]
mod recompute_tests {
    use neuroshard_audit::{IsaLevel, MicroBatchRef};
    use neuroshard_proof::fixtures::test_identity;

    use super::*;

    fn class() -> DeterminismClass {
        DeterminismClass {
            build: [0; 32],
            isa: IsaLevel::X86V3,
            cache_bytes: [32 << 10, 1 << 20, 32 << 20],
            micro_batches: 2,
        }
    }

    /// Worker 0's forward of one micro-batch, committed under `round`.
    fn logged(round: u64) -> Logged {
        let worker = test_identity(0);
        let commitment = JobCommitment {
            network: [9; 32],
            worker: worker.node_id(),
            stage: 1,
            round,
            step: 3,
            micro_batch: MicroBatchRef {
                origin: test_identity(5).node_id(),
                step: 2,
                index: 0,
            },
            kind: JobKind::Forward,
            class: class(),
            weights_hash: [1; 32],
            input_hash: [2; 32],
            upstream_hash: NO_HASH,
            output_hash: [round as u8; 32],
            grads_hash: NO_HASH,
            epoch: 0,
        };
        Logged {
            job: commitment.sign(&worker),
            commitment,
            countersign: None,
        }
    }

    /// An honest worker recomputes a micro-batch after its round ended (its upstream failed
    /// over to it again) and sends it to a receiver that took its earlier output (here, either
    /// of the two it went to, the first before a failover). That receiver counted the job under
    /// the earlier round and signs no tally for it in the new one, where it may be the only
    /// job: the worker does not blame it. Any other silence it does.
    #[test]
    fn a_receiver_that_took_a_jobs_output_under_an_earlier_round_owes_no_tally_for_it() {
        let took = [test_identity(7), test_identity(9)];
        let other = test_identity(8).node_id();
        let mut log = JobLog::new(class());
        let mut first = logged(3);
        let received = first.commitment.output_hash;
        let id = (first.commitment.micro_batch.into(), JobKind::Forward);
        first.countersign = Some(countersign(&took[1], &first.job, received).unwrap());
        log.log(id, first);
        for t in &took {
            log.taken_by(&id, t.node_id());
        }
        assert!(!log.counted_before(&id, took[0].node_id(), 3));
        // Recomputed, and committed under round 4.
        log.forget(&id);
        log.log(id, logged(4));
        for t in &took {
            assert!(log.counted_before(&id, t.node_id(), 4));
        }
        assert!(
            !log.counted_before(&id, other, 4),
            "another receiver owes one"
        );
        // Run again within round 4 and never countersigned: no one is excused any more.
        log.forget(&id);
        log.log(id, logged(4));
        assert!(!log.counted_before(&id, took[0].node_id(), 4));
    }
}
