//! The simulator: many [`NodeCore`]s under one virtual clock, messages carried by a seeded
//! link model, engines run in place with a virtual cost per job. Nothing reads the wall
//! clock or an unseeded RNG, so one seed gives one event trace, bit for bit.

mod genesis;
mod inject;
mod joiner;
mod mover;
mod serve;
mod start;

pub use genesis::SPARE_STAKED;
use genesis::freeze_genesis;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neuroshard_node::NodeSettings;
use neuroshard_node::core::{
    BatchSource, EngineJob, Inbound, NodeCore, Token, TransferError, Transmit,
};
use neuroshard_node::economy::LedgerSnapshot;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::network::{FOUNDER_STAKE, Network};
use neuroshard_node::peers::PeerTable;
use neuroshard_node::records::Topic;
use neuroshard_proof::{Hash32, Identity, NodeId};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::engine::{EngineCosts, SimEngine};
use crate::link::{LinkModel, Partitions};

/// Unix time the virtual clock starts at (any fixed value: it only has to be the same).
pub const UNIX_START_MS: u64 = 1_800_000_000_000;

/// Why the simulator could not build a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FactoryError(pub String);

/// A node's engine and the data its driver reads.
pub type Built = (Box<dyn SimEngine>, Box<dyn BatchSource>);

/// Makes a node's engine and batch source; the simulator calls it at start and restart.
pub trait NodeFactory {
    /// A fresh engine for `stage`, and its data source.
    fn engine(&mut self, node: NodeId, stage: usize) -> Result<Built, FactoryError>;
    /// The data source of a restarted node (its engine comes from its checkpoint).
    fn data(&mut self, node: NodeId, stage: usize) -> Box<dyn BatchSource>;
    /// A fresh engine for `stage`, one the network grew: its blocks `spec` of `model` (the
    /// genesis model deep enough for them). For a replica that moves there.
    fn grown_engine(
        &mut self,
        node: NodeId,
        stage: usize,
        model: neuroshard_model::ModelConfig,
        spec: neuroshard_model::StageSpec,
    ) -> Result<Built, FactoryError>;
    /// Whether its engines keep evidence and replay jobs. Without, audits are off: every
    /// audit would end refused, and the committee's jurors would slash honest workers.
    fn audits(&self) -> bool {
        true
    }
}

/// Rewrites or drops what a node sends: how adversaries are written.
pub type Tamper = Box<dyn FnMut(Transmit) -> Option<Transmit>>;

/// Traffic counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
    /// Messages by kind: "heartbeat", "sync", "proof" (gossip of every stage), "request",
    /// "response", "blob"; penalties as "penalty: <reason>" with every word holding a digit
    /// (ids, rounds) written `#`, so reasons count by kind.
    pub by_kind: BTreeMap<String, u64>,
    /// Bytes by the same kinds (penalties carry none).
    pub bytes_by_kind: BTreeMap<String, u64>,
}

#[derive(Debug, Clone)]
enum Ev {
    Deliver {
        to: usize,
        epoch: u64,
        from: NodeId,
        inbound: Inbound,
    },
    EngineDone {
        node: usize,
        epoch: u64,
        token: Token,
        output: neuroshard_node::core::EngineOutput,
    },
    Timer {
        node: usize,
        epoch: u64,
    },
    Start {
        node: usize,
    },
    Crash {
        node: usize,
    },
}

struct SimNode {
    identity: Identity,
    stage: usize,
    core: Option<NodeCore>,
    engine: Option<Box<dyn SimEngine>>,
    engine_busy: bool,
    engine_queue: VecDeque<(Token, EngineJob)>,
    /// Bumped at every crash: events for an older incarnation are dropped.
    epoch: u64,
    timer: Option<Instant>,
    blobs: HashMap<Hash32, Arc<Vec<u8>>>,
    /// What survives a crash: the ledger writes and the last checkpoint's step.
    disk: LedgerSnapshot,
    saved_step: u64,
    pending_step: BTreeMap<Token, u64>,
    events: Vec<NodeEvent>,
    /// What the node reported about the streams it coordinates.
    served: Vec<neuroshard_node::serve::ServeEvent>,
    tamper: Option<Tamper>,
    /// A joiner's start-up, until its core runs.
    joining: Option<joiner::Joining>,
    /// What a joiner's start-up built and heard, for its first start.
    prepared: Option<(Built, PeerTable)>,
    /// Whose state a joiner's start-up took, at which round.
    joined: Option<neuroshard_node::startup::Joined>,
    /// The architecture versions a mover knew when it left its stage (its ledger settles
    /// them again once it runs).
    layouts: Option<neuroshard_node::layout::Layouts>,
}

/// A simulated network.
pub struct Sim {
    base: Instant,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Ev>,
    rng: ChaCha8Rng,
    link: LinkModel,
    costs: EngineCosts,
    pub partitions: Partitions,
    settings: NodeSettings,
    /// The network id; the genesis naming it is fixed when the first node starts.
    network: Hash32,
    genesis: Option<Network>,
    /// Nodes left out of the genesis stakes (Sybils that never paid in).
    unstaked: BTreeSet<usize>,
    /// Genesis stakes other than the founders' (`Sim::set_stake`).
    stake_of: BTreeMap<usize, u64>,
    /// Keys staked in the genesis for nodes added after it (joiners).
    spare_keys: VecDeque<Identity>,
    /// How many spare keys the genesis stakes (for joiners).
    spares: usize,
    /// The genesis's round lead instead of the protocol default (`Sim::set_round_lead`).
    round_lead: Option<u64>,
    nodes: Vec<SimNode>,
    index: HashMap<NodeId, usize>,
    factory: Box<dyn NodeFactory>,
    /// Inbound request token at the server → (client, client's token).
    requests: HashMap<(usize, Token), (usize, u64, Token)>,
    next_inbound: Token,
    traffic: Traffic,
    trace: blake3::Hasher,
    dht: BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Who hears each gossip topic: the running nodes that subscribe to it.
    subscribers: BTreeMap<Topic, BTreeSet<usize>>,
    /// Which events `events` keeps (all of them unless a scale run says otherwise).
    keep_event: fn(&NodeEvent) -> bool,
}

impl Sim {
    pub fn new(
        seed: u64,
        settings: NodeSettings,
        link: LinkModel,
        costs: EngineCosts,
        factory: Box<dyn NodeFactory>,
    ) -> Self {
        let mut settings = settings;
        if !factory.audits() {
            settings.audit.per_million = 0;
        }
        let base = Instant::now();
        let network = *blake3::hash(format!("neuroshard/sim/{seed}").as_bytes()).as_bytes();
        Self {
            base,
            now: base,
            seq: 0,
            queue: BinaryHeap::new(),
            pending: HashMap::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            link,
            costs,
            partitions: Partitions::default(),
            settings,
            network,
            genesis: None,
            unstaked: BTreeSet::new(),
            stake_of: BTreeMap::new(),
            spare_keys: VecDeque::new(),
            spares: SPARE_STAKED,
            round_lead: None,
            nodes: Vec::new(),
            index: HashMap::new(),
            factory,
            requests: HashMap::new(),
            next_inbound: 1,
            traffic: Traffic::default(),
            trace: blake3::Hasher::new(),
            dht: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            keep_event: |_| true,
        }
    }

    /// Keeps only the events `keep` accepts for [`Sim::events`]; every event still enters the
    /// trace hash. Scale runs keep few: a node logs one event per proof it applies, n² of
    /// them per round across the network.
    pub fn keep_events(&mut self, keep: fn(&NodeEvent) -> bool) {
        self.keep_event = keep;
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }

    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// BLAKE3 of everything that happened: deliveries and every node's events, in order.
    pub fn trace_hash(&self) -> Hash32 {
        *self.trace.finalize().as_bytes()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Adds a node serving `stage` that starts after `at` of virtual time. Its key comes
    /// from the simulator's seed. Nodes added before the first start, and the first
    /// [`SPARE_STAKED`] added after it, hold a stake in the network's genesis.
    pub fn add_node(&mut self, stage: usize, at: Duration) -> usize {
        let identity = match self.spare_keys.pop_front() {
            Some(id) => id,
            None => Identity::generate_with(&mut self.rng),
        };
        let i = self.nodes.len();
        self.index.insert(identity.node_id(), i);
        self.nodes.push(SimNode {
            identity,
            stage,
            core: None,
            engine: None,
            engine_busy: false,
            engine_queue: VecDeque::new(),
            epoch: 0,
            timer: None,
            blobs: HashMap::new(),
            disk: LedgerSnapshot::default(),
            saved_step: 0,
            pending_step: BTreeMap::new(),
            events: Vec::new(),
            served: Vec::new(),
            tamper: None,
            joining: None,
            prepared: None,
            joined: None,
            layouts: None,
        });
        self.push(self.base + at, Ev::Start { node: i });
        i
    }

    /// The network's genesis (fixed at the first start).
    pub fn network(&mut self) -> &Network {
        self.genesis.get_or_insert_with(|| {
            // Its own randomness: founding the network leaves the trace's stream untouched.
            let mut rng = ChaCha8Rng::from_seed(self.network);
            freeze_genesis(
                &self.settings,
                &self.network,
                &self.nodes,
                |i| {
                    (!self.unstaked.contains(&i))
                        .then(|| self.stake_of.get(&i).copied().unwrap_or(FOUNDER_STAKE))
                },
                &mut rng,
                &mut self.spare_keys,
                self.spares,
                self.round_lead,
            )
        })
    }

    pub fn node_id(&self, i: usize) -> NodeId {
        self.nodes[i].identity.node_id()
    }

    pub fn core(&self, i: usize) -> Option<&NodeCore> {
        self.nodes[i].core.as_ref()
    }

    pub fn engine(&self, i: usize) -> Option<&dyn SimEngine> {
        self.nodes[i].engine.as_deref()
    }

    pub fn events(&self, i: usize) -> &[NodeEvent] {
        &self.nodes[i].events
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].core.is_some()
    }

    /// Kills node `i` at `at` (no deathrattle, no checkpoint: what its disk holds survives).
    pub fn crash_at(&mut self, i: usize, at: Duration) {
        self.push(self.base + at, Ev::Crash { node: i });
    }

    /// Restarts node `i` at `at` from its last checkpoint and its ledger.
    pub fn restart_at(&mut self, i: usize, at: Duration) {
        self.push(self.base + at, Ev::Start { node: i });
    }

    /// Runs until virtual time `until` (since the start) or until nothing is left to do.
    pub fn run_until(&mut self, until: Duration) {
        let end = self.base + until;
        while let Some(Reverse((t, seq))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            if let Some(ev) = self.pending.remove(&seq) {
                self.step(ev);
            }
        }
        self.now = self.now.max(end);
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.pending.insert(self.seq, ev);
        self.queue.push(Reverse((at, self.seq)));
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Start { node } => self.start(node),
            Ev::Crash { node } => self.crash(node),
            Ev::Timer { node, epoch } => {
                let n = &mut self.nodes[node];
                if n.epoch != epoch || n.timer.is_none_or(|t| t > self.now) {
                    return;
                }
                n.timer = None;
                if let Some(core) = n.core.as_mut() {
                    core.handle_timeout(self.now);
                }
                self.after(node);
            }
            Ev::Deliver {
                to,
                epoch,
                from,
                inbound,
            } => {
                if self.nodes[to].epoch != epoch || self.nodes[to].core.is_none() {
                    // A request to a dead node fails at the caller like a timeout would.
                    if let Inbound::Request { token, .. } = inbound {
                        self.fail_request(to, token, "peer is down");
                    }
                    return;
                }
                self.record_delivery(to, &from, &inbound);
                if let Some(core) = self.nodes[to].core.as_mut() {
                    core.handle_message(from, inbound, self.now);
                }
                self.after(to);
            }
            Ev::EngineDone {
                node,
                epoch,
                token,
                output,
            } => {
                let n = &mut self.nodes[node];
                if n.epoch != epoch {
                    return;
                }
                n.engine_busy = false;
                if let Some(step) = n.pending_step.remove(&token)
                    && matches!(output, neuroshard_node::core::EngineOutput::Saved(Ok(_)))
                {
                    n.saved_step = step;
                }
                if let Some(core) = n.core.as_mut() {
                    core.handle_engine_done(token, output, self.now);
                }
                self.after(node);
            }
        }
    }

    fn crash(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let Some(core) = n.core.take() else {
            return;
        };
        // What the node's SQLite would hold: every write it made (they are persisted at once).
        n.disk = core.ledger_snapshot();
        for subs in self.subscribers.values_mut() {
            subs.remove(&i);
        }
        let n = &mut self.nodes[i];
        n.epoch += 1;
        n.engine_busy = false;
        n.engine_queue.clear();
        n.pending_step.clear();
        n.timer = None;
        n.blobs.clear();
        // Everyone connected notices the closed connection.
        let from = n.identity.node_id();
        for j in 0..self.nodes.len() {
            if j != i && self.nodes[j].core.is_some() && self.partitions.reachable(i, j) {
                let d = self.link.delay(0, &mut self.rng);
                let epoch = self.nodes[j].epoch;
                self.push(
                    self.now + d,
                    Ev::Deliver {
                        to: j,
                        epoch,
                        from,
                        inbound: Inbound::Disconnected,
                    },
                );
            }
        }
    }

    /// Drains node `i`'s outputs and re-arms its timer.
    fn after(&mut self, i: usize) {
        let Some(core) = self.nodes[i].core.as_mut() else {
            return;
        };
        let mut transmits = Vec::new();
        while let Some(t) = core.poll_transmit() {
            transmits.push(t);
        }
        let mut jobs = Vec::new();
        while let Some(j) = core.poll_engine_job() {
            jobs.push(j);
        }
        // The disk is the economy's state at a crash (`crash`): writes are persisted at once
        // here, so a second copy of each would only double the memory.
        while core.poll_ledger_write().is_some() {}
        let mut events = Vec::new();
        while let Some(ev) = core.poll_event() {
            events.push(ev);
        }
        let served: Vec<_> = std::iter::from_fn(|| core.poll_serve()).collect();
        let timeout = core.poll_timeout();
        self.nodes[i].served.extend(served);
        for ev in events {
            self.trace.update(&(i as u64).to_le_bytes());
            self.trace.update(ev.to_json_line().as_bytes());
            if (self.keep_event)(&ev) {
                self.nodes[i].events.push(ev);
            }
        }
        for t in transmits {
            let t = match self.nodes[i].tamper.as_mut() {
                Some(f) => f(t),
                None => Some(t),
            };
            if let Some(t) = t {
                self.transmit(i, t);
            }
        }
        for (token, job) in jobs {
            if let EngineJob::Checkpoint { step, .. } = &job {
                self.nodes[i].pending_step.insert(token, *step);
            }
            self.nodes[i].engine_queue.push_back((token, job));
        }
        self.run_engine(i);
        if let Some(to) = self.nodes[i]
            .core
            .as_ref()
            .and_then(NodeCore::ready_to_move)
        {
            return self.move_node(i, to);
        }
        if let Some(t) = timeout {
            let n = &mut self.nodes[i];
            // One timer event per earlier deadline; later ones are re-armed when it fires.
            if n.timer.is_none_or(|old| t < old || old < self.now) {
                n.timer = Some(t);
                let epoch = n.epoch;
                self.push(t.max(self.now), Ev::Timer { node: i, epoch });
            }
        }
    }

    /// Starts the next engine job if the engine is idle; its result arrives after its cost.
    fn run_engine(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        if n.engine_busy {
            return;
        }
        let Some((token, job)) = n.engine_queue.pop_front() else {
            return;
        };
        let Some(engine) = n.engine.as_mut() else {
            return;
        };
        let cost = self.costs.of(&job);
        let output = engine.execute(job);
        n.engine_busy = true;
        let epoch = n.epoch;
        self.push(
            self.now + cost,
            Ev::EngineDone {
                node: i,
                epoch,
                token,
                output,
            },
        );
    }

    fn record_delivery(&mut self, to: usize, from: &NodeId, inbound: &Inbound) {
        self.trace.update(&(to as u64).to_le_bytes());
        self.trace.update(&from.0);
        let (kind, bytes): (&str, &[u8]) = match inbound {
            Inbound::Gossip { topic, data } => {
                (Topic::parse(topic).map_or("gossip", |t| t.kind()), data)
            }
            Inbound::Request { data, .. } => ("request", data),
            Inbound::Response { result, .. } => ("response", result.as_deref().unwrap_or(&[])),
            Inbound::Blob { result, .. } => ("blob", result.as_deref().unwrap_or(&[])),
            Inbound::Connected => ("connected", &[]),
            Inbound::Disconnected => ("disconnected", &[]),
        };
        self.trace.update(kind.as_bytes());
        self.trace.update(blake3::hash(bytes).as_bytes());
        self.traffic.messages += 1;
        self.traffic.bytes += bytes.len() as u64;
        *self.traffic.by_kind.entry(kind.to_string()).or_default() += 1;
        *self
            .traffic
            .bytes_by_kind
            .entry(kind.to_string())
            .or_default() += bytes.len() as u64;
    }

    fn deliver(&mut self, from: usize, to: usize, bytes: usize, inbound: Inbound) {
        if !self.partitions.reachable(from, to) {
            if let Inbound::Request { token, .. } = inbound {
                self.fail_request(to, token, "unreachable");
            }
            return;
        }
        let d = self.link.delay(bytes, &mut self.rng);
        let epoch = self.nodes[to].epoch;
        let from = self.nodes[from].identity.node_id();
        self.push(
            self.now + d,
            Ev::Deliver {
                to,
                epoch,
                from,
                inbound,
            },
        );
    }

    /// The request with inbound token `token` at `server` never gets an answer: its client
    /// sees the transport's timeout.
    fn fail_request(&mut self, server: usize, token: Token, why: &str) {
        if let Some((client, epoch, ctoken)) = self.requests.remove(&(server, token)) {
            let from = self.nodes[server].identity.node_id();
            let timeout = self.settings.grad_timeout();
            self.push(
                self.now + timeout,
                Ev::Deliver {
                    to: client,
                    epoch,
                    from,
                    inbound: Inbound::Response {
                        token: ctoken,
                        result: Err(TransferError(format!("request failed: {why}"))),
                    },
                },
            );
        }
    }

    fn transmit(&mut self, i: usize, t: Transmit) {
        match t {
            Transmit::Subscribe { topics } => {
                for subs in self.subscribers.values_mut() {
                    subs.remove(&i);
                }
                for topic in topics {
                    self.subscribers.entry(topic).or_default().insert(i);
                }
            }
            Transmit::Publish { topic, data } => {
                let to: Vec<usize> = self
                    .subscribers
                    .get(&topic)
                    .map(|s| s.iter().copied().filter(|j| *j != i).collect())
                    .unwrap_or_default();
                let name = topic.name();
                for j in to {
                    let inbound = Inbound::Gossip {
                        topic: name.clone(),
                        data: data.clone(),
                    };
                    self.deliver(i, j, data.len(), inbound);
                }
            }
            Transmit::Request { to, token, data } => {
                let Some(&j) = self.index.get(&to) else {
                    return;
                };
                let inbound = self.next_inbound;
                self.next_inbound += 1;
                let epoch = self.nodes[i].epoch;
                self.requests.insert((j, inbound), (i, epoch, token));
                let len = data.len();
                self.deliver(
                    i,
                    j,
                    len,
                    Inbound::Request {
                        token: inbound,
                        data,
                    },
                );
            }
            Transmit::Respond { token, data } => {
                if let Some((client, epoch, ctoken)) = self.requests.remove(&(i, token))
                    && self.nodes[client].epoch == epoch
                {
                    let len = data.len();
                    let inbound = Inbound::Response {
                        token: ctoken,
                        result: Ok(data),
                    };
                    self.deliver(i, client, len, inbound);
                }
            }
            Transmit::FetchBlob {
                from,
                token,
                hash,
                max,
            } => {
                let Some(&j) = self.index.get(&from) else {
                    return;
                };
                let found = self.nodes[j].blobs.get(&hash).cloned();
                let result = match found {
                    _ if self.nodes[j].core.is_none() => Err(TransferError("peer is down".into())),
                    Some(b) if b.len() <= max => Ok(b.to_vec()),
                    Some(b) => Err(TransferError(format!(
                        "blob of {} bytes over {max}",
                        b.len()
                    ))),
                    None => Err(TransferError("blob not offered".into())),
                };
                let len = result.as_ref().map_or(0, |b| b.len());
                // The bytes travel from the holder to the fetcher.
                if self.partitions.reachable(i, j) {
                    self.deliver(j, i, len, Inbound::Blob { token, result });
                } else {
                    let epoch = self.nodes[i].epoch;
                    self.push(
                        self.now + self.settings.grad_timeout(),
                        Ev::Deliver {
                            to: i,
                            epoch,
                            from,
                            inbound: Inbound::Blob {
                                token,
                                result: Err(TransferError("unreachable".into())),
                            },
                        },
                    );
                }
            }
            Transmit::OfferBlob { hash, data } => {
                self.nodes[i].blobs.insert(hash, data);
            }
            Transmit::WithdrawBlob { hash } => {
                self.nodes[i].blobs.remove(&hash);
            }
            Transmit::PutRecord { key, value } => {
                let author = self.nodes[i].identity.node_id().0.to_vec();
                self.dht.entry(key).or_default().insert(author, value);
            }
            Transmit::Penalize { reason, .. } => {
                *self
                    .traffic
                    .by_kind
                    .entry(format!("penalty: {}", penalty_kind(&reason)))
                    .or_default() += 1;
            }
        }
    }
}

/// A penalty's reason without its ids and numbers.
fn penalty_kind(reason: &str) -> String {
    reason
        .split(' ')
        .map(|w| {
            if w.chars().any(|c| c.is_ascii_digit()) {
                "#"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
