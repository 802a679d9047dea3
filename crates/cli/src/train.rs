//! `neuroshard train`: the whole model in one process on a genesis dataset.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use neuroshard_data::{BuildOptions, Genesis, NoProgress, Split, SyntheticConfig};
use neuroshard_model::{
    AdamWConfig, LrSchedule, ModelConfig, SpecialTokens, Trainer, checkpoint, grow,
};
use neuroshard_node::settings;
use neuroshard_proof::Identity;
use serde_json::json;

use crate::bench::default_ffn;

#[derive(Args)]
pub struct TrainArgs {
    /// Genesis dataset directory (default: the built-in synthetic corpus, built on first use).
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Checkpoint directory written at the end (and every --save-every steps).
    #[arg(long)]
    out: PathBuf,
    /// One JSON object per step.
    #[arg(long)]
    json_log: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    step: StepArgs,
    /// Engine threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Validation loss every N steps (0: only at the end).
    #[arg(long, default_value_t = 50)]
    eval_every: u64,
    /// Validation windows per evaluation.
    #[arg(long, default_value_t = 32)]
    eval_windows: usize,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    save_every: u64,
    /// Learning rate after the warmup: cosine to 10% at --steps, or constant.
    #[arg(long, value_enum, default_value_t = Schedule::Cosine)]
    schedule: Schedule,
    /// Grow the model in depth after STEP steps to LAYERS layers, by identity blocks spread
    /// over the depth (the function is unchanged; see `crates/model/src/grow.rs`). Repeat for
    /// several growth steps, e.g. `--grow-at 200:4 --grow-at 400:6`.
    #[arg(long, value_name = "STEP:LAYERS", value_parser = parse_grow)]
    grow_at: Vec<(u64, usize)>,
}

fn parse_grow(s: &str) -> std::result::Result<(u64, usize), String> {
    let (step, layers) = s
        .split_once(':')
        .ok_or_else(|| format!("expected STEP:LAYERS, got {s:?}"))?;
    let step = step.parse().map_err(|e| format!("step {step:?}: {e}"))?;
    let layers = layers
        .parse()
        .map_err(|e| format!("layers {layers:?}: {e}"))?;
    Ok((step, layers))
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Schedule {
    Cosine,
    Constant,
}

impl From<Schedule> for LrSchedule {
    fn from(s: Schedule) -> Self {
        match s {
            Schedule::Cosine => LrSchedule::Cosine,
            Schedule::Constant => LrSchedule::Constant,
        }
    }
}

/// Model shape flags shared by the commands that create a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads (default: same as heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// MLP width (default: 8/3 · d_model rounded up to 16).
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Share the LM head with the embedding.
    #[arg(long)]
    pub tie_embeddings: bool,
}

impl ModelArgs {
    pub fn config(&self, vocab: usize, max_seq: usize) -> Result<ModelConfig> {
        let config = ModelConfig {
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            kv_heads: self.kv_heads.unwrap_or(self.heads),
            ffn: self.ffn.unwrap_or_else(|| default_ffn(self.d_model)),
            vocab,
            max_seq,
            tie_embeddings: self.tie_embeddings,
            rope_theta: 10_000.0,
            norm_eps: 1e-6,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Optimisation flags shared by `train`, `node` and `swarm`.
#[derive(Args, Clone)]
pub struct StepArgs {
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Rows per step: one step of `train`, one driver step of a `node`, and in a `swarm` one
    /// step of all its drivers together (each driver takes an even share: the global batch of
    /// data-parallel training, so a swarm with `train`'s `--steps` sees `train`'s tokens).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Split each batch into this many micro-batches (changes the bits of the result, never
    /// their dependence on the thread count) [default: 2 for `train`, 4 for a network, whose
    /// shorter micro-batches shorten the pipeline's idle time between driver steps, each of at
    /// least 2 rows].
    #[arg(long)]
    pub micro_batches: Option<usize>,
    /// Peak learning rate, after the warm-up [default: 1e-3 for `train` and for a `swarm` whose
    /// drivers share `--batch`; 2e-3 for a `node`'s replicas and a swarm's with
    /// `--driver-batch`, each driver taking a whole batch: crates/node/README.md, "Learning
    /// rates"].
    #[arg(long)]
    pub lr: Option<f64>,
    /// AdamW's second-moment decay [default: 1 − tokens per step / 40,960, within 0.95 to
    /// 0.99: 0.975 for `train`'s 8 rows of 128 tokens, 0.9875 for each of two drivers sharing
    /// them (`neuroshard_model::BETA2_MEMORY_TOKENS`)].
    #[arg(long)]
    pub beta2: Option<f64>,
    #[arg(long, default_value_t = 20)]
    pub warmup: u64,
    /// Gradient-norm clip (0: off); in a network each stage clips its own gradient.
    #[arg(long, default_value_t = 1.0)]
    pub clip_norm: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Optimizer steps the weights a gradient is computed at lag behind those it updates: 0
    /// (a network's drivers flush the pipeline between steps) or 1 (the next step's
    /// micro-batches enter while the last one's backward passes drain, PipeDream-2BW; `train`
    /// then computes what such a pipeline computes). A network takes its founder's.
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_WEIGHT_LAG,
          value_parser = clap::value_parser!(u64).range(0..=neuroshard_node::network::MAX_WEIGHT_LAG))]
    pub weight_lag: u64,
}

/// `train`'s peak learning rate unless `--lr` says otherwise. One process on Shakespeare
/// (1.0M tokens) learned 2.3% better in held-out bits per byte at 1e-3 than at 2e-3, where a
/// network's replicas learn as well or better at 2e-3 ([`settings::DEFAULT_LR`]).
pub const DEFAULT_TRAIN_LR: f64 = 1e-3;

/// `train`'s micro-batches unless `--micro-batches` says otherwise: fewer, larger matrix
/// products are faster on a CPU (4 made `train` 3% slower than 2 here), where a network
/// takes [`settings::DEFAULT_MICRO_BATCHES`].
pub const DEFAULT_TRAIN_MICRO_BATCHES: usize = 2;

impl StepArgs {
    pub fn clip(&self) -> Option<f64> {
        (self.clip_norm > 0.0).then_some(self.clip_norm)
    }

    /// Micro-batches of one process training alone.
    pub fn train_micro_batches(&self) -> usize {
        self.micro_batches.unwrap_or(DEFAULT_TRAIN_MICRO_BATCHES)
    }

    /// Micro-batches of a network's driver steps: the default, of at least two rows each.
    pub fn network_micro_batches(&self) -> usize {
        self.network_micro_batches_of(self.batch)
    }

    /// The same for driver steps of `rows` rows.
    pub fn network_micro_batches_of(&self, rows: usize) -> usize {
        self.micro_batches
            .unwrap_or_else(|| settings::default_micro_batches(rows))
    }

    /// AdamW's β₂ for steps of `rows` rows: `--beta2`, or the rule for their tokens.
    pub fn beta2_for(&self, rows: usize) -> Result<f64> {
        AdamWConfig::beta2_or_rule(self.beta2, rows, self.seq).map_err(|e| anyhow!("--beta2 {e}"))
    }

    /// The learning rate of one process training alone.
    pub fn train_lr(&self) -> f64 {
        self.lr.unwrap_or(DEFAULT_TRAIN_LR)
    }

    /// The learning rate of a network's replicas.
    pub fn network_lr(&self) -> f64 {
        self.lr.unwrap_or(settings::DEFAULT_LR)
    }
}

/// Opens `data`, or builds (once) and opens the built-in synthetic corpus next to `near`.
pub fn open_or_build_default(data: Option<&Path>, near: &Path) -> Result<Genesis> {
    let dir = match data {
        Some(d) => d.to_path_buf(),
        None => {
            let dir = near
                .parent()
                .unwrap_or(Path::new("."))
                .join("genesis-synthetic");
            if !dir.join(neuroshard_data::MANIFEST_FILE).is_file() {
                eprintln!(
                    "building the built-in synthetic corpus in {}",
                    dir.display()
                );
                build_synthetic_default(&dir)?;
            }
            dir
        }
    };
    Genesis::open(&dir).with_context(|| format!("opening genesis dataset {}", dir.display()))
}

/// Builds the built-in synthetic genesis corpus into `dir`, signed by a builder key kept beside
/// it (created on first use).
pub fn build_synthetic_default(dir: &Path) -> Result<()> {
    let key = dir.with_extension("key");
    let identity =
        Identity::load_or_create(&key).with_context(|| format!("builder key {}", key.display()))?;
    let mut opts = BuildOptions::new(dir.to_path_buf());
    opts.synthetic = Some(SyntheticConfig::default());
    neuroshard_data::build(&opts, &identity, &NoProgress)
        .with_context(|| format!("building the synthetic corpus in {}", dir.display()))?;
    Ok(())
}

pub fn run(args: TrainArgs) -> Result<()> {
    let genesis = open_or_build_default(args.data.as_deref(), &args.out)?;
    let config = args.model.config(genesis.vocab_size(), args.step.seq)?;
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let mut layers = config.layers;
    let mut last_step = 0;
    for &(step, target) in &args.grow_at {
        if step == 0 || step >= args.steps || step <= last_step || target <= layers {
            bail!(
                "--grow-at {step}:{target}: growth steps must increase inside 1..{} and each \
                 must add layers (the model has {layers} then)",
                args.steps
            );
        }
        (last_step, layers) = (step, target);
    }
    let optim = AdamWConfig {
        lr: args.step.train_lr(),
        beta2: args.step.beta2_for(args.step.batch)?,
        warmup_steps: args.step.warmup.min(args.steps),
        total_steps: args.steps,
        clip_norm: args.step.clip(),
        schedule: args.schedule.into(),
        ..Default::default()
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    neuroshard_model::with_threads(threads, || train(&args, &genesis, config, optim))?
}

fn train(
    args: &TrainArgs,
    genesis: &Genesis,
    config: ModelConfig,
    optim: AdamWConfig,
) -> Result<()> {
    let mut trainer = Trainer::new(config.clone(), optim, args.step.seed)?;
    trainer.micro_batches = args.step.train_micro_batches();
    trainer.weight_lag = args.step.weight_lag as usize;
    let mut log = match &args.json_log {
        Some(p) => Some(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let val = neuroshard_eval::val_batches(
        genesis,
        args.step.batch,
        args.step.seq,
        args.eval_windows.div_ceil(args.step.batch.max(1)),
    )?;
    let floor = genesis.entropy_floor();
    println!(
        "training {} parameters ({} layers, d_model {}, vocab {}) for {} steps of {}×{} tokens{}",
        config.num_params(),
        config.layers,
        config.d_model,
        config.vocab,
        args.steps,
        args.step.batch,
        args.step.seq,
        floor.map_or(String::new(), |f| format!("; loss floor {f:.4} nats/token"))
    );
    let bar = ProgressBar::new(args.steps);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .map_err(|e| anyhow::anyhow!("progress template: {e}"))?,
    );
    let started = Instant::now();
    let tokens_per_step = (args.step.batch * args.step.seq) as f64;
    let mut val_loss = None;
    let mut flops = 0.0f64;
    for step in 0..args.steps {
        if let Some(&(_, target)) = args.grow_at.iter().find(|(at, _)| *at == step) {
            let event = grow(&mut trainer, target, genesis, &val, &bar)?;
            if let Some(log) = log.as_mut() {
                writeln!(log, "{event}")?;
            }
        }
        let batch = neuroshard_eval::to_model_batch(
            genesis.batch(
                Split::Train,
                args.step.seed,
                step,
                args.step.batch,
                args.step.seq,
            )?,
            args.step.seq,
        );
        let t = Instant::now();
        let result = trainer.step(&batch)?;
        let tok_s = tokens_per_step / t.elapsed().as_secs_f64();
        flops += tokens_per_step * trainer.stage.config().train_flops_per_token();
        let last = step + 1 == args.steps;
        let eval_now = (args.eval_every > 0 && (step + 1) % args.eval_every == 0) || last;
        if eval_now && !val.is_empty() {
            let report = neuroshard_eval::evaluate(&trainer.stage, genesis.tokenizer(), &val)?;
            val_loss = Some(report.loss);
        }
        bar.set_message(format!(
            "loss {:.4}{} | {:.0} tok/s",
            result.loss,
            val_loss.map_or(String::new(), |v| format!(" val {v:.4}")),
            tok_s
        ));
        bar.inc(1);
        if let Some(log) = log.as_mut() {
            writeln!(
                log,
                "{}",
                json!({
                    "step": step + 1,
                    "layers": trainer.stage.config().layers,
                    "architecture_version": trainer.architecture.version,
                    "train_flops": flops,
                    "loss": result.loss,
                    "val_loss": val_loss,
                    "lr": result.stats.lr,
                    "grad_norm": result.stats.grad_norm,
                    "tokens_per_s": tok_s,
                    "elapsed_s": started.elapsed().as_secs_f64(),
                })
            )?;
        }
        if args.save_every > 0 && (step + 1) % args.save_every == 0 && !last {
            save(&args.out, &trainer, step + 1, genesis)?;
        }
    }
    bar.finish();
    if let Some(mut log) = log {
        log.flush()?;
    }
    save(&args.out, &trainer, args.steps, genesis)?;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "done: {} steps in {elapsed:.1} s ({:.0} tokens/s, {:.3e} training FLOPs by 6·N); \
         validation loss {}{}; checkpoint in {}",
        args.steps,
        tokens_per_step * args.steps as f64 / elapsed,
        flops,
        val_loss.map_or("n/a".into(), |v| format!("{v:.4}")),
        floor.map_or(String::new(), |f| format!(" (floor {f:.4})")),
        args.out.display()
    );
    Ok(())
}

/// Grows `trainer` to `target` layers and shows that the validation loss did not move;
/// returns the JSON log line of the growth.
fn grow(
    trainer: &mut Trainer,
    target: usize,
    genesis: &Genesis,
    val: &[neuroshard_model::Batch],
    bar: &ProgressBar,
) -> Result<serde_json::Value> {
    let before = (!val.is_empty())
        .then(|| neuroshard_eval::evaluate(&trainer.stage, genesis.tokenizer(), val))
        .transpose()?
        .map(|r| r.loss);
    let positions = grow::spread_positions(trainer.stage.config().layers, target)?;
    let growth = trainer.grow_depth(&positions)?;
    let after = (!val.is_empty())
        .then(|| neuroshard_eval::evaluate(&trainer.stage, genesis.tokenizer(), val))
        .transpose()?
        .map(|r| r.loss);
    let line = format!(
        "step {}: grew {} → {} layers (identity blocks at {:?}, architecture v{}, {} \
         parameters); validation loss {} before, {} after",
        growth.step,
        growth.from_layers,
        growth.to_layers,
        growth.inserted,
        trainer.architecture.version,
        trainer.stage.config().num_params(),
        before.map_or("n/a".into(), |l| format!("{l:.6}")),
        after.map_or("n/a".into(), |l| format!("{l:.6}")),
    );
    bar.suspend(|| println!("{line}"));
    Ok(json!({
        "grow": growth,
        "architecture_version": trainer.architecture.version,
        "params": trainer.stage.config().num_params(),
        "val_loss_before": before,
        "val_loss_after": after,
    }))
}

/// Writes a checkpoint with the dataset's tokenizer beside it.
pub fn save(out: &Path, trainer: &Trainer, step: u64, genesis: &Genesis) -> Result<()> {
    let tok = genesis.tokenizer();
    let special = SpecialTokens {
        bos: Some(tok.bos_id()),
        eos: Some(tok.eos_id()),
        pad: Some(tok.pad_id()),
    };
    let extra = json!({
        "tokens": special,
        "dataset": { "root": hex::encode(genesis.root()), "name": genesis.manifest().name },
    });
    checkpoint::save_with_architecture(
        out,
        &trainer.stage,
        Some(&trainer.optimizer),
        step,
        &trainer.architecture,
        extra,
    )?;
    std::fs::copy(
        genesis.tokenizer_path(),
        out.join(checkpoint::TOKENIZER_FILE),
    )
    .with_context(|| format!("copying the tokenizer into {}", out.display()))?;
    Ok(())
}
