//! A synthetic batch source with learnable structure, so the simulator needs no dataset on
//! disk: each row follows `next = (a·prev + b) mod vocab` with a few random restarts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use neuroshard_data::{Batch, Split, WindowRef};
use neuroshard_node::core::{BatchError, BatchSource, Window};
use neuroshard_node::wire::{TargetWindow, Targets};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Batches for drivers: a pure function of (origin, step).
#[derive(Debug, Clone)]
pub struct PatternBatches {
    pub vocab: usize,
    pub rows: usize,
    pub seq: usize,
    /// Shards the rows are said to come from (for proofs' shard claims).
    pub shards: usize,
    /// Every row drawn, by the (shard, window) name it was given, shared by the sources of
    /// one simulation: the "genesis text" a provenance check reads back. (A row is a function
    /// of the driver and step, not of its name, so the names are remembered rather than
    /// derived; the draws are those the simulator always made.)
    pub drawn: Drawn,
}

/// Rows by name, shared across a simulation's nodes.
pub type Drawn = Arc<Mutex<HashMap<(u32, u64), Vec<u32>>>>;

impl BatchSource for PatternBatches {
    fn batch(&self, origin: &[u8; 32], step: u64, _: &[[u8; 32]]) -> Result<Batch, BatchError> {
        if self.vocab < 2 || self.rows == 0 || self.seq == 0 {
            return Err(BatchError("empty pattern configuration".into()));
        }
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&step.to_le_bytes());
        seed[8..].copy_from_slice(&origin[..24]);
        let mut rng = ChaCha8Rng::from_seed(seed);
        let mut inputs = Vec::with_capacity(self.rows * self.seq);
        let mut targets = Vec::with_capacity(self.rows * self.seq);
        let mut windows = Vec::with_capacity(self.rows);
        for _ in 0..self.rows {
            let (i, t) = self.row(&mut rng);
            let shard = rng.random_range(0..self.shards.max(1));
            let window = Self::window_id(origin, step, windows.len());
            if let Ok(mut drawn) = self.drawn.lock() {
                let text = i.iter().chain(t.last()).copied().collect();
                drawn.insert((shard as u32, window), text);
            }
            inputs.extend_from_slice(&i);
            targets.extend_from_slice(&t);
            windows.push(WindowRef {
                split: Split::Train,
                shard,
                window,
            });
        }
        let mut h = blake3::Hasher::new();
        for x in &inputs {
            h.update(&x.to_le_bytes());
        }
        Ok(Batch {
            inputs,
            targets,
            rows: self.rows,
            seq_len: self.seq,
            windows,
            token_hash: *h.finalize().as_bytes(),
        })
    }

    /// Held-out rows: the same pattern from a seed no driver's batch uses.
    fn validation(&self, windows: usize, seq: usize) -> Result<Vec<Window>, BatchError> {
        if self.vocab < 2 || seq == 0 {
            return Err(BatchError("empty pattern configuration".into()));
        }
        let mut rng = ChaCha8Rng::from_seed([0xee; 32]);
        let source = Self {
            seq,
            ..self.clone()
        };
        Ok((0..windows).map(|_| source.row(&mut rng)).collect())
    }

    /// A row some driver of this simulation was given under that name.
    fn genesis_window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>> {
        let text = self.drawn.lock().ok()?.get(&(shard, window))?.clone();
        (text.len() == seq as usize + 1).then_some(text)
    }

    /// A pattern batch is a pure function of (origin, step): each row must be one of the
    /// batch's rows, under the window that row was given.
    fn check_targets(
        &self,
        origin: &[u8; 32],
        step: u64,
        seq: usize,
        targets: &Targets,
    ) -> Result<(), BatchError> {
        let rows = targets.windows.len();
        if rows == 0 || seq != self.seq || rows.checked_mul(seq) != Some(targets.ids.len()) {
            return Err(BatchError(format!(
                "{} targets name {rows} windows of {seq}",
                targets.ids.len()
            )));
        }
        let batch = self.batch(origin, step, &[])?;
        let found = |w: &TargetWindow, row: &[u32]| {
            batch
                .windows
                .iter()
                .zip(batch.targets.chunks_exact(self.seq))
                .any(|(b, t)| b.shard == w.shard as usize && b.window == w.window && t == row)
        };
        for (w, row) in targets.windows.iter().zip(targets.ids.chunks_exact(seq)) {
            if !found(w, row) {
                return Err(BatchError(format!(
                    "targets are not the batch of step {step}"
                )));
            }
        }
        Ok(())
    }
}

impl PatternBatches {
    /// A name for row `row` of (origin, step)'s batch, unique within a simulation.
    fn window_id(origin: &[u8; 32], step: u64, row: usize) -> u64 {
        let h = blake3::Hasher::new()
            .update(origin)
            .update(&step.to_le_bytes())
            .update(&(row as u64).to_le_bytes())
            .finalize();
        let mut id = [0; 8];
        id.copy_from_slice(&h.as_bytes()[..8]);
        u64::from_le_bytes(id)
    }

    /// One row's inputs and targets: `next = (5·prev + 3) mod vocab`, restarting at random
    /// 5% of the time.
    fn row(&self, rng: &mut ChaCha8Rng) -> Window {
        let v = self.vocab as u64;
        let mut t = rng.random_range(0..v);
        let mut row = Vec::with_capacity(self.seq + 1);
        for _ in 0..=self.seq {
            row.push(t as u32);
            t = if rng.random_bool(0.05) {
                rng.random_range(0..v)
            } else {
                (5 * t + 3) % v
            };
        }
        (row[..self.seq].to_vec(), row[1..].to_vec())
    }
}
