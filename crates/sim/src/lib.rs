//! A deterministic in-process network of NeuroShard nodes.
//!
//! Every node is the real [`neuroshard_node::core::NodeCore`]; the simulator carries its
//! transmits over a seeded link model ([`LinkModel`]: latency, bandwidth, loss, partitions),
//! runs its engine jobs with a virtual cost (the real engine on a tiny model, or the cheap
//! [`StandIn`] for scale), persists its ledger writes and checkpoints so a crashed node can
//! restart, and lets a test rewrite what a node sends (an adversary). One seed gives one
//! event trace, bit for bit ([`Sim::trace_hash`]).

pub mod byzantine;
pub mod byzfl;
mod data;
mod engine;
mod link;
mod sim;
mod standin;
mod validate;

pub use data::PatternBatches;
pub use engine::{Cheat, EngineCosts, RealEngine, SimEngine};
pub use link::{LinkModel, Partitions};
pub use sim::{
    Built, FactoryError, NodeFactory, SPARE_STAKED, Sim, Tamper, Traffic, UNIX_START_MS,
};
pub use standin::StandIn;
pub use validate::validation_loss;

use neuroshard_model::{ModelConfig, StageSpec};
use neuroshard_node::core::BatchSource;
use neuroshard_node::{DataOrder, NodeSettings};
use neuroshard_proof::NodeId;

/// A tiny model: 2 layers of width 16, vocabulary 32, sequences of 8.
pub fn tiny_model() -> ModelConfig {
    ModelConfig {
        layers: 3,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        max_seq: 8,
        ..ModelConfig::tiny(32)
    }
}

/// A tiny model with room to serve: a prompt and its completion fit its 24 positions.
pub fn serving_model(layers: usize) -> ModelConfig {
    ModelConfig {
        layers,
        d_model: 16,
        heads: 2,
        kv_heads: 1,
        ffn: 32,
        max_seq: 24,
        ..ModelConfig::tiny(32)
    }
}

/// A network of real engines on `settings`, `replicas` per stage (see [`network`]).
pub fn real_network(seed: u64, settings: NodeSettings, replicas: usize) -> Sim {
    network(seed, settings, replicas, EngineKind::Real)
}

/// A network of `kind` engines on `settings` over a LAN, `replicas` per stage: node i serves
/// stage i % stages, the nodes start 10 ms apart.
pub fn network(seed: u64, settings: NodeSettings, replicas: usize, kind: EngineKind) -> Sim {
    let stages = settings.stages;
    let factory = Factory::new(settings.clone(), kind);
    let mut sim = Sim::new(
        seed,
        settings,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for i in 0..stages * replicas {
        sim.add_node(i % stages, std::time::Duration::from_millis(10 * i as u64));
    }
    sim
}

/// Node settings for a simulated network of `stages` stages on `model`.
pub fn settings(model: ModelConfig, stages: usize, wait_replicas: usize) -> NodeSettings {
    NodeSettings {
        data_dir: "sim".into(),
        genesis: "sim".into(),
        listen: Vec::new(),
        bootstrap: Vec::new(),
        seq: model.max_seq,
        model,
        stages,
        stage: None,
        memory_budget: u64::MAX,
        micro_batches: 2,
        // The stand-in engine's tensors are not activations; raw keeps the simulated runs
        // comparable with those before compression existed.
        activations: neuroshard_node::act_codec::ActSpec::UNCOMPRESSED,
        weight_lag: neuroshard_node::settings::DEFAULT_WEIGHT_LAG,
        batch: 4,
        steps: 0,
        lr: 3e-3,
        warmup: 5,
        clip_norm: 0.0,
        beta2: None,
        seed: 7,
        data_order: DataOrder::Assigned,
        threads: 1,
        queue_capacity: 8,
        grad_timeout_ms: 5_000,
        settle_ms: 0,
        checkpoint_secs: 10,
        wait_replicas,
        max_frame: 32 << 20,
        // Dense pseudo-gradients: with the stand-in's quadratic, random-k masks under outer
        // Nesterov momentum 0.9 diverge (see the crate README), which would hide the protocol
        // behaviour the simulator is for.
        sync: neuroshard_node::settings::SyncSettings {
            compression: "fp32".into(),
            every: 10,
            timeout_ms: 3_000,
            ..Default::default()
        },
        network_genesis: None,
        network: None,
        stake_for: Vec::new(),
        http: None,
        paid_only: false,
        min_fee_per_stage: 0,
        // Scenarios that measure the validation loss turn it on.
        eval_windows: 0,
        budgets: Default::default(),
        audit: Default::default(),
        epoch_ms: neuroshard_node::settings::DEFAULT_EPOCH_MS,
        growth: None,
        capacity: Default::default(),
    }
}

/// Which engine simulated nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    StandIn,
    Real,
}

/// Builds engines and data for simulated nodes from their settings.
pub struct Factory {
    pub settings: NodeSettings,
    pub kind: EngineKind,
    /// Nodes whose replicas send `attack` instead of their pseudo-gradient.
    pub attackers: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>,
    pub attack: String,
    /// Lazy workers (real engine only) and how each cheats.
    pub cheats: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<NodeId, Cheat>>>,
    /// The rows every node's batch source drew, by name (what provenance checks read).
    drawn: data::Drawn,
}

impl Factory {
    pub fn new(settings: NodeSettings, kind: EngineKind) -> Self {
        Self {
            settings,
            kind,
            attackers: Default::default(),
            attack: "none".into(),
            cheats: Default::default(),
            drawn: Default::default(),
        }
    }
}

impl Factory {
    /// An engine of the blocks `spec` of `model` for `node` (an attacker's replica sends its
    /// attack, a lazy worker cheats), and its data source.
    fn build(
        &self,
        node: NodeId,
        model: ModelConfig,
        spec: StageSpec,
    ) -> Result<Built, FactoryError> {
        let mut s = self.settings.clone();
        if self.attackers.lock().is_ok_and(|a| a.contains(&node)) {
            s.sync.attack = self.attack.clone();
        }
        let dcfg = (s.sync.every > 0)
            .then(|| s.diloco(node, s.seed))
            .transpose()
            .map_err(|e| FactoryError(e.to_string()))?;
        let engine: Box<dyn SimEngine> = match self.kind {
            EngineKind::StandIn => Box::new(
                StandIn::new(model, spec, s.seed, dcfg).map_err(|e| FactoryError(e.to_string()))?,
            ),
            EngineKind::Real => {
                let cheat = self.cheats.lock().ok().and_then(|c| c.get(&node).copied());
                Box::new(
                    RealEngine::new(
                        model,
                        spec,
                        s.seed,
                        s.adamw().map_err(|e| FactoryError(e.to_string()))?,
                        dcfg,
                        s.weight_lag,
                        s.activations,
                    )?
                    .cheating(cheat),
                )
            }
        };
        Ok((engine, Box::new(self.patterns())))
    }

    fn patterns(&self) -> PatternBatches {
        let s = &self.settings;
        PatternBatches {
            vocab: s.model.vocab,
            rows: s.batch,
            seq: s.seq,
            shards: 8,
            drawn: self.drawn.clone(),
        }
    }
}

impl NodeFactory for Factory {
    fn audits(&self) -> bool {
        matches!(self.kind, EngineKind::Real)
    }

    fn engine(&mut self, node: NodeId, stage: usize) -> Result<Built, FactoryError> {
        let s = &self.settings;
        let specs =
            StageSpec::split(&s.model, s.stages).map_err(|e| FactoryError(e.to_string()))?;
        let spec = *specs
            .get(stage)
            .ok_or_else(|| FactoryError(format!("no stage {stage}")))?;
        self.build(node, s.model.clone(), spec)
    }

    fn data(&mut self, _node: NodeId, _stage: usize) -> Box<dyn BatchSource> {
        Box::new(self.patterns())
    }

    /// The stand-in only: a real grown stage starts as identity blocks drawn from the
    /// network's seed (`grow_pipeline::identity_blocks`), which the simulator's real engine
    /// does not build.
    fn grown_engine(
        &mut self,
        node: NodeId,
        _stage: usize,
        model: ModelConfig,
        spec: StageSpec,
    ) -> Result<Built, FactoryError> {
        match self.kind {
            EngineKind::StandIn => self.build(node, model, spec),
            EngineKind::Real => Err(FactoryError(
                "the simulator's real engine does not build grown stages".into(),
            )),
        }
    }
}
