//! Audit verdicts (verification by recomputation) as the ledger applies them.
//!
//! The ledger does not replay jobs: a node settles a fraud proof with
//! `neuroshard_audit::check` and its own replayer, and hands the outcome here. What the
//! ledger then does depends only on the verdict, so every node that reached it applies the
//! same change.

use neuroshard_audit::{FraudProof, Verdict};
use neuroshard_proof::{Canonical, Hash32, NodeId};

/// A verdict that moves stake: the offender loses a share of its stake, the beneficiary is
/// paid part of it, the rest is burned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedVerdict {
    /// The audited job's key: one verdict per job, whoever files evidence about it and
    /// however often.
    pub job: Hash32,
    /// The worker (guilty) or the accuser (false accusation).
    pub offender: NodeId,
    /// The auditor (guilty) or the wronged worker (false accusation).
    pub beneficiary: NodeId,
    /// BLAKE3 of the fraud proof's canonical bytes.
    pub evidence_hash: Hash32,
    /// The accusation's signed time.
    pub timestamp_ms: u64,
}

impl VerifiedVerdict {
    /// The ledger change of `verdict`, reached by checking `proof`; None for an escalation,
    /// which moves no stake.
    pub fn from_checked(verdict: &Verdict, proof: &FraudProof) -> Option<Self> {
        let (job, offender, beneficiary) = match *verdict {
            Verdict::Guilty {
                job,
                worker,
                auditor,
            } => (job, worker, auditor),
            Verdict::FalseAccusation {
                job,
                worker,
                auditor,
            } => (job, auditor, worker),
            Verdict::Escalate { .. } => return None,
        };
        // The time is read from the signed accusation; `check` verified it already, so a
        // failure here means the verdict is not this proof's.
        let accusation = proof.accusation.verify().ok()?;
        if accusation.job != job {
            return None;
        }
        Some(Self {
            job: job.0,
            offender,
            beneficiary,
            evidence_hash: *blake3::hash(&proof.to_canonical_bytes()).as_bytes(),
            timestamp_ms: accusation.timestamp_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_audit::{
        DeterminismClass, IsaLevel, JobCommitment, JobInputs, JobKind, MicroBatchRef, NO_HASH,
        Replayed, StageData, TokenIds, UpstreamData,
    };
    use neuroshard_proof::fixtures::test_identity;

    fn proof() -> (FraudProof, JobCommitment) {
        let (worker, auditor) = (test_identity(1), test_identity(2));
        let inputs = JobInputs {
            input: StageData::Tokens(TokenIds {
                batch: 1,
                seq: 2,
                ids: vec![3, 4],
            }),
            upstream: UpstreamData::None,
        };
        let c = JobCommitment {
            network: [0; 32],
            worker: worker.node_id(),
            stage: 0,
            round: 1,
            step: 2,
            micro_batch: MicroBatchRef {
                origin: worker.node_id(),
                step: 2,
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
            input_hash: inputs.input.hash(),
            upstream_hash: NO_HASH,
            output_hash: [3; 32],
            grads_hash: NO_HASH,
            epoch: 0,
        };
        let claimed = Replayed {
            output_hash: [4; 32],
            grads_hash: NO_HASH,
            output: None,
        };
        let p = FraudProof::new(&auditor, c.sign(&worker), &c, inputs, &claimed, None, 77);
        (p, c)
    }

    #[test]
    fn the_loser_pays_and_escalations_move_nothing() {
        let (p, c) = proof();
        let (worker, auditor) = (c.worker, p.accusation.signer().node_id());
        let job = c.key();
        let guilty = VerifiedVerdict::from_checked(
            &Verdict::Guilty {
                job,
                worker,
                auditor,
            },
            &p,
        )
        .unwrap();
        assert_eq!((guilty.offender, guilty.beneficiary), (worker, auditor));
        assert_eq!((guilty.job, guilty.timestamp_ms), (job.0, 77));
        let false_accusation = VerifiedVerdict::from_checked(
            &Verdict::FalseAccusation {
                job,
                worker,
                auditor,
            },
            &p,
        )
        .unwrap();
        assert_eq!(
            (false_accusation.offender, false_accusation.beneficiary),
            (auditor, worker)
        );
        assert_eq!(false_accusation.evidence_hash, guilty.evidence_hash);
        let escalate = Verdict::Escalate {
            job,
            job_class: c.class,
            checker_class: c.class,
            comparison: None,
        };
        assert_eq!(VerifiedVerdict::from_checked(&escalate, &p), None);
        // A verdict about another job is not this proof's.
        let other = Verdict::Guilty {
            job: neuroshard_audit::JobKey([9; 32]),
            worker,
            auditor,
        };
        assert_eq!(VerifiedVerdict::from_checked(&other, &p), None);
    }
}
