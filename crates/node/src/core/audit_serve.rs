//! The worker's side of audits: what it serves its auditors (its job list of a round, the
//! evidence of a challenged job) and the committee's jurors (`core/jury.rs`).

use std::time::Instant;

use neuroshard_audit::{SignedJob, auditor_for, is_challenged};
use neuroshard_proof::{Canonical, NodeId};

use super::audit::EngineFor;
use super::{EngineJob, NodeCore, Token, Transmit};
use crate::wire::{AuditAnswer, AuditRequest, MAX_LISTED_JOBS};

impl NodeCore {
    /// A co-replica audits us: a registered replica of this stage gets our commitments of a
    /// round; the evidence of a challenged job goes to the auditor its beacon names and to
    /// the ledger committee's validators.
    pub(super) fn on_audit_request(
        &mut self,
        from: NodeId,
        token: Token,
        req: AuditRequest,
        now: Instant,
    ) {
        if let AuditRequest::Notice(job) = req {
            return self.on_audit_notice(from, token, job, now);
        }
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let refuse = |why: &str| AuditAnswer::Refused(why.into()).to_canonical_bytes();
        // The committee's validators judge an auditor's demand (`core/jury.rs`): they get
        // the evidence of challenged jobs too. The assigned auditor gets it whether or not it
        // is registered now (auditors are drawn among every replica that ever registered: a
        // refusal here would only make it demand).
        let juror = self.is_juror(&from);
        let registered = self.economy.ledger().is_registered(&from, stage);
        match req {
            AuditRequest::List {
                network,
                stage: s,
                round,
            } => {
                let data = if !registered {
                    refuse("not a registered replica of this stage")
                } else if network != self.network || s != stage {
                    refuse("another network or stage")
                } else {
                    let jobs: Vec<SignedJob> = self
                        .job_log
                        .round(round)
                        .into_iter()
                        .take(MAX_LISTED_JOBS)
                        .map(|l| l.job.clone())
                        .collect();
                    AuditAnswer::List(jobs).to_canonical_bytes()
                };
                self.transmits.push_back(Transmit::Respond { token, data });
            }
            AuditRequest::Notice(_) => {}
            AuditRequest::Evidence {
                network,
                round,
                job,
            } => {
                let logged = self
                    .job_log
                    .round(round)
                    .into_iter()
                    .find(|l| l.commitment.key() == job)
                    .map(|l| l.commitment);
                let seed = logged.as_ref().and_then(|c| self.job_seed(c)).map(|s| s.0);
                if let (true, Some(c), None) = (network == self.network, logged, seed)
                    && !self.beacon_lost(&c)
                    && (registered || juror)
                {
                    // Our auditor holds an epoch we do not yet: answered once we do.
                    let req = AuditRequest::Evidence {
                        network,
                        round,
                        job,
                    };
                    return self.defer_evidence_request(from, token, req);
                }
                let why = match (network == self.network, seed, logged) {
                    (false, ..) => Some("another network"),
                    (_, _, None) => Some("no such job"),
                    (_, None, _) => Some("that job's beacon epoch is gone here"),
                    (_, Some(seed), Some(_)) if !is_challenged(&seed, &job, self.audit_rate()) => {
                        Some("that job is not challenged")
                    }
                    // Only the auditor the seed names gets the evidence (weights are megabytes
                    // read from disk): a co-replica cannot make this one serve every job.
                    (_, Some(seed), Some(_))
                        if !juror
                            && auditor_for(&seed, &job, self.me, &self.validators())
                                != Some(from) =>
                    {
                        Some("not this job's auditor")
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    let data = refuse(why);
                    self.transmits.push_back(Transmit::Respond { token, data });
                    return;
                }
                let Some(c) = logged else { return };
                let mb = c.micro_batch.into();
                let t = self.engine(EngineJob::Evidence {
                    mb,
                    kind: c.kind,
                    weights: c.weights_hash,
                });
                // What our answer signs: we served this job's evidence to `from` (an
                // auditor's fee rests on it).
                let served = neuroshard_audit::Served {
                    network: self.network,
                    job,
                    worker: self.me,
                    to: from,
                    input_hash: c.input_hash,
                    timestamp_ms: 0,
                };
                self.audit.engine.insert(
                    t,
                    EngineFor::Evidence {
                        request: token,
                        round,
                        served,
                    },
                );
            }
        }
    }
}
