//! Start-up of a real node: a thin driver of the sans-IO [`Startup`] machine, which makes
//! every decision (network record, settle, stage, resume or fresh, whom a joiner borrows θ₀
//! from). Here its requests run against libp2p, the checkpoint files and the stage's state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use neuroshard_data::Genesis;
use neuroshard_model::{AdamW, AdamWConfig, ModelConfig, ModelError, Stage, StageSpec, checkpoint};
use neuroshard_net::{Net, NetEvent, NetEvents};
use neuroshard_proof::{Hash32, Identity, NodeId};

use super::{CHECKPOINT_DIR, emit, now_ms};
use crate::NodeError;
use crate::compute::{self, Engine, JobStore, codec_wire};
use crate::core::TransferError;
use crate::events::NodeEvent;
use crate::peers::PeerTable;
use crate::records::Topic;
use crate::replica::{Diloco, DilocoConfig, decode_adamw};
use crate::settings::NodeSettings;
use crate::startup::{Hint, Init, JoinError, Local, Part, Request, Saved, Startup, StartupConfig};

/// What start-up decided, with the engine ready to run.
pub struct Started {
    pub stage: usize,
    pub engine: Engine,
    pub steps_done: u64,
    pub sync_round: u64,
    pub sync_theta: Hash32,
    pub numel: usize,
    pub spec: StageSpec,
    /// The stage orders known at start.
    pub layouts: crate::layout::Layouts,
    pub peers: PeerTable,
    /// Network events heard while listening, for the core.
    pub pending: Vec<NetEvent>,
    /// A peer with a θ₀ of our stage (a restarted replica catches up at once).
    pub hint: Option<Hint>,
    pub joined: Option<(u64, Duration)>,
}

/// Runs the start-up machine to its decision; the engine is ready to run.
pub async fn start(
    settings: &NodeSettings,
    identity: &Identity,
    net: &Net,
    net_events: &mut NetEvents,
    genesis: &Genesis,
    network: &crate::network::Network,
) -> Result<Started, NodeError> {
    let specs = StageSpec::split(&settings.model, settings.stages)?;
    let mut layouts = crate::layout::Layouts::fixed(&settings.model, settings.stages)
        .map_err(|e| NodeError::Config(e.to_string()))?;
    let ckpt_dir = settings.data_dir.join(CHECKPOINT_DIR);
    let latest = compute::latest_checkpoint(&ckpt_dir);
    let saved = latest.as_deref().map(|d| Saved {
        path: d.display().to_string(),
        holds: checkpoint::read_meta(d).ok().map(|m| (m.model, m.stage)),
    });
    let cfg = StartupConfig {
        identity: identity.clone(),
        network: network.id,
        genesis: network.signed.clone(),
        model: settings.model.clone(),
        specs,
        stage: settings.stage,
        need: settings.stage_memory()?,
        budget: settings.memory_budget,
        settle: Duration::from_millis(settings.settle_ms),
        sync: settings.sync.every > 0,
        saved,
        grows: settings.growth.is_some(),
        overhead: settings.replica_overhead(),
    };
    let mut machine = Startup::new(cfg, Instant::now(), now_ms());
    let mut io = StartIo {
        settings,
        net,
        latest,
        optim: settings
            .adamw()
            .map_err(|e| NodeError::Config(e.to_string()))?,
        dcfg: settings
            .diloco(identity.node_id(), network.sync_seed())
            .map_err(|e| NodeError::Config(e.to_string()))?,
        state: None,
    };
    let mut pending = Vec::new();
    let decision = loop {
        while let Some(request) = machine.poll_request() {
            io.execute(&mut machine, request).await?;
        }
        while let Some(event) = machine.poll_event() {
            emit(&event);
        }
        if let Some(outcome) = machine.poll_outcome() {
            break outcome?;
        }
        // Every request was answered: only the settle deadline can be left.
        let Some(until) = machine.poll_timeout() else {
            return Err(NodeError::Config("start-up stalled".into()));
        };
        match tokio::time::timeout_at(until.into(), net_events.recv()).await {
            Ok(Some(ev)) => {
                if let Some((author, data)) = heartbeat(&ev) {
                    machine.handle_gossip(author, data, Instant::now());
                }
                pending.push(ev);
            }
            Ok(None) => return Err(NodeError::Config("network task stopped".into())),
            Err(_) => machine.handle_timeout(Instant::now()),
        }
    };
    if let Some(l) = decision.layout.clone() {
        layouts.insert(l);
    }
    let Some(state) = io.state else {
        return Err(NodeError::Config("start-up ended without a stage".into()));
    };
    let (sync_round, sync_theta) = (state.diloco.round(), state.diloco.hash());
    let spec = *state.stage.spec();
    let numel = state.stage.params().numel();
    let sync_on = settings.sync.every > 0;
    // What this replica's auditors may ask for, on disk within the configured budget.
    let audit_dir = settings.data_dir.join("audit");
    let store = JobStore::new(Some(audit_dir.clone()), settings.audit.evidence_mb << 20).map_err(
        |source| NodeError::Io {
            path: audit_dir,
            source,
        },
    )?;
    let wire = codec_wire(settings.activations, settings.model.d_model);
    let engine = Engine::new(
        state.stage,
        state.optimizer,
        sync_on.then_some(state.diloco),
    )
    .with_weight_lag(settings.weight_lag)
    .with_checkpoint_dir(ckpt_dir, genesis.root())
    .with_job_store(store, wire)
    .lazy(settings.audit.lazy)
    .withhold(settings.audit.withhold);
    Ok(Started {
        stage: decision.stage,
        engine,
        steps_done: state.steps,
        sync_round,
        sync_theta,
        numel,
        spec,
        layouts,
        peers: decision.peers,
        pending,
        hint: decision.hint,
        joined: decision.joined.map(|j| (j.round, j.took)),
    })
}

/// The gossip the start-up machine reads: heartbeats (it keeps only signed ones of our
/// network).
fn heartbeat(ev: &NetEvent) -> Option<(NodeId, &[u8])> {
    match ev {
        NetEvent::Gossip {
            topic,
            author,
            data,
        } if matches!(Topic::parse(topic), Some(Topic::Heartbeat(_))) => {
            Some((*author, data.as_slice()))
        }
        _ => None,
    }
}

/// The stage's state while start-up runs.
struct State {
    stage: Stage,
    optimizer: AdamW,
    steps: u64,
    diloco: Diloco,
}

/// Executes the machine's requests: the network, the checkpoint files and the stage's state.
struct StartIo<'a> {
    settings: &'a NodeSettings,
    net: &'a Net,
    latest: Option<PathBuf>,
    optim: AdamWConfig,
    dcfg: DilocoConfig,
    state: Option<State>,
}

impl StartIo<'_> {
    async fn execute(&mut self, m: &mut Startup, request: Request) -> Result<(), NodeError> {
        match request {
            Request::GetRecord { key } => {
                let values = self.net.get_record(key.clone()).await.unwrap_or_default();
                m.handle_record(&key, values, Instant::now());
            }
            Request::PutRecord { key, value } => {
                if let Err(e) = self.net.put_record(key, value).await {
                    tracing::debug!("publishing the network record: {e}");
                }
            }
            Request::GetProviders { stage, key } => {
                let mut found: Vec<NodeId> = self
                    .net
                    .get_providers(key)
                    .await
                    .map(|p| p.into_iter().collect())
                    .unwrap_or_default();
                found.sort();
                m.handle_providers(stage, found, Instant::now());
            }
            Request::LearnKey(key) => {
                self.net.learn_key(key.as_bytes());
            }
            Request::Load { stage, init } => {
                let held = m.stage_model(stage);
                let result = self.load(stage, init, held)?;
                m.handle_loaded(result, Instant::now());
            }
            Request::FetchBlob { peer, hash, max } => {
                let result = self
                    .net
                    .fetch_blob(peer, hash, max)
                    .await
                    .map_err(|e| TransferError(e.to_string()));
                m.handle_blob(hash, result, Instant::now());
            }
            Request::AdoptOuter { bytes, hash, .. } => {
                let result = self.adopt_outer(&bytes, hash);
                m.handle_adopted(Part::Outer, result, Instant::now());
            }
            Request::AdoptOptimizer { bytes } => {
                let result = self.adopt_optimizer(&bytes);
                m.handle_adopted(Part::Optimizer, result, Instant::now());
            }
        }
        Ok(())
    }

    /// Builds the stage's state; a checkpoint that cannot be read is the machine's to judge,
    /// a fresh stage that cannot be built ends the node.
    fn load(
        &mut self,
        stage: usize,
        init: Init,
        held: Option<(ModelConfig, StageSpec, bool)>,
    ) -> Result<Result<Local, ModelError>, NodeError> {
        let (model, spec, born) =
            held.ok_or_else(|| NodeError::Config(format!("stage {stage} does not exist")))?;
        let state = match (init, self.latest.as_deref()) {
            (Init::Resume, Some(dir)) => match checkpoint::load(dir) {
                // The files may have changed since the machine read their metadata.
                Ok(ck) if ck.meta.stage != spec || ck.meta.model != model => {
                    let why = "it now holds another model or stage";
                    return Ok(Err(ModelError::Checkpoint(why.into())));
                }
                Ok(ck) => self.resumed(dir, ck)?,
                Err(e) => return Ok(Err(e)),
            },
            (Init::Resume, None) => {
                return Ok(Err(ModelError::Checkpoint("no checkpoint".into())));
            }
            (Init::Fresh, _) => {
                // A stage the network grew starts as identity blocks: the grown model computes
                // what the old one did until the stage trains.
                let stage = if born {
                    neuroshard_model::grow_pipeline::identity_blocks(
                        model,
                        spec,
                        self.settings.seed,
                    )?
                } else {
                    Stage::init(model, spec, self.settings.seed)?
                };
                let optimizer = AdamW::new(self.optim.clone(), stage.params());
                let diloco = Diloco::new(self.dcfg.clone(), stage.params())
                    .map_err(|e| NodeError::Config(e.to_string()))?;
                State {
                    stage,
                    optimizer,
                    steps: 0,
                    diloco,
                }
            }
        };
        let local = Local {
            steps: state.steps,
            round: state.diloco.round(),
        };
        self.state = Some(state);
        Ok(Ok(local))
    }

    fn resumed(&self, dir: &Path, ck: checkpoint::Checkpoint) -> Result<State, NodeError> {
        let mut optimizer = ck
            .optimizer
            .unwrap_or_else(|| AdamW::new(self.optim.clone(), ck.stage.params()));
        // The schedule is this run's, not the one the checkpoint was written under (a node
        // restarted without `--steps` must not resume an old run's cosine).
        optimizer.config = self.optim.clone();
        let len = ck.stage.params().numel();
        let diloco = match compute::load_diloco(dir, &ck.meta, self.dcfg.clone(), len) {
            Ok(d) => d,
            Err(e) => {
                emit(&NodeEvent::Warning {
                    stage: None,
                    message: format!(
                        "DiLoCo state not usable ({e}); taking θ₀ from the weights and catching up with the stage"
                    ),
                    time_ms: now_ms(),
                });
                Diloco::new(self.dcfg.clone(), ck.stage.params())
                    .map_err(|e| NodeError::Config(e.to_string()))?
            }
        };
        Ok(State {
            steps: ck.meta.step,
            diloco,
            stage: ck.stage,
            optimizer,
        })
    }

    /// Takes a fetched outer state as θ and θ₀; the moments of the old θ no longer apply.
    fn adopt_outer(&mut self, bytes: &[u8], hash: Hash32) -> Result<(), JoinError> {
        let state = self.state.as_mut().ok_or(JoinError::NotLoaded)?;
        let numel = state.stage.params().numel();
        let diloco = Diloco::restore(self.dcfg.clone(), bytes, numel)
            .map_err(|e| JoinError::Decode(e.to_string()))?;
        if diloco.hash() != hash {
            return Err(JoinError::HashMismatch);
        }
        let mut params = state.stage.params().clone();
        params
            .set_flat(diloco.theta())
            .map_err(|e| JoinError::Decode(e.to_string()))?;
        *state.stage.params_mut() = params;
        state.optimizer = AdamW::new(self.optim.clone(), state.stage.params());
        state.steps = 0;
        state.diloco = diloco;
        Ok(())
    }

    /// Takes a replica's AdamW moments; its step count keeps the LR schedule and the run's
    /// length in step with the stage.
    fn adopt_optimizer(&mut self, bytes: &[u8]) -> Result<(), JoinError> {
        let state = self.state.as_mut().ok_or(JoinError::NotLoaded)?;
        let optimizer = decode_adamw(bytes, self.optim.clone(), state.stage.params())
            .map_err(|e| JoinError::Decode(e.to_string()))?;
        state.steps = optimizer.step_count();
        state.optimizer = optimizer;
        Ok(())
    }
}
