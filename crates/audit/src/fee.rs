//! What a validator's fee rests on (issue 15: "validators earn fees for audits done"): the
//! worker's signed statement that it served a challenged job's evidence to a node, and the
//! claim that pairs it with the job's commitment. Both signatures are the worker's, so the
//! claim proves the evidence went to the auditor it names; that the beacon assigned the job
//! to that auditor, every node checks against its own finalized epochs.

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, NodeId, Reader, Signed, Writer,
};

use crate::commit::{JobCommitment, JobKey, SignedJob, verify_job};

/// The worker's statement "I served `job`'s evidence to `to`": signed with every evidence
/// answer, so an auditor holds proof that it fetched what a replay needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub network: Hash32,
    pub job: JobKey,
    pub worker: NodeId,
    pub to: NodeId,
    /// The committed input hash the evidence carries.
    pub input_hash: Hash32,
    pub timestamp_ms: u64,
}

pub type SignedServed = Signed<Served>;

impl Canonical for Served {
    const DOMAIN: &'static str = "neuroshard/audit/served/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.job.0);
        w.fixed(&self.worker.0);
        w.fixed(&self.to.0);
        w.fixed(&self.input_hash);
        w.u64(self.timestamp_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            job: JobKey(r.array()?),
            worker: NodeId(r.array()?),
            to: NodeId(r.array()?),
            input_hash: r.array()?,
            timestamp_ms: r.u64()?,
        })
    }
}

/// Largest signed envelope a claim carries (a commitment or a served statement: under 1 KiB).
const MAX_PART: usize = 4096;

/// An auditor's claim to a fee: the job's commitment and the worker's statement that it
/// served the job's evidence to the auditor. No signature of the auditor's own: the claim
/// pays only the node the worker named, whoever relays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFeeClaim {
    pub job: SignedJob,
    pub served: SignedServed,
}

impl Canonical for AuditFeeClaim {
    const DOMAIN: &'static str = "neuroshard/audit/fee-claim/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.job.to_bytes());
        w.bytes(&self.served.to_bytes());
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let job = r.bytes(MAX_PART)?.to_vec();
        let served = r.bytes(MAX_PART)?.to_vec();
        let invalid = |field: &'static str| {
            move |e: EnvelopeError| CodecError::Invalid {
                field,
                reason: e.to_string(),
            }
        };
        Ok(Self {
            job: Signed::from_bytes(&job).map_err(invalid("claim's commitment"))?,
            served: Signed::from_bytes(&served).map_err(invalid("claim's served statement"))?,
        })
    }
}

/// Why a fee claim proves nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeeClaimError {
    #[error(transparent)]
    Job(#[from] crate::commit::CommitError),
    #[error("served statement: {0}")]
    Served(EnvelopeError),
    #[error("the served statement is not signed by the job's worker")]
    NotTheWorker,
    #[error("the served statement names another job, network or input")]
    OtherJob,
    #[error("a worker cannot be its own auditor")]
    OwnJob,
}

impl AuditFeeClaim {
    /// Both signatures are the worker's, and they are about the same job: the commitment and
    /// what the worker served.
    pub fn verify(&self) -> Result<(JobCommitment, Served), FeeClaimError> {
        let c = verify_job(&self.job)?;
        let s = self.served.verify().map_err(FeeClaimError::Served)?;
        if self.served.signer().node_id() != c.worker || s.worker != c.worker {
            return Err(FeeClaimError::NotTheWorker);
        }
        if s.job != c.key() || s.network != c.network || s.input_hash != c.input_hash {
            return Err(FeeClaimError::OtherJob);
        }
        if s.to == c.worker {
            return Err(FeeClaimError::OwnJob);
        }
        Ok((c, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::{DeterminismClass, IsaLevel};
    use crate::commit::{JobKind, MicroBatchRef};
    use neuroshard_proof::fixtures::test_identity;

    fn job(worker: &neuroshard_proof::Identity) -> JobCommitment {
        JobCommitment {
            network: [1; 32],
            worker: worker.node_id(),
            stage: 1,
            round: 2,
            step: 3,
            micro_batch: MicroBatchRef {
                origin: worker.node_id(),
                step: 3,
                index: 0,
            },
            kind: JobKind::Forward,
            class: DeterminismClass {
                build: [1; 32],
                isa: IsaLevel::X86V3,
                cache_bytes: [1, 2, 3],
                micro_batches: 1,
            },
            weights_hash: [2; 32],
            input_hash: [3; 32],
            upstream_hash: crate::NO_HASH,
            output_hash: [4; 32],
            grads_hash: crate::NO_HASH,
            epoch: 5,
        }
    }

    fn served(c: &JobCommitment, to: NodeId) -> Served {
        Served {
            network: c.network,
            job: c.key(),
            worker: c.worker,
            to,
            input_hash: c.input_hash,
            timestamp_ms: 9,
        }
    }

    #[test]
    fn a_claim_holds_only_with_both_of_the_workers_signatures_about_one_job() {
        let (w, a, x) = (test_identity(1), test_identity(2), test_identity(3));
        let c = job(&w);
        let good = AuditFeeClaim {
            job: c.sign(&w),
            served: Signed::sign(&w, &served(&c, a.node_id())),
        };
        let bytes = good.to_canonical_bytes();
        assert_eq!(AuditFeeClaim::from_canonical_bytes(&bytes).unwrap(), good);
        let (got, s) = good.verify().unwrap();
        assert_eq!((got, s.to), (c, a.node_id()));
        // The auditor signs its own "served" statement.
        let forged = AuditFeeClaim {
            served: Signed::sign(&a, &served(&c, a.node_id())),
            ..good.clone()
        };
        assert_eq!(forged.verify(), Err(FeeClaimError::NotTheWorker));
        // A statement about another job of the worker.
        let mut other = job(&w);
        other.round = 7;
        let mismatched = AuditFeeClaim {
            served: Signed::sign(&w, &served(&other, a.node_id())),
            ..good.clone()
        };
        assert_eq!(mismatched.verify(), Err(FeeClaimError::OtherJob));
        // A commitment signed by someone else than the worker it names.
        let relayed = AuditFeeClaim {
            job: c.sign(&x),
            ..good.clone()
        };
        assert!(matches!(relayed.verify(), Err(FeeClaimError::Job(_))));
        // A worker paying itself.
        let own = AuditFeeClaim {
            served: Signed::sign(&w, &served(&c, w.node_id())),
            ..good
        };
        assert_eq!(own.verify(), Err(FeeClaimError::OwnJob));
        // Truncated bytes fail to decode.
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert!(AuditFeeClaim::from_canonical_bytes(&bytes[..cut]).is_err());
        }
    }
}
