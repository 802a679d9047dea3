//! A NeuroShard node: stage roles, the micro-batched pipeline across peers, swarm routing
//! with failover, signed heartbeats and DHT records, and the runtime that joins them to the
//! network (`neuroshard-net`) and the engine (`neuroshard-model`).
//!
//! The protocol modules (`pipeline`, `peers`, `router`, `records`, `wire`) are sans-IO: they
//! take messages, time and results and return actions, so tests drive them without sockets.

pub mod act_codec;
pub mod compute;
pub mod core;
pub mod economy;
pub mod events;
pub mod finality;
pub mod genesis_source;
pub mod layout;
pub mod network;
pub mod peers;
pub mod pipeline;
pub mod recent;
pub mod records;
pub mod replica;
pub mod router;
pub mod runtime;
pub mod serve;
pub mod settings;
pub mod startup;
pub mod sync;
pub mod telemetry;
pub mod wire;

use std::path::{Path, PathBuf};

pub use pipeline::{Action, Job, JobDone, Pipeline, PipelineConfig};
pub use records::Role;
pub use settings::{DataOrder, NodeSettings};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Config(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("identity: {0}")]
    Identity(#[from] neuroshard_proof::IdentityError),
    #[error("dataset: {0}")]
    Data(#[from] neuroshard_data::DataError),
    #[error("model: {0}")]
    Model(#[from] neuroshard_model::ModelError),
    #[error("network: {0}")]
    Net(#[from] neuroshard_net::NetError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("start-up: {0}")]
    Start(#[from] startup::StartError),
    #[error("network genesis: {0}")]
    Network(#[from] network::NetworkError),
    #[error("ledger: {0}")]
    Economy(#[from] economy::EconomyError),
}

impl NodeError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        NodeError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
