//! Fraud proofs and their verdict, which every node reaches alike by replaying the one job.

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, Identity, NodeId, Reader, Signed, Writer,
};

use crate::class::{DeterminismClass, Tolerance};
use crate::commit::{CommitError, JobCommitment, JobKey, JobKind, SignedJob, verify_job};
use crate::provenance::{GenesisText, check_provenance};
use crate::sample::{AuditRate, ChallengeSeed, auditor_for, is_challenged};
use crate::tensor::{EvidenceLimits, JobInputs, LimitError, Tensor, UpstreamData};

/// The auditor's signed claim: "replaying `job` I get these hashes, not the committed ones".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accusation {
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    pub job: JobKey,
    /// Payload hash of the exact signed commitment accused.
    pub commitment: Hash32,
    pub claimed_output_hash: Hash32,
    pub claimed_grads_hash: Hash32,
    /// What the worker is accused of.
    pub charge: Charge,
    /// When the auditor filed it (its own clock, signed): the time ledgers record for the
    /// verdict, the same on every node.
    pub timestamp_ms: u64,
}

impl Canonical for Accusation {
    const DOMAIN: &'static str = "neuroshard/audit/accusation/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.u16(self.stage);
        w.u64(self.round);
        w.fixed(&self.job.0);
        w.fixed(&self.commitment);
        w.fixed(&self.claimed_output_hash);
        w.fixed(&self.claimed_grads_hash);
        w.u8(self.charge as u8);
        w.u64(self.timestamp_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            stage: r.u16()?,
            round: r.u64()?,
            job: JobKey(r.array()?),
            commitment: r.array()?,
            claimed_output_hash: r.array()?,
            claimed_grads_hash: r.array()?,
            charge: match r.u8()? {
                0 => Charge::Replay,
                1 => Charge::Provenance,
                v => {
                    return Err(CodecError::Invalid {
                        field: "charge",
                        reason: format!("unknown charge {v}"),
                    });
                }
            },
            timestamp_ms: r.u64()?,
        })
    }
}

/// What an accusation claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Charge {
    /// A replay of the job gives other outputs than the worker committed (the accusation
    /// carries the replay's hashes).
    Replay = 0,
    /// The first stage's tokens are not the genesis text they name (no replay needed: the
    /// checker reads the named windows, [`check_provenance_charge`]).
    Provenance = 1,
}

/// Evidence that a committed job's outputs are not what its inputs give: the signed
/// accusation, the signed commitment, the committed inputs, and (optionally) the tensor the
/// worker sent, which lets a checker of another class compare values within a tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct FraudProof {
    pub accusation: Signed<Accusation>,
    pub job: SignedJob,
    pub inputs: JobInputs,
    pub sent_output: Option<Tensor>,
}

impl FraudProof {
    /// Builds and signs the auditor's side of the evidence.
    #[allow(clippy::too_many_arguments)] // the parts of the evidence, each needed once
    pub fn new(
        auditor: &Identity,
        job: SignedJob,
        commitment: &JobCommitment,
        inputs: JobInputs,
        claimed: &Replayed,
        sent_output: Option<Tensor>,
        timestamp_ms: u64,
    ) -> Self {
        let claimed = (claimed.output_hash, claimed.grads_hash);
        let accusation = accuse(&job, commitment, claimed, Charge::Replay, timestamp_ms);
        Self {
            accusation: Signed::sign(auditor, &accusation),
            job,
            inputs,
            sent_output,
        }
    }

    /// The evidence that a first-stage job's tokens are not the genesis text they name: the
    /// committed inputs are the whole case (the hashes claimed are the committed ones).
    pub fn provenance(
        auditor: &Identity,
        job: SignedJob,
        commitment: &JobCommitment,
        inputs: JobInputs,
        timestamp_ms: u64,
    ) -> Self {
        let claimed = (commitment.output_hash, commitment.grads_hash);
        let accusation = accuse(&job, commitment, claimed, Charge::Provenance, timestamp_ms);
        Self {
            accusation: Signed::sign(auditor, &accusation),
            job,
            inputs,
            sent_output: None,
        }
    }

    /// The charge the accusation makes (None when its payload does not decode; the
    /// signature is not checked here: [`check_before_replay`] does that).
    pub fn charge(&self) -> Option<Charge> {
        Accusation::from_canonical_bytes(self.accusation.payload_bytes())
            .ok()
            .map(|a| a.charge)
    }
}

impl Canonical for FraudProof {
    const DOMAIN: &'static str = "neuroshard/audit/fraud-proof/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.accusation.to_bytes());
        w.bytes(&self.job.to_bytes());
        self.inputs.encode(w);
        match &self.sent_output {
            None => w.u8(0),
            Some(t) => {
                w.u8(1);
                t.encode(w);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        // Both envelopes are a few hundred bytes; 4 KiB bounds them generously.
        let envelope = |r: &mut Reader<'_>, field| -> Result<Vec<u8>, CodecError> {
            r.bytes(4096).map(<[u8]>::to_vec).map_err(|e| match e {
                CodecError::TooLong { got, max } => CodecError::TooLong { got, max },
                other => CodecError::Invalid {
                    field,
                    reason: other.to_string(),
                },
            })
        };
        let framing = |field| {
            move |e: EnvelopeError| CodecError::Invalid {
                field,
                reason: e.to_string(),
            }
        };
        let accusation =
            Signed::from_bytes(&envelope(r, "accusation")?).map_err(framing("accusation"))?;
        let job = Signed::from_bytes(&envelope(r, "job commitment")?)
            .map_err(framing("job commitment"))?;
        let inputs = JobInputs::decode(r)?;
        let sent_output = match r.u8()? {
            0 => None,
            1 => Some(Tensor::decode(r)?),
            v => {
                return Err(CodecError::Invalid {
                    field: "sent output",
                    reason: format!("unknown tag {v}"),
                });
            }
        };
        Ok(Self {
            accusation,
            job,
            inputs,
            sent_output,
        })
    }
}

/// The accusation of `job` (whose payload is `commitment`) with the hashes the accuser got.
fn accuse(
    job: &SignedJob,
    commitment: &JobCommitment,
    (claimed_output_hash, claimed_grads_hash): (Hash32, Hash32),
    charge: Charge,
    timestamp_ms: u64,
) -> Accusation {
    Accusation {
        network: commitment.network,
        stage: commitment.stage,
        round: commitment.round,
        job: commitment.key(),
        commitment: job.payload_hash(),
        claimed_output_hash,
        claimed_grads_hash,
        charge,
        timestamp_ms,
    }
}

/// What a replay produced: the hashes a commitment names, and the tensor sent on (for the
/// tolerance comparison across classes).
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub output_hash: Hash32,
    pub grads_hash: Hash32,
    pub output: Option<Tensor>,
}

/// Recomputes one job. The model crate implements it over the real engine; it finds the
/// weights by `job.weights_hash` and must run the very code path the worker's engine runs.
pub trait Replayer {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The class this replayer's bits belong to.
    fn class(&self) -> DeterminismClass;

    fn replay(&self, job: &JobCommitment, inputs: &JobInputs) -> Result<Replayed, Self::Error>;
}

/// What a checker knows independently of the evidence: the finalized round it audits and the
/// network's rules. Built from the node's own ledger and round state, never from the evidence.
#[derive(Debug, Clone, Copy)]
pub struct AuditContext<'a> {
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    pub seed: ChallengeSeed,
    /// Validators registered for the stage in that round.
    pub validators: &'a [NodeId],
    pub rate: AuditRate,
    pub limits: EvidenceLimits,
    pub tolerance: Tolerance,
}

/// A replay across classes compared with the tensor the worker sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossClass {
    pub max_abs_diff: f32,
    pub within_tolerance: bool,
}

/// The outcome of a fraud proof. Only the first two move stake.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The replay contradicts the worker's commitment.
    Guilty {
        job: JobKey,
        worker: NodeId,
        auditor: NodeId,
    },
    /// The replay reproduces the worker's commitment: the accuser lied or erred.
    FalseAccusation {
        job: JobKey,
        worker: NodeId,
        auditor: NodeId,
    },
    /// The checker is of another class than the job: its bits prove nothing either way, so
    /// it compares values (when the sent tensor is given) and hands the case to a checker of
    /// the job's class; no stake moves.
    Escalate {
        job: JobKey,
        job_class: DeterminismClass,
        checker_class: DeterminismClass,
        comparison: Option<CrossClass>,
    },
}

/// Why evidence was refused without a verdict. None of these move stake.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("accusation: {0}")]
    Accusation(EnvelopeError),
    #[error(transparent)]
    Commitment(#[from] CommitError),
    #[error("evidence is for network {got:02x?}, this is {want:02x?}")]
    WrongNetwork { got: Hash32, want: Hash32 },
    #[error(
        "evidence names stage {stage} round {round}; this audit is of stage {want_stage} round {want_round}"
    )]
    WrongRound {
        stage: u16,
        round: u64,
        want_stage: u16,
        want_round: u64,
    },
    #[error("the accusation is about another commitment than the one enclosed")]
    AccusationMismatch,
    #[error("a worker cannot audit its own job")]
    SelfAudit,
    #[error("the sampler did not pick this job for audit")]
    NotChallenged,
    #[error("the job's auditor is {assigned:?}, not the accuser")]
    NotAssigned { assigned: Option<NodeId> },
    #[error("the accusation claims the committed hashes: there is nothing to dispute")]
    NoDispute,
    #[error("inputs: {0}")]
    Limits(#[from] LimitError),
    #[error("the enclosed {0} does not hash to the committed one")]
    InputMismatch(&'static str),
    #[error("a tensor in the evidence holds a non-finite value")]
    NonFinite,
    #[error("a {0:?} job with the other kind's upstream data")]
    KindMismatch(JobKind),
    #[error("a provenance charge against a job of a stage other than the first")]
    NotFirstStage,
    #[error("the accusation's charge needs another check")]
    WrongCharge,
    #[error("replay failed: {0}")]
    Replay(Box<dyn std::error::Error + Send + Sync>),
}

/// Settles a fraud proof for the audit `ctx` describes, by replaying the job with `replayer`.
///
/// Checked in order, cheapest first, so malformed or misdirected evidence costs no replay:
/// signatures; network, stage and round; that the accusation names the enclosed commitment;
/// that the sampler picked the job and assigned it to the accuser; that there is a dispute;
/// the inputs' size and hashes. Only then is the one job replayed.
pub fn check<R: Replayer>(
    ctx: &AuditContext<'_>,
    proof: &FraudProof,
    replayer: &R,
) -> Result<Verdict, EvidenceError> {
    let (c, auditor) = check_before_replay(ctx, proof)?;
    if proof.charge() != Some(Charge::Replay) {
        return Err(EvidenceError::WrongCharge);
    }
    let key = c.key();
    let checker_class = replayer.class();
    if !checker_class.job_bits_comparable(&c.class) {
        let replayed = replayer
            .replay(&c, &proof.inputs)
            .map_err(|e| EvidenceError::Replay(Box::new(e)))?;
        let comparison = match (&replayed.output, &proof.sent_output) {
            (Some(mine), Some(sent)) => {
                let (max_abs_diff, within_tolerance) =
                    ctx.tolerance.compare(&mine.data, &sent.data);
                Some(CrossClass {
                    max_abs_diff,
                    within_tolerance,
                })
            }
            _ => None,
        };
        return Ok(Verdict::Escalate {
            job: key,
            job_class: c.class,
            checker_class,
            comparison,
        });
    }

    let replayed = replayer
        .replay(&c, &proof.inputs)
        .map_err(|e| EvidenceError::Replay(Box::new(e)))?;
    if (replayed.output_hash, replayed.grads_hash) == (c.output_hash, c.grads_hash) {
        Ok(Verdict::FalseAccusation {
            job: key,
            worker: c.worker,
            auditor,
        })
    } else {
        Ok(Verdict::Guilty {
            job: key,
            worker: c.worker,
            auditor,
        })
    }
}

/// Settles a [`Charge::Provenance`] proof: after the checks of [`check_before_replay`], the
/// worker is guilty when its committed tokens are not the genesis windows they name
/// ([`check_provenance`]), and the accuser is when they are. No replay: the genesis text is
/// the same on every node, so every node reaches the same verdict.
pub fn check_provenance_charge(
    ctx: &AuditContext<'_>,
    proof: &FraudProof,
    text: &dyn GenesisText,
) -> Result<Verdict, EvidenceError> {
    let (c, auditor) = check_before_replay(ctx, proof)?;
    if proof.charge() != Some(Charge::Provenance) {
        return Err(EvidenceError::WrongCharge);
    }
    // An offer reads no tokens: its input is the outer state, which names no genesis text.
    if c.kind == JobKind::Offer {
        return Err(EvidenceError::KindMismatch(c.kind));
    }
    let (job, worker) = (c.key(), c.worker);
    Ok(match check_provenance(&proof.inputs, text) {
        Ok(()) => Verdict::FalseAccusation {
            job,
            worker,
            auditor,
        },
        Err(_) => Verdict::Guilty {
            job,
            worker,
            auditor,
        },
    })
}

/// Every check of [`check`] that needs no replay: what a node runs before it fetches the
/// weights a replay needs, so that evidence that cannot convict costs it nothing. Returns the
/// commitment and the accuser.
pub fn check_before_replay(
    ctx: &AuditContext<'_>,
    proof: &FraudProof,
) -> Result<(JobCommitment, NodeId), EvidenceError> {
    let acc = proof
        .accusation
        .verify()
        .map_err(EvidenceError::Accusation)?;
    let auditor = proof.accusation.signer().node_id();
    let c = verify_job(&proof.job)?;
    for got in [acc.network, c.network] {
        if got != ctx.network {
            return Err(EvidenceError::WrongNetwork {
                got,
                want: ctx.network,
            });
        }
    }
    for (stage, round) in [(acc.stage, acc.round), (c.stage, c.round)] {
        if (stage, round) != (ctx.stage, ctx.round) {
            return Err(EvidenceError::WrongRound {
                stage,
                round,
                want_stage: ctx.stage,
                want_round: ctx.round,
            });
        }
    }
    let key = c.key();
    if acc.job != key || acc.commitment != proof.job.payload_hash() {
        return Err(EvidenceError::AccusationMismatch);
    }
    if auditor == c.worker {
        return Err(EvidenceError::SelfAudit);
    }
    if !is_challenged(&ctx.seed, &key, ctx.rate) {
        return Err(EvidenceError::NotChallenged);
    }
    let assigned = auditor_for(&ctx.seed, &key, c.worker, ctx.validators);
    if assigned != Some(auditor) {
        return Err(EvidenceError::NotAssigned { assigned });
    }
    match acc.charge {
        Charge::Replay
            if (acc.claimed_output_hash, acc.claimed_grads_hash)
                == (c.output_hash, c.grads_hash) =>
        {
            return Err(EvidenceError::NoDispute);
        }
        Charge::Replay => {}
        // Only the embedding stage reads genesis text.
        Charge::Provenance if c.stage != 0 => return Err(EvidenceError::NotFirstStage),
        Charge::Provenance => {}
    }
    check_inputs(ctx, proof, &c)?;

    Ok((c, auditor))
}

fn check_inputs(
    ctx: &AuditContext<'_>,
    proof: &FraudProof,
    c: &JobCommitment,
) -> Result<(), EvidenceError> {
    let inputs = &proof.inputs;
    inputs.check_limits(&ctx.limits)?;
    // Decoding refuses them already; evidence built in memory is checked here too, since an
    // honest engine refuses non-finite inputs and such a job never ran.
    let finite = |t: &Tensor| t.data.iter().all(|x| x.is_finite());
    let tensors = [
        match &inputs.input {
            crate::tensor::StageData::Hidden(t) => Some(t),
            crate::tensor::StageData::Tokens(_)
            | crate::tensor::StageData::Genesis(_)
            | crate::tensor::StageData::Outer { .. } => None,
        },
        match &inputs.upstream {
            UpstreamData::Grad(g) => Some(g),
            _ => None,
        },
        proof.sent_output.as_ref(),
    ];
    if !tensors.into_iter().flatten().all(finite) {
        return Err(EvidenceError::NonFinite);
    }
    let outer = matches!(inputs.input, crate::tensor::StageData::Outer { .. });
    match (c.kind, &inputs.upstream, outer) {
        (JobKind::Forward, UpstreamData::None, false) => {}
        (JobKind::Backward, UpstreamData::Grad(_) | UpstreamData::Targets(_), false) => {}
        (JobKind::Offer, UpstreamData::None, true) => {}
        (kind, ..) => return Err(EvidenceError::KindMismatch(kind)),
    }
    if inputs.input.hash() != c.input_hash {
        return Err(EvidenceError::InputMismatch("input"));
    }
    if inputs.upstream.hash() != c.upstream_hash {
        return Err(EvidenceError::InputMismatch("upstream data"));
    }
    if let Some(sent) = &proof.sent_output {
        let (batch, seq) = inputs.input.rows();
        if [sent.batch, sent.seq, sent.dim] != [batch, seq, ctx.limits.dim] {
            return Err(LimitError::Shape {
                what: "sent output",
                got: [sent.batch, sent.seq, sent.dim],
                want: [batch, seq, ctx.limits.dim],
            }
            .into());
        }
        if sent.hash() != c.output_hash {
            return Err(EvidenceError::InputMismatch("sent output"));
        }
    }
    Ok(())
}

/// Two commitments by one worker to the same job, on the same weights and inputs and in the
/// same class, that claim different outputs: a deterministic job has one result, so one of
/// them is a lie whichever was sent. Needs no replay. Returns the job and the worker.
///
/// A job legitimately run twice (a micro-batch re-sent after a step) differs in its weights
/// hash, so it is never mistaken for this.
pub fn check_equivocation(a: &SignedJob, b: &SignedJob) -> Result<(JobKey, NodeId), EvidenceError> {
    let (x, y) = (verify_job(a)?, verify_job(b)?);
    let same_job = x.key() == y.key()
        && x.class == y.class
        && (x.weights_hash, x.input_hash, x.upstream_hash)
            == (y.weights_hash, y.input_hash, y.upstream_hash);
    if !same_job {
        return Err(EvidenceError::AccusationMismatch);
    }
    if (x.output_hash, x.grads_hash) == (y.output_hash, y.grads_hash) {
        return Err(EvidenceError::NoDispute);
    }
    Ok((x.key(), x.worker))
}

#[cfg(test)]
mod tests;
