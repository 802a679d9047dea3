//! Inference through the pipeline.
//!
//! A request enters at any node, which becomes the stream's coordinator: it sends the prompt
//! to a live replica of stage 0, that replica's hidden states to a replica of stage 1, and so
//! on; the last stage samples a token, which comes back to the coordinator and goes out again
//! to stage 0. Each replica keeps a key/value cache per stream, so a new token costs one
//! token's forward pass per stage. The coordinator keeps every stage's inputs, so when a
//! replica fails it feeds another replica the stream's history in the same chunks (the same
//! computations, hence the same cache) and the stream goes on. Replicas serve from θ₀, the
//! outer weights every replica of a stage shares, so any of them answers alike while training
//! moves its inner weights.
//!
//! Sans-IO like the rest of the core: the coordinator and the replica side live in
//! `core/serve.rs`, the engine side (caches, runner, sampling) in [`engine`], the messages in
//! [`wire`]. The runtime hands requests in through [`ServeCmd`] (from a [`ServeHandle`]) and streams [`ServeEvent`]s
//! out.

pub mod engine;
pub mod handle;
pub mod wire;

use std::time::Duration;

pub use handle::{HandleError, ServeCmd, ServeHandle, StreamRx};
pub use wire::{Chunk, Head, InferMsg, InferReply, SampleSpec};

/// Bounds of the serving path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Streams this node coordinates at once (beyond: refused, the API answers 503).
    pub max_streams: usize,
    /// Streams whose caches a replica keeps for one peer; a peer opening more evicts its own
    /// least recently used one.
    pub per_peer: usize,
    /// Streams whose caches a replica keeps in all; beyond, new streams are answered busy.
    pub cached: usize,
    /// Steps queued for the engine; beyond, busy.
    pub queued: usize,
    /// A cache unused this long is dropped.
    pub idle: Duration,
    /// A hop without an answer this long goes to another replica.
    pub hop_timeout: Duration,
    /// Serve only paid requests.
    pub paid_only: bool,
    /// Least fee per stage a paid request must offer (NEURO units).
    pub min_fee_per_stage: u64,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_streams: 64,
            per_peer: 64,
            cached: 256,
            queued: 256,
            idle: Duration::from_secs(60),
            hop_timeout: Duration::from_secs(10),
            paid_only: false,
            min_fee_per_stage: 0,
        }
    }
}

/// A completion request in token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sample: SampleSpec,
    /// Ends the stream without being emitted (the tokenizer's end of text).
    pub stop_token: Option<u32>,
    /// The caller's signed `PayInference` op (wire bytes), if the request is paid.
    pub payment: Option<Vec<u8>>,
}

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` generated, or the model's `max_seq` reached.
    Length,
    /// The stop token was drawn.
    Stop,
    /// The caller cancelled it (a stop string, a closed connection).
    Cancelled,
}

/// What a coordinator reports about its streams.
#[derive(Debug, Clone, PartialEq)]
pub enum ServeEvent {
    Token { stream: u64, token: u32 },
    Finished { stream: u64, reason: Finish },
    Failed { stream: u64, error: String },
}

impl ServeEvent {
    pub fn stream(&self) -> u64 {
        match self {
            ServeEvent::Token { stream, .. }
            | ServeEvent::Finished { stream, .. }
            | ServeEvent::Failed { stream, .. } => *stream,
        }
    }
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Invalid(String),
    #[error("this node coordinates {0} streams already")]
    Full(usize),
    /// The payment is missing (a paid-only node), malformed or not good for this node.
    #[error("payment: {0}")]
    Payment(#[from] crate::core::PaymentRefused),
}
