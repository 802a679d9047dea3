//! What a network's drivers train on: the genesis dataset as the core's batch source (the
//! network itself is named by its signed genesis, `crate::network`).

use neuroshard_data::Genesis;

use crate::core::{BatchError, BatchSource, Window};
use crate::settings::DataOrder;
use crate::wire::Targets;
use neuroshard_data::Split;

/// The genesis dataset as the core's batch source.
pub struct GenesisBatches {
    pub genesis: Genesis,
    pub order: DataOrder,
    pub seed: u64,
    pub batch: usize,
    pub seq: usize,
    /// Driver steps per data round: the drivers move on to the next shard every this many
    /// steps (the DiLoCo round length, so a round's pseudo-gradients come from disjoint data).
    pub round_steps: u64,
}

/// Data round length when DiLoCo is off (no round to follow).
pub const ROUND_STEPS_WITHOUT_SYNC: u64 = 20;

impl BatchSource for GenesisBatches {
    fn batch(
        &self,
        origin: &[u8; 32],
        step: u64,
        drivers: &[[u8; 32]],
    ) -> Result<neuroshard_data::Batch, BatchError> {
        let b = match self.order {
            DataOrder::Assigned => self.genesis.rotated_train_batch(
                drivers,
                origin,
                step / self.round_steps.max(1),
                step,
                self.batch,
                self.seq,
            ),
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

    fn validation(&self, windows: usize, seq: usize) -> Result<Vec<Window>, BatchError> {
        let batches = self
            .genesis
            .val_batches(1, seq, windows)
            .map_err(|e| BatchError(e.to_string()))?;
        Ok(batches.into_iter().map(|b| (b.inputs, b.targets)).collect())
    }

    fn genesis_window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>> {
        self.genesis
            .window(Split::Train, shard as usize, window, seq as usize)
            .ok()
    }

    /// Each row must be the targets of the training window it names (which driver read it
    /// when is not checked: the assignment depends on the driver set each driver sees).
    fn check_targets(
        &self,
        _origin: &[u8; 32],
        _step: u64,
        seq: usize,
        targets: &Targets,
    ) -> Result<(), BatchError> {
        let rows = targets.windows.len();
        if rows == 0 || rows.checked_mul(seq) != Some(targets.ids.len()) {
            return Err(BatchError(format!(
                "{} targets name {rows} genesis windows of {seq}",
                targets.ids.len()
            )));
        }
        for (w, row) in targets.windows.iter().zip(targets.ids.chunks_exact(seq)) {
            let tokens = self
                .genesis
                .window(Split::Train, w.shard as usize, w.window, seq)
                .map_err(|e| BatchError(e.to_string()))?;
            if tokens.get(1..) != Some(row) {
                return Err(BatchError(format!(
                    "targets differ from genesis window {}:{}",
                    w.shard, w.window
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use neuroshard_data::{BuildOptions, NoProgress, SyntheticConfig, build};
    use neuroshard_proof::Identity;

    use super::*;

    fn source(dir: &std::path::Path) -> GenesisBatches {
        let opts = BuildOptions {
            synthetic: Some(SyntheticConfig {
                seed: 3,
                tokens: 60_000,
                ..SyntheticConfig::default()
            }),
            shard_tokens: 4096,
            val_fraction: 0.05,
            ..BuildOptions::new(dir.join("gen"))
        };
        build(&opts, &Identity::generate(), &NoProgress).expect("genesis");
        GenesisBatches {
            genesis: Genesis::open(&dir.join("gen")).expect("open"),
            order: DataOrder::Assigned,
            seed: 0,
            batch: 4,
            seq: 16,
            round_steps: 5,
        }
    }

    fn shards(b: &neuroshard_data::Batch) -> BTreeSet<usize> {
        b.windows.iter().map(|w| w.shard).collect()
    }

    #[test]
    fn drivers_share_the_data_out_by_round_and_move_on_each_round() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = source(dir.path());
        let drivers = [[1u8; 32], [2; 32], [3; 32]];
        let mut seen: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); 3];
        for round in 0..12u64 {
            let step = round * 5 + 2;
            let mut taken = BTreeSet::new();
            for (i, d) in drivers.iter().enumerate() {
                let b = src.batch(d, step, &drivers).expect("batch");
                let s = shards(&b);
                assert_eq!(s.len(), 1, "one shard per driver and round");
                assert!(
                    taken.is_disjoint(&s),
                    "round {round}: two drivers on one shard"
                );
                taken.extend(s.iter().copied());
                seen[i].extend(s);
            }
        }
        // Over the run each driver visits more than the one shard it would hold if fixed.
        for (i, s) in seen.iter().enumerate() {
            assert!(s.len() >= 3, "driver {i} saw only shards {s:?}");
        }
        // Steps inside one round stay on its shard; the batch is a pure function of its inputs.
        let a = src.batch(&drivers[0], 10, &drivers).expect("batch");
        let b = src.batch(&drivers[0], 14, &drivers).expect("batch");
        assert_eq!(shards(&a), shards(&b));
        assert_eq!(a, src.batch(&drivers[0], 10, &drivers).expect("batch"));
    }
}
