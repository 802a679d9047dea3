//! What a network's drivers train on: the genesis dataset as the core's batch source (the
//! network itself is named by its signed genesis, `crate::network`).

use neuroshard_data::Genesis;

use crate::core::{BatchError, BatchSource};
use crate::settings::DataOrder;

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
