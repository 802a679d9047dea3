//! Start-up of a real node: the network record check, listening before choosing a stage,
//! resuming from a checkpoint, and a joiner borrowing its stage's θ₀ and AdamW state.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use neuroshard_data::Genesis;
use neuroshard_model::{AdamW, AdamWConfig, ParamSet, Stage, StageSpec, checkpoint};
use neuroshard_net::{Net, NetEvent};
use neuroshard_proof::{Identity, NodeId, Signed};
use tokio::sync::mpsc;

use super::{CHECKPOINT_DIR, emit, now_ms};
use crate::NodeError;
use crate::compute::{self, Engine};
use crate::core::{BatchError, BatchSource, outer_state_limit};
use crate::events::NodeEvent;
use crate::peers::{PeerTable, choose_stage};
use crate::records::{Heartbeat, NETWORK_KEY, NetworkRecord, open, stage_key};
use crate::replica::{Diloco, DilocoConfig, decode_adamw};
use crate::settings::{DataOrder, NodeSettings};
use crate::sync::{ThetaRecord, theta_key};

/// The network id: model shape, stage count and dataset root, hashed.
pub fn network_id(settings: &NodeSettings, genesis_root: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/network/v1");
    h.update(
        serde_json::to_string(&settings.model)
            .unwrap_or_default()
            .as_bytes(),
    );
    h.update(&(settings.stages as u64).to_le_bytes());
    h.update(genesis_root);
    *h.finalize().as_bytes()
}

/// The genesis dataset as the core's batch source.
pub struct GenesisBatches {
    pub genesis: Genesis,
    pub order: DataOrder,
    pub seed: u64,
    pub batch: usize,
    pub seq: usize,
}

impl BatchSource for GenesisBatches {
    fn batch(&self, origin: &[u8; 32], step: u64) -> Result<neuroshard_data::Batch, BatchError> {
        let b = match self.order {
            DataOrder::Assigned => self
                .genesis
                .train_batch(origin, 0, step, self.batch, self.seq),
            DataOrder::Global => self.genesis.batch(
                neuroshard_data::Split::Train,
                self.seed,
                step,
                self.batch,
                self.seq,
            ),
        };
        b.map_err(|e| BatchError(e.to_string()))
    }
}

/// What start-up decided.
pub struct Started {
    pub stage: usize,
    pub engine: Engine,
    pub steps_done: u64,
    pub sync_round: u64,
    pub sync_theta: [u8; 32],
    pub numel: usize,
    pub spec: StageSpec,
    pub peers: PeerTable,
    pub pending: Vec<NetEvent>,
    /// A peer with a newer θ₀ of our stage (a restarted replica catches up at once).
    pub hint: Option<(NodeId, ThetaRecord)>,
    pub joined: Option<(u64, Duration)>,
}

/// Listens, chooses the stage, resumes or joins; the engine is ready to run.
pub async fn start(
    settings: &NodeSettings,
    identity: &Identity,
    net: &Net,
    net_events: &mut mpsc::Receiver<NetEvent>,
    genesis: &Genesis,
    network: [u8; 32],
) -> Result<Started, NodeError> {
    let specs = StageSpec::split(&settings.model, settings.stages)?;
    check_network_record(net, identity, network, genesis, settings).await?;
    // Listen before choosing: heartbeats and DHT providers tell which stages are served.
    let ckpt_dir = settings.data_dir.join(CHECKPOINT_DIR);
    let latest = compute::latest_checkpoint(&ckpt_dir);
    let saved = latest
        .as_deref()
        .and_then(|d| checkpoint::read_meta(d).ok());
    // A node restarting from its checkpoint already knows its stage: it rejoins at once.
    let settle = if saved.is_some() && settings.stage.is_none() {
        Duration::ZERO
    } else {
        Duration::from_millis(settings.settle_ms)
    };
    let settle_until = Instant::now() + settle;
    let mut pending = Vec::new();
    let mut peers = PeerTable::default();
    for (s, _) in specs.iter().enumerate() {
        if let Ok(providers) = net.get_providers(stage_key(&network, s)).await {
            for node in providers.into_iter().filter(|p| *p != net.node_id()) {
                peers.on_discovered(node, s, Instant::now());
            }
        }
    }
    while Instant::now() < settle_until {
        match tokio::time::timeout_at(settle_until.into(), net_events.recv()).await {
            Ok(Some(ev)) => {
                if let NetEvent::Gossip { author, data, .. } = &ev
                    && let Ok(hb) = open::<Heartbeat>(data, Some(author))
                    && hb.network == network
                    && hb.node == *author
                {
                    peers.on_heartbeat(hb.node, &hb, Instant::now());
                }
                pending.push(ev);
            }
            Ok(None) => return Err(NodeError::Config("network task stopped".into())),
            Err(_) => break,
        }
    }

    let resume = saved.filter(|m| m.model == settings.model);
    let resume_stage = resume
        .as_ref()
        .and_then(|m| specs.iter().position(|s| *s == m.stage));
    let need = settings.stage_memory()?;
    let stage_index = match settings.stage.or(resume_stage) {
        Some(s) if s < specs.len() => s,
        Some(s) => {
            return Err(NodeError::Config(format!(
                "stage {s} does not exist ({} stages)",
                specs.len()
            )));
        }
        None => choose_stage(
            &peers.replica_counts(specs.len()),
            &need,
            settings.memory_budget,
        )
        .ok_or_else(|| {
            NodeError::Config(format!(
                "no stage fits the memory budget of {} MiB (need {:?} MiB)",
                settings.memory_budget >> 20,
                need.iter().map(|n| n >> 20).collect::<Vec<_>>()
            ))
        })?,
    };
    let optim = settings.adamw();
    let dcfg = settings
        .diloco(identity.node_id())
        .map_err(|e| NodeError::Config(e.to_string()))?;
    let (mut stage, mut optimizer, mut steps_done, mut diloco) =
        resume_or_init(settings, &specs, stage_index, resume, latest, &optim, &dcfg)?;
    let records = if settings.sync.every > 0 {
        let values = net
            .get_record(theta_key(&network, stage_index))
            .await
            .unwrap_or_default();
        theta_records(net, &values, &network, stage_index, &identity.node_id())
    } else {
        Vec::new()
    };
    // A newcomer borrows the stage's θ₀ and a replica's AdamW moments before its first step.
    let mut joined = None;
    if steps_done == 0
        && let Some((peer, rec)) = records.first()
        && rec.round > diloco.round()
    {
        let started = Instant::now();
        match join_stage(net, *peer, rec, &dcfg, &optim, stage.params()).await {
            Ok((d, opt, params)) => {
                *stage.params_mut() = params;
                diloco = d;
                // The borrowed step count keeps the LR schedule and the run's length in step
                // with the stage.
                steps_done = opt.step_count();
                optimizer = opt;
                joined = Some((rec.round, started.elapsed()));
            }
            Err(e) => warn(format!(
                "joining from {peer}: {e}; starting from scratch and catching up at the next round"
            )),
        }
    }
    let hint = records.first().map(|(_, rec)| (rec.node, rec.clone()));
    let (sync_round, sync_theta) = (diloco.round(), diloco.hash());
    let spec = *stage.spec();
    let numel = stage.params().numel();
    let sync_on = settings.sync.every > 0;
    let engine = Engine::new(stage, optimizer, sync_on.then_some(diloco))
        .with_checkpoint_dir(ckpt_dir.clone(), genesis.root());
    Ok(Started {
        stage: stage_index,
        engine,
        steps_done,
        sync_round,
        sync_theta,
        numel,
        spec,
        peers,
        pending,
        hint,
        joined,
    })
}

fn warn(message: String) {
    emit(&NodeEvent::Warning {
        stage: None,
        message,
        time_ms: now_ms(),
    });
}

type Resumed = (Stage, AdamW, u64, Diloco);

fn resume_or_init(
    settings: &NodeSettings,
    specs: &[StageSpec],
    stage_index: usize,
    resume: Option<checkpoint::CheckpointMeta>,
    latest: Option<PathBuf>,
    optim: &AdamWConfig,
    dcfg: &DilocoConfig,
) -> Result<Resumed, NodeError> {
    if let Some(meta) = resume.filter(|m| m.stage == specs[stage_index])
        && let Some(dir) = latest.as_deref()
        && let Ok(ck) = checkpoint::load(dir)
    {
        let mut opt = ck
            .optimizer
            .unwrap_or_else(|| AdamW::new(optim.clone(), ck.stage.params()));
        // The schedule is this run's, not the one the checkpoint was written under (a node
        // restarted without `--steps` must not resume an old run's cosine).
        opt.config = optim.clone();
        let len = ck.stage.params().numel();
        let diloco = match compute::load_diloco(dir, &meta, dcfg.clone(), len) {
            Ok(d) => d,
            Err(e) => {
                warn(format!(
                    "DiLoCo state not usable ({e}); taking θ₀ from the weights and catching up with the stage"
                ));
                Diloco::new(dcfg.clone(), ck.stage.params()).map_err(NodeError::Config)?
            }
        };
        return Ok((ck.stage, opt, meta.step, diloco));
    }
    if let Some(d) = &latest {
        warn(format!(
            "checkpoint {} not usable for stage {stage_index}; starting fresh",
            d.display()
        ));
    }
    let stage = Stage::init(settings.model.clone(), specs[stage_index], settings.seed)?;
    let opt = AdamW::new(optim.clone(), stage.params());
    let diloco = Diloco::new(dcfg.clone(), stage.params()).map_err(NodeError::Config)?;
    Ok((stage, opt, 0, diloco))
}

/// Fetches the stage's outer state and the publisher's AdamW moments named by its record.
async fn join_stage(
    net: &Net,
    peer: NodeId,
    rec: &ThetaRecord,
    dcfg: &DilocoConfig,
    optim: &AdamWConfig,
    params: &ParamSet,
) -> Result<(Diloco, AdamW, ParamSet), String> {
    let max = outer_state_limit(params.numel());
    let outer = net
        .fetch_blob(peer, rec.theta, max)
        .await
        .map_err(|e| format!("outer state: {e}"))?;
    let diloco = Diloco::restore(dcfg.clone(), &outer, params.numel())?;
    if diloco.hash() != rec.theta {
        return Err("outer state does not match the announced hash".into());
    }
    let mut params = params.clone();
    params.set_flat(diloco.theta()).map_err(|e| e.to_string())?;
    let adamw = match net
        .fetch_blob(peer, rec.optimizer, params.numel() * 8 + 64)
        .await
    {
        Ok(bytes) => decode_adamw(&bytes, optim.clone(), &params)?,
        Err(e) => {
            warn(format!(
                "optimizer state from {peer}: {e}; starting AdamW from zero"
            ));
            AdamW::new(optim.clone(), &params)
        }
    };
    Ok((diloco, adamw, params))
}

/// Reads the stage's θ₀ records from the DHT: the latest round first. Each publisher becomes
/// known to the transport by its key, so its blobs can be fetched.
fn theta_records(
    net: &Net,
    values: &[Vec<u8>],
    network: &[u8; 32],
    stage: usize,
    me: &NodeId,
) -> Vec<(NodeId, ThetaRecord)> {
    let mut out: Vec<(NodeId, ThetaRecord)> = values
        .iter()
        .filter_map(|v| {
            let signed = Signed::<ThetaRecord>::from_bytes(v).ok()?;
            let rec = signed.verify().ok()?;
            let peer = net.learn_key(signed.signer().as_bytes())?;
            (rec.network == *network
                && usize::from(rec.stage) == stage
                && rec.node == signed.signer().node_id()
                && rec.node != *me
                && rec.expires_ms > now_ms())
            .then_some((peer, rec))
        })
        .collect();
    out.sort_by_key(|(_, r)| std::cmp::Reverse(r.round));
    out
}

/// Refuses to join a network that trains another model or dataset; the first node writes
/// the record.
async fn check_network_record(
    net: &Net,
    identity: &Identity,
    network: [u8; 32],
    genesis: &Genesis,
    settings: &NodeSettings,
) -> Result<(), NodeError> {
    let found = net
        .get_record(NETWORK_KEY.to_vec())
        .await
        .unwrap_or_default();
    for value in &found {
        if let Ok(rec) = open::<NetworkRecord>(value, None)
            && rec.network != network
        {
            return Err(NodeError::Config(format!(
                "the network trains another model or dataset ({}; dataset root {}): check the model flags, --stages and --data",
                rec.description,
                hex::encode(rec.genesis_root)
            )));
        }
    }
    if found.is_empty() {
        let rec = NetworkRecord {
            network,
            genesis_root: genesis.root(),
            stages: settings.stages as u16,
            description: format!(
                "{} layers, d_model {}, vocab {}, {} stages",
                settings.model.layers,
                settings.model.d_model,
                settings.model.vocab,
                settings.stages
            ),
        };
        let _ = net
            .put_record(
                NETWORK_KEY.to_vec(),
                Signed::sign(identity, &rec).to_bytes(),
            )
            .await;
    }
    Ok(())
}
