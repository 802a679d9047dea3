//! `neuroshard swarm`: flags and printing over `neuroshard-swarm`, which runs a local network
//! of real node processes training one model and assembles it. The CLI also evaluates the
//! assembled model and samples from it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use neuroshard_data::Genesis;
use neuroshard_model::{ParamSet, Stage, StageSpec};
use neuroshard_node::act_codec::ActSpec;
use neuroshard_node::{DataOrder, NodeSettings};
use neuroshard_swarm::{Chaos, Kill, Observer, Outcome, SwarmConfig};

use crate::node::{self, SyncArgs};
use crate::train::{ModelArgs, StepArgs, open_or_build_default};

#[derive(Args)]
pub struct SwarmArgs {
    /// Node processes. Six make 2 stages × 3 replicas: the fewest replicas a stage needs for
    /// the robust aggregator to tolerate one Byzantine replica (two allow no robust rule).
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Genesis dataset (default: the built-in synthetic corpus, built on first use).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Optimizer steps per driver.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Rows per driver step, instead of an even share of `--batch` among a stage's replicas.
    #[arg(long)]
    driver_batch: Option<usize>,
    /// The assembled model (all stages and the tokenizer) is written here.
    #[arg(long, default_value = "runs/swarm")]
    out: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    step: StepArgs,
    #[command(flatten)]
    sync: SyncArgs,
    /// Byzantine nodes (indices, comma-separated) that send --attack instead of their
    /// pseudo-gradient, e.g. `--attackers 4,5`.
    #[arg(long, value_delimiter = ',')]
    attackers: Vec<usize>,
    /// The attackers' pseudo-gradient: sign-flip, scale:K, gaussian:S, alie, ipm:E, zeros.
    #[arg(long, default_value = "sign-flip")]
    attack: String,
    /// Lazy workers (indices, comma-separated): they send noise as their forward outputs,
    /// for trying the audits (`--audit-rate`), e.g. `--lazy 2`.
    #[arg(long, value_delimiter = ',')]
    lazy: Vec<usize>,
    /// Withholding workers (indices, comma-separated): they serve no one the evidence of
    /// their jobs, for trying the committee's jurors, e.g. `--withhold 2`.
    #[arg(long, value_delimiter = ',')]
    withhold: Vec<usize>,
    /// Start one more node once the drivers reach this step; it joins mid-run.
    #[arg(long)]
    join_at: Option<u64>,
    /// Grow the model mid-run: once the drivers reach this step, two more nodes join, and
    /// their joins (with `--grow-every`, by default every node that will have joined) make
    /// the network's upgrade rule add a stage of identity blocks, which a replica moves to.
    #[arg(long, conflicts_with = "join_at")]
    grow_at: Option<u64>,
    /// After the drivers finish: wait up to this long for every ledger to agree.
    #[arg(long, default_value_t = 30)]
    settle_s: u64,
    /// How activations and their gradients cross stage boundaries: int8/int4 (default),
    /// int8, int4, int2 (gradients), bf16 or f32, one name for both directions or
    /// forward/backward, e.g. int4/int2.
    #[arg(long, default_value_t = ActSpec::default())]
    activations: ActSpec,
    /// Run node i inside network namespace PREFIX<i> at 10.77.0.<i+1>, as set up by
    /// `bench/links.sh` (shaped links between the nodes); needs root.
    #[arg(long)]
    netns: Option<String>,
    /// Engine threads per node.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Node 0's OpenAI-compatible HTTP API address; port 0 picks a free one, "" for none.
    #[arg(long, default_value = "127.0.0.1:0")]
    http: String,
    /// After training, keep the nodes up and serving the API until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// Drivers train on the global order of `neuroshard train` instead of their assignment.
    #[arg(long)]
    global_order: bool,
    /// Chaos: SIGKILL node NODE once the drivers reach STEP, e.g. `--kill 3@20`.
    #[arg(long)]
    kill: Option<String>,
    /// With --kill: start the killed node again after this many milliseconds; it resumes from
    /// its latest speculative checkpoint and rejoins.
    #[arg(long)]
    restart_after_ms: Option<u64>,
    /// The chaos soak (bench/soak.sh): for SECS seconds of training, SIGKILL a random node
    /// every 30–60 s and restart it, cut one node's link for 20 s (needs --netns), flood one
    /// node from a hostile process; then judge the run. `key=value,…` over the defaults
    /// secs=600,seed=1,kill=30-60,restart-ms=3000,partition-s=20,flood=on,recover-ms=60000,
    /// mem-mb=2048,loss-drop=0.2. Give --steps enough to train past the window.
    #[arg(long)]
    chaos: Option<String>,
    /// Speculative checkpoint period of every node, in seconds.
    #[arg(long, default_value_t = 120)]
    checkpoint_secs: u64,
    /// Write the run's figures as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Give up after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    timeout_s: u64,
    #[arg(long, default_value = "The")]
    prompt: String,
    /// Tokens generated from the trained model at the end (0: skip).
    #[arg(long, default_value_t = 40)]
    gen_tokens: usize,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

impl SwarmArgs {
    /// The replicas' peak learning rate: `--lr`, else one process's where the drivers share
    /// `--batch` (a step of the whole stage is one process's step), else a network's, whose
    /// drivers each take a whole batch (more rows a step, so a longer step pays).
    fn lr(&self) -> f64 {
        match (self.step.lr, self.driver_batch) {
            (Some(lr), _) => lr,
            (None, None) => crate::train::DEFAULT_TRAIN_LR,
            (None, Some(_)) => self.step.network_lr(),
        }
    }

    /// Rows per driver step: `--driver-batch`, else `--batch` shared evenly among the replicas
    /// a stage starts with (rounded, at least one), as data-parallel training shares its global
    /// batch. At equal tokens that keeps one process's number of optimizer steps: two
    /// replicas of 4 rows each learned 3.2% worse than one process of 8, where two of 8 rows
    /// each (half the steps) were 4.3–5.1% worse (crates/node/README.md, "Replicas that share
    /// one process's batch").
    fn driver_rows(&self) -> Result<usize> {
        if let Some(rows) = self.driver_batch {
            if rows == 0 {
                bail!("--driver-batch must be at least 1");
            }
            return Ok(rows);
        }
        if self.step.batch == 0 {
            bail!("--batch must be at least 1");
        }
        Ok(share_rows(self.step.batch, self.nodes / self.stages.max(1)))
    }

    /// The swarm's settings; each node's file is this template with its own dir and peers.
    fn config(&self, genesis: &Genesis) -> Result<SwarmConfig> {
        let model = self.model.config(genesis.vocab_size(), self.step.seq)?;
        let batch = self.driver_rows()?;
        let node = NodeSettings {
            data_dir: PathBuf::new(),
            genesis: genesis.dir().to_path_buf(),
            listen: Vec::new(),
            bootstrap: Vec::new(),
            model,
            stages: self.stages,
            stage: None,
            memory_budget: node::MEMORY_MB << 20,
            micro_batches: self.step.network_micro_batches_of(batch),
            activations: self.activations,
            weight_lag: self.step.weight_lag,
            batch,
            seq: self.step.seq,
            steps: self.steps,
            lr: self.lr(),
            warmup: self.step.warmup,
            clip_norm: self.step.clip_norm,
            beta2: self.step.beta2,
            seed: self.step.seed,
            data_order: if self.global_order {
                DataOrder::Global
            } else {
                DataOrder::Assigned
            },
            threads: self.threads,
            queue_capacity: node::QUEUE,
            grad_timeout_ms: node::GRAD_TIMEOUT_MS,
            settle_ms: 0,
            checkpoint_secs: self.checkpoint_secs,
            wait_replicas: 0,
            max_frame: node::MAX_FRAME_MB << 20,
            sync: self.sync.settings("none"),
            // The swarm founds the network and hands every node its genesis file.
            network_genesis: None,
            network: None,
            stake_for: Vec::new(),
            http: None,
            paid_only: false,
            min_fee_per_stage: 0,
            eval_windows: neuroshard_node::settings::DEFAULT_EVAL_WINDOWS,
            budgets: Default::default(),
            audit: self.sync.audit()?,
            // Finality settles the rounds nodes are paid for three epochs after their first
            // proof: a local network finalizes in milliseconds, so shorter epochs pay sooner.
            epoch_ms: self.sync.epoch_ms.unwrap_or(SWARM_EPOCH_MS),
            growth: match (self.sync.growth()?, self.grow_at) {
                (None, Some(_)) => {
                    // Every node that will have joined: the joiners' registrations trigger it.
                    let mut policy =
                        neuroshard_growth::GrowthPolicy::depth(self.sync.grow_max_layers);
                    policy.rule.every_joins = (self.nodes + GROW_JOINERS) as u64;
                    policy.rule.min_gain_pct = self.sync.grow_min_gain;
                    Some(policy)
                }
                (policy, _) => policy,
            },
            capacity: self.sync.capacity(self.nodes),
        };
        // Refused here, before any node starts, rather than by every node at its start.
        node.adamw()?;
        let kill = self
            .kill
            .as_deref()
            .map(|k| Kill::parse(k, self.restart_after_ms))
            .transpose()?;
        let cfg = SwarmConfig {
            nodes: self.nodes,
            node,
            exe: std::env::current_exe().context("locating the neuroshard binary")?,
            out: self.out.clone(),
            attackers: self.attackers.clone(),
            lazy: self.lazy.clone(),
            withhold: self.withhold.clone(),
            attack: self.attack.clone(),
            join_at: self.join_at.or(self.grow_at),
            joiners: if self.grow_at.is_some() {
                GROW_JOINERS
            } else {
                1
            },
            kill,
            settle: Duration::from_secs(self.settle_s),
            timeout: (self.timeout_s > 0).then(|| Duration::from_secs(self.timeout_s)),
            netns: self.netns.clone(),
            http: (!self.http.is_empty()).then(|| self.http.clone()),
            serve: self.serve,
            chaos: self.chaos.as_deref().map(Chaos::parse).transpose()?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `batch` rows shared among `replicas` drivers, rounded to the nearest, at least one each.
fn share_rows(batch: usize, replicas: usize) -> usize {
    let replicas = replicas.max(1);
    (batch.saturating_add(replicas / 2) / replicas).max(1)
}

/// Nodes that join at `--grow-at`.
const GROW_JOINERS: usize = 2;
/// Ledger finality's epoch in a swarm, in ms (nodes default to 10 s).
const SWARM_EPOCH_MS: u64 = 3_000;

/// Node lines before training, then a progress bar.
#[derive(Default)]
struct Console {
    bar: Option<ProgressBar>,
}

impl Observer for Console {
    fn ready(&mut self, node: usize, stage: usize, role: &str) {
        println!("  node {node}: stage {stage} ({role})");
    }

    fn training(&mut self, steps: u64) {
        let bar = ProgressBar::new(steps);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
        {
            bar.set_style(style);
        }
        self.bar = Some(bar);
    }

    fn progress(&mut self, step: u64, status: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step);
            bar.set_message(status.to_string());
        }
    }

    fn note(&mut self, text: &str) {
        match &self.bar {
            // A hidden bar (output not a terminal) prints nothing: notes go to stderr then.
            Some(bar) if !bar.is_hidden() => bar.println(text),
            _ => eprintln!("{text}"),
        }
    }

    fn unparsed(&mut self, node: usize, line: &str, error: &str) {
        tracing::warn!("node {node}: unreadable event line ({error}): {line}");
    }

    fn done(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

pub fn run(args: SwarmArgs) -> Result<()> {
    let genesis = open_or_build_default(args.data.as_deref(), &args.out)?;
    let cfg = args.config(&genesis)?;
    // SAFETY: installing a handler that only stores to an atomic is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
    println!(
        "starting {} nodes ({} stages) for {} steps of {}×{} tokens per driver; model {} parameters",
        args.nodes,
        args.stages,
        args.steps,
        cfg.node.batch,
        args.step.seq,
        cfg.node.model.num_params()
    );
    let mut outcome = neuroshard_swarm::run(&cfg, &genesis, &mut Console::default(), &INTERRUPTED)?;
    finish(&args, &genesis, &cfg, &mut outcome)
}

/// Validation loss before and after, a sample, the summary and its JSON.
fn finish(
    args: &SwarmArgs,
    genesis: &Genesis,
    cfg: &SwarmConfig,
    outcome: &mut Outcome,
) -> Result<()> {
    let Outcome { report, assembly } = outcome;
    let config = &cfg.node.model;
    let val = neuroshard_eval::val_batches(genesis, args.step.batch, args.step.seq, 4)?;
    let full = StageSpec::full(config);
    let initial = Stage::from_params(
        config.clone(),
        full,
        ParamSet::init(full.param_specs(config), args.step.seed),
    )?;
    if !val.is_empty() {
        report.initial_val =
            Some(neuroshard_eval::evaluate(&initial, genesis.tokenizer(), &val)?.loss);
        report.final_val =
            Some(neuroshard_eval::evaluate(&assembly.stage, genesis.tokenizer(), &val)?.loss);
    }
    if args.gen_tokens > 0 {
        let tok = genesis.tokenizer();
        let prompt = tok.encode(&args.prompt)?;
        let generator = neuroshard_model::Generator::new(assembly.stage.clone())?;
        let sampling = neuroshard_model::Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            seed: args.step.seed,
            stop_token: Some(tok.eos_id()),
        };
        let out = generator.generate(&prompt, args.gen_tokens, &sampling)?;
        report.sample = Some(format!("{}{}", args.prompt, tok.decode(&out)?));
    }
    for line in report.summary_lines(assembly) {
        println!("{line}");
    }
    if let Some(path) = &args.summary_json {
        let text = serde_json::to_string_pretty(&report.to_json(assembly))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if report.driver_steps_total() == 0 {
        bail!("no training step completed");
    }
    if report.soak_passed() == Some(false) {
        bail!("the chaos soak failed a check (see the soak lines above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{SwarmArgs, share_rows};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        swarm: SwarmArgs,
    }

    fn parse(args: &[&str]) -> SwarmArgs {
        let argv = std::iter::once("swarm").chain(args.iter().copied());
        Cli::try_parse_from(argv).expect("valid flags").swarm
    }

    fn rows(args: &[&str]) -> anyhow::Result<usize> {
        parse(args).driver_rows()
    }

    #[test]
    fn drivers_take_their_share_of_the_batch_unless_told_their_own() {
        assert_eq!(rows(&["--nodes", "4", "--stages", "2"]).unwrap(), 4);
        assert_eq!(
            rows(&["--nodes", "8", "--stages", "2", "--batch", "16"]).unwrap(),
            4
        );
        assert_eq!(rows(&["--nodes", "3", "--stages", "3"]).unwrap(), 8);
        let own = ["--nodes", "4", "--stages", "2", "--driver-batch", "8"];
        assert_eq!(rows(&own).unwrap(), 8);
        assert!(rows(&["--nodes", "4", "--driver-batch", "0"]).is_err());
        assert!(rows(&["--nodes", "4", "--batch", "0"]).is_err());
    }

    #[test]
    fn drivers_sharing_the_batch_take_one_processs_learning_rate() {
        let lr = |args: &[&str]| parse(args).lr();
        assert_eq!(lr(&["--nodes", "4"]), crate::train::DEFAULT_TRAIN_LR);
        let own = lr(&["--nodes", "4", "--driver-batch", "8"]);
        assert_eq!(own, neuroshard_node::settings::DEFAULT_LR);
        assert_ne!(own, crate::train::DEFAULT_TRAIN_LR);
        assert_eq!(lr(&["--driver-batch", "8", "--lr", "3e-3"]), 3e-3);
    }

    #[test]
    fn drivers_sharing_the_batch_remember_as_many_tokens_as_one_process() {
        let args = parse(&["--nodes", "4", "--stages", "2"]);
        let rows = args.driver_rows().unwrap();
        assert!((args.step.beta2_for(rows).unwrap() - 0.9875).abs() < 1e-12);
        // One process steps on the whole batch: a shorter memory of the same tokens.
        assert!((args.step.beta2_for(args.step.batch).unwrap() - 0.975).abs() < 1e-12);
        let told = parse(&["--nodes", "4", "--beta2", "0.95"]);
        assert!((told.step.beta2_for(rows).unwrap() - 0.95).abs() < 1e-12);
        for bad in ["1", "1.5", "-0.1", "NaN"] {
            let args = parse(&["--nodes", "4", &format!("--beta2={bad}")]);
            assert!(args.step.beta2_for(rows).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_stage_shares_the_batch_among_its_replicas() {
        assert_eq!(share_rows(8, 1), 8);
        assert_eq!(share_rows(8, 2), 4);
        assert_eq!(share_rows(8, 4), 2);
        // Rounded to the nearest share, never below one row.
        assert_eq!(share_rows(8, 3), 3);
        assert_eq!(share_rows(8, 16), 1);
        assert_eq!(share_rows(8, 0), 8);
        assert_eq!(share_rows(usize::MAX, 1), usize::MAX);
    }
}
