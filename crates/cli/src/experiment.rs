//! `neuroshard experiment diloco`: R DiLoCo replicas (or a DDP baseline) in one process on a
//! genesis dataset, with robust aggregation, simulated Byzantine replicas and compression.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use neuroshard_aggregate::Attack;
use neuroshard_data::{Genesis, Split};
use neuroshard_model::{AdamWConfig, Batch, ModelConfig, Trainer};
use neuroshard_node::replica::{Diloco, DilocoConfig};
use neuroshard_proof::NodeId;
use neuroshard_train::CompressSpec;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

mod moments;
pub use moments::Moments;
use moments::share_moments;

#[derive(Subcommand)]
pub enum ExperimentCommand {
    /// DiLoCo with R in-process replicas: robust aggregation, attacks, compression, DDP baseline.
    Diloco(DilocoArgs),
}

/// Where a replica's training windows come from.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaData {
    /// Each replica its own uniform draws over every training window.
    Uniform,
    /// As a network's drivers read: each round a section of one shard from the genesis
    /// rotation (`Genesis::rotated_train_batch`), the replicas as the drivers.
    Assigned,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// Synchronous data parallel: the replicas' gradients averaged every step, same tokens.
    Ddp,
}

/// Where a compressing replica keeps what it could not send.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ErrorFeedback {
    /// In its own parameters: the replica restarts from θ₀ − residual, so its next Δ already
    /// contains the unsent part and the residual is not added again.
    Params,
    /// In a separate residual, scaled by `--ef-decay` β and added to every next Δ while the
    /// replica restarts from θ₀. With β = 1 the replica re-learns the unsent progress and it is
    /// counted twice (kept for comparison); with β < 1 and no outer momentum this is SparseLoCo,
    /// where the decaying accumulator takes the place of the outer momentum.
    Accumulate,
}

#[derive(Args)]
pub struct DilocoArgs {
    /// Genesis dataset directory (default: the built-in synthetic corpus, built on first use).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Replicas in total, Byzantine ones included.
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Inner AdamW steps per replica between syncs (H; default: the nodes').
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_SYNC_EVERY)]
    inner_steps: u64,
    #[arg(long, default_value_t = 10)]
    outer_steps: u64,
    /// `K:h`: the first K of the --outer-steps take h inner steps each instead of H (replicas
    /// that sync more often while they are far apart early on).
    #[arg(long, value_parser = parse_early)]
    early: Option<(u64, u64)>,
    /// What each replica's AdamW moments become after a round.
    #[arg(long, value_enum, default_value_t = Moments::Keep)]
    moments: Moments,
    /// mean, clipped-mean, trimmed-mean, median, krum, multi-krum, geometric-median,
    /// centered-clipping, with optional parameters, e.g. `clipped-mean:c=3,f=1`,
    /// `trimmed-mean:beta=0.1` or `centered-clipping:tau=auto,iters=3`.
    #[arg(long, default_value = "mean")]
    aggregator: String,
    /// Byzantine replicas among --replicas; also the f the aggregator is told.
    #[arg(long, default_value_t = 0)]
    byzantine: usize,
    /// Per-input norm bound as a multiple of the round's median input norm (0: off), as nodes
    /// apply it (`--norm-bound` of `node`).
    #[arg(long, default_value_t = 1.0)]
    norm_bound: f64,
    /// What Byzantine replicas send: none, sign-flip, scale:K, gaussian[:SIGMA], alie, ipm[:EPS], zeros.
    #[arg(long, default_value = "none")]
    attack: String,
    /// Pseudo-gradient compression with error feedback, e.g. topk:0.01:int2 (default: dense fp32).
    #[arg(long, default_value = "none")]
    compress: String,
    /// Where a compressing replica keeps its unsent residual.
    #[arg(long, value_enum, default_value_t = ErrorFeedback::Params)]
    error_feedback: ErrorFeedback,
    /// Decay β of the `accumulate` residual (SparseLoCo uses about 0.95 with outer momentum 0).
    #[arg(long, default_value_t = 1.0)]
    ef_decay: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Which windows each replica trains on.
    #[arg(long, value_enum, default_value_t = ReplicaData::Uniform)]
    replica_data: ReplicaData,
    /// Write the run (settings and per-outer-step figures) as JSON.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Run a baseline instead of DiLoCo.
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Rows per replica batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Inner AdamW peak learning rate (warmup, then cosine over all inner steps; default: the
    /// nodes').
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_LR)]
    lr: f64,
    /// Inner AdamW's second-moment decay β₂ (default: the nodes' rule for a replica's
    /// `--batch` rows of `--seq` tokens, `AdamWConfig::beta2_for`).
    #[arg(long)]
    beta2: Option<f64>,
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// The outer step (default: the nodes').
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_OUTER_LR)]
    outer_lr: f32,
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_OUTER_MOMENTUM)]
    outer_momentum: f32,
    /// Evaluate every this many outer steps (and always after the last).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: u64,
    /// Validation windows per evaluation.
    #[arg(long, default_value_t = 64)]
    eval_windows: usize,
    /// Engine threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Serialize)]
struct OuterReport {
    outer_step: u64,
    tokens: u64,
    train_loss: f64,
    /// Absent on outer steps `--eval-every` skips.
    #[serde(skip_serializing_if = "Option::is_none")]
    val_loss: Option<f64>,
    bytes_sent_per_replica: u64,
    bytes_dense_per_replica: u64,
    wall_s: f64,
    /// ‖mean Δᵢ‖ over the honest replicas' raw pseudo-gradients (DiLoCo only).
    #[serde(skip_serializing_if = "Option::is_none")]
    delta_norm: Option<f64>,
    /// ‖mean Δ̂ᵢ − mean Δᵢ‖ / ‖mean Δᵢ‖: what compression changed in this round's average.
    #[serde(skip_serializing_if = "Option::is_none")]
    compress_rel_error: Option<f64>,
    /// Mean over honest replicas of ‖error-feedback residual‖ / ‖Δᵢ‖ after this round.
    #[serde(skip_serializing_if = "Option::is_none")]
    residual_ratio: Option<f64>,
    /// ‖θ₀ after − θ₀ before‖, the outer step actually applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    update_norm: Option<f64>,
}

#[derive(Serialize)]
struct RunReport {
    mode: &'static str,
    replicas: usize,
    byzantine: usize,
    inner_steps: u64,
    outer_steps: u64,
    aggregator: String,
    attack: String,
    compress: String,
    error_feedback: &'static str,
    ef_decay: f32,
    outer_lr: f32,
    outer_momentum: f32,
    moments: Moments,
    replica_data: ReplicaData,
    beta2: f64,
    seed: u64,
    params: usize,
    entropy_floor: Option<f64>,
    steps: Vec<OuterReport>,
    final_val_loss: f64,
}

pub fn run(cmd: ExperimentCommand) -> Result<()> {
    match cmd {
        ExperimentCommand::Diloco(args) => diloco(args),
    }
}

fn diloco(args: DilocoArgs) -> Result<()> {
    if args.replicas == 0 || args.inner_steps == 0 || args.outer_steps == 0 {
        bail!("--replicas, --inner-steps and --outer-steps must be at least 1");
    }
    if args.byzantine >= args.replicas {
        bail!(
            "--byzantine {} leaves no honest replica of {}",
            args.byzantine,
            args.replicas
        );
    }
    if args.replicas >= 3 && args.replicas < 2 * args.byzantine + 1 {
        // The replicas' aggregation refuses such rounds (n < 2f + 1): nothing would train.
        bail!(
            "--byzantine {} needs at least {} replicas, got {}",
            args.byzantine,
            2 * args.byzantine + 1,
            args.replicas
        );
    }
    let near = args
        .json_out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs/experiment.json"));
    let genesis = crate::train::open_or_build_default(args.data.as_deref(), &near)?;
    let config = ModelConfig {
        layers: args.layers,
        d_model: args.d_model,
        heads: args.heads,
        kv_heads: args.heads,
        ffn: crate::bench::default_ffn(args.d_model),
        vocab: genesis.vocab_size(),
        max_seq: args.seq,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    };
    config.validate()?;
    // DDP steps on every honest replica's rows at once.
    let rows = match args.baseline {
        Some(_) => args
            .batch
            .saturating_mul(args.replicas.saturating_sub(args.byzantine).max(1)),
        None => args.batch,
    };
    let beta2 = AdamWConfig::beta2_or_rule(args.beta2, rows, args.seq)
        .map_err(|e| anyhow!("--beta2 {e}"))?;
    if args.early.is_some() && args.baseline.is_some() {
        bail!("--early shapes DiLoCo's rounds; a baseline has none");
    }
    let total = steps_before(&args, args.outer_steps);
    let optim = AdamWConfig {
        lr: args.lr,
        beta2,
        warmup_steps: args.warmup.min(total),
        total_steps: total,
        ..Default::default()
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let report = neuroshard_model::with_threads(threads, || match args.baseline {
        Some(Baseline::Ddp) => ddp(&args, &genesis, config, optim),
        None => run_diloco(&args, &genesis, config, optim),
    })??;
    if let Some(path) = &args.json_out {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "final validation loss {:.4}{}",
        report.final_val_loss,
        report
            .entropy_floor
            .map_or(String::new(), |f| format!(" (entropy floor {f:.4})"))
    );
    Ok(())
}

/// Each replica reads its own deterministic stream of training windows.
fn replica_batch(genesis: &Genesis, args: &DilocoArgs, replica: usize, step: u64) -> Result<Batch> {
    let batch = match args.replica_data {
        ReplicaData::Uniform => {
            let stream = args.seed ^ ((replica as u64 + 1) << 32);
            genesis.batch(Split::Train, stream, step, args.batch, args.seq)?
        }
        ReplicaData::Assigned => {
            // Replica r drives as the id r + 1 (ids need only be distinct here).
            let id = |r: usize| {
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&(r as u64 + 1).to_le_bytes());
                id
            };
            let drivers: Vec<[u8; 32]> = (0..args.replicas).map(id).collect();
            let round = step / args.inner_steps.max(1);
            genesis.rotated_train_batch(
                &drivers,
                &id(replica),
                round,
                step,
                args.batch,
                args.seq,
            )?
        }
    };
    Ok(neuroshard_eval::to_model_batch(batch, args.seq))
}

fn parse_early(s: &str) -> Result<(u64, u64), String> {
    let (k, h) = s.split_once(':').ok_or("expected K:h")?;
    let k = k.parse::<u64>().map_err(|e| format!("K: {e}"))?;
    let h = h.parse::<u64>().map_err(|e| format!("h: {e}"))?;
    if h == 0 {
        return Err("h must be at least 1".into());
    }
    Ok((k, h))
}

/// Inner steps of outer step `outer` (0-based).
fn inner_at(args: &DilocoArgs, outer: u64) -> u64 {
    match args.early {
        Some((k, h)) if outer < k => h,
        _ => args.inner_steps,
    }
}

/// Inner steps each replica takes before outer step `outer` (0-based).
fn steps_before(args: &DilocoArgs, outer: u64) -> u64 {
    (0..outer).map(|o| inner_at(args, o)).sum()
}

/// Whether outer step `round` (1-based) is evaluated: every `--eval-every`-th and the last.
fn eval_due(args: &DilocoArgs, round: u64) -> bool {
    round.is_multiple_of(args.eval_every) || round == args.outer_steps
}

struct Evaluator {
    trainer: Trainer,
    val: Vec<Batch>,
}

impl Evaluator {
    fn new(genesis: &Genesis, args: &DilocoArgs, config: ModelConfig) -> Result<Self> {
        let val = neuroshard_eval::val_batches(
            genesis,
            args.batch,
            args.seq,
            args.eval_windows.div_ceil(args.batch.max(1)),
        )?;
        if val.is_empty() {
            bail!("the validation split has no window of {} tokens", args.seq);
        }
        Ok(Self {
            trainer: Trainer::new(config, AdamWConfig::default(), 0)?,
            val,
        })
    }

    fn loss(&mut self, genesis: &Genesis, theta: &[f32]) -> Result<f64> {
        self.trainer.stage.params_mut().set_flat(theta)?;
        Ok(neuroshard_eval::evaluate(&self.trainer.stage, genesis.tokenizer(), &self.val)?.loss)
    }
}

fn print_header(mode: &str, args: &DilocoArgs, params: usize, floor: Option<f64>) {
    println!(
        "{mode}: {} replicas ({} Byzantine, attack {}), H = {}, {} outer steps, aggregator {}, compression {}, {params} parameters{}",
        args.replicas,
        args.byzantine,
        args.attack,
        args.inner_steps,
        args.outer_steps,
        args.aggregator,
        args.compress,
        floor.map_or(String::new(), |f| format!(", entropy floor {f:.4}"))
    );
}

fn print_step(r: &OuterReport, outer_steps: u64) {
    println!(
        "outer {:>3}/{outer_steps}  tokens {:>9}  train {:.4}  val {}  sent {:>10} B/replica (dense fp32 {:>10} B, {:.1}x)  wall {:.1} s",
        r.outer_step,
        r.tokens,
        r.train_loss,
        r.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
        r.bytes_sent_per_replica,
        r.bytes_dense_per_replica,
        r.bytes_dense_per_replica as f64 / r.bytes_sent_per_replica.max(1) as f64,
        r.wall_s
    );
    if let (Some(d), Some(u)) = (r.delta_norm, r.update_norm) {
        print!("          |mean delta| {d:.4}  |outer update| {u:.4}");
        if let (Some(e), Some(q)) = (r.compress_rel_error, r.residual_ratio) {
            print!("  compression rel. error {e:.3}  |residual|/|delta| {q:.3}");
        }
        println!();
    }
}

/// A replica's network id in the experiment: honest replicas 1..=R, Byzantine ones after.
fn replica_id(i: usize) -> NodeId {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    NodeId(id)
}

/// DiLoCo with the nodes' round code: every honest replica owns a `Diloco` (θ₀, outer
/// optimizer, compressor) and runs `prepare` / `apply` exactly as a node's engine does; the
/// experiment only adds the simulated Byzantine messages and the measurements.
fn run_diloco(
    args: &DilocoArgs,
    genesis: &Genesis,
    config: ModelConfig,
    optim: AdamWConfig,
) -> Result<RunReport> {
    let beta2 = optim.beta2;
    let attack: Attack = args.attack.parse()?;
    if args.byzantine > 0 && attack == Attack::None {
        bail!("--byzantine {} needs an --attack", args.byzantine);
    }
    let compress: Option<CompressSpec> = match args.compress.as_str() {
        "none" => None,
        spec => Some(spec.parse()?),
    };
    if args.ef_decay != 1.0 && args.error_feedback != ErrorFeedback::Accumulate {
        bail!("--ef-decay applies to --error-feedback accumulate");
    }
    if !(args.ef_decay > 0.0 && args.ef_decay <= 1.0) {
        bail!("--ef-decay must be in (0, 1], got {}", args.ef_decay);
    }
    // Dense messages are lossless fp32 (all coordinates, exact values).
    let spec = compress.unwrap_or("topk:1:fp32".parse()?);
    let honest = args.replicas - args.byzantine;
    // Every replica starts from the same θ₀ (seeded init) and keeps its own AdamW state.
    let mut replicas = (0..honest)
        .map(|r| {
            let mut t = Trainer::new(config.clone(), optim.clone(), args.seed)?;
            t.micro_batches = 1;
            let cfg = DilocoConfig {
                me: replica_id(r),
                aggregator: args.aggregator.clone(),
                byzantine: args.byzantine,
                compression: spec,
                outer_lr: args.outer_lr,
                outer_momentum: args.outer_momentum,
                seed: args.seed,
                attack: Attack::None,
                norm_bound: args.norm_bound,
            };
            let d = Diloco::new(cfg, t.stage.params()).map_err(anyhow::Error::msg)?;
            Ok((t, d))
        })
        .collect::<Result<Vec<_>>>()?;
    let len = replicas[0].1.theta().len();
    // With `--error-feedback accumulate` a replica's unsent residual lives here, not in its
    // parameters: it restarts from θ₀ and β·residual is added to its next Δ.
    let mut residuals: Vec<Vec<f32>> = vec![vec![0.0; len]; honest];
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0xA77AC);
    let mut eval = Evaluator::new(genesis, args, config.clone())?;
    let floor = genesis.entropy_floor();
    print_header("diloco", args, len, floor);
    let started = Instant::now();
    let mut steps = Vec::new();
    for outer in 0..args.outer_steps {
        let round = outer + 1;
        // This round's inner steps, and how many each replica took before it.
        let (inner, first) = (inner_at(args, outer), steps_before(args, outer));
        let mut loss_sum = 0.0f64;
        let mut messages = Vec::with_capacity(args.replicas);
        let mut decoded = Vec::with_capacity(args.replicas);
        let mut raw_mean = vec![0.0f64; len];
        let mut residual_ratio = 0.0f64;
        let mut sent = 0u64;
        for (r, (trainer, diloco)) in replicas.iter_mut().enumerate() {
            for h in 0..inner {
                let batch = replica_batch(genesis, args, r, first + h)?;
                loss_sum += f64::from(trainer.step(&batch)?.loss);
            }
            let params = trainer.stage.params_mut();
            let mut theta = params.flatten();
            let delta: Vec<f32> = diloco
                .theta()
                .iter()
                .zip(&theta)
                .map(|(a, b)| a - b)
                .collect();
            for (m, &d) in raw_mean.iter_mut().zip(&delta) {
                *m += f64::from(d) / honest as f64;
            }
            if args.error_feedback == ErrorFeedback::Accumulate {
                // θ − β·e makes the round's Δ = θ₀ − θ + β·e.
                for (t, e) in theta.iter_mut().zip(&residuals[r]) {
                    *t -= args.ef_decay * e;
                }
                params.set_flat(&theta)?;
            }
            let offer = diloco.prepare(round, params).map_err(anyhow::Error::msg)?;
            let mine = diloco.decode_offer(&offer.blob, params)?;
            // What the message left out: (θ₀ − θ) − ĉ, over the Δ actually compressed.
            let unsent = diloco.theta().iter().zip(&theta).zip(&mine);
            let unsent: Vec<f32> = unsent.map(|((a, b), c)| a - b - c).collect();
            residual_ratio += norm(&unsent) / norm(&delta).max(1e-30) / honest as f64;
            // A dense message is its fp32 payload; a compressed one its whole encoding.
            sent += if compress.is_some() {
                offer.blob.len() as u64
            } else {
                4 * len as u64
            };
            messages.push((replica_id(r), offer.blob.to_vec()));
            decoded.push(mine);
        }
        let delta_norm = raw_mean.iter().map(|d| d * d).sum::<f64>().sqrt();
        let compress_rel_error = compress.map(|_| {
            let err = (0..len)
                .map(|i| {
                    let avg = decoded.iter().map(|d| f64::from(d[i])).sum::<f64>() / honest as f64;
                    (avg - raw_mean[i]).powi(2)
                })
                .sum::<f64>()
                .sqrt();
            err / delta_norm.max(1e-30)
        });
        // Byzantine replicas see the honest messages (the strongest attacker) and send theirs
        // in the same encoding.
        for (b, forged) in attack
            .forge(&decoded, args.byzantine, &mut rng)
            .into_iter()
            .enumerate()
        {
            let (trainer, diloco) = &replicas[0];
            let blob = diloco.encode_offer(&forged, trainer.stage.params())?;
            messages.push((replica_id(honest + b), blob));
        }
        let before = replicas[0].1.theta().to_vec();
        let mut outcome = None;
        for (r, (trainer, diloco)) in replicas.iter_mut().enumerate() {
            let params = trainer.stage.params_mut();
            let applied = diloco
                .apply(round, messages.clone(), params)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("outer step {round}"))?;
            if *outcome.get_or_insert(applied.theta) != applied.theta {
                bail!("outer step {round}: replica {r} ended on another θ₀");
            }
            if args.error_feedback == ErrorFeedback::Accumulate {
                // Move the residual out of the parameters: restart from θ₀.
                let theta = params.flatten();
                residuals[r] = diloco
                    .theta()
                    .iter()
                    .zip(&theta)
                    .map(|(a, b)| a - b)
                    .collect();
                params.set_flat(diloco.theta())?;
            }
        }
        share_moments(&mut replicas, args.moments)?;
        let after = replicas[0].1.theta();
        let update_norm = before
            .iter()
            .zip(after)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        let report = OuterReport {
            outer_step: round,
            tokens: (first + inner) * (honest * args.batch * args.seq) as u64,
            train_loss: loss_sum / (honest as u64 * inner) as f64,
            val_loss: eval_due(args, round)
                .then(|| eval.loss(genesis, after))
                .transpose()?,
            bytes_sent_per_replica: sent / honest as u64,
            bytes_dense_per_replica: 4 * len as u64,
            wall_s: started.elapsed().as_secs_f64(),
            delta_norm: Some(delta_norm),
            compress_rel_error,
            residual_ratio: compress.map(|_| residual_ratio),
            update_norm: Some(update_norm),
        };
        print_step(&report, args.outer_steps);
        steps.push(report);
    }
    Ok(finish("diloco", args, len, floor, steps, beta2))
}

/// DDP with the same data: every step averages the gradients of the honest replicas' batches,
/// i.e. one step on their concatenation split into per-replica micro-batches.
fn ddp(
    args: &DilocoArgs,
    genesis: &Genesis,
    config: ModelConfig,
    optim: AdamWConfig,
) -> Result<RunReport> {
    let beta2 = optim.beta2;
    let honest = args.replicas - args.byzantine;
    let mut trainer = Trainer::new(config.clone(), optim, args.seed)?;
    trainer.micro_batches = honest;
    let len = trainer.stage.params().numel();
    let mut eval = Evaluator::new(genesis, args, config)?;
    let floor = genesis.entropy_floor();
    print_header("ddp", args, len, floor);
    let started = Instant::now();
    let mut steps = Vec::new();
    for outer in 0..args.outer_steps {
        let mut loss_sum = 0.0f64;
        for h in 0..args.inner_steps {
            let step = outer * args.inner_steps + h;
            let parts = (0..honest)
                .map(|r| replica_batch(genesis, args, r, step))
                .collect::<Result<Vec<_>>>()?;
            let batch = concat(&parts, args.seq);
            loss_sum += f64::from(trainer.step(&batch)?.loss);
        }
        let theta = trainer.stage.params().flatten();
        let report = OuterReport {
            outer_step: outer + 1,
            tokens: (outer + 1) * args.inner_steps * (honest * args.batch * args.seq) as u64,
            train_loss: loss_sum / args.inner_steps as f64,
            val_loss: eval_due(args, outer + 1)
                .then(|| eval.loss(genesis, &theta))
                .transpose()?,
            // Each replica sends its dense fp32 gradient every step.
            bytes_sent_per_replica: args.inner_steps * 4 * len as u64,
            bytes_dense_per_replica: args.inner_steps * 4 * len as u64,
            wall_s: started.elapsed().as_secs_f64(),
            delta_norm: None,
            compress_rel_error: None,
            residual_ratio: None,
            update_norm: None,
        };
        print_step(&report, args.outer_steps);
        steps.push(report);
    }
    Ok(finish("ddp", args, len, floor, steps, beta2))
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

fn concat(parts: &[Batch], seq: usize) -> Batch {
    Batch {
        batch: parts.iter().map(|b| b.batch).sum(),
        seq,
        inputs: parts
            .iter()
            .flat_map(|b| b.inputs.iter().copied())
            .collect(),
        targets: parts
            .iter()
            .flat_map(|b| b.targets.iter().copied())
            .collect(),
    }
}

fn finish(
    mode: &'static str,
    args: &DilocoArgs,
    params: usize,
    floor: Option<f64>,
    steps: Vec<OuterReport>,
    beta2: f64,
) -> RunReport {
    RunReport {
        mode,
        replicas: args.replicas,
        byzantine: args.byzantine,
        inner_steps: args.inner_steps,
        outer_steps: args.outer_steps,
        aggregator: args.aggregator.clone(),
        attack: args.attack.clone(),
        compress: args.compress.clone(),
        error_feedback: match args.error_feedback {
            ErrorFeedback::Params => "params",
            ErrorFeedback::Accumulate => "accumulate",
        },
        ef_decay: args.ef_decay,
        outer_lr: args.outer_lr,
        outer_momentum: args.outer_momentum,
        moments: args.moments,
        replica_data: args.replica_data,
        beta2,
        seed: args.seed,
        params,
        entropy_floor: floor,
        final_val_loss: steps.last().and_then(|s| s.val_loss).unwrap_or(f64::NAN),
        steps,
    }
}
