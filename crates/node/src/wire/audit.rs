//! Audit requests between replicas of a stage: "list your jobs of round r" and "give me the
//! evidence of this job of yours".

use neuroshard_audit::{AuditFeeClaim, FraudProof, JobInputs, JobKey, SignedJob, SignedServed};
use neuroshard_proof::{Canonical, CodecError, EnvelopeError, Hash32, Reader, Signed, Writer};

/// Job commitments one list carries at most (a round of H steps × m micro-batches has 2·H·m).
pub const MAX_LISTED_JOBS: usize = 4096;
const MAX_ENVELOPE: usize = 4096;
const MAX_REASON: usize = 1024;

/// Largest fraud proof a report carries (one micro-batch's input and upstream tensors).
const MAX_PROOF_BYTES: usize = 1 << 24;

/// An auditor's fraud proof as gossiped to every node: the proof, the final hash of the round
/// its challenge was drawn from, and the blob of the weights the job committed to, which the
/// auditor serves so that any node can replay the job.
#[derive(Debug, Clone, PartialEq)]
pub struct FraudReport {
    pub proof: FraudProof,
    /// The hash of the finalized epoch the job's challenges were drawn from.
    pub beacon: Hash32,
    pub weights_blob: Hash32,
}

impl Canonical for FraudReport {
    const DOMAIN: &'static str = "neuroshard/fraud-report/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.proof.to_canonical_bytes());
        w.fixed(&self.beacon);
        w.fixed(&self.weights_blob);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let proof = FraudProof::from_canonical_bytes(r.bytes(MAX_PROOF_BYTES)?)?;
        Ok(Self {
            proof,
            beacon: r.array()?,
            weights_blob: r.array()?,
        })
    }
}

/// One signed job commitment (an envelope, checked by whoever uses it).
fn read_job(r: &mut Reader<'_>) -> Result<SignedJob, CodecError> {
    Signed::from_bytes(r.bytes(MAX_ENVELOPE)?).map_err(|e: EnvelopeError| CodecError::Invalid {
        field: "job commitment",
        reason: e.to_string(),
    })
}

/// Jobs one demand names at most.
pub const MAX_DEMAND_JOBS: usize = 32;

/// An auditor's demand, gossiped network-wide, when the workers of jobs its beacon assigned
/// to it did not serve the jobs' evidence: the committee's validators then ask each worker
/// for it themselves, and a worker is slashed if more than two thirds of the committee's
/// power could not get evidence on which its job replays (see `core/jury.rs`). Sent as a
/// `Signed<AuditDemand>` by the auditor, at most one a second (a demand per job would run
/// over the topic's gossip rate when a worker refuses many).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditDemand {
    pub network: Hash32,
    /// The workers' signed commitments of the jobs (1 to `MAX_DEMAND_JOBS`).
    pub jobs: Vec<SignedJob>,
    /// When the auditor demanded (the time of the ledger entries a verdict writes).
    pub timestamp_ms: u64,
}

impl Canonical for AuditDemand {
    const DOMAIN: &'static str = "neuroshard/audit-demand/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.len(self.jobs.len());
        for job in &self.jobs {
            w.bytes(&job.to_bytes());
        }
        w.u64(self.timestamp_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let network = r.array()?;
        let n = r.len(MAX_DEMAND_JOBS)?;
        if n == 0 {
            return Err(CodecError::Invalid {
                field: "audit demand",
                reason: "no job".into(),
            });
        }
        let jobs = (0..n).map(|_| read_job(r)).collect::<Result<_, _>>()?;
        Ok(Self {
            network,
            jobs,
            timestamp_ms: r.u64()?,
        })
    }
}

/// Fee claims one message carries at most.
pub const MAX_FEE_CLAIMS: usize = 32;

/// An auditor's claims to validator fees, gossiped network-wide (the committee's validators
/// put them in epochs; see `core/fees.rs`): sent as a `Signed<FeeClaims>` by the auditor every
/// claim names, at most one a few seconds, so a claim per audit does not run over the
/// topic's gossip rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeeClaims {
    pub network: Hash32,
    /// 1 to `MAX_FEE_CLAIMS` claims.
    pub claims: Vec<AuditFeeClaim>,
}

impl Canonical for FeeClaims {
    const DOMAIN: &'static str = "neuroshard/audit-fee-claims/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.len(self.claims.len());
        for c in &self.claims {
            w.bytes(&c.to_canonical_bytes());
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let network = r.array()?;
        let n = r.len(MAX_FEE_CLAIMS)?;
        if n == 0 {
            return Err(CodecError::Invalid {
                field: "fee claims",
                reason: "no claim".into(),
            });
        }
        let claims = (0..n)
            .map(|_| AuditFeeClaim::from_canonical_bytes(r.bytes(2 * MAX_ENVELOPE + 64)?))
            .collect::<Result<_, _>>()?;
        Ok(Self { network, claims })
    }
}

/// An auditor's requests to a worker of its stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditRequest {
    /// The worker's signed commitments of `round`.
    List {
        network: Hash32,
        stage: u16,
        round: u64,
    },
    /// The inputs of `job` (of `round`), and the blob of the weights it ran at.
    Evidence {
        network: Hash32,
        round: u64,
        job: JobKey,
    },
    /// From the receiver of a job's output to the auditor its beacon names: the worker's
    /// commitment, so the audit does not depend on the worker listing it.
    Notice(SignedJob),
}

/// A worker's answers.
#[derive(Debug, Clone, PartialEq)]
pub enum AuditAnswer {
    List(Vec<SignedJob>),
    /// The job's inputs; its weights are served as a blob of this hash and length; and the
    /// worker's signed statement that it served them to the asker (what an auditor's fee
    /// rests on: an answer without it is a refusal).
    Evidence {
        inputs: JobInputs,
        weights_blob: Hash32,
        weights_len: u64,
        served: Box<SignedServed>,
    },
    Refused(String),
}

impl Canonical for AuditRequest {
    const DOMAIN: &'static str = "neuroshard/audit-request/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            AuditRequest::List {
                network,
                stage,
                round,
            } => {
                w.u8(0);
                w.fixed(network);
                w.u16(*stage);
                w.u64(*round);
            }
            AuditRequest::Evidence {
                network,
                round,
                job,
            } => {
                w.u8(1);
                w.fixed(network);
                w.u64(*round);
                w.fixed(&job.0);
            }
            AuditRequest::Notice(job) => {
                w.u8(2);
                w.bytes(&job.to_bytes());
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            0 => Ok(AuditRequest::List {
                network: r.array()?,
                stage: r.u16()?,
                round: r.u64()?,
            }),
            1 => Ok(AuditRequest::Evidence {
                network: r.array()?,
                round: r.u64()?,
                job: JobKey(r.array()?),
            }),
            2 => Ok(AuditRequest::Notice(read_job(r)?)),
            k => Err(CodecError::Invalid {
                field: "audit request",
                reason: format!("{k}"),
            }),
        }
    }
}

impl Canonical for AuditAnswer {
    const DOMAIN: &'static str = "neuroshard/audit-answer/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            AuditAnswer::List(jobs) => {
                w.u8(0);
                w.len(jobs.len());
                for j in jobs {
                    w.bytes(&j.to_bytes());
                }
            }
            AuditAnswer::Evidence {
                inputs,
                weights_blob,
                weights_len,
                served,
            } => {
                w.u8(1);
                inputs.encode(w);
                w.fixed(weights_blob);
                w.u64(*weights_len);
                w.bytes(&served.to_bytes());
            }
            AuditAnswer::Refused(why) => {
                w.u8(2);
                w.bytes(&why.as_bytes()[..why.len().min(MAX_REASON)]);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            0 => {
                let n = r.len(MAX_LISTED_JOBS)?;
                let jobs = (0..n).map(|_| read_job(r)).collect::<Result<_, _>>()?;
                Ok(AuditAnswer::List(jobs))
            }
            1 => Ok(AuditAnswer::Evidence {
                inputs: JobInputs::decode(r)?,
                weights_blob: r.array()?,
                weights_len: r.u64()?,
                served: Box::new(Signed::from_bytes(r.bytes(MAX_ENVELOPE)?).map_err(
                    |e: EnvelopeError| CodecError::Invalid {
                        field: "served statement",
                        reason: e.to_string(),
                    },
                )?),
            }),
            2 => Ok(AuditAnswer::Refused(
                String::from_utf8_lossy(r.bytes(MAX_REASON)?).into_owned(),
            )),
            k => Err(CodecError::Invalid {
                field: "audit answer",
                reason: format!("{k}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_audit::{StageData, TokenIds, UpstreamData};

    #[test]
    fn a_demand_round_trips_and_truncations_fail() {
        let id = neuroshard_proof::fixtures::test_identity(2);
        let d = AuditDemand {
            network: [1; 32],
            jobs: vec![
                crate::core::fraud_tests::forward_job([1; 32], &id, 3).sign(&id),
                crate::core::fraud_tests::forward_job([1; 32], &id, 4).sign(&id),
            ],
            timestamp_ms: 77,
        };
        let b = d.to_canonical_bytes();
        assert_eq!(AuditDemand::from_canonical_bytes(&b), Ok(d.clone()));
        for n in 0..b.len() {
            assert!(AuditDemand::from_canonical_bytes(&b[..n]).is_err(), "{n}");
        }
        // A demand of no job is not one.
        let empty = AuditDemand {
            jobs: Vec::new(),
            ..d.clone()
        };
        assert!(AuditDemand::from_canonical_bytes(&empty.to_canonical_bytes()).is_err());
        // Another message's bytes are not a demand (the domain tells them apart).
        let req =
            AuditRequest::Notice(crate::core::fraud_tests::forward_job([1; 32], &id, 3).sign(&id));
        assert!(AuditDemand::from_canonical_bytes(&req.to_canonical_bytes()).is_err());
    }

    #[test]
    fn audit_messages_round_trip_and_truncations_fail() {
        let reqs = [
            AuditRequest::List {
                network: [1; 32],
                stage: 2,
                round: 3,
            },
            AuditRequest::Evidence {
                network: [1; 32],
                round: 3,
                job: JobKey([4; 32]),
            },
            AuditRequest::Notice(
                crate::core::fraud_tests::forward_job(
                    [1; 32],
                    &neuroshard_proof::fixtures::test_identity(2),
                    3,
                )
                .sign(&neuroshard_proof::fixtures::test_identity(2)),
            ),
        ];
        for q in reqs {
            let b = q.to_canonical_bytes();
            assert_eq!(AuditRequest::from_canonical_bytes(&b), Ok(q));
            assert!(AuditRequest::from_canonical_bytes(&b[..b.len() - 1]).is_err());
        }
        let answers = [
            AuditAnswer::List(Vec::new()),
            AuditAnswer::Evidence {
                inputs: JobInputs {
                    input: StageData::Tokens(TokenIds {
                        batch: 1,
                        seq: 2,
                        ids: vec![5, 6],
                    }),
                    upstream: UpstreamData::None,
                },
                weights_blob: [7; 32],
                weights_len: 40,
                served: Box::new(Signed::sign(
                    &neuroshard_proof::fixtures::test_identity(2),
                    &neuroshard_audit::Served {
                        network: [1; 32],
                        job: JobKey([4; 32]),
                        worker: neuroshard_proof::fixtures::test_identity(2).node_id(),
                        to: neuroshard_proof::fixtures::test_identity(3).node_id(),
                        input_hash: [5; 32],
                        timestamp_ms: 6,
                    },
                )),
            },
            AuditAnswer::Refused("gone".into()),
        ];
        for a in answers {
            let b = a.to_canonical_bytes();
            assert_eq!(AuditAnswer::from_canonical_bytes(&b), Ok(a));
            assert!(AuditAnswer::from_canonical_bytes(&b[..b.len() - 1]).is_err());
        }
        // A pipeline request is no audit request.
        assert!(AuditRequest::from_canonical_bytes(&[0; 40]).is_err());
    }
}
