//! What verification by recomputation adds to a training step of the default model (4 layers,
//! `d_model` 256, vocab 4096, 2 stages, batch 8 × 128): hashing each stage's weights every step
//! (the per-value hash it replaced, for comparison), hashing a backward job's parameter
//! gradients, and a whole training step. Medians; prints one JSON line.
//!
//! `cargo test --workspace --no-run && target/debug/examples/audit_cost [REPEATS]` (the dev
//! profile builds this crate and its dependencies at opt-level 3).

use std::time::Instant;

use neuroshard_model::{AdamWConfig, Batch, ModelConfig, Stage, StageSpec, Trainer};
use rand::{Rng, SeedableRng};

fn median_ms(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// The weights hash as it was: one hasher update per value.
fn per_value_hash(stage: &Stage) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard-params-v1");
    for (spec, v) in stage.params().specs().iter().zip(stage.params().values()) {
        h.update(&(spec.name.len() as u64).to_le_bytes());
        h.update(spec.name.as_bytes());
        h.update(&(spec.shape.len() as u64).to_le_bytes());
        for d in &spec.shape {
            h.update(&(*d as u64).to_le_bytes());
        }
        for x in v {
            h.update(&x.to_le_bytes());
        }
    }
    *h.finalize().as_bytes()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeats: usize = std::env::args().nth(1).map_or(Ok(21), |s| s.parse())?;
    let config = ModelConfig {
        max_seq: 128,
        ..ModelConfig::tiny(4096)
    };
    let mut stages = Vec::new();
    for (i, spec) in StageSpec::split(&config, 2)?.into_iter().enumerate() {
        let stage = Stage::init(config.clone(), spec, i as u64)?;
        assert_eq!(stage.model_hash(), per_value_hash(&stage));
        let params = stage.params().numel();
        let fast = median_ms(repeats, || {
            std::hint::black_box(stage.model_hash());
        });
        let slow = median_ms(repeats, || {
            std::hint::black_box(per_value_hash(&stage));
        });
        let grads: Vec<Vec<f32>> = stage.params().values().to_vec();
        let grads_ms = median_ms(repeats, || {
            std::hint::black_box(neuroshard_audit::grads_hash(Some(1.0), &grads));
        });
        stages.push(format!(
            "{{\"stage\":{i},\"params\":{params},\"weights_hash_ms\":{fast:.3},\"per_value_hash_ms\":{slow:.3},\"grads_hash_ms\":{grads_ms:.3}}}"
        ));
    }

    let mut trainer = Trainer::new(config, AdamWConfig::default(), 0)?;
    trainer.micro_batches = 2;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let windows: Vec<Vec<u32>> = (0..8)
        .map(|_| (0..=128).map(|_| rng.random_range(0..4096u32)).collect())
        .collect();
    let batch = Batch::from_windows(&windows, 128)?;
    let step_repeats = repeats.clamp(1, 5);
    let mut failed = None;
    let step_ms = neuroshard_model::with_threads(2, || {
        median_ms(step_repeats, || {
            if let Err(e) = trainer.step(&batch) {
                failed = Some(e);
            }
        })
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    println!(
        "{{\"engine\":\"{}\",\"threads\":2,\"micro_batches\":2,\"train_step_ms\":{step_ms:.1},\"stages\":[{}]}}",
        neuroshard_model::engine_name(),
        stages.join(",")
    );
    Ok(())
}
