//! How soon the sampler catches a cheater, measured over seeds: a replica runs 80 jobs a round
//! (20 inner steps × 2 micro-batches × forward and backward, the node defaults) and cheats on
//! k of them; it is caught in a round when the sampler picks any cheated job (a picked job is
//! convicted by replay within its class). Prints a Markdown table.
//!
//! `cargo test --workspace --no-run && target/debug/examples/detection [RUNS]`

use neuroshard_audit::{AuditRate, ChallengeSeed, JobKey, is_challenged};

fn key(round: u64, job: u64) -> JobKey {
    let mut h = blake3::Hasher::new();
    h.update(&round.to_le_bytes());
    h.update(&job.to_le_bytes());
    JobKey(*h.finalize().as_bytes())
}

fn main() -> Result<(), std::num::ParseIntError> {
    let runs: u64 = std::env::args().nth(1).map_or(Ok(2000), |s| s.parse())?;
    let rate = AuditRate::default();
    let jobs = 80u64;
    println!(
        "| cheated jobs / round | caught in a round | 1 − 0.95^k | mean rounds until caught | most rounds in {runs} runs |"
    );
    println!("|---|---|---|---|---|");
    for k in [1u64, 4, 8, 20, 80] {
        let (mut first, mut total, mut worst) = (0u64, 0u64, 0u64);
        for run in 0..runs {
            let mut round = 0u64;
            loop {
                round += 1;
                let id = run * 1_000_000 + round;
                let seed = ChallengeSeed::from_beacon([0; 32], 1, id, [7; 32]);
                if (0..k).any(|i| is_challenged(&seed, &key(id, i), rate)) {
                    break;
                }
            }
            first += u64::from(round == 1);
            total += round;
            worst = worst.max(round);
        }
        println!(
            "| {k} of {jobs} | {:.3} | {:.3} | {:.2} | {worst} |",
            first as f64 / runs as f64,
            rate.detection_probability(k as u32),
            total as f64 / runs as f64
        );
    }
    Ok(())
}
