//! `neuroshard bench …`: measured figures for the issues' speed goals.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use neuroshard_model::{AdamWConfig, Batch, Trainer, with_threads};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::train::ModelArgs;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// One full training step (forward, loss, backward, AdamW) on random tokens.
    Step(StepArgs),
    /// A simulated network of N nodes (stand-in compute) running DiLoCo rounds: wall time,
    /// messages and bytes per node per round, peak memory.
    Sim(crate::bench_sim::SimArgs),
    /// ByzFL attacks (sign-flip, ALIE, IPM, scale, Gaussian) from Sybil replicas in simulated
    /// networks on the real engine: validation loss against the clean run.
    Byzantine(crate::bench_byzantine::ByzantineArgs),
}

#[derive(Args)]
pub struct StepArgs {
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    seq: usize,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Engine threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Split each batch into this many concurrently computed micro-batches. The default, 2, is
    /// what `train` and the nodes run: each micro-batch's graph runs on its own thread, which is
    /// how the engine's single-threaded elementwise ops use a second core.
    #[arg(long, default_value_t = 2)]
    micro_batches: usize,
    /// Timed steps (the median is reported).
    #[arg(long, default_value_t = 21)]
    steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long)]
    json: bool,
}

/// Default SwiGLU width: 8/3 · d, rounded up to a multiple of 16 (LLaMA's rule).
pub fn default_ffn(d_model: usize) -> usize {
    (8 * d_model / 3).div_ceil(16) * 16
}

#[derive(Serialize)]
struct StepReport {
    engine: String,
    threads: usize,
    micro_batches: usize,
    params: usize,
    tokens_per_step: usize,
    median_step_s: f64,
    min_step_s: f64,
    steps_per_s: f64,
    tokens_per_s: f64,
    gflops: f64,
    peak_rss_mb: f64,
    final_loss: f32,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Step(args) => step(args),
        BenchCommand::Sim(args) => crate::bench_sim::run(args),
        BenchCommand::Byzantine(args) => crate::bench_byzantine::run(args),
    }
}

fn step(args: StepArgs) -> Result<()> {
    let config = args.model.config(args.vocab, args.seq)?;
    let threads = args.threads.unwrap_or_else(num_cpus);
    let optim = AdamWConfig {
        warmup_steps: 0,
        ..Default::default()
    };
    let report = with_threads(threads, || -> Result<StepReport> {
        let mut trainer = Trainer::new(config.clone(), optim, 0)?;
        trainer.micro_batches = args.micro_batches;
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let mut times = Vec::with_capacity(args.steps);
        let mut loss = 0.0;
        for i in 0..args.warmup + args.steps {
            let windows: Vec<Vec<u32>> = (0..args.batch)
                .map(|_| {
                    (0..=args.seq)
                        .map(|_| rng.random_range(0..config.vocab as u32))
                        .collect()
                })
                .collect();
            let batch = Batch::from_windows(&windows, args.seq)?;
            let t = Instant::now();
            loss = trainer.step(&batch)?.loss;
            if i >= args.warmup {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let tokens = args.batch * args.seq;
        Ok(StepReport {
            engine: neuroshard_model::engine_name(),
            threads,
            micro_batches: args.micro_batches,
            params: config.num_params(),
            tokens_per_step: tokens,
            median_step_s: median,
            min_step_s: times[0],
            steps_per_s: 1.0 / median,
            tokens_per_s: tokens as f64 / median,
            gflops: config.train_flops_per_token() * tokens as f64 / median / 1e9,
            peak_rss_mb: peak_rss_mb(),
            final_loss: loss,
        })
    })??;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} threads: {:.4} s/step (min {:.4}), {:.2} steps/s, {:.0} tokens/s, {:.2} GFLOP/s, peak RSS {:.0} MB ({} params)",
            report.threads,
            report.median_step_s,
            report.min_step_s,
            report.steps_per_s,
            report.tokens_per_s,
            report.gflops,
            report.peak_rss_mb,
            report.params
        );
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Peak resident set size of this process (VmHWM), in MB; 0 where /proc is unavailable.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .context("reading /proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
