//! What goes in and out of a [`super::NodeCore`]: messages, transmits, engine jobs and
//! their results. Plain data, so a runtime over libp2p and the simulator drive the same core.

use std::path::PathBuf;
use std::sync::Arc;

use neuroshard_model::ModelError;
use neuroshard_proof::{Canonical, Hash32, NodeId, PublicKey, Signed};

use crate::pipeline::{Job, JobDone};
use crate::records::Topic;
use crate::replica::{Applied, Prepared, ReplicaError};
use crate::serve::engine::{StepJob, StepResult, StreamKey};
use crate::serve::wire::SampleError;
use crate::wire::MicroBatchId;
use neuroshard_audit::{JobCommitment, JobInputs, JobKind, Replayed};

/// Identifies a request, a blob fetch or an engine job of one core.
pub type Token = u64;

/// Why a transfer failed (timeout, closed connection, refused, hash mismatch...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransferError(pub String);

/// Why an engine job failed. Sources sit behind `Arc` so that an [`EngineOutput`] stays
/// `Clone` (the simulator replays them).
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("DiLoCo is off")]
    DilocoOff,
    #[error("the weights of step {version} are not held (current: step {current})")]
    WeightsNotHeld { version: u64, current: u64 },
    #[error("non-finite parameter gradient")]
    NonFiniteGradient,
    #[error("optimizer step {step}: {source}")]
    Optimizer { step: u64, source: Arc<ModelError> },
    #[error(transparent)]
    Model(Arc<ModelError>),
    #[error(transparent)]
    Replica(Arc<ReplicaError>),
    #[error("no checkpoint directory")]
    NoCheckpointDir,
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("{}: hash {got} differs from the checkpoint's {want:?}", path.display())]
    DilocoHash {
        path: PathBuf,
        got: String,
        want: String,
    },
    #[error("{}: {source}", path.display())]
    DilocoState {
        path: PathBuf,
        source: Arc<ReplicaError>,
    },
    #[error("no serving weights")]
    NoServingWeights,
    #[error("a step without input")]
    EmptyStep,
    #[error("the last stage needs sampling rules")]
    NoSampling,
    #[error("the sampler's position does not fit 64 bits")]
    SamplerPosition,
    #[error("{0}")]
    Sample(#[from] SampleError),
    #[error("no result")]
    NoResult,
    #[error("this engine has no model to serve")]
    NoModel,
    #[error("no evidence kept: {0}")]
    NoEvidence(String),
    #[error("audit weights: {0}")]
    AuditWeights(String),
    #[error("audit inputs: {0}")]
    AuditInputs(String),
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        Self::Model(Arc::new(e))
    }
}

impl From<ReplicaError> for EngineError {
    fn from(e: ReplicaError) -> Self {
        Self::Replica(Arc::new(e))
    }
}

/// Something a peer sent, or the transport noticed about a peer.
#[derive(Debug, Clone)]
pub enum Inbound {
    /// A gossip message authored by the peer (already deduplicated by the transport).
    Gossip {
        topic: String,
        data: Vec<u8>,
    },
    /// The peer's request; answer with [`Transmit::Respond`] carrying the same token.
    Request {
        token: Token,
        data: Vec<u8>,
    },
    /// The answer to our [`Transmit::Request`].
    Response {
        token: Token,
        result: Result<Vec<u8>, TransferError>,
    },
    /// The bytes of our [`Transmit::FetchBlob`], already checked against the hash.
    Blob {
        token: Token,
        result: Result<Vec<u8>, TransferError>,
    },
    Connected,
    Disconnected,
}

/// What the transport must do.
#[derive(Debug, Clone)]
pub enum Transmit {
    /// Hear exactly these topics from now on (the stages a node talks to changed: the network
    /// grew a stage).
    Subscribe {
        topics: Vec<Topic>,
    },
    /// Gossip signed bytes on a topic.
    Publish {
        topic: Topic,
        data: Vec<u8>,
    },
    /// Send a request; the answer comes back as [`Inbound::Response`].
    Request {
        to: NodeId,
        token: Token,
        data: Vec<u8>,
    },
    /// Answer the request `token` that came in.
    Respond {
        token: Token,
        data: Vec<u8>,
    },
    /// Fetch the blob `hash` (at most `max` bytes) from `from`.
    FetchBlob {
        from: NodeId,
        token: Token,
        hash: Hash32,
        max: usize,
    },
    /// Serve these bytes to peers that ask for their BLAKE3 hash.
    OfferBlob {
        hash: Hash32,
        data: Arc<Vec<u8>>,
    },
    WithdrawBlob {
        hash: Hash32,
    },
    /// Store a signed record in the DHT.
    PutRecord {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Lower the peer's transport score (misbehaviour).
    Penalize {
        peer: NodeId,
        reason: String,
    },
}

/// Work for the engine, which runs one job at a time in the order they were polled.
#[derive(Debug, Clone)]
pub enum EngineJob {
    Run(Job),
    /// Compute and compress this replica's pseudo-gradient of `round`.
    SyncPrepare {
        round: u64,
    },
    /// Aggregate `round` from these messages and apply the outer step.
    SyncApply {
        round: u64,
        messages: Vec<(NodeId, Vec<u8>)>,
    },
    /// Recompute `round` over the contributor set `set`, with the messages in `extra` added.
    SyncReapply {
        round: u64,
        extra: Vec<(NodeId, Vec<u8>)>,
        set: Vec<NodeId>,
    },
    /// Take a peer's outer state of `round`.
    SyncAdopt {
        round: u64,
        bytes: Vec<u8>,
        included: bool,
    },
    /// Write a checkpoint of the stage (where is the runtime's business).
    Checkpoint {
        step: u64,
        extra: serde_json::Value,
    },
    /// The stored inputs of one of our jobs and the weights it ran at, for an auditor.
    Evidence {
        mb: MicroBatchId,
        kind: JobKind,
        weights: Hash32,
    },
    /// Replay a job of the stage `spec` on the weights it committed to.
    Replay {
        spec: neuroshard_model::StageSpec,
        job: Box<JobCommitment>,
        inputs: Box<JobInputs>,
        weights: Arc<Vec<u8>>,
    },
    /// Drop the evidence of jobs before optimizer step `before` (their audits are over).
    ForgetEvidence {
        before: u64,
    },
    /// Settle a fraud proof by replaying its job on the weights served with it.
    Settle {
        settle: Box<crate::compute::Settle>,
        weights: Arc<Vec<u8>>,
    },
    /// Inference steps of several streams in one job (the stage's batch), after dropping the
    /// caches of `evict`.
    Infer {
        steps: Vec<StepJob>,
        evict: Vec<StreamKey>,
    },
}

/// What the engine attests about a forward or backward job it ran: the hashes its commitment
/// names (see `neuroshard_audit::JobCommitment`), but the output, which is hashed as the
/// receiver sees it, after the activation codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobHashes {
    /// The optimizer step whose weights the job ran at.
    pub step: u64,
    pub weights: Hash32,
    pub input: Hash32,
    /// Backward: the output gradient or targets; forward: `NO_HASH`.
    pub upstream: Hash32,
    /// Backward: the parameter gradients and loss; forward: `NO_HASH`.
    pub grads: Hash32,
}

/// One of our jobs' evidence for an auditor: its inputs (encoded) and the weights it ran at
/// (flat `f32`, little-endian).
#[derive(Debug, Clone)]
pub struct Evidence {
    pub inputs: Arc<Vec<u8>>,
    pub weights: Arc<Vec<u8>>,
}

/// An engine job's result.
#[derive(Debug, Clone)]
pub enum EngineOutput {
    /// A finished job, with its hashes when it was a forward or backward pass that ran.
    Job(JobDone, Option<JobHashes>),
    /// Our offer, and what its commitment names.
    Prepared(Result<(Prepared, crate::compute::OfferHashes), EngineError>),
    /// The round's outcome and this replica's AdamW state (served to joiners).
    Applied(Result<(Applied, Arc<Vec<u8>>), EngineError>),
    Adopted(Result<Hash32, EngineError>),
    /// The checkpoint's model hash.
    Saved(Result<String, EngineError>),
    /// One result per step of an [`EngineJob::Infer`], in order.
    Inferred(Vec<Result<StepResult, EngineError>>),
    Evidence(Result<Evidence, EngineError>),
    /// Evidence bytes held after a [`EngineJob::ForgetEvidence`], and the budget.
    EvidenceHeld {
        bytes: u64,
        budget: u64,
    },
    Replayed(Result<Replayed, EngineError>),
    /// A fraud proof's verdict, or why the evidence was refused.
    Settled(Result<neuroshard_audit::Verdict, Arc<neuroshard_audit::EvidenceError>>),
}

/// Runs engine jobs: the real engine over a stage, or a stand-in in the simulator.
pub trait Compute {
    fn execute(&mut self, job: EngineJob) -> EngineOutput;
}

/// Why a signed message from a peer was refused.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Envelope(#[from] neuroshard_proof::EnvelopeError),
    #[error("signed by {signer}, sent by {from}")]
    NotTheSender { signer: NodeId, from: NodeId },
}

/// Opens a signed value and checks that `from` signed it; returns the signer's key too.
pub fn open_from<T: Canonical>(bytes: &[u8], from: &NodeId) -> Result<(T, PublicKey), OpenError> {
    let signed = Signed::<T>::from_bytes(bytes)?;
    let key = signed.signer();
    if key.node_id() != *from {
        return Err(OpenError::NotTheSender {
            signer: key.node_id(),
            from: *from,
        });
    }
    Ok((signed.verify()?, key))
}

/// The blob's content address, as the transport computes it.
pub fn blob_hash(data: &[u8]) -> Hash32 {
    *blake3::hash(data).as_bytes()
}
