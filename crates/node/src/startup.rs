//! Start-up of a node as a sans-IO state machine, in the style of [`crate::core::NodeCore`]:
//! it checks the network record, listens for a settle period, chooses the stage, decides
//! between resuming a checkpoint and a fresh start, and picks whom a joiner borrows its
//! stage's θ₀ and AdamW moments from.
//!
//! Inputs: [`Startup::handle_record`], [`Startup::handle_providers`],
//! [`Startup::handle_gossip`], [`Startup::handle_loaded`], [`Startup::handle_blob`],
//! [`Startup::handle_adopted`] and [`Startup::handle_timeout`]. Outputs:
//! [`Startup::poll_request`] (DHT look-ups and writes, loading the stage, blob fetches, adopting
//! fetched state), [`Startup::poll_event`], [`Startup::poll_timeout`] and finally
//! [`Startup::poll_outcome`]. It reads no clock and does no I/O; the runtime and the simulator
//! execute its requests and answer each one.

mod grown;
pub use grown::EXTRA_STAGE_IDS;
mod join;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_model::{ModelConfig, ModelError, StageSpec};
use neuroshard_proof::{Hash32, Identity, NodeId, PublicKey};

use crate::core::{TransferError, outer_state_limit};
use crate::events::{Clock, NodeEvent};
use crate::network::Network;
use crate::peers::{PeerTable, choose_stage};
use crate::records::{Heartbeat, NETWORK_KEY, network_key, open, stage_key};
use crate::sync::{ThetaRecord, theta_key};

/// Bounds on what peers can make a starting node hold: providers per stage, peers in the
/// table, θ₀ records read, publishers tried before starting from scratch.
const MAX_PROVIDERS: usize = 1024;
const MAX_PEERS: usize = 4096;
const MAX_RECORDS: usize = 4096;
const MAX_JOIN_TRIES: usize = 3;

/// What the node starts from.
pub struct StartupConfig {
    pub identity: Identity,
    pub network: Hash32,
    /// The network's signed genesis (its hash is `network`), republished when the DHT lacks it.
    pub genesis: Vec<u8>,
    pub model: ModelConfig,
    /// The model's stages (`StageSpec::split`).
    pub specs: Vec<StageSpec>,
    /// Serve this stage instead of choosing (`--stage`).
    pub stage: Option<usize>,
    /// Bytes a replica of each stage needs, and what this node may use.
    pub need: Vec<u64>,
    pub budget: u64,
    /// How long a node without a known stage listens before choosing.
    pub settle: Duration,
    /// DiLoCo is on: a newcomer borrows its stage's θ₀.
    pub sync: bool,
    /// The checkpoint found on disk, if any.
    pub saved: Option<Saved>,
    /// The network grows (its genesis has a growth policy): stages past `specs` may exist,
    /// and heartbeats say which.
    pub grows: bool,
    /// Bytes a replica needs besides 16 per parameter (stashed activations): what a stage the
    /// network grew needs.
    pub overhead: u64,
}

/// A checkpoint on disk.
#[derive(Debug, Clone)]
pub struct Saved {
    /// Where it lies (for messages).
    pub path: String,
    /// The model and stage its metadata names; `None` when the metadata is unreadable.
    pub holds: Option<(ModelConfig, StageSpec)>,
}

/// Where the stage's state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// The checkpoint on disk.
    Resume,
    /// A fresh initialisation from the seed.
    Fresh,
}

/// The loaded state as far as start-up cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// Optimizer steps already taken.
    pub steps: u64,
    /// The DiLoCo round of its θ₀.
    pub round: u64,
}

/// What the runtime must do for the machine; each one is answered by a `handle_*` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Answer with [`Startup::handle_record`] (empty when the look-up failed).
    GetRecord { key: Vec<u8> },
    /// Fire and forget.
    PutRecord { key: Vec<u8>, value: Vec<u8> },
    /// Answer with [`Startup::handle_providers`] (empty when the look-up failed).
    GetProviders { stage: usize, key: Vec<u8> },
    /// Make the signer of a θ₀ record reachable (fire and forget).
    LearnKey(PublicKey),
    /// Build the stage's state; answer with [`Startup::handle_loaded`].
    Load { stage: usize, init: Init },
    /// Answer with [`Startup::handle_blob`].
    FetchBlob {
        peer: NodeId,
        hash: Hash32,
        max: usize,
    },
    /// Take this outer state of `round` as θ and θ₀ (its re-encoding must hash to `hash`)
    /// and reset the optimizer; answer with [`Startup::handle_adopted`].
    AdoptOuter {
        bytes: Vec<u8>,
        hash: Hash32,
        round: u64,
    },
    /// Take this AdamW state and its step count; answer with [`Startup::handle_adopted`].
    AdoptOptimizer { bytes: Vec<u8> },
}

/// Which part of a joiner's borrowed state an answer is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Outer,
    Optimizer,
}

/// A peer with a θ₀ of our stage: the core catches up from it when it is newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint {
    pub node: NodeId,
    pub round: u64,
    pub theta: Hash32,
}

/// A completed join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    pub peer: NodeId,
    pub round: u64,
    /// From the first fetch to the last adoption.
    pub took: Duration,
}

/// What start-up decided.
#[derive(Debug)]
pub struct Decision {
    pub stage: usize,
    /// Where the state came from in the end (a checkpoint that failed to load is `Fresh`).
    pub init: Init,
    pub joined: Option<Joined>,
    pub hint: Option<Hint>,
    /// Peers heard of while starting (heartbeats, DHT providers).
    pub peers: PeerTable,
    /// The grown architecture the node chose its stage in (None: version 0).
    pub layout: Option<crate::layout::Layout>,
}

/// Why the node cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("stage {stage} does not exist ({stages} stages)")]
    NoSuchStage { stage: usize, stages: usize },
    #[error("no stage fits the memory budget of {budget_mib} MiB (need {need_mib:?} MiB)")]
    NoStageFits { budget_mib: u64, need_mib: Vec<u64> },
    #[error("initialising stage {stage}: {reason}")]
    Init { stage: usize, reason: String },
}

/// Why borrowing a part of the stage's state failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error("transfer: {0}")]
    Transfer(#[from] TransferError),
    #[error("{len} bytes where at most {max} were asked for")]
    TooLarge { len: usize, max: usize },
    #[error("the bytes do not match the announced hash")]
    HashMismatch,
    #[error("undecodable: {0}")]
    Decode(String),
    #[error("no stage state to adopt it into")]
    NotLoaded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the network record.
    Network,
    /// Providers asked; listening until the settle deadline.
    Listening,
    /// The runtime builds the stage's state.
    Loading(Init),
    /// Reading the stage's θ₀ records.
    Records,
    /// Borrowing `part` from candidate `index`.
    Joining {
        index: usize,
        part: Part,
    },
    Done,
}

/// The start-up state machine.
pub struct Startup {
    cfg: StartupConfig,
    me: NodeId,
    clock: Clock,
    phase: Phase,
    settle_until: Instant,
    /// Stages whose provider look-up is unanswered.
    providers_pending: BTreeSet<usize>,
    peers: PeerTable,
    stage: usize,
    /// The last load asked for (a resume that failed is followed by a fresh one).
    init: Init,
    local: Local,
    /// Valid θ₀ records of our stage, the latest round first.
    candidates: Vec<ThetaRecord>,
    join_started: Option<Instant>,
    joined: Option<Joined>,
    /// A growing network: the newest architecture each peer's heartbeat names.
    views: std::collections::BTreeMap<NodeId, crate::records::ArchView>,
    /// The grown architecture chosen when the stage was.
    layout: Option<crate::layout::Layout>,
    requests: VecDeque<Request>,
    events: VecDeque<NodeEvent>,
    outcome: Option<Result<Decision, StartError>>,
}

impl Startup {
    /// Starts at `now` (Unix time `unix_ms`) by reading the network record.
    pub fn new(cfg: StartupConfig, now: Instant, unix_ms: u64) -> Self {
        // A node whose checkpoint names its stage rejoins at once; one told its stage still
        // listens, to know its peers before the first step.
        let settle = if cfg.stage.is_none() && resume_stage(&cfg).is_some() {
            Duration::ZERO
        } else {
            // A day is plenty, and keeps `now + settle` from overflowing on a silly setting.
            cfg.settle.min(Duration::from_secs(86_400))
        };
        let mut s = Self {
            me: cfg.identity.node_id(),
            clock: Clock::new(now, unix_ms),
            phase: Phase::Network,
            settle_until: now + settle,
            providers_pending: BTreeSet::new(),
            peers: PeerTable::default(),
            stage: 0,
            init: Init::Fresh,
            local: Local { steps: 0, round: 0 },
            candidates: Vec::new(),
            join_started: None,
            joined: None,
            views: std::collections::BTreeMap::new(),
            layout: None,
            requests: VecDeque::new(),
            events: VecDeque::new(),
            outcome: None,
            cfg,
        };
        s.requests.push_back(Request::GetRecord {
            key: NETWORK_KEY.to_vec(),
        });
        s
    }

    pub fn poll_request(&mut self) -> Option<Request> {
        self.requests.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front()
    }

    /// The settle deadline while listening.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.phase == Phase::Listening).then_some(self.settle_until)
    }

    /// The decision or the reason the node cannot start, once.
    pub fn poll_outcome(&mut self) -> Option<Result<Decision, StartError>> {
        self.outcome.take()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.try_choose(now);
    }

    /// The values found under `key` (empty when the look-up failed).
    pub fn handle_record(&mut self, key: &[u8], values: Vec<Vec<u8>>, now: Instant) {
        match self.phase {
            Phase::Network if key == NETWORK_KEY => self.on_network_records(&values, now),
            Phase::Records if key == theta_key(&self.cfg.network, self.stage) => {
                self.on_theta_records(&values, now)
            }
            _ => {}
        }
    }

    /// The providers of `stage`'s DHT key (empty when the look-up failed).
    pub fn handle_providers(&mut self, stage: usize, providers: Vec<NodeId>, now: Instant) {
        if self.phase != Phase::Listening || !self.providers_pending.remove(&stage) {
            return;
        }
        for node in providers.into_iter().take(MAX_PROVIDERS) {
            if node != self.me && self.has_room(&node) {
                self.peers.on_discovered(node, stage, now);
            }
        }
        self.try_choose(now);
    }

    /// A gossip message from `author`: only signed heartbeats of our network about the author
    /// itself count; anything else is ignored.
    pub fn handle_gossip(&mut self, author: NodeId, data: &[u8], now: Instant) {
        let Ok(hb) = open::<Heartbeat>(data, Some(&author)) else {
            return;
        };
        self.handle_heartbeat(author, &hb, now);
    }

    /// A heartbeat whose signature the caller checked against `author`.
    pub fn handle_heartbeat(&mut self, author: NodeId, hb: &Heartbeat, now: Instant) {
        if self.phase == Phase::Done
            || hb.network != self.cfg.network
            || hb.node != author
            || author == self.me
            || usize::from(hb.stage) >= self.stage_ids()
            || !self.has_room(&author)
        {
            return;
        }
        if self.cfg.grows && hb.arch.version > 0 {
            self.views.insert(author, hb.arch.clone());
        }
        self.peers.on_heartbeat(author, hb, now);
    }

    /// The stage's state was built ([`Request::Load`]), or the checkpoint could not be read.
    pub fn handle_loaded(&mut self, result: Result<Local, ModelError>, now: Instant) {
        let Phase::Loading(init) = self.phase else {
            return;
        };
        match result {
            Ok(local) => {
                self.local = local;
                if self.cfg.sync {
                    self.phase = Phase::Records;
                    self.requests.push_back(Request::GetRecord {
                        key: theta_key(&self.cfg.network, self.stage),
                    });
                } else {
                    self.finish(now);
                }
            }
            Err(e) if init == Init::Resume => {
                let path = self.cfg.saved.as_ref().map_or("", |s| s.path.as_str());
                self.warn(
                    format!("checkpoint {path} not usable ({e}); starting fresh"),
                    now,
                );
                self.load(Init::Fresh);
            }
            Err(e) => self.fail(StartError::Init {
                stage: self.stage,
                reason: e.to_string(),
            }),
        }
    }

    fn has_room(&self, node: &NodeId) -> bool {
        self.peers.len() < MAX_PEERS || self.peers.get(node).is_some()
    }

    fn numel(&self) -> usize {
        self.stage_model(self.stage).map_or(0, |(model, s, _)| {
            s.param_specs(&model)
                .iter()
                .map(|p| p.numel())
                .fold(0usize, usize::saturating_add)
        })
    }

    fn outer_max(&self) -> usize {
        outer_state_limit(self.numel())
    }

    /// Two f32 moments per parameter plus the header.
    fn optimizer_max(&self) -> usize {
        self.numel().saturating_mul(8).saturating_add(64)
    }

    fn warn(&mut self, message: String, now: Instant) {
        self.events.push_back(NodeEvent::Warning {
            stage: (!matches!(self.phase, Phase::Network | Phase::Listening)).then_some(self.stage),
            message,
            time_ms: self.clock.unix_ms(now),
        });
    }

    fn fail(&mut self, error: StartError) {
        self.phase = Phase::Done;
        self.outcome = Some(Err(error));
    }

    /// Publishes our network's genesis when the DHT holds none of it. Another network's
    /// genesis never stops the node (anyone can write one, and the DHT keeps one value per key,
    /// so refusing would let a stranger veto every start); it is reported as a warning, since
    /// it may mean this node was given another network's genesis than its peers.
    fn on_network_records(&mut self, values: &[Vec<u8>], now: Instant) {
        let found: Vec<Network> = values
            .iter()
            .take(MAX_RECORDS)
            .filter_map(|v| Network::open(v).ok())
            .collect();
        if let Some(other) = found.iter().find(|n| n.id != self.cfg.network) {
            // The description is the record writer's text: printable and short.
            let description: String = other
                .genesis
                .description
                .chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect();
            self.warn(
                format!(
                    "the DHT also names another network ({description}; id {}); this node \
                     follows its own genesis, {}",
                    hex::encode(other.id),
                    hex::encode(self.cfg.network)
                ),
                now,
            );
        }
        if !found.iter().any(|n| n.id == self.cfg.network) {
            for key in [NETWORK_KEY.to_vec(), network_key(&self.cfg.network)] {
                self.requests.push_back(Request::PutRecord {
                    key,
                    value: self.cfg.genesis.clone(),
                });
            }
        }
        self.phase = Phase::Listening;
        self.providers_pending = (0..self.stage_ids()).collect();
        for stage in 0..self.stage_ids() {
            self.requests.push_back(Request::GetProviders {
                stage,
                key: stage_key(&self.cfg.network, stage),
            });
        }
        self.try_choose(now);
    }

    /// Once the settle period is over and every provider look-up answered: the stage, and
    /// whether the checkpoint serves it.
    fn try_choose(&mut self, now: Instant) {
        if self.phase != Phase::Listening
            || !self.providers_pending.is_empty()
            || now < self.settle_until
        {
            return;
        }
        self.choose_layout(now);
        let stages = self.stage_count();
        let need = self.need();
        let stage = match self.cfg.stage.or(self.resume_in_layout()) {
            Some(s) if s < stages && self.stage_model(s).is_some() => s,
            Some(stage) => return self.fail(StartError::NoSuchStage { stage, stages }),
            None => {
                let counts = self.peers.replica_counts(stages);
                match choose_stage(&counts, &need, self.cfg.budget) {
                    Some(s) => s,
                    None => {
                        return self.fail(StartError::NoStageFits {
                            budget_mib: self.cfg.budget >> 20,
                            need_mib: need.iter().map(|n| n >> 20).collect(),
                        });
                    }
                }
            }
        };
        self.stage = stage;
        let resumable = self
            .cfg
            .saved
            .as_ref()
            .and_then(|s| s.holds.as_ref())
            .is_some_and(|(m, spec)| {
                self.stage_model(stage)
                    .is_some_and(|(model, s, _)| *m == model && *spec == s)
            });
        let init = if resumable { Init::Resume } else { Init::Fresh };
        self.load(init);
        if let (Init::Fresh, Some(saved)) = (init, &self.cfg.saved) {
            let message = format!(
                "checkpoint {} not usable for stage {stage}; starting fresh",
                saved.path
            );
            self.warn(message, now);
        }
    }

    fn load(&mut self, init: Init) {
        self.init = init;
        self.phase = Phase::Loading(init);
        self.requests.push_back(Request::Load {
            stage: self.stage,
            init,
        });
    }

    fn finish(&mut self, now: Instant) {
        if let (Some(j), Some(t0)) = (self.joined.as_mut(), self.join_started) {
            j.took = now.saturating_duration_since(t0);
        }
        let hint = match self.joined {
            Some(j) => self.candidates.iter().find(|r| r.node == j.peer),
            None => self.candidates.first(),
        }
        .map(|r| Hint {
            node: r.node,
            round: r.round,
            theta: r.theta,
        });
        self.phase = Phase::Done;
        self.outcome = Some(Ok(Decision {
            stage: self.stage,
            init: self.init,
            joined: self.joined,
            hint,
            peers: std::mem::take(&mut self.peers),
            layout: self.layout.take(),
        }));
    }
}

/// The stage a usable checkpoint names.
fn resume_stage(cfg: &StartupConfig) -> Option<usize> {
    let (model, spec) = cfg.saved.as_ref()?.holds.as_ref()?;
    if *model != cfg.model {
        return None;
    }
    cfg.specs.iter().position(|s| s == spec)
}
