//! The one error type of the network layer.

/// Why a network operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("secret key is zero or not below the secp256k1 group order")]
    InvalidSecret,
    #[error("not a compressed secp256k1 public key")]
    InvalidPublicKey,
    #[error("transport set-up failed: {0}")]
    Transport(String),
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("not a transport address: {addr:?}: {reason}")]
    InvalidAddress { addr: String, reason: String },
    #[error("dial failed: {0}")]
    DialFailure(String),
    #[error("request timed out")]
    Timeout,
    #[error("connection closed before the response arrived")]
    ConnectionClosed,
    #[error("peer does not support the protocol")]
    UnsupportedProtocol,
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    #[error("remote failed: {0}")]
    Remote(String),
    #[error("publish failed: {0}")]
    Publish(String),
    #[error("record store: {0}")]
    Record(String),
    #[error("the record validator refused the record")]
    InvalidRecord,
    #[error("peer does not have the blob")]
    BlobNotFound,
    #[error("blob of {len} bytes exceeds the limit of {max} bytes")]
    BlobTooLarge { len: u64, max: usize },
    #[error("blob content does not match its BLAKE3 hash")]
    HashMismatch,
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("no transport address known for node {0}")]
    UnknownPeer(neuroshard_proof::NodeId),
    #[error("the network task has shut down")]
    Shutdown,
}
