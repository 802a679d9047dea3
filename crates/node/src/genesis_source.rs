//! What names a network and what its drivers train on: the network id (model shape, stage
//! count and dataset root, hashed) and the genesis dataset as the core's batch source.

use neuroshard_data::Genesis;
use neuroshard_proof::Hash32;

use crate::core::{BatchError, BatchSource};
use crate::settings::{DataOrder, NodeSettings};

/// The network id: model shape, stage count and dataset root, hashed.
pub fn network_id(settings: &NodeSettings, genesis_root: &Hash32) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/network/v1");
    h.update(
        serde_json::to_string(&settings.model)
            .unwrap_or_default()
            .as_bytes(),
    );
    h.update(&(settings.stages as u64).to_le_bytes());
    h.update(genesis_root);
    *h.finalize().as_bytes()
}

/// The genesis dataset as the core's batch source.
pub struct GenesisBatches {
    pub genesis: Genesis,
    pub order: DataOrder,
    pub seed: u64,
    pub batch: usize,
    pub seq: usize,
}

impl BatchSource for GenesisBatches {
    fn batch(&self, origin: &[u8; 32], step: u64) -> Result<neuroshard_data::Batch, BatchError> {
        let b = match self.order {
            DataOrder::Assigned => self
                .genesis
                .train_batch(origin, 0, step, self.batch, self.seq),
            DataOrder::Global => self.genesis.batch(
                neuroshard_data::Split::Train,
                self.seed,
                step,
                self.batch,
                self.seq,
            ),
        };
        b.map_err(|e| BatchError(e.to_string()))
    }
}
