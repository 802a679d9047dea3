//! The node's Prometheus metrics, updated from its events. Every metric is an atomic (or a
//! label family behind its own short lock), so a scrape never waits on the node's loop.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::valid_loss;
use crate::events::NodeEvent;

type Labels = Vec<(String, String)>;

/// Most stages given a per-stage series: a stage count is local configuration, but this
/// keeps the exposition bounded whatever it says.
const MAX_STAGE_SERIES: usize = 256;

fn gauge_u64(g: &Gauge, v: u64) {
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
}

/// Adds to `counter` what a cumulative total grew by since `last` saw it.
fn follow_total(counter: &Counter, last: &AtomicU64, total: u64) {
    let before = last.swap(total, Ordering::Relaxed);
    counter.inc_by(total.saturating_sub(before));
}

pub struct NodeMetrics {
    registry: Registry,
    info: Family<Labels, Gauge>,
    steps: Counter,
    step: Gauge,
    tokens: Counter,
    step_seconds: Histogram,
    loss: Gauge<f64, AtomicU64>,
    validation_loss: Gauge<f64, AtomicU64>,
    busy_seconds: Counter<f64, AtomicU64>,
    queue: Gauge,
    engine_queue: Gauge,
    peers: Gauge,
    replicas: Family<Labels, Gauge>,
    sync_round: Gauge,
    sync_rounds: Counter,
    round_seconds: Histogram,
    round_sent_bytes: Histogram,
    round_dense_bytes: Histogram,
    sync_sent_bytes: Counter,
    sync_dense_bytes: Counter,
    contributors: Gauge,
    ledger_proofs: Gauge,
    ledger_balance: Gauge,
    ledger_state: Family<Labels, Gauge>,
    finalized_epoch: Gauge,
    architecture_version: Gauge,
    finality_seconds: Histogram,
    proofs_made: Counter,
    proofs_applied: Counter,
    /// Audits this node ended, by outcome (`passed`, `guilty`, `refused`, `escalated`).
    audits: Family<Labels, Counter>,
    verdicts_applied: Counter,
    audit_fees: Counter,
    rewards: Counter,
    dropped: Counter,
    failovers: Counter,
    net_sent_bytes: Counter,
    net_received_bytes: Counter,
    /// Inbound messages the transport refused over a budget.
    net_refused: Family<Labels, Counter>,
    last_step_ms: AtomicU64,
    last_busy_ms: AtomicU64,
    last_net_sent: AtomicU64,
    last_net_received: AtomicU64,
    last_events_dropped: AtomicU64,
    last_gossip_over_rate: AtomicU64,
    last_requests_over_rate: AtomicU64,
    last_providers_refused: AtomicU64,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::default(),
            info: Family::default(),
            steps: Counter::default(),
            step: Gauge::default(),
            tokens: Counter::default(),
            // 10 ms to ~5 min.
            step_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            loss: Gauge::default(),
            validation_loss: Gauge::default(),
            busy_seconds: Counter::default(),
            queue: Gauge::default(),
            engine_queue: Gauge::default(),
            peers: Gauge::default(),
            replicas: Family::default(),
            sync_round: Gauge::default(),
            sync_rounds: Counter::default(),
            round_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            // 1 KiB to 16 GiB.
            round_sent_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 13)),
            round_dense_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 13)),
            sync_sent_bytes: Counter::default(),
            sync_dense_bytes: Counter::default(),
            contributors: Gauge::default(),
            ledger_proofs: Gauge::default(),
            ledger_balance: Gauge::default(),
            ledger_state: Family::default(),
            finalized_epoch: Gauge::default(),
            architecture_version: Gauge::default(),
            // 10 ms to about 5 minutes.
            finality_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            proofs_made: Counter::default(),
            proofs_applied: Counter::default(),
            audits: Family::default(),
            verdicts_applied: Counter::default(),
            audit_fees: Counter::default(),
            rewards: Counter::default(),
            dropped: Counter::default(),
            failovers: Counter::default(),
            net_sent_bytes: Counter::default(),
            net_received_bytes: Counter::default(),
            net_refused: Family::default(),
            last_step_ms: AtomicU64::new(0),
            last_busy_ms: AtomicU64::new(0),
            last_net_sent: AtomicU64::new(0),
            last_net_received: AtomicU64::new(0),
            last_events_dropped: AtomicU64::new(0),
            last_gossip_over_rate: AtomicU64::new(0),
            last_requests_over_rate: AtomicU64::new(0),
            last_providers_refused: AtomicU64::new(0),
        };
        m.registered()
    }

    /// Registers clones of every metric (they share their values) in the node's registry.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "neuroshard_node",
            "This node: id, network, stage and role as labels (value 1)",
            self.info.clone(),
        );
        r.register(
            "neuroshard_steps",
            "Optimizer steps this replica applied",
            self.steps.clone(),
        );
        r.register(
            "neuroshard_step",
            "Optimizer steps done (resumed included)",
            self.step.clone(),
        );
        r.register(
            "neuroshard_training_tokens",
            "Tokens this driver trained on",
            self.tokens.clone(),
        );
        r.register_with_unit(
            "neuroshard_step_duration",
            "Wall time between two optimizer steps",
            Unit::Seconds,
            self.step_seconds.clone(),
        );
        r.register(
            "neuroshard_training_loss",
            "Latest training loss this driver measured",
            self.loss.clone(),
        );
        r.register(
            "neuroshard_validation_loss",
            "Latest validation loss (held-out windows through the pipeline) this driver measured",
            self.validation_loss.clone(),
        );
        r.register_with_unit(
            "neuroshard_engine_busy",
            "Time the engine spent computing",
            Unit::Seconds,
            self.busy_seconds.clone(),
        );
        r.register(
            "neuroshard_pipeline_queue_depth",
            "Micro-batches queued at this stage (inbound work)",
            self.queue.clone(),
        );
        r.register(
            "neuroshard_engine_queue_depth",
            "Jobs sent to the engine thread and not finished",
            self.engine_queue.clone(),
        );
        r.register(
            "neuroshard_peers",
            "Live peers in the peer table",
            self.peers.clone(),
        );
        r.register(
            "neuroshard_stage_replicas",
            "Live replicas this node hears per stage (itself excluded)",
            self.replicas.clone(),
        );
        r.register(
            "neuroshard_finalized_epoch",
            "Last ledger epoch finalized here",
            self.finalized_epoch.clone(),
        );
        r.register(
            "neuroshard_architecture_version",
            "Architecture version of a growing network in the finalized state (0: the genesis's)",
            self.architecture_version.clone(),
        );
        r.register_with_unit(
            "neuroshard_finality_latency",
            "From this node's start of an epoch to its finalization",
            Unit::Seconds,
            self.finality_seconds.clone(),
        );
        r.register(
            "neuroshard_sync_round",
            "Current DiLoCo round",
            self.sync_round.clone(),
        );
        r.register(
            "neuroshard_sync_rounds",
            "DiLoCo rounds this replica aggregated",
            self.sync_rounds.clone(),
        );
        r.register_with_unit(
            "neuroshard_sync_round_duration",
            "Wall time of a DiLoCo round",
            Unit::Seconds,
            self.round_seconds.clone(),
        );
        r.register_with_unit(
            "neuroshard_sync_round_sent",
            "Compressed pseudo-gradient bytes sent per DiLoCo round",
            Unit::Bytes,
            self.round_sent_bytes.clone(),
        );
        r.register_with_unit(
            "neuroshard_sync_round_dense",
            "Dense (uncompressed) size of a round's pseudo-gradient",
            Unit::Bytes,
            self.round_dense_bytes.clone(),
        );
        r.register_with_unit(
            "neuroshard_sync_sent",
            "Compressed pseudo-gradient bytes sent, all rounds",
            Unit::Bytes,
            self.sync_sent_bytes.clone(),
        );
        r.register_with_unit(
            "neuroshard_sync_dense",
            "Dense size of the pseudo-gradients sent, all rounds",
            Unit::Bytes,
            self.sync_dense_bytes.clone(),
        );
        r.register(
            "neuroshard_sync_contributors",
            "Replicas whose offer the latest round averaged",
            self.contributors.clone(),
        );
        r.register(
            "neuroshard_ledger_proofs",
            "Proofs applied to this node's ledger (its height)",
            self.ledger_proofs.clone(),
        );
        r.register(
            "neuroshard_ledger_balance",
            "This node's spendable balance",
            self.ledger_balance.clone(),
        );
        r.register(
            "neuroshard_ledger_state",
            "The ledger's state hash as a label (value 1)",
            self.ledger_state.clone(),
        );
        r.register(
            "neuroshard_proofs_made",
            "Proofs this node signed",
            self.proofs_made.clone(),
        );
        r.register(
            "neuroshard_proofs_applied",
            "Peers' proofs applied from gossip",
            self.proofs_applied.clone(),
        );
        r.register(
            "neuroshard_audits",
            "Audits of co-replicas' jobs this node ended, by outcome",
            self.audits.clone(),
        );
        r.register(
            "neuroshard_verdicts_applied",
            "Audit verdicts the ledger applied",
            self.verdicts_applied.clone(),
        );
        r.register(
            "neuroshard_audit_fees",
            "Validator fees the ledger paid from finalized epochs",
            self.audit_fees.clone(),
        );
        r.register(
            "neuroshard_proof_rewards",
            "Rewards of the proofs this node signed",
            self.rewards.clone(),
        );
        r.register(
            "neuroshard_dropped",
            "Messages from peers refused",
            self.dropped.clone(),
        );
        r.register(
            "neuroshard_failovers",
            "Micro-batches re-routed after a replica failed",
            self.failovers.clone(),
        );
        r.register_with_unit(
            "neuroshard_net_sent",
            "Bytes the transport sent",
            Unit::Bytes,
            self.net_sent_bytes.clone(),
        );
        r.register_with_unit(
            "neuroshard_net_received",
            "Bytes the transport received",
            Unit::Bytes,
            self.net_received_bytes.clone(),
        );
        r.register(
            "neuroshard_net_refused",
            "Inbound messages refused over a budget (budget: inbound_queue, gossip_rate, request_rate)",
            self.net_refused.clone(),
        );
        self
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Jobs handed to the engine and not yet finished (the runtime counts them).
    pub fn set_engine_queue(&self, jobs: usize) {
        self.engine_queue
            .set(i64::try_from(jobs).unwrap_or(i64::MAX));
    }

    pub fn on_event(&self, ev: &NodeEvent) {
        match ev {
            NodeEvent::Ready {
                node,
                network,
                stage,
                role,
                resumed_step,
                sync_round,
                ..
            } => {
                let labels = vec![
                    ("node".to_string(), node.clone()),
                    ("network".to_string(), network.clone()),
                    ("stage".to_string(), stage.to_string()),
                    ("role".to_string(), role.clone()),
                ];
                self.info.clear();
                self.info.get_or_create(&labels).set(1);
                gauge_u64(&self.step, *resumed_step);
                gauge_u64(&self.sync_round, *sync_round);
            }
            NodeEvent::Validation { loss, .. } if valid_loss(*loss) => {
                self.validation_loss.set(*loss);
            }
            NodeEvent::Step {
                step,
                loss,
                tokens,
                busy_ms,
                time_ms,
                ..
            } => {
                self.steps.inc();
                gauge_u64(&self.step, *step);
                self.tokens.inc_by(*tokens);
                if let Some(l) = loss.map(f64::from).filter(|l| valid_loss(*l)) {
                    self.loss.set(l);
                }
                let before = self.last_step_ms.swap(*time_ms, Ordering::Relaxed);
                if before > 0 && *time_ms >= before {
                    self.step_seconds.observe((*time_ms - before) as f64 / 1e3);
                }
                if let Some(busy) = busy_ms.filter(|b| b.is_finite() && *b >= 0.0) {
                    let ms = busy as u64;
                    let before = self.last_busy_ms.swap(ms, Ordering::Relaxed);
                    self.busy_seconds
                        .inc_by(ms.saturating_sub(before) as f64 / 1e3);
                }
            }
            NodeEvent::Stats {
                step,
                queue,
                peers,
                replicas,
                net,
                sync_round,
                ledger,
                ..
            } => {
                gauge_u64(&self.step, *step);
                gauge_u64(&self.queue, *queue as u64);
                gauge_u64(&self.peers, *peers as u64);
                for (stage, n) in replicas.iter().enumerate().take(MAX_STAGE_SERIES) {
                    let labels = vec![("stage".to_string(), stage.to_string())];
                    gauge_u64(&self.replicas.get_or_create(&labels), *n as u64);
                }
                gauge_u64(&self.sync_round, *sync_round);
                self.on_ledger(ledger.proofs as u64, &ledger.state_hash);
                gauge_u64(&self.ledger_balance, ledger.balance);
                if let Some(net) = net {
                    follow_total(&self.net_sent_bytes, &self.last_net_sent, net.sent_bytes());
                    follow_total(
                        &self.net_received_bytes,
                        &self.last_net_received,
                        net.received_bytes(),
                    );
                    let refused = |budget: &str| {
                        self.net_refused
                            .get_or_create(&vec![("budget".to_string(), budget.to_string())])
                            .clone()
                    };
                    follow_total(
                        &refused("inbound_queue"),
                        &self.last_events_dropped,
                        net.events_dropped,
                    );
                    follow_total(
                        &refused("gossip_rate"),
                        &self.last_gossip_over_rate,
                        net.gossip_over_rate,
                    );
                    follow_total(
                        &refused("request_rate"),
                        &self.last_requests_over_rate,
                        net.requests_over_rate,
                    );
                    follow_total(
                        &refused("dht_provider"),
                        &self.last_providers_refused,
                        net.providers_refused,
                    );
                }
            }
            NodeEvent::Sync {
                round,
                contributors,
                wall_ms,
                sent_bytes,
                dense_bytes,
                ..
            } => {
                self.sync_rounds.inc();
                gauge_u64(&self.sync_round, round.saturating_add(1));
                gauge_u64(&self.contributors, *contributors as u64);
                if wall_ms.is_finite() && *wall_ms >= 0.0 {
                    self.round_seconds.observe(wall_ms / 1e3);
                }
                self.round_sent_bytes.observe(*sent_bytes as f64);
                self.round_dense_bytes.observe(*dense_bytes as f64);
                self.sync_sent_bytes.inc_by(*sent_bytes);
                self.sync_dense_bytes.inc_by(*dense_bytes);
            }
            NodeEvent::Proof {
                balance, reward, ..
            } => {
                self.proofs_made.inc();
                self.rewards.inc_by(reward.unwrap_or(0));
                gauge_u64(&self.ledger_balance, *balance);
            }
            NodeEvent::Ledger {
                kind: Some(kind),
                state_hash,
                ..
            } => {
                match super::LedgerKind::of(kind) {
                    super::LedgerKind::Proof => self.proofs_applied.inc(),
                    super::LedgerKind::Verdict => self.verdicts_applied.inc(),
                    super::LedgerKind::AuditFee => self.audit_fees.inc(),
                };
                self.on_state(state_hash);
            }
            NodeEvent::Audit { outcome, .. } => {
                // The outcome's class only (the reason after the colon is free text).
                let class = outcome
                    .split(':')
                    .next()
                    .filter(|c| matches!(*c, "passed" | "guilty" | "refused" | "escalated"))
                    .unwrap_or("other");
                self.audits
                    .get_or_create(&vec![("outcome".to_string(), class.to_string())])
                    .inc();
            }
            NodeEvent::Settled {
                reward,
                balance,
                state_hash,
                ..
            } => {
                self.rewards.inc_by(*reward);
                gauge_u64(&self.ledger_balance, *balance);
                self.on_state(state_hash);
            }
            NodeEvent::Ledger { state_hash, .. } | NodeEvent::LedgerSync { state_hash, .. } => {
                self.on_state(state_hash)
            }
            NodeEvent::Dropped { .. } => {
                self.dropped.inc();
            }
            NodeEvent::Finalized {
                epoch, latency_ms, ..
            } => {
                gauge_u64(&self.finalized_epoch, *epoch);
                if let Some(ms) = latency_ms.filter(|ms| ms.is_finite()) {
                    self.finality_seconds.observe(ms / 1e3);
                }
            }
            NodeEvent::Architecture { version, .. } => {
                gauge_u64(&self.architecture_version, u64::from(*version));
            }
            NodeEvent::Failover { .. } => {
                self.failovers.inc();
            }
            _ => {}
        }
    }

    fn on_ledger(&self, proofs: u64, state_hash: &str) {
        gauge_u64(&self.ledger_proofs, proofs);
        self.on_state(state_hash);
    }

    /// One series, the current state: the old hash's goes, so the family stays at one.
    fn on_state(&self, state_hash: &str) {
        let labels = vec![("state_hash".to_string(), state_hash.to_string())];
        if self.ledger_state.get(&labels).is_none() {
            self.ledger_state.clear();
            self.ledger_state.get_or_create(&labels).set(1);
        }
    }
}
