//! The running node: the libp2p adapter, the engine thread and the pipeline state machine,
//! joined by one event loop. Everything here is I/O; decisions live in `pipeline`.

mod node;
mod sync_io;

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use neuroshard_data::Genesis;
use neuroshard_model::{AdamW, AdamWConfig, ParamSet, Stage, StageSpec, checkpoint};
use neuroshard_net::{Multiaddr, Net, NetConfig, NetEvent, PeerId};
use neuroshard_proof::{Identity, Signed};
use serde_json::json;
use tokio::sync::mpsc;

use crate::NodeError;
use crate::compute::{self, Engine};
use crate::economy::Economy;
use crate::peers::{HEARTBEAT_EVERY, choose_stage};
use crate::pipeline::{Action, JobDone, Pipeline, PipelineConfig};
use crate::records::PROOF_TOPIC;
use crate::records::{
    HEARTBEAT_TOPIC, Heartbeat, NETWORK_KEY, NetworkRecord, NodeRecord, Role, node_key, open,
    stage_key, validate_gossip, validate_record,
};
use crate::replica::{Diloco, DilocoConfig, decode_adamw};
use crate::settings::NodeSettings;
use crate::sync::{SYNC_TOPIC, SyncConfig, Syncer, theta_key};
use crate::wire::{Ack, MicroBatchId};
use node::Node;
use sync_io::{SyncResult, SyncState, theta_records};

const CHECKPOINT_DIR: &str = "checkpoint";
const RECORD_TTL: Duration = Duration::from_secs(60);
const REPUBLISH_EVERY: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(50);

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes one JSON event line on stdout (the swarm launcher reads them).
pub fn emit(value: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

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

struct SendResult {
    to: PeerId,
    mb: MicroBatchId,
    kind: &'static str,
    result: Result<Ack, String>,
}

/// Runs a node until Ctrl-C or SIGTERM; then it announces its departure, checkpoints its
/// stage and exits.
pub async fn run(settings: NodeSettings) -> Result<(), NodeError> {
    std::fs::create_dir_all(&settings.data_dir)
        .map_err(|e| NodeError::io(&settings.data_dir, e))?;
    let identity = Identity::load_or_create(&settings.data_dir.join(neuroshard_proof::KEY_FILE))?;
    let genesis = Genesis::open(&settings.genesis)?;
    if genesis.vocab_size() != settings.model.vocab {
        return Err(NodeError::Config(format!(
            "model vocabulary {} differs from the dataset's {}",
            settings.model.vocab,
            genesis.vocab_size()
        )));
    }
    let network = network_id(&settings, &genesis.root());
    let specs = StageSpec::split(&settings.model, settings.stages)?;

    let mut net_cfg = NetConfig::local();
    net_cfg.listen = parse_addrs(&settings.listen)?;
    net_cfg.bootstrap = parse_addrs(&settings.bootstrap)?;
    net_cfg.max_frame = settings.max_frame;
    net_cfg.request_timeout = settings.grad_timeout();
    net_cfg.topics = vec![
        HEARTBEAT_TOPIC.to_string(),
        SYNC_TOPIC.to_string(),
        PROOF_TOPIC.to_string(),
    ];
    net_cfg.record_ttl = RECORD_TTL;
    net_cfg.republish_interval = REPUBLISH_EVERY;
    net_cfg.gossip_validator = Arc::new(validate_gossip);
    net_cfg.record_validator =
        Arc::new(|k: &[u8], v: &[u8], p: Option<&PeerId>| validate_record(k, v, p, now_ms()));
    let (net, mut net_events) = Net::start(identity.secret_bytes(), net_cfg).await?;
    let addrs = net.listen_addrs().await;

    check_network_record(&net, &identity, network, &genesis, &settings).await?;

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
    let mut pending_events = Vec::new();
    let mut table = crate::peers::PeerTable::default();
    for (s, _) in specs.iter().enumerate() {
        if let Ok(providers) = net.get_providers(stage_key(&network, s)).await {
            for p in providers.into_iter().filter(|p| *p != net.peer_id()) {
                table.on_discovered(p, s, Instant::now());
            }
        }
    }
    while Instant::now() < settle_until {
        match tokio::time::timeout_at(settle_until.into(), net_events.recv()).await {
            Ok(Some(ev)) => {
                if let NetEvent::Gossip { author, data, .. } = &ev
                    && let Ok(hb) = open::<Heartbeat>(data, Some(author))
                    && hb.network == network
                {
                    table.on_heartbeat(*author, &hb, Instant::now());
                }
                pending_events.push(ev);
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
            &table.replica_counts(specs.len()),
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
    let optim = AdamWConfig {
        lr: settings.lr,
        warmup_steps: settings.warmup.min(settings.steps.max(1)),
        total_steps: settings.steps.max(1),
        clip_norm: (settings.clip_norm > 0.0).then_some(settings.clip_norm),
        ..Default::default()
    };
    let dcfg = diloco_config(&settings, &identity)?;
    let mut joined = None;
    let (mut stage, mut optimizer, mut steps_done, mut diloco) = match resume
        .filter(|m| m.stage == specs[stage_index])
    {
        Some(meta)
            if let Some(dir) = latest.as_deref()
                && let Ok(ck) = checkpoint::load(dir) =>
        {
            let opt = ck
                .optimizer
                .unwrap_or_else(|| AdamW::new(optim.clone(), ck.stage.params()));
            let len = ck.stage.params().numel();
            let diloco = match compute::load_diloco(dir, &meta, dcfg.clone(), len) {
                Ok(d) => d,
                Err(e) => {
                    emit(
                        json!({"event": "warning", "message": format!("DiLoCo state not usable ({e}); taking θ₀ from the weights and catching up with the stage")}),
                    );
                    Diloco::new(dcfg.clone(), ck.stage.params()).map_err(NodeError::Config)?
                }
            };
            (ck.stage, opt, meta.step, diloco)
        }
        _ => {
            if let Some(d) = &latest {
                emit(
                    json!({"event": "warning", "message": format!("checkpoint {} not usable for stage {stage_index}; starting fresh", d.display())}),
                );
            }
            let stage = Stage::init(settings.model.clone(), specs[stage_index], settings.seed)?;
            let opt = AdamW::new(optim.clone(), stage.params());
            let diloco = Diloco::new(dcfg.clone(), stage.params()).map_err(NodeError::Config)?;
            (stage, opt, 0, diloco)
        }
    };
    let records = if settings.sync.every > 0 {
        let values = net
            .get_record(theta_key(&network, stage_index))
            .await
            .unwrap_or_default();
        theta_records(&values, &network, stage_index, &identity.node_id())
    } else {
        Vec::new()
    };
    // A newcomer borrows the stage's θ₀ and a replica's AdamW moments before its first step.
    if steps_done == 0
        && let Some((peer, rec)) = records.first()
        && rec.round > diloco.round()
    {
        let started = Instant::now();
        match join_stage(&net, *peer, rec, &dcfg, &optim, stage.params()).await {
            Ok((d, opt, params)) => {
                *stage.params_mut() = params;
                diloco = d;
                // The borrowed step count keeps the LR schedule and the run's length in step
                // with the stage.
                steps_done = opt.step_count();
                optimizer = opt;
                joined = Some((rec.round, started.elapsed()));
            }
            Err(e) => emit(
                json!({"event": "warning", "message": format!("joining from {peer}: {e}; starting from scratch and catching up at the next round")}),
            ),
        }
    }
    let role = Role::of(stage_index, specs.len());
    let model_hash = hex::encode(stage.model_hash());
    let (sync_round, sync_theta) = (diloco.round(), diloco.hash());
    let spec = *stage.spec();
    let numel = stage.params().numel();
    let sync_on = settings.sync.every > 0;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<JobDone>();
    let engine = compute::spawn(
        Engine::new(stage, optimizer, sync_on.then_some(diloco)),
        settings.threads,
        done_tx,
    )
    .map_err(|e| NodeError::io(&settings.data_dir, e))?;
    let mut economy = Economy::open(
        &settings.data_dir.join(neuroshard_ledger::LEDGER_FILE),
        identity.clone(),
    )
    .map_err(|e| NodeError::Config(format!("ledger: {e}")))?;
    economy.min_interval_ms = settings.sync.proof_interval_ms;

    let _ = net.start_providing(stage_key(&network, stage_index)).await;
    publish_record(&net, &identity, network, stage_index, &addrs).await;
    emit(json!({
        "event": "ready",
        "node": identity.node_id().to_string(),
        "peer": net.peer_id().to_string(),
        "stage": stage_index,
        "role": role.name(),
        "addrs": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "resumed_step": steps_done,
        "model_hash": model_hash,
        "sync_round": sync_round,
        "theta": hex::encode(sync_theta),
        "joined_round": joined.map(|(r, _)| r),
        "join_ms": joined.map(|(_, t)| t.as_secs_f64() * 1e3),
        "time_ms": now_ms(),
    }));

    let pcfg = PipelineConfig {
        stage: stage_index,
        stages: specs.len(),
        model: settings.model.clone(),
        micro_batches: settings.micro_batches.max(1),
        queue_capacity: settings.queue_capacity.max(1),
        candidates: 3,
        grad_timeout: settings.grad_timeout(),
        retry_after: Duration::from_millis(100),
        steps: settings.steps,
    };
    let syncer = Syncer::new(
        SyncConfig {
            every: settings.sync.every,
            timeout: Duration::from_millis(settings.sync.timeout_ms),
            retry_after: Duration::from_secs(1),
            network,
            stage: stage_index as u16,
        },
        identity.node_id(),
        sync_round,
        sync_theta,
        steps_done,
    );
    let rows = settings.batch.div_ceil(settings.micro_batches.max(1)) as u64;
    let tokens_per_mb = rows * settings.seq as u64;
    let mut node = Node {
        pipeline: Pipeline::new(pcfg, identity.node_id().0, steps_done),
        net: net.clone(),
        engine,
        genesis,
        settings: settings.clone(),
        identity,
        network,
        stage: stage_index,
        send_tx: mpsc::unbounded_channel().0,
        sync_tx: mpsc::unbounded_channel().0,
        sync: SyncState::new(syncer, spec, numel),
        economy,
    };
    let (send_tx, mut send_rx) = mpsc::unbounded_channel::<SendResult>();
    node.send_tx = send_tx;
    let (sync_tx, mut sync_rx) = mpsc::unbounded_channel::<SyncResult>();
    node.sync_tx = sync_tx;
    node.pipeline.peers = table;
    // A restarted replica behind its stage fetches the newer θ₀ at once.
    for (peer, rec) in records.iter().take(1) {
        node.sync.syncer.on_hint(*peer, rec.round, rec.theta);
    }

    let mut queue: VecDeque<Action> = VecDeque::new();
    for ev in pending_events {
        node.on_net_event(ev, &mut queue);
    }
    let mut started = false;
    node.apply(&mut queue);

    let mut tick = tokio::time::interval(TICK);
    let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
    let mut republish = tokio::time::interval(REPUBLISH_EVERY);
    let every = Duration::from_secs(settings.checkpoint_secs.max(1));
    let mut speculative = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        // Rounds move on a finished optimizer step, a sync result or sync gossip (handled
        // where it arrives), and deadlines on the tick; nothing else needs a poll.
        let mut rounds_due = false;
        tokio::select! {
            ev = net_events.recv() => match ev {
                Some(ev) => node.on_net_event(ev, &mut queue),
                None => break,
            },
            Some(done) = done_rx.recv() => {
                match &done {
                    JobDone::Backward { mb, loss, .. } => node.sync.count_backward(mb, tokens_per_mb, *loss),
                    JobDone::Step { .. } => rounds_due = true,
                    _ => {}
                }
                queue.extend(node.pipeline.on_job_done(done, Instant::now()));
            }
            Some(r) = sync_rx.recv() => {
                node.on_sync_result(r, Instant::now());
                rounds_due = true;
            }
            Some(r) = send_rx.recv() => {
                queue.extend(node.pipeline.on_send_result(r.to, r.mb, r.kind, r.result, Instant::now()));
            }
            _ = tick.tick() => {
                queue.extend(node.pipeline.on_tick(Instant::now()));
                node.poll_proof();
                rounds_due = true;
            }
            _ = beat.tick() => {
                node.heartbeat(false);
                node.ledger_anti_entropy();
            }
            _ = republish.tick() => publish_record(&node.net, &node.identity, network, stage_index, &addrs).await,
            _ = speculative.tick(), if settings.checkpoint_secs > 0 => node.speculative_checkpoint(),
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        if !started && node.pipeline.peers.len() >= settings.wait_peers {
            started = true;
            queue.extend(node.pipeline.start());
        }
        node.apply(&mut queue);
        if rounds_due {
            node.poll_sync(Instant::now());
        }
    }
    node.shutdown().await
}

fn diloco_config(settings: &NodeSettings, identity: &Identity) -> Result<DilocoConfig, NodeError> {
    let s = &settings.sync;
    let bad = |what: &str, e: String| NodeError::Config(format!("{what}: {e}"));
    let cfg = DilocoConfig {
        me: identity.node_id(),
        aggregator: s.aggregator.clone(),
        byzantine: s.byzantine,
        compression: s
            .compression
            .parse()
            .map_err(|e: neuroshard_train::SpecError| bad("--compression", e.to_string()))?,
        outer_lr: s.outer_lr,
        outer_momentum: s.outer_momentum,
        seed: settings.seed,
        attack: s
            .attack
            .parse()
            .map_err(|e: neuroshard_aggregate::AttackParseError| bad("--attack", e.to_string()))?,
    };
    // Refuse a bad aggregator spec at start rather than at the first round.
    neuroshard_aggregate::Aggregator::parse(&s.aggregator, s.byzantine)
        .map_err(|e| bad("--aggregator", e.to_string()))?;
    Ok(cfg)
}

/// Fetches the stage's outer state and the publisher's AdamW moments named by its record.
async fn join_stage(
    net: &Net,
    peer: PeerId,
    rec: &crate::sync::ThetaRecord,
    dcfg: &DilocoConfig,
    optim: &AdamWConfig,
    params: &ParamSet,
) -> Result<(Diloco, AdamW, ParamSet), String> {
    let max = sync_io::outer_state_limit(params.numel());
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
            emit(
                json!({"event": "warning", "message": format!("optimizer state from {peer}: {e}; starting AdamW from zero")}),
            );
            AdamW::new(optim.clone(), &params)
        }
    };
    Ok((diloco, adamw, params))
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Result<tokio::signal::unix::Signal, NodeError> {
    tokio::signal::unix::signal(kind).map_err(|e| NodeError::Config(format!("signal handler: {e}")))
}

fn parse_addrs(list: &[String]) -> Result<Vec<Multiaddr>, NodeError> {
    list.iter()
        .map(|a| {
            a.parse::<Multiaddr>()
                .map_err(|e| NodeError::Config(format!("address {a:?}: {e}")))
        })
        .collect()
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

async fn publish_record(
    net: &Net,
    identity: &Identity,
    network: [u8; 32],
    stage: usize,
    addrs: &[Multiaddr],
) {
    let rec = NodeRecord {
        node: identity.node_id(),
        network,
        stage: stage as u16,
        expires_ms: now_ms() + RECORD_TTL.as_millis() as u64,
        addrs: addrs.iter().map(|a| a.to_string()).collect(),
    };
    if let Err(e) = net
        .put_record(
            node_key(&identity.node_id()),
            Signed::sign(identity, &rec).to_bytes(),
        )
        .await
    {
        tracing::debug!("publishing the node record: {e}");
    }
}
