//! Audits of co-replicas' jobs (verification by recomputation, issue 15).
//!
//! A job's challenges are drawn from the finalized ledger epoch its commitment names plus
//! `BEACON_LAG` (`core/beacon.rs`): no worker picks its auditor or which of its jobs are
//! replayed, and every node can check the draw. When the stage enters round r + 2, each
//! replica asks its live registered co-replicas for their signed commitments of r, and for
//! each job the seed assigns to it (as soon as the job's beacon epoch is final) fetches the
//! job's inputs and weights from the worker, replays it on its engine and compares the bits.
//! A mismatch is a fraud proof; a worker that does not serve the evidence of a challenged job
//! is reported as refusing.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use neuroshard_audit::{
    AuditRate, EvidenceLimits, JobCommitment, JobInputs, JobKey, JobKind, SignedJob, auditor_for,
    check_provenance, is_challenged, verify_job,
};
use neuroshard_proof::{Canonical, Hash32, NodeId};

use super::beacon::MAX_EPOCHS_AHEAD;
use super::fraud::GenesisOf;
use super::{EngineJob, NodeCore, Pending, SharedBlob, Token, TransferError, Transmit, blob_hash};
use crate::events::NodeEvent;
use crate::wire::{AuditAnswer, AuditRequest};

/// Challenges one replica takes on per co-replica and round at most (a worker cannot make
/// its auditors replay without end by listing jobs).
pub const MAX_AUDITS_PER_WORKER: usize = 64;
/// Audits of one worker whose evidence is asked for at once, at most.
const MAX_ASKED_PER_WORKER: usize = 4;
/// Rounds before the current one whose evidence and offered weights a replica keeps at least:
/// round r is audited as the stage enters round r + 2, so its evidence is needed until the
/// stage enters r + 3 (and longer while its jobs' beacon epochs are not final).
pub(super) const KEEP_ROUNDS: u64 = 2;
/// Commitments an auditor holds while their beacon epochs are not final, at most.
pub(super) const MAX_AWAITING_BEACON: usize = 8192;

/// What an audit of ours waits for.
#[derive(Debug, Clone)]
pub(super) struct Open {
    pub(super) job: SignedJob,
    pub(super) commitment: JobCommitment,
    pub(super) inputs: Option<JobInputs>,
    /// The weights the worker served, kept to serve them on with a fraud proof.
    pub(super) weights: Option<SharedBlob>,
    /// Whether its evidence was asked for (audits wait their turn per worker).
    pub(super) asked: bool,
    /// When the audit opened (its beacon was final here).
    pub(super) opened: Instant,
    /// Set when this node judges a demand as a juror, not audits.
    pub(super) jury: Option<super::jury::Jury>,
    /// The worker's signed statement that it served us the evidence: our fee's claim.
    pub(super) served: Option<neuroshard_audit::SignedServed>,
}

/// How an audit (or a juror's check) ended.
#[derive(Debug, Clone)]
pub(super) enum End {
    Passed,
    /// The replay gave other bits than the commitment.
    Guilty,
    /// The first stage's tokens are not the genesis text they name (no replay: any class
    /// can tell).
    NotTheText(String),
    /// The worker did not serve evidence the job replays on (or we could not replay it).
    Refused(String),
    /// Our replay disagrees, but we are of another determinism class than the job: we
    /// cannot tell a cheat from our own rounding, so the job goes to the committee's
    /// validators of its class (a demand), never to a fraud report (whose checkers of the
    /// job's class would slash us as a false accuser when the worker was honest).
    Escalated,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Passed => write!(f, "passed"),
            End::Guilty => write!(f, "guilty"),
            End::NotTheText(why) => write!(f, "guilty: {why}"),
            End::Refused(why) => write!(f, "refused: {why}"),
            End::Escalated => write!(f, "escalated: replayed in another determinism class"),
        }
    }
}

/// A signed job commitment, with what its signature was checked to say.
#[derive(Debug, Clone)]
pub(super) struct Committed {
    pub(super) job: SignedJob,
    pub(super) commitment: JobCommitment,
}

/// Audit state of one replica: the audits in progress and those waiting for their beacon,
/// and the weights it serves to its own auditors.
#[derive(Debug, Default)]
pub(super) struct AuditState {
    /// The round the stage was at when last looked.
    seen_round: Option<u64>,
    pub(super) open: BTreeMap<JobKey, Open>,
    pub(super) awaiting: BTreeMap<JobKey, Committed>,
    /// Jobs whose challenge was decided here (audited or not picked), the latest first out.
    pub(super) done: crate::recent::RecentSet<JobKey, MAX_DONE>,
    /// Commitments of jobs whose output we received, kept until their beacon is final: a
    /// challenged one goes to its auditor, whatever its worker lists.
    pub(super) noticed: std::collections::VecDeque<Committed>,
    /// Challenges taken per (worker, round), against `MAX_AUDITS_PER_WORKER`.
    pub(super) taken: BTreeMap<(NodeId, u64), usize>,
    /// Evidence requests of our auditors that came before the job's beacon was final here.
    pub(super) deferred: Vec<(NodeId, Token, AuditRequest)>,
    /// The first round whose evidence is still kept.
    pub(super) kept_from: u64,
    /// When each recent epoch was finalized here.
    pub(super) final_times: std::collections::VecDeque<(u64, Instant)>,
    /// Beacons set by unit tests (no epochs finalize there).
    #[cfg(test)]
    pub(super) test_beacons: BTreeMap<u64, Hash32>,
    /// The committee set by unit tests (their cores finalize nothing).
    #[cfg(test)]
    pub(super) test_committee: Vec<NodeId>,
    /// Engine jobs of ours: evidence to serve (for the request token) or a replay.
    pub(super) engine: HashMap<Token, EngineFor>,
    blobs: HashMap<Token, JobKey>,
    /// Weights served to auditors, by round.
    pub(super) offered: BTreeMap<u64, Vec<Hash32>>,
    /// The optimizer step each round began at (what its evidence is filed under).
    pub(super) round_start: BTreeMap<u64, u64>,
    /// Demands judged here, and rounds kept for jurors.
    pub(super) juries: super::jury::JuryState,
    /// Fee claims to send, and (on the committee) claims waiting for an epoch.
    pub(super) fees: super::fees::FeeState,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum EngineFor {
    /// Evidence to serve for `request`, with the statement that we served it.
    Evidence {
        request: Token,
        round: u64,
        served: neuroshard_audit::Served,
    },
    Replay(JobKey),
    Forget,
}

/// Decided challenges an auditor remembers (a job listed and noticed is audited once).
const MAX_DONE: usize = 16_384;

impl AuditState {
    /// Whether the blob `hash` is offered for a round's audits.
    pub(super) fn offers(&self, hash: &Hash32) -> bool {
        self.offered.values().any(|hs| hs.contains(hash))
    }

    /// Whether the blob fetch `token` is ours.
    pub(super) fn fetching(&self, token: Token) -> bool {
        self.blobs.contains_key(&token)
    }

    /// Whether the job was audited, is being audited, or waits for its beacon here.
    pub(super) fn known(&self, key: &JobKey) -> bool {
        self.open.contains_key(key) || self.awaiting.contains_key(key) || self.done.contains(key)
    }
}

impl NodeCore {
    pub(super) fn audit_rate(&self) -> AuditRate {
        AuditRate {
            per_million: self.settings.audit.per_million,
        }
    }

    /// The validators the stage's audits are assigned among: every replica that registered
    /// for it (see `LedgerState::ever_registered`).
    pub(super) fn validators(&self) -> Vec<NodeId> {
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        self.economy.ledger().ever_registered(stage).collect()
    }

    /// Called whenever the stage may have moved to a new round: starts the audits of the
    /// round before the one that just ended, and drops evidence no audit needs any more.
    pub(super) fn poll_audits(&mut self, now: Instant) {
        let round = self.rounds.syncer.round();
        if self.audit.seen_round == Some(round) {
            return;
        }
        let steps = self.pipeline.steps_done();
        self.audit.round_start.entry(round).or_insert(steps);
        let Some(seen) = self.audit.seen_round.replace(round) else {
            return;
        };
        self.forget_audited(now);
        if round <= seen || self.audit_rate().per_million == 0 {
            return;
        }
        if let Some(audited) = round.checked_sub(KEEP_ROUNDS) {
            self.request_lists(audited, now);
        }
    }

    fn request_lists(&mut self, round: u64, _now: Instant) {
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let live: Vec<NodeId> = self.live_co_replicas().iter().copied().collect();
        for peer in live {
            let token = self.token();
            self.requests
                .insert(token, Pending::AuditList { peer, round });
            let req = AuditRequest::List {
                network: self.network,
                stage,
                round,
            };
            self.transmits.push_back(Transmit::Request {
                to: peer,
                token,
                data: req.to_canonical_bytes(),
            });
        }
    }

    /// A worker's list of its commitments of `round`: each must be its own, for this
    /// network, stage and round; the seed picks the ones this replica replays.
    pub(super) fn on_audit_list(
        &mut self,
        peer: NodeId,
        round: u64,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let jobs = match super::decode_answer::<AuditAnswer>(result) {
            Ok(AuditAnswer::List(jobs)) => jobs,
            Ok(AuditAnswer::Refused(why)) => {
                self.warn(
                    format!("{peer} refused its job list of round {round}: {why}"),
                    now,
                );
                return;
            }
            Ok(_) => return self.penalize(peer, "an audit list answered with evidence"),
            Err(e) => {
                self.warn(format!("{peer}'s job list of round {round}: {e}"), now);
                return;
            }
        };
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        for job in jobs {
            let c = match verify_job(&job) {
                Ok(c) if c.worker == peer && c.network == self.network => c,
                _ => return self.penalize(peer, "an audit list with another's commitment"),
            };
            if c.stage != stage || c.round != round {
                return self.penalize(peer, "an audit list with another round's commitment");
            }
            let key = c.key();
            if self.audit.known(&key) {
                continue;
            }
            self.consider_challenge(Committed { job, commitment: c }, now);
        }
    }

    /// Opens the audit of a co-replica's job if its beacon challenges it and names us; holds
    /// it while the beacon epoch is not final here.
    pub(super) fn consider_challenge(&mut self, w: Committed, now: Instant) {
        let c = w.commitment;
        let key = c.key();
        let Some((seed, _)) = self.job_seed(&c) else {
            if self.beacon_lost(&c) {
                return;
            }
            // A commitment naming an epoch far beyond ours was not signed when it claims:
            // its beacon would come after the evidence is gone.
            let ahead = c.epoch.saturating_sub(self.finalized_epoch());
            if ahead > MAX_EPOCHS_AHEAD {
                let why = format!("refused: names epoch {}, {ahead} past ours", c.epoch);
                return self.audit_event(&c, key, why, now);
            }
            if self.audit.awaiting.len() < MAX_AWAITING_BEACON {
                self.audit.awaiting.insert(key, w);
            }
            return;
        };
        let (rate, validators) = (self.audit_rate(), self.validators());
        self.audit.done.insert(key);
        if !is_challenged(&seed, &key, rate)
            || auditor_for(&seed, &key, c.worker, &validators) != Some(self.me)
        {
            return;
        }
        let taken = self.audit.taken.entry((c.worker, c.round)).or_insert(0);
        if *taken >= MAX_AUDITS_PER_WORKER {
            return;
        }
        *taken += 1;
        self.audit.open.insert(
            key,
            Open {
                job: w.job,
                commitment: c,
                inputs: None,
                weights: None,
                asked: false,
                opened: now,
                jury: None,
                served: None,
            },
        );
        self.ask_evidence(c.worker);
    }

    /// A co-replica's offer, checked to be its committed job; its challenge is considered
    /// like a noticed job's (we hold the commitment whatever the worker lists).
    pub(super) fn notice_offer(
        &mut self,
        from: NodeId,
        offer: &crate::sync::SyncOffer,
        now: Instant,
    ) -> Result<(), crate::sync::OfferCommitError> {
        let (commitment, job) = offer.commitment(from)?;
        // As for a job's receiver: an offer signed at an epoch whose beacon may be final
        // already would let its worker cheat only where it knows no audit comes.
        if let Some(head) = self.long_final(commitment.epoch) {
            let epoch = commitment.epoch;
            return Err(crate::sync::OfferCommitError::Stale { epoch, head });
        }
        let fresh = from != self.me && !self.audit.known(&commitment.key());
        if fresh && self.audit_rate().per_million > 0 {
            let job = job.clone();
            self.consider_challenge(Committed { job, commitment }, now);
        }
        Ok(())
    }

    /// Bytes of the blob a job's replay fetches: the stage's weights, and for an offer the
    /// outer state after them (at most three vectors of the stage's size and a header: θ₀,
    /// the outer momentum and the last aggregate). None when the inputs name an outer state
    /// no honest replica has, or the stage is unknown.
    pub(super) fn evidence_blob_bytes(&self, c: &JobCommitment, inputs: &JobInputs) -> Option<u64> {
        let weights = self.weights_bytes(c.stage);
        match (&inputs.input, c.kind) {
            _ if weights == 0 => None,
            (neuroshard_audit::StageData::Outer { len, .. }, JobKind::Offer) => {
                let most = weights.checked_mul(3)?.checked_add(64)?;
                (*len <= most).then(|| weights.checked_add(*len)).flatten()
            }
            (neuroshard_audit::StageData::Outer { .. }, _) | (_, JobKind::Offer) => None,
            _ => Some(weights),
        }
    }

    /// Asks `worker` for the evidence of our audits of its jobs not asked yet, keeping at
    /// most `MAX_ASKED_PER_WORKER` in progress: the audits of many jobs whose beacon came in
    /// one epoch would otherwise open more streams at once than a connection carries.
    pub(super) fn ask_evidence(&mut self, worker: NodeId) {
        let in_progress = self
            .audit
            .open
            .values()
            .filter(|o| o.asked && o.commitment.worker == worker)
            .count();
        let next: Vec<(JobKey, u64)> = self
            .audit
            .open
            .iter()
            .filter(|(_, o)| !o.asked && o.commitment.worker == worker)
            .filter(|(_, o)| o.jury.is_none_or(|j| j.retry_at.is_none()))
            .map(|(k, o)| (*k, o.commitment.round))
            .take(MAX_ASKED_PER_WORKER.saturating_sub(in_progress))
            .collect();
        for (key, round) in next {
            if let Some(o) = self.audit.open.get_mut(&key) {
                o.asked = true;
            }
            let token = self.token();
            self.requests.insert(
                token,
                Pending::AuditEvidence {
                    peer: worker,
                    job: key,
                },
            );
            let req = AuditRequest::Evidence {
                network: self.network,
                round,
                job: key,
            };
            self.transmits.push_back(Transmit::Request {
                to: worker,
                token,
                data: req.to_canonical_bytes(),
            });
        }
    }

    /// The worker's evidence for a job we audit: inputs that hash to the committed ones and
    /// fit one micro-batch, and the blob of its weights, which we fetch.
    pub(super) fn on_audit_evidence(
        &mut self,
        peer: NodeId,
        key: JobKey,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let Some(open) = self.audit.open.get(&key) else {
            return;
        };
        let c = open.commitment;
        let limits = self.evidence_limits();
        let (inputs, blob, len, served) = match super::decode_answer::<AuditAnswer>(result) {
            Ok(AuditAnswer::Evidence {
                inputs,
                weights_blob,
                weights_len,
                served,
            }) => (inputs, weights_blob, weights_len, served),
            Ok(AuditAnswer::Refused(why)) => {
                return self.end_audit(key, End::Refused(why), now);
            }
            Ok(AuditAnswer::List(_)) => {
                return self.end_audit(key, End::Refused("answered with a list".into()), now);
            }
            Err(e) => return self.end_audit(key, End::Refused(e.to_string()), now),
        };
        // A juror judges jobs of any stage: the weights are that stage's.
        let blob_bytes = self.evidence_blob_bytes(&c, &inputs);
        let why =
            if inputs.input.hash() != c.input_hash || inputs.upstream.hash() != c.upstream_hash {
                Some("inputs other than the committed ones".to_string())
            } else if let Err(e) = inputs.check_limits(&limits) {
                Some(format!("inputs: {e}"))
            } else if blob_bytes != Some(len) {
                Some(format!("{len} bytes of weights for {blob_bytes:?}"))
            } else if !self.served_to_me(&served, &c) {
                Some("no signed statement that it served us".to_string())
            } else {
                None
            };
        if let Some(why) = why {
            return self.end_audit(key, End::Refused(why), now);
        }
        // The first stage's tokens must be the genesis text they name; if they are not, that
        // alone convicts, with no weights and no replay.
        let provenance = (c.stage == 0 && c.kind != JobKind::Offer)
            .then(|| check_provenance(&inputs, &GenesisOf(self.data.as_ref())).err())
            .flatten();
        let jury = self.audit.open.get(&key).is_some_and(|o| o.jury.is_some());
        if let Some(open) = self.audit.open.get_mut(&key) {
            open.inputs = Some(inputs);
            open.served = Some(*served);
        }
        if let Some(why) = provenance {
            // A juror only votes; the fraud report is the assigned auditor's to file.
            if !jury {
                self.file_provenance_proof(key, now);
            }
            return self.end_audit(key, End::NotTheText(why.to_string()), now);
        }
        let token = self.token();
        self.audit.blobs.insert(token, key);
        self.transmits.push_back(Transmit::FetchBlob {
            from: peer,
            token,
            hash: blob,
            max: usize::try_from(len).unwrap_or(usize::MAX),
        });
    }

    /// Whether `served` is the worker's statement that it served us `c`'s evidence.
    fn served_to_me(&self, served: &neuroshard_audit::SignedServed, c: &JobCommitment) -> bool {
        served.signer().node_id() == c.worker
            && served.verify().is_ok_and(|s| {
                s.network == c.network
                    && s.job == c.key()
                    && s.worker == c.worker
                    && s.to == self.me
                    && s.input_hash == c.input_hash
            })
    }

    /// A blob fetched for an audit (None: not one of ours).
    pub(super) fn on_audit_blob(
        &mut self,
        token: Token,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) -> bool {
        let Some(key) = self.audit.blobs.remove(&token) else {
            return false;
        };
        let weights = match result {
            Ok(w) => w,
            Err(e) => {
                self.end_audit(key, End::Refused(format!("weights: {e}")), now);
                return true;
            }
        };
        let weights: SharedBlob = std::sync::Arc::new(weights);
        let Some(open) = self.audit.open.get_mut(&key) else {
            return true;
        };
        open.weights = Some(std::sync::Arc::clone(&weights));
        let Some(inputs) = open.inputs.clone() else {
            return true;
        };
        let commitment = open.commitment;
        // A juror replays a job of any stage: the spec is the job's stage's.
        let spec = if usize::from(commitment.stage) == self.stage {
            Some(self.rounds.spec)
        } else {
            self.stage_spec(commitment.stage)
        };
        let Some(spec) = spec else {
            self.end_audit(key, End::Refused("no such stage".into()), now);
            return true;
        };
        let job = EngineJob::Replay {
            spec,
            job: Box::new(commitment),
            inputs: Box::new(inputs),
            weights,
        };
        let t = self.engine(job);
        self.audit.engine.insert(t, EngineFor::Replay(key));
        true
    }

    /// Bytes of the weights of `stage` (a replica's own stage: the engine's count).
    pub(super) fn weights_bytes(&self, stage: u16) -> u64 {
        if usize::from(stage) == self.stage {
            return (self.rounds.numel as u64).saturating_mul(4);
        }
        self.stage_spec(stage).map_or(0, |spec| {
            let numel: usize = spec
                .param_specs(&self.settings.model)
                .iter()
                .map(|p| p.numel())
                .sum();
            (numel as u64).saturating_mul(4)
        })
    }

    /// One micro-batch of this network's shape.
    pub(super) fn evidence_limits(&self) -> EvidenceLimits {
        let rows = self
            .settings
            .batch
            .div_ceil(self.settings.micro_batches.max(1));
        EvidenceLimits {
            max_rows: u32::try_from(rows.saturating_mul(self.settings.seq)).unwrap_or(u32::MAX),
            dim: u32::try_from(self.settings.model.d_model).unwrap_or(u32::MAX),
        }
    }

    pub(super) fn end_audit(&mut self, key: JobKey, end: End, now: Instant) {
        if let End::Refused(_) = &end
            && self.retry_jury(key, now)
        {
            return;
        }
        let Some(open) = self.audit.open.remove(&key) else {
            return;
        };
        self.ask_evidence(open.commitment.worker);
        if open.jury.is_some() {
            return self.jury_decided(&open, &end, now);
        }
        match &end {
            End::Refused(_) => self.demand_evidence(&open.job, now),
            End::Escalated => {
                self.demand_evidence(&open.job, now);
                self.claim_fee(&open, now);
            }
            End::Passed | End::Guilty | End::NotTheText(_) => self.claim_fee(&open, now),
        }
        self.audit_event(&open.commitment, key, end.to_string(), now);
    }

    /// Reports how the audit of `c` ended.
    pub(super) fn audit_event(
        &mut self,
        c: &JobCommitment,
        key: JobKey,
        outcome: String,
        now: Instant,
    ) {
        let time_ms = self.unix_ms(now);
        let kind = match c.kind {
            JobKind::Forward => "forward",
            JobKind::Backward => "backward",
            JobKind::Offer => "offer",
        };
        self.events.push_back(NodeEvent::Audit {
            stage: self.stage,
            round: c.round,
            worker: c.worker.to_string(),
            job: hex::encode(key.0),
            kind: kind.into(),
            outcome,
            time_ms,
        });
    }

    /// An engine result for the audit module (false: not ours).
    pub(super) fn on_audit_engine(
        &mut self,
        token: Token,
        output: &super::EngineOutput,
        now: Instant,
    ) -> bool {
        let Some(what) = self.audit.engine.remove(&token) else {
            return false;
        };
        match (what, output) {
            (EngineFor::Replay(key), super::EngineOutput::Replayed(result)) => {
                let Some(open) = self.audit.open.get(&key) else {
                    return true;
                };
                let (c, jury) = (open.commitment, open.jury.is_some());
                let end = match result {
                    Ok(r) if r.output_hash == c.output_hash && r.grads_hash == c.grads_hash => {
                        End::Passed
                    }
                    // A juror only votes (its class decides how: `jury_decided`).
                    Ok(_) if jury => End::Guilty,
                    // The fraud report is the assigned auditor's, of the job's class.
                    Ok(r) if self.job_log.class().job_bits_comparable(&c.class) => {
                        let r = r.clone();
                        self.file_fraud_proof(key, &r, now);
                        End::Guilty
                    }
                    Ok(_) => End::Escalated,
                    Err(e) => End::Refused(e.to_string()),
                };
                self.end_audit(key, end, now);
            }
            (EngineFor::Forget, super::EngineOutput::EvidenceHeld { bytes, budget }) => {
                let time_ms = self.unix_ms(now);
                self.events.push_back(NodeEvent::Evidence {
                    bytes: *bytes,
                    budget: *budget,
                    audit_ms: None,
                    busy_ms: None,
                    time_ms,
                });
            }
            (
                EngineFor::Evidence {
                    request,
                    round,
                    served,
                },
                super::EngineOutput::Evidence(result),
            ) => {
                let answer = match result {
                    Ok(super::Evidence { inputs, weights }) => {
                        match crate::compute::decode_inputs(inputs) {
                            Ok(inputs) => {
                                let hash = blob_hash(weights);
                                self.offer_audit_blob(round, hash, std::sync::Arc::clone(weights));
                                let served = neuroshard_audit::Served {
                                    timestamp_ms: self.unix_ms(now),
                                    ..served
                                };
                                AuditAnswer::Evidence {
                                    inputs,
                                    weights_blob: hash,
                                    weights_len: weights.len() as u64,
                                    served: Box::new(neuroshard_proof::Signed::sign(
                                        &self.identity,
                                        &served,
                                    )),
                                }
                            }
                            Err(e) => AuditAnswer::Refused(e.to_string()),
                        }
                    }
                    Err(e) => AuditAnswer::Refused(e.to_string()),
                };
                self.transmits.push_back(Transmit::Respond {
                    token: request,
                    data: answer.to_canonical_bytes(),
                });
            }
            _ => {}
        }
        true
    }

    /// Serves `data` (weights) to auditors and checkers until `round`'s audits are over.
    pub(super) fn offer_audit_blob(&mut self, round: u64, hash: Hash32, data: SharedBlob) {
        let offered = self.audit.offered.entry(round).or_default();
        if !offered.contains(&hash) {
            offered.push(hash);
            self.transmits.push_back(Transmit::OfferBlob { hash, data });
        }
    }
}
