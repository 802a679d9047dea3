//! What workers sign about their jobs and rounds, and what receivers countersign.

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, Identity, NodeId, Reader, Signed, Writer,
};

use crate::class::DeterminismClass;

/// Forward pass, or the backward pass (vector–Jacobian product) of one micro-batch, or a
/// replica's DiLoCo offer of a round: its pseudo-gradient, encoded in the network's codec, of
/// the weights it trained to against the stage's θ₀.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKind {
    Forward = 0,
    Backward = 1,
    Offer = 2,
}

impl JobKind {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        match v {
            0 => Ok(Self::Forward),
            1 => Ok(Self::Backward),
            2 => Ok(Self::Offer),
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
///
/// An offer ([`JobKind::Offer`], one per replica and round: [`offer_micro_batch`]) is the
/// replica's round commitment: its weights are those the pseudo-gradient was taken from (θ
/// after the round's inner steps), its input the outer state it was taken against (θ₀: the
/// offer's base), its output the offer's blob, and its `grads_hash` the round's state
/// ([`round_state_hash`]: AdamW's state then and the chain of the round's jobs). Replaying it
/// re-encodes θ₀ − θ, so an offer that is not the replica's own pseudo-gradient of the weights
/// it names (last round's, say) is caught like a job with other outputs.
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

/// What an offer's commitment claims (see [`JobKind::Offer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfferClaims {
    /// The replica's optimizer step count when it made the offer.
    pub step: u64,
    pub class: DeterminismClass,
    /// Model hash of the weights the pseudo-gradient was taken from.
    pub weights: Hash32,
    /// Hash of the outer state it was taken against (the offer's base).
    pub outer: Hash32,
    /// Hash of the offer's blob.
    pub blob: Hash32,
    /// [`round_state_hash`] of the round.
    pub round_state: Hash32,
    /// The last finalized ledger epoch the worker knew.
    pub epoch: u64,
}

impl JobCommitment {
    /// `worker`'s offer of DiLoCo round `jobs_round + 1` on `stage`: a job of `jobs_round`,
    /// the round its inner steps' jobs carry.
    pub fn offer(
        network: Hash32,
        worker: NodeId,
        stage: u16,
        jobs_round: u64,
        claims: OfferClaims,
    ) -> Self {
        Self {
            network,
            worker,
            stage,
            round: jobs_round,
            step: claims.step,
            micro_batch: offer_micro_batch(worker, jobs_round),
            kind: JobKind::Offer,
            class: claims.class,
            weights_hash: claims.weights,
            input_hash: claims.outer,
            upstream_hash: crate::tensor::NO_HASH,
            output_hash: claims.blob,
            grads_hash: claims.round_state,
            epoch: claims.epoch,
        }
    }
}

/// The micro-batch an offer's commitment names: one per worker and round, so its key names
/// the round's offer whatever the commitment claims.
pub fn offer_micro_batch(worker: NodeId, round: u64) -> MicroBatchRef {
    MicroBatchRef {
        origin: worker,
        step: round,
        index: u32::MAX,
    }
}

/// What an offer's commitment names as its `grads_hash`: the replica's AdamW state when it
/// made the offer, and the chain of the round's job commitments (payload hashes) in the order
/// they ran, seeded with θ₀: `h₀ = H(θ₀)`, `hᵢ = H(hᵢ₋₁ ‖ jobᵢ)`, so any reordering,
/// insertion or omission changes it.
pub fn round_state_hash(theta0: &Hash32, adamw: &Hash32, jobs: &[Hash32]) -> Hash32 {
    let mut head = *blake3::Hasher::new()
        .update(b"neuroshard/audit/job-chain")
        .update(theta0)
        .finalize()
        .as_bytes();
    for j in jobs {
        head = *blake3::Hasher::new()
            .update(&head)
            .update(j)
            .finalize()
            .as_bytes();
    }
    *blake3::Hasher::new()
        .update(b"neuroshard/audit/round-state")
        .update(adamw)
        .update(&head)
        .finalize()
        .as_bytes()
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
    fn the_round_state_changes_with_the_jobs_order_omission_and_state() {
        let jobs = [[4; 32], [5; 32]];
        let h = round_state_hash(&[2; 32], &[3; 32], &jobs);
        assert_ne!(h, round_state_hash(&[2; 32], &[3; 32], &[[5; 32], [4; 32]]));
        assert_ne!(h, round_state_hash(&[2; 32], &[3; 32], &jobs[..1]));
        assert_ne!(h, round_state_hash(&[9; 32], &[3; 32], &jobs));
        assert_ne!(h, round_state_hash(&[2; 32], &[9; 32], &jobs));
    }

    #[test]
    fn an_offer_is_one_job_per_worker_and_round() {
        let w = test_identity(1);
        let mut a = commitment(&w, 0, JobKind::Offer);
        a.micro_batch = offer_micro_batch(w.node_id(), a.round);
        let mut other_blob = a;
        other_blob.output_hash = [0xee; 32];
        assert_eq!(a.key(), other_blob.key());
        let mut next = a;
        next.round += 1;
        next.micro_batch = offer_micro_batch(w.node_id(), next.round);
        assert_ne!(a.key(), next.key());
        let bytes = a.sign(&w).to_bytes();
        let back = SignedJob::from_bytes(&bytes).unwrap();
        assert_eq!(verify_job(&back).unwrap(), a);
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
    }
}
