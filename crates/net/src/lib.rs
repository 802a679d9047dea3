//! NeuroShard's network layer on rust-libp2p: one swarm per node, driven by a tokio task and
//! used through the cloneable [`Net`] handle. See `README.md` for the protocols and limits.

mod address;
mod behaviour;
mod blob;
mod codec;
mod config;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod ids;
mod net;
mod task;

pub use address::Address;
pub use behaviour::MAX_RECORD_VALUE;
pub use blob::CHUNK_SIZE;
pub use codec::{Counters, Traffic};
pub use config::{
    DEFAULT_GOSSIP_BURST, DEFAULT_GOSSIP_PER_SEC, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_DHT_KEYS, DEFAULT_MAX_FRAME, DEFAULT_MAX_GOSSIP,
    DEFAULT_MAX_QUEUED_BYTES, DEFAULT_REQUEST_BURST, DEFAULT_REQUEST_PER_SEC, GossipValidator,
    NetConfig, ProviderValidator, RecordValidator, Validation,
};
pub use error::NetError;
pub use net::{Net, NetEvent, NetEvents, ResponseChannel};
pub use neuroshard_proof::NodeId;

// Decoder tests measure their largest allocation; the allocator forwards to the system's.
#[cfg(test)]
#[global_allocator]
static ALLOC: neuroshard_mutate::TrackingAlloc = neuroshard_mutate::TrackingAlloc;
