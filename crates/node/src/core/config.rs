//! What a core starts from, and the genesis data it is handed as a pure function.

use std::time::Instant;

use neuroshard_model::StageSpec;
use neuroshard_proof::{Hash32, Identity};

use super::evaluate::Window;
use crate::peers::PeerTable;
use crate::settings::NodeSettings;

/// Why a batch could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BatchError(pub String);

/// The batches a driver trains on: a pure function of the genesis dataset.
pub trait BatchSource: Send {
    /// The batch the driver `origin` trains on at `step`, when `drivers` (sorted, `origin`
    /// among them) are the network's drivers: drivers of a round share the data without
    /// overlap.
    fn batch(
        &self,
        origin: &[u8; 32],
        step: u64,
        drivers: &[[u8; 32]],
    ) -> Result<neuroshard_data::Batch, BatchError>;

    /// The first `windows` held-out windows of `seq` inputs (fewer when the validation split
    /// has fewer), the same ones every time: what the validation loss is measured on.
    fn validation(&self, windows: usize, seq: usize) -> Result<Vec<Window>, BatchError>;

    /// The `seq + 1` tokens of genesis training window `window` of shard `shard` (None when
    /// there is no such window, or no genesis): what a provenance check compares a driver's
    /// committed rows with.
    fn genesis_window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>>;

    /// Whether `targets` (rows of `seq`) are the training data the driver `origin` read at
    /// `step` from the windows they name: the last stage's check of every micro-batch.
    fn check_targets(
        &self,
        origin: &[u8; 32],
        step: u64,
        seq: usize,
        targets: &crate::wire::Targets,
    ) -> Result<(), BatchError>;
}

/// Everything the core starts from; the runtime (or simulator) prepares it.
pub struct CoreConfig {
    pub settings: NodeSettings,
    pub identity: Identity,
    pub network: Hash32,
    /// The network's signed genesis (the bytes whose hash is `network`), served to joiners
    /// that ask which network this node is in.
    pub network_genesis: Vec<u8>,
    pub stage: usize,
    pub spec: StageSpec,
    /// The stage orders the node knows at start (version 0, and for a joiner of a grown
    /// network the version it joined); finalized upgrades add the rest.
    pub layouts: crate::layout::Layouts,
    /// Parameters of the stage (bounds what peers may send).
    pub numel: usize,
    /// Optimizer steps already taken (resumed or borrowed by a joiner).
    pub steps_done: u64,
    pub sync_round: u64,
    pub sync_theta: Hash32,
    /// Seed of the core's own randomness (anti-entropy peer choice).
    pub seed: u64,
    /// The instant the core starts at and the Unix time in ms it corresponds to.
    pub start: Instant,
    pub start_unix_ms: u64,
    /// Addresses the node announces in its DHT record.
    pub addrs: Vec<String>,
    /// Peers heard of before the core started (heartbeats, DHT providers).
    pub peers: PeerTable,
    /// The determinism class this node's job commitments name
    /// (`neuroshard_model::replay::determinism_class`).
    pub class: neuroshard_audit::DeterminismClass,
}
