//! What a node's read API serves: a sans-IO fold of its [`NodeEvent`]s and of small snapshots
//! of its core (peers, ledger accounts), kept in bounded histories, and Prometheus metrics
//! ([`metrics`]) updated from the same events.
//!
//! Memory is bounded whatever peers send: the loss curve is down-sampled to at most
//! [`MAX_LOSS_POINTS`], rounds and proofs are rings, and the node list is capped. The runtime
//! feeds a shared [`Telemetry`]; readers copy a view out under a lock held for the copy only,
//! so a client polling the API cannot hold up the node's loop.

pub mod metrics;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::events::{LedgerSummary, NodeEvent};
use crate::records::Role;

pub use metrics::NodeMetrics;

/// Most points of a loss curve; past it the curve keeps every other point and samples half as
/// often from then on.
pub const MAX_LOSS_POINTS: usize = 2_000;
/// Most DiLoCo rounds kept (oldest dropped).
pub const MAX_ROUNDS: usize = 500;
/// Most proofs kept (oldest dropped).
pub const MAX_PROOFS: usize = 200;
/// Most other nodes listed; past it the longest unheard are forgotten first.
pub const MAX_NODES: usize = 1_024;
/// Most accounts listed, by balance.
pub const MAX_ACCOUNTS: usize = 100;
/// A cross-entropy above this is no measurement (ln of any vocabulary is far below it).
pub const MAX_LOSS: f64 = 1e4;

/// Whether `loss` is a believable measurement: finite, non-negative and bounded.
pub fn valid_loss(loss: f64) -> bool {
    (0.0..=MAX_LOSS).contains(&loss)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossPoint {
    pub step: u64,
    pub loss: f64,
    pub time_ms: u64,
}

/// A loss curve of bounded length: every point until full, then every 2nd, 4th, … point, so
/// it covers the whole run at falling resolution. The latest point is always served.
#[derive(Debug, Clone)]
pub struct LossSeries {
    points: Vec<LossPoint>,
    latest: Option<LossPoint>,
    stride: u64,
    seen: u64,
    cap: usize,
}

impl LossSeries {
    pub fn new(cap: usize) -> Self {
        Self {
            points: Vec::new(),
            latest: None,
            stride: 1,
            seen: 0,
            cap: cap.max(2),
        }
    }

    /// Adds a point; refuses (returns false) a loss that is not [`valid_loss`].
    pub fn push(&mut self, point: LossPoint) -> bool {
        if !valid_loss(point.loss) {
            return false;
        }
        self.latest = Some(point);
        let index = self.seen;
        self.seen = self.seen.saturating_add(1);
        if !index.is_multiple_of(self.stride) {
            return true;
        }
        if self.points.len() >= self.cap {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride = self.stride.saturating_mul(2);
            if !index.is_multiple_of(self.stride) {
                return true;
            }
        }
        self.points.push(point);
        true
    }

    /// The kept points, oldest first, ending with the latest.
    pub fn points(&self) -> Vec<LossPoint> {
        let mut out = self.points.clone();
        if let Some(l) = self.latest
            && out.last() != Some(&l)
        {
            out.push(l);
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundPoint {
    pub stage: usize,
    pub round: u64,
    /// The architecture version of a growing network the round trained: on a driver the
    /// version its steps ran under (a round never mixes two), elsewhere the newest version
    /// its finalized state held. None for a network of one fixed model.
    pub version: Option<u32>,
    pub contributors: usize,
    pub expected: usize,
    pub wall_ms: f64,
    pub sent_bytes: u64,
    pub dense_bytes: u64,
    pub time_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProofPoint {
    pub node: String,
    pub kind: String,
    pub reward: u64,
    pub time_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountView {
    pub node: String,
    pub balance: u64,
    pub stake: u64,
}

/// A peer as the core's peer table holds it (all live).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenPeer {
    pub node: [u8; 32],
    pub stage: usize,
    pub last_seen_ms: u64,
}

/// What the runtime copies out of the core for the API (events do not carry it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreSnapshot {
    pub stages: usize,
    pub step: u64,
    pub sync_round: u64,
    pub ledger: LedgerSummary,
    /// The live peer table.
    pub peers: Vec<SeenPeer>,
    /// Nodes the ledger registers, with their stage: stages beyond this node's neighbours
    /// send it no heartbeats, so this is how it knows them.
    pub registered: Vec<([u8; 32], usize)>,
    /// The richest accounts, at most [`MAX_ACCOUNTS`].
    pub accounts: Vec<AccountView>,
    /// The model the network trains (a growing network's, from the finalized state).
    pub model: ModelView,
}

/// The model the network trains: its shape and, for a network that grows, the version and
/// stage layout the finalized ledger state holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelView {
    /// None for a network of one fixed model.
    pub version: Option<u32>,
    pub layers: u64,
    pub d_model: u64,
    pub params: u64,
    /// (stage id, blocks) in pipeline order, for a network that grows.
    pub stages: Vec<(u16, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    pub node: String,
    pub stage: usize,
    pub role: &'static str,
    /// Heard from (heartbeat) within its liveness window.
    pub alive: bool,
    /// Unix ms of its last heartbeat here; 0 when never heard (known from the ledger only).
    pub last_seen_ms: u64,
    #[serde(rename = "self")]
    pub is_self: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusView {
    pub node: String,
    pub network: String,
    pub stage: usize,
    pub role: String,
    pub stages: usize,
    pub step: u64,
    pub sync_round: u64,
    pub time_ms: u64,
    pub ledger: LedgerSummary,
    pub nodes: Vec<NodeView>,
    pub model: ModelView,
}

#[derive(Debug, Clone, Copy)]
struct NodeEntry {
    stage: usize,
    alive: bool,
    last_seen_ms: u64,
}

#[derive(Debug, Clone)]
struct Me {
    node: String,
    network: String,
    stage: usize,
    role: String,
}

/// The fold itself: plain data, no clock, no lock.
#[derive(Debug, Clone)]
pub struct TelemetryFold {
    me: Option<Me>,
    stages: usize,
    step: u64,
    sync_round: u64,
    ledger: LedgerSummary,
    model: ModelView,
    /// The version a driver's steps run under, once it moved to one.
    driving: Option<u32>,
    train: LossSeries,
    validation: LossSeries,
    rounds: VecDeque<RoundPoint>,
    proofs: VecDeque<ProofPoint>,
    nodes: BTreeMap<[u8; 32], NodeEntry>,
    accounts: Vec<AccountView>,
}

impl Default for TelemetryFold {
    fn default() -> Self {
        Self::new()
    }
}

/// What a `NodeEvent::Ledger` with a kind applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerKind {
    Proof,
    /// An audit verdict (`verdict: …`).
    Verdict,
    /// A validator fee (`audit fee`).
    AuditFee,
}

impl LedgerKind {
    pub(crate) fn of(kind: &str) -> Self {
        if kind.starts_with("verdict") {
            Self::Verdict
        } else if kind == "audit fee" {
            Self::AuditFee
        } else {
            Self::Proof
        }
    }
}

fn parse_node(hex_id: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_id, &mut out).ok()?;
    Some(out)
}

impl TelemetryFold {
    pub fn new() -> Self {
        Self {
            me: None,
            stages: 0,
            step: 0,
            sync_round: 0,
            ledger: LedgerSummary::default(),
            model: ModelView::default(),
            driving: None,
            train: LossSeries::new(MAX_LOSS_POINTS),
            validation: LossSeries::new(MAX_LOSS_POINTS),
            rounds: VecDeque::new(),
            proofs: VecDeque::new(),
            nodes: BTreeMap::new(),
            accounts: Vec::new(),
        }
    }

    /// The version a round of this node trained (see [`RoundPoint::version`]): a driver
    /// trains version 0 until it moves.
    fn round_version(&self) -> Option<u32> {
        let driver = self.me.as_ref().is_some_and(|m| m.role == "driver");
        match (self.model.version, driver) {
            (None, _) => None,
            (Some(_), true) => Some(self.driving.unwrap_or(0)),
            (newest, false) => newest,
        }
    }

    /// Folds one event of this node.
    pub fn on_event(&mut self, ev: &NodeEvent) {
        match ev {
            NodeEvent::Driving { version, .. } => self.driving = Some(*version),
            NodeEvent::Ready {
                node,
                network,
                stage,
                role,
                resumed_step,
                sync_round,
                ..
            } => {
                self.me = Some(Me {
                    node: node.clone(),
                    network: network.clone(),
                    stage: *stage,
                    role: role.clone(),
                });
                self.step = *resumed_step;
                self.sync_round = *sync_round;
            }
            NodeEvent::Step {
                step,
                loss,
                time_ms,
                ..
            } => {
                self.step = self.step.max(*step);
                if let Some(l) = loss {
                    self.on_train_loss(*step, f64::from(*l), *time_ms);
                }
            }
            NodeEvent::Validation {
                step,
                loss,
                time_ms,
                ..
            } => {
                self.on_validation_loss(*step, *loss, *time_ms);
            }
            NodeEvent::Stats {
                step,
                sync_round,
                ledger,
                ..
            } => {
                self.step = self.step.max(*step);
                self.sync_round = *sync_round;
                self.ledger = ledger.clone();
            }
            NodeEvent::Sync {
                stage,
                round,
                contributors,
                expected,
                wall_ms,
                sent_bytes,
                dense_bytes,
                time_ms,
                ..
            } => {
                self.sync_round = self.sync_round.max(round.saturating_add(1));
                let version = self.round_version();
                if wall_ms.is_finite() {
                    push_bounded(
                        &mut self.rounds,
                        MAX_ROUNDS,
                        RoundPoint {
                            stage: *stage,
                            round: *round,
                            version,
                            contributors: *contributors,
                            expected: *expected,
                            wall_ms: *wall_ms,
                            sent_bytes: *sent_bytes,
                            dense_bytes: *dense_bytes,
                            time_ms: *time_ms,
                        },
                    );
                }
            }
            NodeEvent::Proof {
                balance,
                reward,
                time_ms,
                ..
            } => {
                self.ledger.balance = *balance;
                if let (Some(me), Some(reward)) = (&self.me, reward) {
                    let node = me.node.clone();
                    // A node makes training proofs only (`Economy::poll_proof`).
                    self.on_proof(node, "training".into(), *reward, *time_ms);
                }
            }
            NodeEvent::Ledger {
                applied,
                reward,
                kind: Some(kind),
                state_hash,
                time_ms,
            } => {
                self.ledger.state_hash = state_hash.clone();
                // Applied proofs name their prover; batches of parked ones name none (and
                // verdicts and fees name a job or claim, not a prover).
                if LedgerKind::of(kind) == LedgerKind::Proof && parse_node(applied).is_some() {
                    self.on_proof(applied.clone(), kind.clone(), *reward, *time_ms);
                }
            }
            NodeEvent::Ledger { state_hash, .. } | NodeEvent::LedgerSync { state_hash, .. } => {
                self.ledger.state_hash = state_hash.clone();
            }
            _ => {}
        }
    }

    /// A training loss measured at `step` (this node's, or a peer's it was told): refused
    /// unless [`valid_loss`]. Returns whether it was kept.
    pub fn on_train_loss(&mut self, step: u64, loss: f64, time_ms: u64) -> bool {
        self.train.push(LossPoint {
            step,
            loss,
            time_ms,
        })
    }

    /// A validation loss (held-out data), same checks.
    pub fn on_validation_loss(&mut self, step: u64, loss: f64, time_ms: u64) -> bool {
        self.validation.push(LossPoint {
            step,
            loss,
            time_ms,
        })
    }

    fn on_proof(&mut self, node: String, kind: String, reward: u64, time_ms: u64) {
        push_bounded(
            &mut self.proofs,
            MAX_PROOFS,
            ProofPoint {
                node,
                kind,
                reward,
                time_ms,
            },
        );
    }

    /// Takes a fresh snapshot of the core: peers heard now are alive, the others known before
    /// are not, nodes the ledger registers are listed even when never heard.
    pub fn on_snapshot(&mut self, snap: CoreSnapshot) {
        self.stages = snap.stages;
        self.step = self.step.max(snap.step);
        self.sync_round = snap.sync_round;
        self.ledger = snap.ledger;
        self.model = snap.model;
        for e in self.nodes.values_mut() {
            e.alive = false;
        }
        for p in snap.peers {
            let e = self.nodes.entry(p.node).or_insert(NodeEntry {
                stage: p.stage,
                alive: true,
                last_seen_ms: p.last_seen_ms,
            });
            e.stage = p.stage;
            e.alive = true;
            e.last_seen_ms = e.last_seen_ms.max(p.last_seen_ms);
        }
        for (node, stage) in snap.registered {
            self.nodes.entry(node).or_insert(NodeEntry {
                stage,
                alive: false,
                last_seen_ms: 0,
            });
        }
        if let Some(me) = self.me.as_ref().and_then(|m| parse_node(&m.node)) {
            self.nodes.remove(&me);
        }
        if self.nodes.len() > MAX_NODES {
            // Forget the dead before the living, the longest unheard first.
            let mut order: Vec<(bool, u64, [u8; 32])> = self
                .nodes
                .iter()
                .map(|(id, e)| (e.alive, e.last_seen_ms, *id))
                .collect();
            order.sort_unstable();
            let excess = self.nodes.len() - MAX_NODES;
            for (_, _, id) in order.into_iter().take(excess) {
                self.nodes.remove(&id);
            }
        }
        let mut accounts = snap.accounts;
        accounts.sort_by(|a, b| b.balance.cmp(&a.balance).then(a.node.cmp(&b.node)));
        accounts.truncate(MAX_ACCOUNTS);
        self.accounts = accounts;
    }

    /// `/api/status` at `now_ms`; none before the node is ready.
    pub fn status(&self, now_ms: u64) -> Option<StatusView> {
        let me = self.me.as_ref()?;
        let stages = self.stages.max(me.stage.saturating_add(1));
        let mut nodes = Vec::with_capacity(self.nodes.len() + 1);
        nodes.push(NodeView {
            node: me.node.clone(),
            stage: me.stage,
            role: Role::of(me.stage, stages).name(),
            alive: true,
            last_seen_ms: now_ms,
            is_self: true,
        });
        nodes.extend(self.nodes.iter().map(|(id, e)| NodeView {
            node: hex::encode(id),
            stage: e.stage,
            role: Role::of(e.stage, stages.max(e.stage.saturating_add(1))).name(),
            alive: e.alive,
            last_seen_ms: e.last_seen_ms,
            is_self: false,
        }));
        Some(StatusView {
            node: me.node.clone(),
            network: me.network.clone(),
            stage: me.stage,
            role: me.role.clone(),
            stages,
            step: self.step,
            sync_round: self.sync_round,
            time_ms: now_ms,
            ledger: self.ledger.clone(),
            nodes,
            model: self.model.clone(),
        })
    }

    pub fn train_loss(&self) -> Vec<LossPoint> {
        self.train.points()
    }

    pub fn validation_loss(&self) -> Vec<LossPoint> {
        self.validation.points()
    }

    /// Rounds, oldest first.
    pub fn rounds(&self) -> Vec<RoundPoint> {
        self.rounds.iter().cloned().collect()
    }

    /// The newest `n` proofs, newest first.
    pub fn proofs(&self, n: usize) -> Vec<ProofPoint> {
        self.proofs.iter().rev().take(n).cloned().collect()
    }

    /// Accounts by balance, richest first.
    pub fn accounts(&self) -> &[AccountView] {
        &self.accounts
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, cap: usize, item: T) {
    while ring.len() >= cap {
        ring.pop_front();
    }
    ring.push_back(item);
}

/// The fold and the metrics, shared between the node's loop (writer) and its API (reader).
/// Cloning shares them.
#[derive(Clone, Default)]
pub struct Telemetry {
    fold: Arc<Mutex<TelemetryFold>>,
    metrics: Arc<NodeMetrics>,
}

impl Telemetry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event and updates the metrics (these are atomics: no lock).
    pub fn record(&self, ev: &NodeEvent) {
        self.lock().on_event(ev);
        self.metrics.on_event(ev);
    }

    pub fn snapshot(&self, snap: CoreSnapshot) {
        self.lock().on_snapshot(snap);
    }

    /// Runs `f` on the fold under its lock: `f` should copy out, never wait.
    pub fn read<R>(&self, f: impl FnOnce(&TelemetryFold) -> R) -> R {
        f(&self.lock())
    }

    pub fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    fn lock(&self) -> MutexGuard<'_, TelemetryFold> {
        // A panic while folding leaves plain data behind, still fine to read.
        self.fold.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;
