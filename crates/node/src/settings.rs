//! Everything a node needs to start, from flags or a JSON config file.

use std::path::PathBuf;
use std::time::Duration;

use neuroshard_aggregate::{Aggregator, AttackParseError};
use neuroshard_model::{AdamWConfig, LrSchedule, ModelConfig, StageSpec};
use neuroshard_proof::NodeId;
use neuroshard_train::SpecError;

use crate::replica::DilocoConfig;

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("--{0}: {1}")]
    Spec(&'static str, String),
}
use serde::{Deserialize, Serialize};

/// Which windows a driver trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataOrder {
    /// The node's genesis assignment (shard and window chosen from its node id).
    Assigned,
    /// The same global order `neuroshard train --seed` uses (for exactness checks).
    Global,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeSettings {
    /// Key file, checkpoint and logs live here.
    pub data_dir: PathBuf,
    /// Genesis dataset directory.
    pub genesis: PathBuf,
    pub listen: Vec<String>,
    pub bootstrap: Vec<String>,
    pub model: ModelConfig,
    pub stages: usize,
    /// Serve this stage instead of choosing (the role preference).
    pub stage: Option<usize>,
    /// Memory this node may use for its stage, in bytes.
    pub memory_budget: u64,
    pub micro_batches: usize,
    /// How activations and their gradients cross stage boundaries (`int8/int4`, `f32`...).
    #[serde(default)]
    pub activations: crate::act_codec::ActSpec,
    /// Optimizer steps a micro-batch's weights may lag behind the step it counts toward: 0
    /// flushes the pipeline between driver steps, 1 overlaps them (see
    /// `pipeline/schedule.rs`).
    #[serde(default = "default_weight_lag")]
    pub weight_lag: u64,
    /// Rows per driver step (split into `micro_batches`).
    pub batch: usize,
    pub seq: usize,
    /// Driver steps (0: until stopped); also the length of every replica's LR schedule.
    pub steps: u64,
    pub lr: f64,
    pub warmup: u64,
    /// AdamW's second-moment decay; none: from the tokens of a driver step
    /// (`AdamWConfig::beta2_for`), so every replica of a network, which shares its batch,
    /// takes the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    /// Per-stage gradient-norm clip (0: off). A stage clips its own gradient, not the
    /// whole model's, so with clipping on a pipeline differs from one process.
    pub clip_norm: f64,
    pub seed: u64,
    pub data_order: DataOrder,
    pub threads: usize,
    pub queue_capacity: usize,
    pub grad_timeout_ms: u64,
    /// How long a new node listens to the network before choosing its stage.
    pub settle_ms: u64,
    /// Speculative checkpoint period in seconds (0: only at shutdown).
    pub checkpoint_secs: u64,
    /// A node starts training once its own stage and each neighbouring stage has this many
    /// live replicas (itself included): the stages it hears, not the whole network.
    pub wait_replicas: usize,
    /// Maximum request/response frame.
    pub max_frame: usize,
    /// DiLoCo between the replicas of a stage, and the economy.
    #[serde(default)]
    pub sync: SyncSettings,
    /// The network's signed genesis file. Without it a node reads the one in its data
    /// directory, founds a network (no bootstrap peers) or learns it from the DHT.
    #[serde(default)]
    pub network_genesis: Option<PathBuf>,
    /// The network id (hex) a joiner that learns the genesis from the DHT must find.
    #[serde(default)]
    pub network: Option<String>,
    /// A founding node's genesis also stakes these nodes, named by public key (they can then
    /// register and be paid, and they sit in the first finality committee); ignored when the
    /// network already exists.
    #[serde(default)]
    pub stake_for: Vec<neuroshard_proof::PublicKey>,
    /// Address of the node's HTTP API (OpenAI-compatible completions), e.g. 127.0.0.1:8080;
    /// none: no API.
    #[serde(default)]
    pub http: Option<String>,
    /// Serve only completions that carry a payment.
    #[serde(default)]
    pub paid_only: bool,
    /// Least fee per stage (NEURO units) a paid completion must offer.
    #[serde(default)]
    pub min_fee_per_stage: u64,
    /// Held-out windows a driver scores after every DiLoCo round for the validation loss
    /// (0: none).
    #[serde(default = "default_eval_windows")]
    pub eval_windows: usize,
    /// Limits on what peers can make this node hold.
    #[serde(default)]
    pub budgets: Budgets,
    /// Verification by recomputation.
    #[serde(default)]
    pub audit: AuditSettings,
    /// Ledger finality: time from one finalized epoch to the next epoch's start, in ms.
    #[serde(default = "default_epoch_ms")]
    pub epoch_ms: u64,
    /// A founder's growth policy for a new network (`None`: one fixed model). A joiner takes
    /// the network's from its genesis.
    #[serde(default)]
    pub growth: Option<neuroshard_growth::GrowthPolicy>,
    /// The capacity this node announces once registered (what a growing network's scaler
    /// reads); nothing is announced while the memory is 0.
    #[serde(default)]
    pub capacity: CapacityClaim,
}

/// Memory and throughput a node offers for training, announced in a signed ledger op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityClaim {
    pub memory_bytes: u64,
    pub flops_per_s: u64,
}

/// Epoch length when none is set: a proof is final within about this long.
pub const DEFAULT_EPOCH_MS: u64 = 10_000;

fn default_epoch_ms() -> u64 {
    DEFAULT_EPOCH_MS
}

/// How a replica audits its co-replicas and what it keeps for its own auditors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AuditSettings {
    /// Jobs replayed, in parts per million (`neuroshard_audit::AuditRate`; 0: no audits).
    pub per_million: u32,
    /// Bytes of evidence (job inputs, the weights of each step) kept for auditors, in MiB.
    pub evidence_mb: u64,
    /// A test adversary (`swarm --lazy`): the node sends noise as its forward outputs, and
    /// commits to it, instead of computing them. Never set on a real node.
    pub lazy: bool,
    /// A test adversary (`swarm --withhold`): the node serves no one the evidence of its
    /// jobs. Never set on a real node.
    pub withhold: bool,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self {
            per_million: neuroshard_audit::AuditRate::default().per_million,
            evidence_mb: crate::compute::DEFAULT_AUDIT_BUDGET >> 20,
            lazy: false,
            withhold: false,
        }
    }
}

/// Limits on what peers can make a node hold (issue 20's budgets), each a named setting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budgets {
    /// Inbound message bytes (gossip, requests) waiting for the node; past it gossip is dropped
    /// and requests fail at once.
    pub inbound_queue_mb: usize,
    /// Established connections in all, and per peer.
    pub connections: u32,
    pub connections_per_peer: u32,
    /// Gossip messages per second, and at once, one author may have delivered and forwarded
    /// on one topic.
    pub gossip_per_sec: f64,
    pub gossip_burst: u32,
    /// Requests per second, and at once, one peer may make of one protocol.
    pub request_per_sec: f64,
    pub request_burst: u32,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            inbound_queue_mb: neuroshard_net::DEFAULT_MAX_QUEUED_BYTES >> 20,
            connections: neuroshard_net::DEFAULT_MAX_CONNECTIONS,
            connections_per_peer: neuroshard_net::DEFAULT_MAX_CONNECTIONS_PER_PEER,
            gossip_per_sec: neuroshard_net::DEFAULT_GOSSIP_PER_SEC,
            gossip_burst: neuroshard_net::DEFAULT_GOSSIP_BURST,
            request_per_sec: neuroshard_net::DEFAULT_REQUEST_PER_SEC,
            request_burst: neuroshard_net::DEFAULT_REQUEST_BURST,
        }
    }
}

/// Enough windows for a steady curve at a small fraction of a round's compute: 4 forward
/// passes against a round's `H × batch` forward and backward passes.
pub const DEFAULT_EVAL_WINDOWS: usize = 4;

fn default_eval_windows() -> usize {
    DEFAULT_EVAL_WINDOWS
}

fn default_weight_lag() -> u64 {
    DEFAULT_WEIGHT_LAG
}

/// The pipeline schedule unless configured: see `pipeline/schedule.rs`.
pub const DEFAULT_WEIGHT_LAG: u64 = 0;

/// A replica's peak inner learning rate unless configured. Higher than one process's best
/// (`neuroshard train` takes 1e-3): on Shakespeare (1.0M tokens) the 2 × 4 swarm learned 1.5%
/// worse in held-out bits per byte at 1e-3 than at 2e-3, and the 2 × 2 swarm the same at
/// both, while one process learned 2.3% better at 1e-3 (node README, "Learning rates").
pub const DEFAULT_LR: f64 = 2e-3;

/// Micro-batches per driver step unless configured. More of them shorten the time a stage
/// waits for the pipeline to fill and drain around each step: on "home" links (20 Mbit/s,
/// 40 ms) the 4-node swarm made 12% more tokens/s with 4 than with 2, and 2.7% fewer on
/// loopback, where the cores are the limit (3 runs each; README, "Micro-batches").
pub const DEFAULT_MICRO_BATCHES: usize = 4;

/// Fewest rows a default micro-batch holds. Each micro-batch pays costs that grow with the
/// stage's parameters and not its rows (the gradient commitment's hash, the weights' upload,
/// the gradients' copy): drivers of 4 rows made 1,580 tokens/s in 4 micro-batches and 2,249
/// in 2 (the 4-node swarm on Shakespeare, crates/node/README.md, "Replicas that share one
/// process's batch").
pub const MIN_MICRO_BATCH_ROWS: usize = 2;

/// Micro-batches of a driver step of `rows` rows unless configured: the default, each of at
/// least [`MIN_MICRO_BATCH_ROWS`] rows where the step has that many.
pub fn default_micro_batches(rows: usize) -> usize {
    DEFAULT_MICRO_BATCHES.min((rows / MIN_MICRO_BATCH_ROWS).max(1))
}

/// Inner steps per DiLoCo round (H) unless configured. On Shakespeare with `int2` offers, H 10
/// against 20 took 2 replicas from +3.4% to +1.1% over one process and 4 from +7.1% to +6.1%
/// (the 2 × 2 swarm: +3.0% to +2.1% on the validation split). The price: offers add about
/// 132 kB per driver step instead of 66 kB (activations carry 435 kB), and round messages and
/// proofs come twice as often. The simulator's ByzFL bench always ran at 10 (README, "The
/// outer step").
pub const DEFAULT_SYNC_EVERY: u64 = 10;
/// Pseudo-gradient compression unless configured: every coordinate at 2 bits with a scale per
/// chunk, about 16× smaller than fp32: +0.9% over dense on Shakespeare at 2 replicas, and
/// within 3% of the clean run under every ByzFL attack in the simulator. Sparser offers cost
/// more: a shared random quarter at 2 bits (62×) +1.9% over dense; with signs (120×, the
/// former default) +14% in the simulator, where ALIE then got through (README, "The outer
/// step").
pub const DEFAULT_COMPRESSION: &str = "int2";
/// The outer step unless configured: the plain average of the replicas' progress. DiLoCo's
/// lr 0.7 with Nesterov 0.9 learned 11% worse on Shakespeare, and its momentum carries an
/// attacker's small bias from round to round (README, "The outer step").
pub const DEFAULT_OUTER_LR: f32 = 1.0;
pub const DEFAULT_OUTER_MOMENTUM: f32 = 0.0;

/// DiLoCo and economy settings (the defaults are measured: see the constants above).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SyncSettings {
    /// Inner steps per outer round (H); 0 turns DiLoCo off.
    pub every: u64,
    /// How long a replica waits for its co-replicas' offers.
    pub timeout_ms: u64,
    /// Robust aggregator spec, e.g. `clipped-mean`, `trimmed-mean`, `median`.
    pub aggregator: String,
    /// Byzantine replicas per stage the aggregator must tolerate.
    pub byzantine: usize,
    /// No pseudo-gradient counts longer than this multiple of the round's median input norm
    /// (longer ones are clipped to it before aggregation; 0: off; a round of two inputs uses
    /// at least `replica::PAIR_NORM_BOUND`, 3). At 1 no offer counts for more than the
    /// median honest one, so liars one more than the f a trimmed mean assumes (two of five)
    /// cannot outweigh the honest inputs left after the trim; at the former 3 a scaled offer
    /// counted 3× and two of five reversed every step (+79% loss in the bench's 3 × 5 run,
    /// +2.7% at 1), while clean runs of 2 × 3 and 3 × 5 learned alike at 1 and 3.
    pub norm_bound: f64,
    /// Pseudo-gradient compression, e.g. `int2`, `randk:0.25:int2`, `lowrank:4:int8`, `fp32`.
    pub compression: String,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    /// Robustness experiments only: send this attack instead of the honest pseudo-gradient.
    pub attack: String,
}

/// Every value clamped to its coordinate's median ± 2 spreads of the values the f extremes
/// cannot reach, then all averaged (the median where n − 2f < 2: three replicas). At four
/// replicas on Shakespeare the trimmed mean (one value dropped a side) cost 1.0 point of
/// validation loss over the plain mean (node README, "An aggregator that keeps honest offers").
pub const DEFAULT_AGGREGATOR: &str = "clipped-mean";

impl Default for SyncSettings {
    fn default() -> Self {
        Self {
            every: DEFAULT_SYNC_EVERY,
            timeout_ms: 5_000,
            aggregator: DEFAULT_AGGREGATOR.into(),
            byzantine: 1,
            norm_bound: 1.0,
            compression: DEFAULT_COMPRESSION.into(),
            outer_lr: DEFAULT_OUTER_LR,
            outer_momentum: DEFAULT_OUTER_MOMENTUM,
            attack: "none".into(),
        }
    }
}

impl NodeSettings {
    /// The optimizer of every replica. A run with a known length (`--steps`) warms up then decays
    /// by cosine to its end, as `neuroshard train` does; a node that runs until stopped warms up
    /// and then holds the peak rate (a cosine toward "step 1" would train it at the floor rate).
    ///
    /// A β₂ outside [0, 1) is refused ([`neuroshard_model::Beta2Error`]).
    pub fn adamw(&self) -> Result<AdamWConfig, SettingsError> {
        let beta2 = AdamWConfig::beta2_or_rule(self.beta2, self.batch, self.seq)
            .map_err(|e| SettingsError::Spec("beta2", e.to_string()))?;
        let (warmup_steps, schedule) = if self.steps == 0 {
            (self.warmup, LrSchedule::Constant)
        } else {
            (self.warmup.min(self.steps), LrSchedule::Cosine)
        };
        Ok(AdamWConfig {
            lr: self.lr,
            beta2,
            warmup_steps,
            total_steps: self.steps.max(1),
            clip_norm: (self.clip_norm > 0.0).then_some(self.clip_norm),
            schedule,
            ..Default::default()
        })
    }

    /// The DiLoCo side of a replica; a bad compression, attack or aggregator spec is refused
    /// here, at start, rather than at the first round. `sync_seed` is the network's
    /// (`Network::sync_seed`): masks and bases must agree across replicas whatever `--seed`
    /// each node was started with.
    pub fn diloco(&self, me: NodeId, sync_seed: u64) -> Result<DilocoConfig, SettingsError> {
        let s = &self.sync;
        let cfg = DilocoConfig {
            me,
            aggregator: s.aggregator.clone(),
            byzantine: s.byzantine,
            compression: s
                .compression
                .parse()
                .map_err(|e: SpecError| SettingsError::Spec("compression", e.to_string()))?,
            outer_lr: s.outer_lr,
            outer_momentum: s.outer_momentum,
            seed: sync_seed,
            attack: s
                .attack
                .parse()
                .map_err(|e: AttackParseError| SettingsError::Spec("attack", e.to_string()))?,
            norm_bound: s.norm_bound,
        };
        if !(s.norm_bound == 0.0 || s.norm_bound.is_finite() && s.norm_bound >= 1.0) {
            return Err(SettingsError::Spec(
                "norm-bound",
                format!(
                    "{} is neither 0 (off) nor a multiple of at least 1",
                    s.norm_bound
                ),
            ));
        }
        Aggregator::parse(&s.aggregator, s.byzantine)
            .map_err(|e| SettingsError::Spec("aggregator", e.to_string()))?;
        Ok(cfg)
    }

    pub fn grad_timeout(&self) -> Duration {
        Duration::from_millis(self.grad_timeout_ms)
    }

    /// Bytes a replica of each stage needs: weights, accumulated gradients and two AdamW
    /// moments (4 f32 per parameter) plus the stashed inputs of a full queue.
    pub fn stage_memory(&self) -> Result<Vec<u64>, neuroshard_model::ModelError> {
        let specs = StageSpec::split(&self.model, self.stages)?;
        Ok(specs
            .iter()
            .map(|s| {
                let params: u64 = s
                    .param_specs(&self.model)
                    .iter()
                    .map(|p| p.numel() as u64)
                    .sum();
                params * 16 + self.replica_overhead()
            })
            .collect())
    }

    /// Bytes a replica needs besides its parameters: the stashed inputs of a full queue.
    pub fn replica_overhead(&self) -> u64 {
        let rows = self.batch.div_ceil(self.micro_batches.max(1)) as u64;
        let acts = rows * self.seq as u64 * self.model.d_model as u64 * 4;
        acts * (self.queue_capacity as u64 + self.micro_batches as u64) * 2
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn settings(steps: u64) -> NodeSettings {
        NodeSettings {
            data_dir: "d".into(),
            genesis: "g".into(),
            listen: Vec::new(),
            bootstrap: Vec::new(),
            model: ModelConfig::tiny(64),
            stages: 1,
            stage: None,
            memory_budget: 0,
            micro_batches: 2,
            activations: Default::default(),
            weight_lag: DEFAULT_WEIGHT_LAG,
            batch: 8,
            seq: 16,
            steps,
            lr: 1e-3,
            warmup: 100,
            clip_norm: 0.0,
            beta2: None,
            seed: 0,
            data_order: DataOrder::Assigned,
            threads: 1,
            queue_capacity: 4,
            grad_timeout_ms: 1000,
            settle_ms: 0,
            checkpoint_secs: 0,
            wait_replicas: 0,
            max_frame: 1 << 20,
            sync: SyncSettings::default(),
            network_genesis: None,
            network: None,
            stake_for: Vec::new(),
            http: None,
            paid_only: false,
            min_fee_per_stage: 0,
            eval_windows: 0,
            budgets: Budgets::default(),
            audit: AuditSettings::default(),
            epoch_ms: DEFAULT_EPOCH_MS,
            growth: None,
            capacity: Default::default(),
        }
    }

    #[test]
    fn default_micro_batches_hold_two_rows_each_up_to_four() {
        let of = super::default_micro_batches;
        assert_eq!(
            [of(16), of(8), of(6), of(4), of(3), of(2), of(1)],
            [4, 4, 3, 2, 1, 1, 1]
        );
        assert_eq!(of(0), 1);
    }

    #[test]
    fn a_norm_bound_below_one_or_not_finite_is_refused_at_start() {
        let me = NodeId([1; 32]);
        let mut s = settings(0);
        for ok in [0.0, 1.0, 2.0, 50.0] {
            s.sync.norm_bound = ok;
            assert_eq!(s.diloco(me, 0).unwrap().norm_bound, ok);
        }
        for bad in [0.5, -1.0, f64::NAN, f64::INFINITY] {
            s.sync.norm_bound = bad;
            assert!(s.diloco(me, 0).is_err(), "{bad}");
        }
        // Settings files written before the bound existed read with the default.
        let mut json = serde_json::to_value(settings(0)).unwrap();
        json["sync"].as_object_mut().unwrap().remove("norm_bound");
        let back: NodeSettings = serde_json::from_value(json).unwrap();
        assert_eq!(back.sync.norm_bound, 1.0);
    }

    #[test]
    fn beta2_follows_the_tokens_of_a_driver_step_unless_set_and_never_reaches_one() {
        let mut s = settings(0);
        (s.batch, s.seq) = (8, 128);
        assert!((s.adamw().unwrap().beta2 - 0.975).abs() < 1e-12);
        s.batch = 4;
        assert!((s.adamw().unwrap().beta2 - 0.9875).abs() < 1e-12);
        s.beta2 = Some(0.9);
        assert!((s.adamw().unwrap().beta2 - 0.9).abs() < 1e-12);
        // At 1 the bias correction divides by zero: NaN weights at the first step.
        for bad in [1.0, 1.5, -0.1, f64::NAN, f64::INFINITY] {
            s.beta2 = Some(bad);
            assert!(s.adamw().is_err(), "{bad}");
        }
        // Settings files written before the field take the rule, and files without an
        // override are written without it.
        let json = serde_json::to_value(settings(0)).unwrap();
        assert!(json.get("beta2").is_none());
        let back: NodeSettings = serde_json::from_value(json).unwrap();
        assert_eq!(back.beta2, None);
    }

    #[test]
    fn a_node_without_an_end_warms_up_then_holds_the_peak_rate() {
        let opt = settings(0).adamw().unwrap();
        assert!(opt.lr_at(0) < 1e-4, "{}", opt.lr_at(0));
        assert!((opt.lr_at(100) - 1e-3).abs() < 1e-12);
        assert!((opt.lr_at(1_000_000) - 1e-3).abs() < 1e-12);
        // With an end it decays to the floor by then, as `train` does.
        let opt = settings(1000).adamw().unwrap();
        assert!(opt.lr_at(999) < 2e-4, "{}", opt.lr_at(999));
        assert_eq!(opt.warmup_steps, 100);
        assert_eq!(settings(10).adamw().unwrap().warmup_steps, 10);
    }
}
