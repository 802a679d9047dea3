//! What workers sign about their jobs and rounds, and what receivers countersign.

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, Identity, NodeId, Reader, Signed, Writer,
};

use crate::class::DeterminismClass;

/// Most job commitments one round commitment chains (512 KiB of hashes: under the envelope's
/// 1 MiB). A round of H inner steps × m micro-batches runs 2·H·m jobs.
pub const MAX_ROUND_JOBS: usize = 16_384;
/// Most genesis batch ids one round commitment names.
pub const MAX_ROUND_BATCHES: usize = 4_096;

/// Forward pass, or the backward pass (vector–Jacobian product) of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKind {
    Forward = 0,
    Backward = 1,
}

impl JobKind {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        match v {
            0 => Ok(Self::Forward),
            1 => Ok(Self::Backward),
            _ => Err(CodecError::Invalid {
                field: "job kind",
                reason: format!("unknown kind {v}"),
            }),
        }
    }
}

/// The pipeline's name for a micro-batch: the driver that made it, its step and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MicroBatchRef {
    pub origin: NodeId,
    pub step: u64,
    pub index: u32,
}

/// Which job a commitment is about, independent of what it claims: one verdict per key, and
/// the sampler's pick cannot be re-rolled by changing a claimed hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey(pub Hash32);

/// A worker's signed statement about one job it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobCommitment {
    pub network: Hash32,
    pub worker: NodeId,
    pub stage: u16,
    /// The DiLoCo round the job belongs to.
    pub round: u64,
    /// The replica's optimizer step count when the job ran: which weights it used.
    pub step: u64,
    pub micro_batch: MicroBatchRef,
    pub kind: JobKind,
    pub class: DeterminismClass,
    /// Hash of the stage's parameters the job ran with.
    pub weights_hash: Hash32,
    /// Hash of the input: token ids or the hidden states received.
    pub input_hash: Hash32,
    /// Backward: hash of the output gradient or targets received; forward: [`crate::NO_HASH`].
    pub upstream_hash: Hash32,
    /// Hash of the tensor sent on: activations downstream (forward) or the input gradient
    /// upstream (backward; [`crate::NO_HASH`] on the embedding stage).
    pub output_hash: Hash32,
    /// Backward: hash of the parameter gradients and loss; forward: [`crate::NO_HASH`].
    pub grads_hash: Hash32,
    /// The last finalized ledger epoch the worker knew when it signed. The job's challenges
    /// are drawn from epoch `epoch + BEACON_LAG` (see [`JobCommitment::beacon_epoch`]), which
    /// no one knew then; its receiver refuses an epoch more than two before its own.
    pub epoch: u64,
}

/// Epochs between a commitment's and the one whose hash seeds its challenges. Its receiver
/// accepts a commitment of its own finalized epoch or up to two before (a worker may lag), so a
/// worker would have to be two epochs ahead of the receiver to know its seed when signing.
pub const BEACON_LAG: u64 = 4;

pub type SignedJob = Signed<JobCommitment>;

impl JobCommitment {
    pub fn key(&self) -> JobKey {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/audit/job-key");
        h.update(&self.network);
        h.update(&self.worker.0);
        h.update(&self.stage.to_le_bytes());
        h.update(&self.round.to_le_bytes());
        h.update(&self.micro_batch.origin.0);
        h.update(&self.micro_batch.step.to_le_bytes());
        h.update(&self.micro_batch.index.to_le_bytes());
        h.update(&[self.kind as u8]);
        JobKey(*h.finalize().as_bytes())
    }

    pub fn sign(&self, identity: &Identity) -> SignedJob {
        Signed::sign(identity, self)
    }

    /// The finalized epoch whose hash seeds this job's challenges (None: past the end of time).
    pub fn beacon_epoch(&self) -> Option<u64> {
        self.epoch.checked_add(BEACON_LAG)
    }
}

impl Canonical for JobCommitment {
    const DOMAIN: &'static str = "neuroshard/audit/job/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.worker.0);
        w.u16(self.stage);
        w.u64(self.round);
        w.u64(self.step);
        w.fixed(&self.micro_batch.origin.0);
        w.u64(self.micro_batch.step);
        w.u32(self.micro_batch.index);
        w.u8(self.kind as u8);
        self.class.encode(w);
        for h in [
            &self.weights_hash,
            &self.input_hash,
            &self.upstream_hash,
            &self.output_hash,
            &self.grads_hash,
        ] {
            w.fixed(h);
        }
        w.u64(self.epoch);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            worker: NodeId(r.array()?),
            stage: r.u16()?,
            round: r.u64()?,
            step: r.u64()?,
            micro_batch: MicroBatchRef {
                origin: NodeId(r.array()?),
                step: r.u64()?,
                index: r.u32()?,
            },
            kind: JobKind::from_u8(r.u8()?)?,
            class: DeterminismClass::decode(r)?,
            weights_hash: r.array()?,
            input_hash: r.array()?,
            upstream_hash: r.array()?,
            output_hash: r.array()?,
            grads_hash: r.array()?,
            epoch: r.u64()?,
        })
    }
}

/// Why a commitment or countersignature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("job commitment: {0}")]
    Job(EnvelopeError),
    #[error("countersignature: {0}")]
    Countersign(EnvelopeError),
    #[error("round commitment: {0}")]
    Round(EnvelopeError),
    #[error("signed by {signer:?} but names worker {worker:?}")]
    NotTheWorker { signer: NodeId, worker: NodeId },
    #[error("the worker committed output {committed:02x?} but sent {received:02x?}")]
    SentOther { committed: Hash32, received: Hash32 },
    #[error("the countersignature is for another job or network")]
    OtherJob,
}

/// A job commitment whose signer is the worker it names.
pub fn verify_job(job: &SignedJob) -> Result<JobCommitment, CommitError> {
    let c = job.verify().map_err(CommitError::Job)?;
    let signer = job.signer().node_id();
    if signer != c.worker {
        return Err(CommitError::NotTheWorker {
            signer,
            worker: c.worker,
        });
    }
    Ok(c)
}

/// The receiver's statement "I received `received_hash` as the output of `job`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Countersign {
    pub network: Hash32,
    pub job: JobKey,
    pub worker: NodeId,
    pub received_hash: Hash32,
}

impl Canonical for Countersign {
    const DOMAIN: &'static str = "neuroshard/audit/countersign/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.job.0);
        w.fixed(&self.worker.0);
        w.fixed(&self.received_hash);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            job: JobKey(r.array()?),
            worker: NodeId(r.array()?),
            received_hash: r.array()?,
        })
    }
}

/// The receiver's side: checks the worker's signed commitment against the hash of the tensor
/// that actually arrived, and countersigns only if they agree. A worker that commits one
/// output and sends another gets no countersignature (and its data is not used).
pub fn countersign(
    receiver: &Identity,
    job: &SignedJob,
    received_hash: Hash32,
) -> Result<Signed<Countersign>, CommitError> {
    let c = verify_job(job)?;
    if c.output_hash != received_hash {
        return Err(CommitError::SentOther {
            committed: c.output_hash,
            received: received_hash,
        });
    }
    Ok(Signed::sign(
        receiver,
        &Countersign {
            network: c.network,
            job: c.key(),
            worker: c.worker,
            received_hash,
        },
    ))
}

/// A commitment with its receiver's countersignature: both signatures valid, and the receiver
/// acknowledged exactly the output the worker committed. Returns the commitment and the
/// receiver.
pub fn verify_countersigned(
    job: &SignedJob,
    cs: &Signed<Countersign>,
) -> Result<(JobCommitment, NodeId), CommitError> {
    let c = verify_job(job)?;
    let s = cs.verify().map_err(CommitError::Countersign)?;
    if s.network != c.network || s.job != c.key() || s.worker != c.worker {
        return Err(CommitError::OtherJob);
    }
    if s.received_hash != c.output_hash {
        return Err(CommitError::SentOther {
            committed: c.output_hash,
            received: s.received_hash,
        });
    }
    Ok((c, cs.signer().node_id()))
}

/// A replica's statement about a whole DiLoCo round: where it started (θ₀), its optimizer
/// state, which genesis batches it trained on, every job it ran in order, and the
/// pseudo-gradient it offered, so that the offer is a deterministic function of committed
/// inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundCommitment {
    pub network: Hash32,
    pub worker: NodeId,
    pub stage: u16,
    pub round: u64,
    pub class: DeterminismClass,
    pub theta0_hash: Hash32,
    pub adamw_hash: Hash32,
    pub batch_ids: Vec<u64>,
    /// Payload hashes of the round's signed job commitments, in the order they ran.
    pub jobs: Vec<Hash32>,
    pub pseudo_gradient_hash: Hash32,
}

impl RoundCommitment {
    /// The hash chain over the jobs, seeded with θ₀: `h₀ = H(θ₀)`, `hᵢ = H(hᵢ₋₁ ‖ jobᵢ)`. Any
    /// reordering, insertion or omission changes the head.
    pub fn job_chain(&self) -> Hash32 {
        let mut head = *blake3::Hasher::new()
            .update(b"neuroshard/audit/job-chain")
            .update(&self.theta0_hash)
            .finalize()
            .as_bytes();
        for j in &self.jobs {
            head = *blake3::Hasher::new()
                .update(&head)
                .update(j)
                .finalize()
                .as_bytes();
        }
        head
    }

    /// Whether the round lists the signed job (by its payload hash).
    pub fn contains(&self, job: &SignedJob) -> bool {
        let h = job.payload_hash();
        self.jobs.contains(&h)
    }
}

impl Canonical for RoundCommitment {
    const DOMAIN: &'static str = "neuroshard/audit/round/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.worker.0);
        w.u16(self.stage);
        w.u64(self.round);
        self.class.encode(w);
        w.fixed(&self.theta0_hash);
        w.fixed(&self.adamw_hash);
        w.len(self.batch_ids.len());
        for b in &self.batch_ids {
            w.u64(*b);
        }
        w.len(self.jobs.len());
        for j in &self.jobs {
            w.fixed(j);
        }
        w.fixed(&self.pseudo_gradient_hash);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let network = r.array()?;
        let worker = NodeId(r.array()?);
        let stage = r.u16()?;
        let round = r.u64()?;
        let class = DeterminismClass::decode(r)?;
        let theta0_hash = r.array()?;
        let adamw_hash = r.array()?;
        let n = r.len(MAX_ROUND_BATCHES)?;
        let batch_ids = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
        let n = r.len(MAX_ROUND_JOBS)?;
        let jobs = (0..n).map(|_| r.array()).collect::<Result<_, _>>()?;
        Ok(Self {
            network,
            worker,
            stage,
            round,
            class,
            theta0_hash,
            adamw_hash,
            batch_ids,
            jobs,
            pseudo_gradient_hash: r.array()?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::class::tests::class;
    use neuroshard_proof::fixtures::test_identity;
    use proptest::prelude::*;

    pub fn commitment(worker: &Identity, index: u32, kind: JobKind) -> JobCommitment {
        JobCommitment {
            network: [5; 32],
            worker: worker.node_id(),
            stage: 1,
            round: 3,
            step: 17,
            micro_batch: MicroBatchRef {
                origin: NodeId([9; 32]),
                step: 40,
                index,
            },
            kind,
            class: class(1),
            weights_hash: [1; 32],
            input_hash: [2; 32],
            upstream_hash: [3; 32],
            output_hash: [4; 32],
            grads_hash: [6; 32],
            epoch: 7,
        }
    }

    #[test]
    fn a_commitment_signed_by_someone_else_is_refused() {
        let worker = test_identity(1);
        let other = test_identity(2);
        let forged = commitment(&worker, 0, JobKind::Forward).sign(&other);
        assert!(matches!(
            verify_job(&forged),
            Err(CommitError::NotTheWorker { .. })
        ));
    }

    #[test]
    fn a_worker_that_sends_other_bits_than_it_committed_gets_no_countersignature() {
        let (worker, receiver) = (test_identity(1), test_identity(2));
        let job = commitment(&worker, 0, JobKind::Forward).sign(&worker);
        assert!(matches!(
            countersign(&receiver, &job, [8; 32]),
            Err(CommitError::SentOther { .. })
        ));
        let cs = countersign(&receiver, &job, [4; 32]).unwrap();
        let (c, who) = verify_countersigned(&job, &cs).unwrap();
        assert_eq!((c.output_hash, who), ([4; 32], receiver.node_id()));
        // A receiver's countersignature of another hash, or of another job, does not pair.
        let lie = Signed::sign(
            &receiver,
            &Countersign {
                received_hash: [8; 32],
                ..cs.verify().unwrap()
            },
        );
        assert!(matches!(
            verify_countersigned(&job, &lie),
            Err(CommitError::SentOther { .. })
        ));
        let other_job = commitment(&worker, 1, JobKind::Forward).sign(&worker);
        assert_eq!(
            verify_countersigned(&other_job, &cs),
            Err(CommitError::OtherJob)
        );
    }

    #[test]
    fn the_key_names_the_job_not_its_claims() {
        let w = test_identity(1);
        let a = commitment(&w, 0, JobKind::Forward);
        let mut b = a;
        b.output_hash = [0xee; 32];
        b.step += 1;
        assert_eq!(a.key(), b.key());
        let mut c = a;
        c.kind = JobKind::Backward;
        assert_ne!(a.key(), c.key());
        let mut d = a;
        d.round += 1;
        assert_ne!(a.key(), d.key());
    }

    #[test]
    fn the_job_chain_changes_with_order_and_omission() {
        let r = RoundCommitment {
            network: [0; 32],
            worker: NodeId([1; 32]),
            stage: 0,
            round: 1,
            class: class(1),
            theta0_hash: [2; 32],
            adamw_hash: [3; 32],
            batch_ids: vec![1, 2],
            jobs: vec![[4; 32], [5; 32]],
            pseudo_gradient_hash: [6; 32],
        };
        let mut swapped = r.clone();
        swapped.jobs.reverse();
        let mut dropped = r.clone();
        dropped.jobs.pop();
        assert_ne!(r.job_chain(), swapped.job_chain());
        assert_ne!(r.job_chain(), dropped.job_chain());
    }

    fn arb_hash() -> impl Strategy<Value = Hash32> {
        any::<[u8; 32]>()
    }

    fn arb_commitment() -> impl Strategy<Value = JobCommitment> {
        (
            (
                arb_hash(),
                arb_hash(),
                any::<u16>(),
                any::<u64>(),
                any::<u64>(),
            ),
            (arb_hash(), any::<u64>(), any::<u32>(), any::<bool>()),
            (any::<u16>(), any::<[u64; 3]>(), 0u8..5, any::<u64>()),
            prop::array::uniform5(arb_hash()),
        )
            .prop_map(
                |((net, w, stage, round, step), (o, s, i, bwd), (mb, cache, isa, epoch), h)| {
                    let mut class = class(1);
                    class.micro_batches = mb;
                    class.cache_bytes = cache;
                    let mut bytes = Writer::new();
                    class.encode(&mut bytes);
                    let mut raw = bytes.into_bytes();
                    raw[32] = isa;
                    let class = DeterminismClass::decode(&mut Reader::new(&raw)).unwrap();
                    JobCommitment {
                        network: net,
                        worker: NodeId(w),
                        stage,
                        round,
                        step,
                        micro_batch: MicroBatchRef {
                            origin: NodeId(o),
                            step: s,
                            index: i,
                        },
                        kind: if bwd {
                            JobKind::Backward
                        } else {
                            JobKind::Forward
                        },
                        class,
                        weights_hash: h[0],
                        input_hash: h[1],
                        upstream_hash: h[2],
                        output_hash: h[3],
                        grads_hash: h[4],
                        epoch,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn job_commitments_round_trip(c in arb_commitment()) {
            let bytes = c.to_canonical_bytes();
            prop_assert_eq!(JobCommitment::from_canonical_bytes(&bytes), Ok(c));
            for cut in [0, bytes.len() / 2, bytes.len() - 1] {
                prop_assert!(JobCommitment::from_canonical_bytes(&bytes[..cut]).is_err());
            }
        }

        #[test]
        fn countersigns_round_trip(net in arb_hash(), job in arb_hash(), w in arb_hash(), h in arb_hash()) {
            let c = Countersign { network: net, job: JobKey(job), worker: NodeId(w), received_hash: h };
            prop_assert_eq!(Countersign::from_canonical_bytes(&c.to_canonical_bytes()), Ok(c));
        }

        #[test]
        fn round_commitments_round_trip(
            c in arb_commitment(),
            batch_ids in prop::collection::vec(any::<u64>(), 0..20),
            jobs in prop::collection::vec(arb_hash(), 0..20),
            pg in arb_hash(),
        ) {
            let r = RoundCommitment {
                network: c.network,
                worker: c.worker,
                stage: c.stage,
                round: c.round,
                class: c.class,
                theta0_hash: c.weights_hash,
                adamw_hash: c.input_hash,
                batch_ids,
                jobs,
                pseudo_gradient_hash: pg,
            };
            let bytes = r.to_canonical_bytes();
            prop_assert_eq!(RoundCommitment::from_canonical_bytes(&bytes), Ok(r));
        }
    }

    #[test]
    fn a_round_naming_too_many_jobs_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.bytes(RoundCommitment::DOMAIN.as_bytes());
        w.fixed(&[0; 32]);
        w.fixed(&[0; 32]);
        w.u16(0);
        w.u64(0);
        class(1).encode(&mut w);
        w.fixed(&[0; 64]);
        w.len(0);
        w.len(MAX_ROUND_JOBS + 1);
        assert!(matches!(
            RoundCommitment::from_canonical_bytes(&w.into_bytes()),
            Err(CodecError::TooLong { .. })
        ));
    }
}
