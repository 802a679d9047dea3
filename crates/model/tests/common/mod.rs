//! Small models and seeded batches shared by the model crate's integration tests.

// Each test binary includes this module and uses a different subset of it.
#![allow(dead_code)]

use neuroshard_model::{Batch, ModelConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A model small enough for hundreds of steps in a test.
pub fn small_config(vocab: usize) -> ModelConfig {
    ModelConfig {
        layers: 3,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 160,
        vocab,
        max_seq: 64,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    }
}

/// A batch of i.i.d. uniform tokens.
pub fn random_batch(rng: &mut ChaCha8Rng, vocab: usize, batch: usize, seq: usize) -> Batch {
    let windows: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..=seq)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect();
    Batch::from_windows(&windows, seq).expect("windows have seq + 1 tokens")
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}
