//! What goes in and out of a [`super::NodeCore`]: messages, transmits, engine jobs and
//! their results. Plain data, so a runtime over libp2p and the simulator drive the same core.

use std::sync::Arc;

use neuroshard_proof::{Canonical, Hash32, NodeId, PublicKey, Signed};

use crate::pipeline::{Job, JobDone};
use crate::records::Topic;
use crate::replica::{Applied, Prepared};
use crate::serve::engine::{StepJob, StepResult, StreamKey};

/// Identifies a request, a blob fetch or an engine job of one core.
pub type Token = u64;

/// Why a transfer failed (timeout, closed connection, refused, hash mismatch...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransferError(pub String);

/// Why an engine job failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

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
    /// Inference steps of several streams in one job (the stage's batch), after dropping the
    /// caches of `evict`.
    Infer {
        steps: Vec<StepJob>,
        evict: Vec<StreamKey>,
    },
}

/// An engine job's result.
#[derive(Debug, Clone)]
pub enum EngineOutput {
    Job(JobDone),
    Prepared(Result<Prepared, EngineError>),
    /// The round's outcome and this replica's AdamW state (served to joiners).
    Applied(Result<(Applied, Arc<Vec<u8>>), EngineError>),
    Adopted(Result<Hash32, EngineError>),
    /// The checkpoint's model hash.
    Saved(Result<String, EngineError>),
    /// One result per step of an [`EngineJob::Infer`], in order.
    Inferred(Vec<Result<StepResult, EngineError>>),
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
