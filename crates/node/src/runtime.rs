//! The running node: the libp2p adapter, the engine thread and the pipeline state machine,
//! joined by one event loop. Everything here is I/O; decisions live in `pipeline`.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use neuroshard_data::{Genesis, Split};
use neuroshard_model::{AdamW, AdamWConfig, Batch, Stage, StageSpec, checkpoint};
use neuroshard_net::{Multiaddr, Net, NetConfig, NetEvent, PeerId};
use neuroshard_proof::{Canonical, Identity, Signed};
use serde_json::json;
use tokio::sync::mpsc;

use crate::NodeError;
use crate::compute::{self, Engine, EngineRequest};
use crate::peers::{HEARTBEAT_EVERY, choose_stage};
use crate::pipeline::{Action, JobDone, Pipeline, PipelineConfig};
use crate::records::{
    HEARTBEAT_TOPIC, Heartbeat, NETWORK_KEY, NetworkRecord, NodeRecord, Role, node_key, open,
    stage_key, validate_gossip, validate_record,
};
use crate::settings::{DataOrder, NodeSettings};
use crate::wire::{Ack, MicroBatchId, Msg};

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
    net_cfg.topics = vec![HEARTBEAT_TOPIC.to_string()];
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
    let (stage, optimizer, steps_done) = match resume.filter(|m| m.stage == specs[stage_index]) {
        Some(meta) if let Some(Ok(ck)) = latest.as_deref().map(checkpoint::load) => {
            let opt = ck
                .optimizer
                .unwrap_or_else(|| AdamW::new(optim.clone(), ck.stage.params()));
            (ck.stage, opt, meta.step)
        }
        _ => {
            if let Some(d) = &latest {
                emit(
                    json!({"event": "warning", "message": format!("checkpoint {} not usable for stage {stage_index}; starting fresh", d.display())}),
                );
            }
            let stage = Stage::init(settings.model.clone(), specs[stage_index], settings.seed)?;
            let opt = AdamW::new(optim, stage.params());
            (stage, opt, 0)
        }
    };
    let role = Role::of(stage_index, specs.len());
    let model_hash = hex::encode(stage.model_hash());
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<JobDone>();
    let engine = compute::spawn(Engine::new(stage, optimizer), settings.threads, done_tx)
        .map_err(|e| NodeError::io(&settings.data_dir, e))?;

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
    };
    let (send_tx, mut send_rx) = mpsc::unbounded_channel::<SendResult>();
    node.send_tx = send_tx;
    node.pipeline.peers = table;

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
        tokio::select! {
            ev = net_events.recv() => match ev {
                Some(ev) => node.on_net_event(ev, &mut queue),
                None => break,
            },
            Some(done) = done_rx.recv() => {
                queue.extend(node.pipeline.on_job_done(done, Instant::now()));
            }
            Some(r) = send_rx.recv() => {
                queue.extend(node.pipeline.on_send_result(r.to, r.mb, r.kind, r.result, Instant::now()));
            }
            _ = tick.tick() => queue.extend(node.pipeline.on_tick(Instant::now())),
            _ = beat.tick() => node.heartbeat(false),
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
    }
    node.shutdown().await
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

struct Node {
    pipeline: Pipeline,
    net: Net,
    engine: std::sync::mpsc::Sender<EngineRequest>,
    genesis: Genesis,
    settings: NodeSettings,
    identity: Identity,
    network: [u8; 32],
    stage: usize,
    send_tx: mpsc::UnboundedSender<SendResult>,
}

impl Node {
    fn on_net_event(&mut self, ev: NetEvent, queue: &mut VecDeque<Action>) {
        let now = Instant::now();
        match ev {
            NetEvent::Gossip { author, data, .. } => {
                // Already verified by the gossip validator; decode again for the contents.
                let Ok(hb) = open::<Heartbeat>(&data, Some(&author)) else {
                    return;
                };
                if hb.network != self.network {
                    return;
                }
                if hb.leaving {
                    queue.extend(self.pipeline.on_peer_down(author, "left the network", now));
                } else {
                    self.pipeline.peers.on_heartbeat(author, &hb, now);
                }
            }
            NetEvent::Request {
                peer,
                data,
                channel,
            } => {
                let ack = match Msg::from_canonical_bytes(&data) {
                    Ok(msg) => {
                        let (ack, actions) = self.pipeline.on_message(peer, msg, now);
                        queue.extend(actions);
                        ack
                    }
                    Err(e) => {
                        let reason = format!("undecodable message: {e}");
                        self.net.penalize(peer, &reason);
                        emit(
                            json!({"event": "dropped", "peer": peer.to_string(), "reason": reason}),
                        );
                        Ack::Rejected(reason)
                    }
                };
                self.net.respond(channel, ack.to_canonical_bytes());
            }
            NetEvent::PeerConnected(_) => {}
            NetEvent::PeerDisconnected(peer) => {
                if self.pipeline.peers.get(&peer).is_some() {
                    queue.extend(self.pipeline.on_peer_down(peer, "connection closed", now));
                }
            }
        }
    }

    fn apply(&mut self, queue: &mut VecDeque<Action>) {
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to, msg } => self.send(to, msg),
                Action::Compute(job) => {
                    if self.engine.send(EngineRequest::Run(job)).is_err() {
                        tracing::error!("the engine thread stopped");
                    }
                }
                Action::NeedBatch { step } => match self.load_batch(step) {
                    Ok(batch) => queue.extend(self.pipeline.on_batch(step, batch)),
                    Err(e) => emit(
                        json!({"event": "warning", "message": format!("loading batch {step}: {e}")}),
                    ),
                },
                Action::Penalize { peer, reason } => self.net.penalize(peer, &reason),
                Action::Event(ev) => {
                    let mut v = serde_json::to_value(&ev).unwrap_or_default();
                    if let Some(obj) = v.as_object_mut() {
                        obj.insert("time_ms".into(), json!(now_ms()));
                    }
                    emit(v);
                }
            }
        }
    }

    fn send(&self, to: PeerId, msg: Msg) {
        let net = self.net.clone();
        let tx = self.send_tx.clone();
        let (mb, kind) = (msg.mb(), msg.kind());
        let bytes = msg.to_canonical_bytes();
        tokio::spawn(async move {
            let result = match net.request(to, bytes).await {
                Ok(reply) => {
                    Ack::from_canonical_bytes(&reply).map_err(|e| format!("bad answer: {e}"))
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(SendResult {
                to,
                mb,
                kind,
                result,
            });
        });
    }

    fn load_batch(&self, step: u64) -> Result<Batch, NodeError> {
        let s = &self.settings;
        let b = match s.data_order {
            DataOrder::Assigned => {
                self.genesis
                    .train_batch(&self.identity.node_id().0, 0, step, s.batch, s.seq)?
            }
            DataOrder::Global => self
                .genesis
                .batch(Split::Train, s.seed, step, s.batch, s.seq)?,
        };
        Ok(Batch {
            batch: b.rows,
            seq: s.seq,
            inputs: b.inputs,
            targets: b.targets,
        })
    }

    fn heartbeat(&self, leaving: bool) {
        let hb = Heartbeat {
            node: self.identity.node_id(),
            network: self.network,
            stage: self.stage as u16,
            step: self.pipeline.steps_done(),
            queue: self.pipeline.queue_depth() as u32,
            time_ms: now_ms(),
            leaving,
        };
        if let Err(e) = self.net.publish(
            HEARTBEAT_TOPIC,
            Signed::sign(&self.identity, &hb).to_bytes(),
        ) {
            tracing::debug!("heartbeat not published: {e}");
        }
        let counters = self.net.counters();
        emit(json!({
            "event": "stats",
            "stage": self.stage,
            "step": self.pipeline.steps_done(),
            "queue": self.pipeline.queue_depth(),
            "peers": self.pipeline.peers.len(),
            "replicas": self.pipeline.peers.replica_counts(self.settings.stages),
            "net": counters,
            "time_ms": now_ms(),
        }));
    }

    fn checkpoint_extra(&self) -> serde_json::Value {
        json!({
            "node": self.identity.node_id().to_string(),
            "stage_index": self.stage,
            "dataset": { "root": hex::encode(self.genesis.root()) },
        })
    }

    /// Checkpoints in the engine between jobs; the result is reported as an event.
    fn speculative_checkpoint(&self) {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let started = Instant::now();
        let step = self.pipeline.steps_done();
        let request = EngineRequest::Save {
            dir: self.settings.data_dir.join(CHECKPOINT_DIR),
            step,
            extra: self.checkpoint_extra(),
            reply,
        };
        if self.engine.send(request).is_err() {
            return;
        }
        tokio::spawn(async move {
            let result = rx.await.unwrap_or_else(|_| Err("engine stopped".into()));
            emit(json!({
                "event": "checkpoint",
                "step": step,
                "ms": started.elapsed().as_secs_f64() * 1e3,
                "model_hash": result.as_ref().ok(),
                "error": result.as_ref().err(),
                "time_ms": now_ms(),
            }));
        });
    }

    async fn shutdown(self) -> Result<(), NodeError> {
        self.heartbeat(true);
        let (reply, rx) = tokio::sync::oneshot::channel();
        let dir = self.settings.data_dir.join(CHECKPOINT_DIR);
        let extra = self.checkpoint_extra();
        let saved = if self
            .engine
            .send(EngineRequest::Save {
                dir: dir.clone(),
                step: self.pipeline.steps_done(),
                extra,
                reply,
            })
            .is_ok()
        {
            rx.await.unwrap_or_else(|_| Err("engine stopped".into()))
        } else {
            Err("engine stopped".into())
        };
        // Give the deathrattle a moment on the wire before the connections close.
        tokio::time::sleep(Duration::from_millis(200)).await;
        emit(json!({
            "event": "stopped",
            "stage": self.stage,
            "step": self.pipeline.steps_done(),
            "checkpoint": dir.display().to_string(),
            "model_hash": saved.as_ref().ok(),
            "error": saved.as_ref().err(),
            "net": self.net.counters(),
            "time_ms": now_ms(),
        }));
        self.net.shutdown().await;
        saved.map(|_| ()).map_err(NodeError::Checkpoint)
    }
}
