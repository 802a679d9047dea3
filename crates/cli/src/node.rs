//! `neuroshard node`: one real node, for deployment across machines (and for `swarm`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use neuroshard_node::act_codec::ActSpec;
use neuroshard_node::settings::{self, SyncSettings};
use neuroshard_node::{DataOrder, NodeSettings};

use crate::train::{ModelArgs, StepArgs, open_or_build_default};

// Defaults of the node-only flags; `swarm` builds its nodes' settings with the same values.
pub const MEMORY_MB: u64 = 4096;
pub const QUEUE: usize = 8;
pub const GRAD_TIMEOUT_MS: u64 = 15_000;
pub const MAX_FRAME_MB: usize = 32;
/// Requests waiting for the node's loop before the API answers 429.
pub const API_QUEUE: usize = 64;

#[derive(Clone, Copy, ValueEnum)]
pub enum Order {
    /// The node's genesis assignment.
    Assigned,
    /// The global order of `neuroshard train --seed` (exactness checks).
    Global,
}

/// DiLoCo between replicas and the economy; shared by `node` and `swarm`.
#[derive(Args, Clone)]
pub struct SyncArgs {
    /// Inner steps per DiLoCo round (H); 0 turns replica sync (and proofs) off.
    #[arg(long, default_value_t = settings::DEFAULT_SYNC_EVERY)]
    pub sync_every: u64,
    /// How long a replica waits for its co-replicas' pseudo-gradients.
    #[arg(long, default_value_t = 5_000)]
    pub sync_timeout_ms: u64,
    /// Robust aggregator: clipped-mean, mean, trimmed-mean, median, krum, multi-krum,
    /// geometric-median, centered-clipping (parameters as name:key=value,...).
    #[arg(long, default_value = settings::DEFAULT_AGGREGATOR)]
    pub aggregator: String,
    /// Byzantine replicas per stage the aggregator tolerates: a round of n ≥ 3 offers bounds
    /// (or trims) at least this many and ⌊(n−1)/3⌋ (at least 1), and is refused when
    /// n < 2·byzantine + 1.
    #[arg(long, default_value_t = 1)]
    pub byzantine: usize,
    /// Per-input norm bound: a pseudo-gradient longer than this multiple of the round's median
    /// input norm is clipped to it before aggregation (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub norm_bound: f64,
    /// Pseudo-gradient compression, e.g. int2, randk:0.25:int2, lowrank:4:int8, fp32.
    #[arg(long, default_value = settings::DEFAULT_COMPRESSION)]
    pub compression: String,
    #[arg(long, default_value_t = settings::DEFAULT_OUTER_LR)]
    pub outer_lr: f32,
    /// Nesterov momentum of the outer step.
    #[arg(long, default_value_t = settings::DEFAULT_OUTER_MOMENTUM)]
    pub outer_momentum: f32,
    /// Share of its co-replicas' jobs a replica replays once their round is final (0: no
    /// audits). An audited job costs one replay of the job. Fixed per network in its genesis
    /// (a founder's value; a joiner takes the network's).
    #[arg(long, default_value_t = 0.05)]
    pub audit_rate: f64,
    /// Evidence a replica keeps for its own auditors (each job's inputs, the weights of each
    /// step), in MiB; the oldest goes first.
    #[arg(long, default_value_t = neuroshard_node::compute::DEFAULT_AUDIT_BUDGET >> 20)]
    pub evidence_mb: u64,
    /// Ledger finality: time from one finalized epoch to the start of the next, in ms
    /// (default: 10,000 for `node`; 3,000 for `swarm`, whose nodes share one machine).
    #[arg(long)]
    pub epoch_ms: Option<u64>,
    /// Found a network whose model grows (by depth, with identity blocks): the upgrade rule
    /// runs after every K registrations (joins). Fixed in the genesis; a joiner takes the
    /// network's.
    #[arg(long)]
    pub grow_every: Option<u64>,
    /// Growth takes a target only with at least this many percent more parameters.
    #[arg(long, default_value_t = 30)]
    pub grow_min_gain: u64,
    /// Deepest model growth proposes.
    #[arg(long, default_value_t = 64)]
    pub grow_max_layers: u64,
    /// Memory this node offers a growing network, GiB (default: the machine's, shared by the
    /// nodes it runs).
    #[arg(long)]
    pub announce_memory_gib: Option<u64>,
    /// Training throughput this node announces, TFLOP/s (default: measured from the engine's
    /// busy time over its first optimizer steps).
    #[arg(long)]
    pub announce_tflops: Option<f64>,
}

impl SyncArgs {
    pub fn audit(&self) -> Result<settings::AuditSettings> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.audit_rate),
            "--audit-rate {} is not a share between 0 and 1",
            self.audit_rate
        );
        Ok(settings::AuditSettings {
            per_million: (self.audit_rate * 1e6).round() as u32,
            evidence_mb: self.evidence_mb,
            lazy: false,
            withhold: false,
        })
    }

    /// The growth policy a founder's flags ask for (`None`: one fixed model).
    pub fn growth(&self) -> Result<Option<neuroshard_growth::GrowthPolicy>> {
        let Some(every) = self.grow_every else {
            return Ok(None);
        };
        let mut policy = neuroshard_growth::GrowthPolicy::depth(self.grow_max_layers);
        policy.rule.every_joins = every;
        policy.rule.min_gain_pct = self.grow_min_gain;
        policy
            .validate()
            .context("--grow-every / --grow-min-gain / --grow-max-layers")?;
        Ok(Some(policy))
    }

    /// What this node announces; `nodes` run on this machine and share its memory.
    pub fn capacity(&self, nodes: usize) -> settings::CapacityClaim {
        let memory_bytes = match self.announce_memory_gib {
            Some(gib) => gib.saturating_mul(1 << 30),
            None => machine_memory_bytes() / nodes.max(1) as u64,
        };
        let flops_per_s = self
            .announce_tflops
            .map(|t| (t * 1e12).clamp(0.0, u64::MAX as f64) as u64)
            .unwrap_or(0);
        settings::CapacityClaim {
            memory_bytes,
            flops_per_s,
        }
    }

    pub fn settings(&self, attack: &str) -> SyncSettings {
        SyncSettings {
            every: self.sync_every,
            timeout_ms: self.sync_timeout_ms,
            aggregator: self.aggregator.clone(),
            byzantine: self.byzantine,
            norm_bound: self.norm_bound,
            compression: self.compression.clone(),
            outer_lr: self.outer_lr,
            outer_momentum: self.outer_momentum,
            attack: attack.to_string(),
        }
    }
}

#[derive(Args)]
pub struct NodeArgs {
    /// JSON settings file (write one with --print-config); other flags are then ignored.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the settings these flags resolve to as JSON and exit.
    #[arg(long)]
    print_config: bool,
    /// Directory for the node key, checkpoints and logs.
    #[arg(long, default_value = "node")]
    data_dir: PathBuf,
    /// Genesis dataset (default: the built-in synthetic corpus beside --data-dir).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Listen address (libp2p multiaddr); QUIC as /ip4/…/udp/…/quic-v1.
    #[arg(long, default_values_t = ["/ip4/0.0.0.0/tcp/0".to_string()])]
    listen: Vec<String>,
    /// Peers to join through, as multiaddrs ending in /p2p/<peer id>. A joiner learns the
    /// network's model and protocol from its signed genesis in the DHT (its own model flags
    /// are then ignored).
    #[arg(long)]
    bootstrap: Vec<String>,
    /// The network's signed genesis file (default: the one in --data-dir; without one, a node
    /// with no --bootstrap founds a network and a joiner looks it up).
    #[arg(long)]
    network_genesis: Option<PathBuf>,
    /// Id (hex) of the network to join: the genesis found in the DHT must hash to it.
    #[arg(long)]
    network: Option<String>,
    /// When this node founds the network: also stake the node with this public key (hex, from
    /// `neuroshard wallet show`), so it can register and be paid. Repeatable.
    #[arg(long = "stake-for")]
    stake_for: Vec<neuroshard_proof::PublicKey>,
    /// Serve the OpenAI-compatible HTTP API on this address (e.g. 127.0.0.1:8080).
    #[arg(long)]
    http: Option<String>,
    /// Serve only completions that carry a payment (`neuroshard ledger pay-inference`).
    #[arg(long)]
    paid_only: bool,
    /// Least fee per stage a paid completion must offer, in NEURO (e.g. 0.001).
    #[arg(long, default_value = "0")]
    min_fee: String,
    /// Held-out windows a driver scores after every DiLoCo round (the validation loss of
    /// the dashboard and `/api/loss`); 0 turns it off.
    #[arg(long, default_value_t = neuroshard_node::settings::DEFAULT_EVAL_WINDOWS)]
    eval_windows: usize,
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Serve this stage (0 = driver) instead of the one with the fewest live replicas.
    #[arg(long)]
    stage: Option<usize>,
    /// Memory the node may use for its stage, in MiB.
    #[arg(long, default_value_t = MEMORY_MB)]
    memory_mb: u64,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    step: StepArgs,
    #[command(flatten)]
    sync: SyncArgs,
    /// Robustness experiments only: send this attack (sign-flip, scale:K, gaussian:S, …)
    /// instead of the honest pseudo-gradient.
    #[arg(long, default_value = "none")]
    attack: String,
    /// Driver steps before it stops feeding data (0: until stopped); also the LR schedule.
    #[arg(long, default_value_t = 0)]
    steps: u64,
    #[arg(long, value_enum, default_value_t = Order::Assigned)]
    data_order: Order,
    /// Engine threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Forward micro-batches queued before the node answers Busy.
    #[arg(long, default_value_t = QUEUE)]
    queue: usize,
    /// A micro-batch whose gradient has not returned by then is routed elsewhere.
    #[arg(long, default_value_t = GRAD_TIMEOUT_MS)]
    grad_timeout_ms: u64,
    /// Listen this long before choosing a stage.
    #[arg(long, default_value_t = 2_500)]
    settle_ms: u64,
    /// Speculative checkpoint every this many seconds (0: only at shutdown).
    #[arg(long, default_value_t = 120)]
    checkpoint_secs: u64,
    /// Start training once this stage and its neighbours each have this many live
    /// replicas (this node included).
    #[arg(long, default_value_t = 1)]
    wait_replicas: usize,
    /// Largest request or response frame, in MiB.
    #[arg(long, default_value_t = MAX_FRAME_MB)]
    max_frame_mb: usize,
    /// When this node founds the network: how activations and their gradients cross stage
    /// boundaries (`int8/int4`, `int8`, `int4`, `int2`, `bf16`, `f32`; forward/backward). A joiner
    /// takes the network's.
    #[arg(long, default_value_t = ActSpec::default())]
    activations: ActSpec,
}

impl NodeArgs {
    fn settings(&self) -> Result<NodeSettings> {
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            return serde_json::from_str(&text)
                .with_context(|| format!("parsing node settings {}", path.display()));
        }
        let genesis = open_or_build_default(self.data.as_deref(), &self.data_dir)?;
        let model = self.model.config(genesis.vocab_size(), self.step.seq)?;
        Ok(NodeSettings {
            data_dir: self.data_dir.clone(),
            genesis: genesis.dir().to_path_buf(),
            listen: self.listen.clone(),
            bootstrap: self.bootstrap.clone(),
            model,
            stages: self.stages,
            stage: self.stage,
            memory_budget: self.memory_mb << 20,
            micro_batches: self.step.network_micro_batches(),
            activations: self.activations,
            weight_lag: self.step.weight_lag,
            batch: self.step.batch,
            seq: self.step.seq,
            steps: self.steps,
            lr: self.step.network_lr(),
            warmup: self.step.warmup,
            clip_norm: self.step.clip_norm,
            beta2: self.step.beta2,
            seed: self.step.seed,
            data_order: match self.data_order {
                Order::Assigned => DataOrder::Assigned,
                Order::Global => DataOrder::Global,
            },
            threads: self.threads,
            queue_capacity: self.queue,
            grad_timeout_ms: self.grad_timeout_ms,
            settle_ms: self.settle_ms,
            checkpoint_secs: self.checkpoint_secs,
            wait_replicas: self.wait_replicas,
            max_frame: self.max_frame_mb << 20,
            sync: self.sync.settings(&self.attack),
            network_genesis: self.network_genesis.clone(),
            network: self.network.clone(),
            stake_for: self.stake_for.clone(),
            http: self.http.clone(),
            paid_only: self.paid_only,
            min_fee_per_stage: neuroshard_ledger::parse_neuro(&self.min_fee).with_context(
                || format!("--min-fee {:?} is not an amount of NEURO", self.min_fee),
            )?,
            eval_windows: self.eval_windows,
            budgets: Default::default(),
            audit: self.sync.audit()?,
            epoch_ms: self.sync.epoch_ms.unwrap_or(settings::DEFAULT_EPOCH_MS),
            growth: self.sync.growth()?,
            capacity: self.sync.capacity(1),
        })
    }
}

/// The machine's memory (`MemTotal` of /proc/meminfo), 0 where it cannot be read: a node
/// that knows no figure announces nothing.
fn machine_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib.saturating_mul(1024))
}

pub fn run(args: NodeArgs) -> Result<()> {
    let settings = args.settings()?;
    if args.print_config {
        println!("{}", serde_json::to_string_pretty(&settings)?);
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_node(settings)).context("node")
}

/// The node, with its HTTP API beside it when `settings.http` names an address.
async fn run_node(mut settings: NodeSettings) -> Result<()> {
    let Some(addr) = settings.http.clone() else {
        return Ok(neuroshard_node::runtime::run(settings).await?);
    };
    let genesis = neuroshard_data::Genesis::open(&settings.genesis)
        .with_context(|| format!("opening {}", settings.genesis.display()))?;
    let (handle, commands) = neuroshard_node::serve::ServeHandle::new(API_QUEUE);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding the HTTP API to {addr}"))?;
    // The bound address (port 0 picks one) goes out in the node's `ready` event.
    let bound = listener.local_addr()?;
    settings.http = Some(bound.to_string());
    let telemetry = neuroshard_node::telemetry::Telemetry::new();
    let state =
        neuroshard_api::ApiState::new(handle, std::sync::Arc::new(genesis.tokenizer().clone()))
            .with_telemetry(telemetry.clone());
    let api = tokio::spawn(neuroshard_api::serve(listener, state));
    let result =
        neuroshard_node::runtime::run_serving(settings, Some(commands), Some(telemetry)).await;
    api.abort();
    // A node serving the API never moves stage (`core/migrate.rs`), so it only stops.
    result?;
    Ok(())
}
