//! Runs a few training steps of the benchmark model for profilers (callgrind, perf):
//! `cargo run --release -p neuroshard-model --example profile_step -- STEPS MICRO_BATCHES`.

use neuroshard_model::{AdamWConfig, Batch, ModelConfig, Trainer};
use rand::{Rng, SeedableRng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    let micro: usize = args.next().map_or(Ok(1), |s| s.parse())?;
    let config = ModelConfig {
        max_seq: 128,
        ..ModelConfig::tiny(4096)
    };
    let mut trainer = Trainer::new(config, AdamWConfig::default(), 0)?;
    trainer.micro_batches = micro;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    for _ in 0..steps {
        let windows: Vec<Vec<u32>> = (0..8)
            .map(|_| (0..=128).map(|_| rng.random_range(0..4096u32)).collect())
            .collect();
        let t = std::time::Instant::now();
        let loss = trainer.step(&Batch::from_windows(&windows, 128)?)?.loss;
        eprintln!("loss {loss:.4} in {:.3} s", t.elapsed().as_secs_f64());
    }
    Ok(())
}
