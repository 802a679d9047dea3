//! What a swarm learns from its nodes' typed events, and the summary it prints and writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use neuroshard_net::Counters;
use neuroshard_node::events::{LedgerSummary, NodeEvent};
use serde_json::{Value, json};

use crate::soak::Soak;
use crate::{Assembly, Member};

/// How long ledgers and rounds must stay unchanged before a finished swarm stops: longer
/// than a round's collection timeout (5 s by default).
const QUIET_MS: u64 = 6_000;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The node's clock of an event.
fn time_of(ev: &NodeEvent) -> u64 {
    use NodeEvent::*;
    match ev {
        Ready { time_ms, .. }
        | Step { time_ms, .. }
        | Validation { time_ms, .. }
        | Failover { time_ms, .. }
        | Finished { time_ms, .. }
        | Dropped { time_ms, .. }
        | Warning { time_ms, .. }
        | Stats { time_ms, .. }
        | Stopped { time_ms, .. }
        | Sync { time_ms, .. }
        | Adopted { time_ms, .. }
        | Agreed { time_ms, .. }
        | Proof { time_ms, .. }
        | Ledger { time_ms, .. }
        | LedgerSync { time_ms, .. }
        | Finalized { time_ms, .. }
        | Settled { time_ms, .. }
        | Architecture { time_ms, .. }
        | Moving { time_ms, .. }
        | Drained { time_ms, .. }
        | Driving { time_ms, .. }
        | Parked { time_ms, .. }
        | Audit { time_ms, .. }
        | Jury { time_ms, .. }
        | Evidence { time_ms, .. }
        | Checkpoint { time_ms, .. }
        | Serving { time_ms, .. } => *time_ms,
    }
}

/// One round a replica aggregated itself.
struct SyncSample {
    sent: u64,
    dense: u64,
    wall_ms: f64,
    contributors: u64,
    expected: u64,
}

/// A node's engine time at one of its steps: (wall clock ms, engine busy ms).
type BusyAt = (u64, f64);

/// One failover: (wall clock ms, failover ms, reason).
type FailoverSample = (u64, f64, String);

#[derive(Default)]
pub struct Report {
    steps: u64,
    pub startup: Duration,
    /// Per driver: (step, loss, wall clock ms).
    losses: BTreeMap<usize, Vec<(u64, f32, u64)>>,
    /// Per driver: the validation loss it measured through the network, (round, step, loss).
    validation: BTreeMap<usize, Vec<(u64, u64, f64)>>,
    /// Tokens of driver steps after each driver's first (that one has no start time).
    tokens: u64,
    pub finished: HashSet<usize>,
    failovers: Vec<FailoverSample>,
    /// Kills and their recoveries, and the chaos soak's records.
    pub soak: Soak,
    latest_net: HashMap<usize, Counters>,
    stopped_net: BTreeMap<usize, Counters>,
    pub initial_val: Option<f64>,
    pub final_val: Option<f64>,
    pub sample: Option<String>,
    pub timed_out: bool,
    /// The node started mid-run: (index, wall clock ms).
    pub joiner: Option<(usize, u64)>,
    /// The joiner's ready event: (joined round, join ms).
    joined: Option<(Option<u64>, Option<f64>)>,
    /// The joiner's first round after joining: (round, it contributed).
    joiner_first_sync: Option<(u64, bool)>,
    stages: HashMap<usize, usize>,
    /// (stage, round) → node → the outer-state hash it ended the round with.
    thetas: BTreeMap<(usize, u64), BTreeMap<usize, String>>,
    syncs: Vec<SyncSample>,
    adoptions: u64,
    /// Audits of co-replicas' jobs by outcome (`passed`, `guilty`, `refused`).
    audits: BTreeMap<String, u64>,
    /// Those of them that audited an offer (a replica's pseudo-gradient of a round).
    offer_audits: BTreeMap<String, u64>,
    /// Juror checks of auditors' demands by finding (`guilty`, `served`).
    juries: BTreeMap<String, u64>,
    /// Per node: the validator fees its ledger paid (from finalized epochs).
    fees: BTreeMap<usize, u64>,
    /// The most evidence any replica held for its auditors, in bytes.
    evidence_max: u64,
    /// Per node: its engine's latest (audit ms, busy ms): what audits cost its compute.
    audit_busy: BTreeMap<usize, (f64, f64)>,
    /// When any replica last ended a round (wall clock ms).
    last_round_ms: u64,
    /// Latest ledger summary per node, and when its state hash last changed.
    ledgers: BTreeMap<usize, (LedgerSummary, u64)>,
    /// Per node: (stage, first step's (wall ms, engine busy ms), latest step's).
    busy: BTreeMap<usize, (usize, BusyAt, BusyAt)>,
    /// Per node: the finalized state hash of each epoch it finalized.
    finalized: BTreeMap<usize, BTreeMap<u64, String>>,
    /// Finality latencies (ms) every node measured for the epochs it took part in.
    finality_ms: Vec<f64>,
    /// A growing network's upgrades, per node.
    pub architecture: crate::architecture::ArchitectureLog,
}

impl Report {
    /// Engine time spent on audits (replays, settlements, evidence served) over all engine
    /// time, over every node and for the node where it was largest; None before any report.
    pub(crate) fn audit_share(&self) -> Value {
        let (audit, busy) = self
            .audit_busy
            .values()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let max = self
            .audit_busy
            .values()
            .filter(|(_, b)| *b > 0.0)
            .map(|(a, b)| a / b)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        json!({
            "all": (busy > 0.0).then(|| audit / busy),
            "max_node": max,
        })
    }

    pub fn new(steps: u64) -> Self {
        Self {
            steps,
            ..Default::default()
        }
    }

    pub fn on_event(&mut self, i: usize, ev: &NodeEvent) {
        let t = time_of(ev);
        self.soak.on_event(i, ev, t);
        self.architecture.on_event(i, ev);
        match ev {
            NodeEvent::Ready {
                stage,
                joined_round,
                join_ms,
                ..
            } => {
                self.stages.insert(i, *stage);
                if self.joiner.is_some_and(|(j, _)| j == i) {
                    self.joined = Some((*joined_round, *join_ms));
                }
            }
            NodeEvent::Validation {
                step, round, loss, ..
            } => {
                let list = self.validation.entry(i).or_default();
                list.push((*round, *step, *loss));
            }
            NodeEvent::Step {
                stage,
                step,
                loss,
                tokens,
                busy_ms,
                ..
            } => {
                if let Some(b) = busy_ms {
                    // A restarted process counts from zero again: measure it afresh.
                    let e = self.busy.entry(i).or_insert((*stage, (t, *b), (t, *b)));
                    if *b < e.2.1 {
                        *e = (*stage, (t, *b), (t, *b));
                    }
                    e.2 = (t, *b);
                }
                if let Some(loss) = loss {
                    let list = self.losses.entry(i).or_default();
                    if !list.is_empty() {
                        self.tokens += tokens;
                    }
                    list.push((*step, *loss, t));
                }
            }
            NodeEvent::Finished { .. } => {
                self.finished.insert(i);
            }
            NodeEvent::Finalized {
                epoch,
                state_hash,
                latency_ms,
                ..
            } => {
                let node = self.finalized.entry(i).or_default();
                node.insert(*epoch, state_hash.clone());
                // A node keeps the last few hundred epochs: enough to compare.
                while node.len() > 512 {
                    node.pop_first();
                }
                self.finality_ms.extend(latency_ms);
            }
            NodeEvent::Failover { ms, reason, .. } => {
                self.failovers.push((t, *ms, reason.clone()));
            }
            NodeEvent::Stats { net, ledger, .. } => {
                if let Some(n) = net.as_deref().copied() {
                    self.latest_net.insert(i, n);
                }
                self.on_ledger(i, ledger);
            }
            NodeEvent::Sync {
                stage,
                round,
                theta,
                contributors,
                expected,
                included_self,
                wall_ms,
                sent_bytes,
                dense_bytes,
                ..
            } => {
                self.on_round(i, *stage, *round, theta, t);
                self.syncs.push(SyncSample {
                    sent: *sent_bytes,
                    dense: *dense_bytes,
                    wall_ms: *wall_ms,
                    contributors: *contributors as u64,
                    expected: *expected as u64,
                });
                let joined_round = self.joined.and_then(|j| j.0);
                if self.joiner.is_some_and(|(j, _)| j == i)
                    && self.joiner_first_sync.is_none()
                    && joined_round.is_none_or(|r| *round > r)
                {
                    self.joiner_first_sync = Some((*round, *included_self));
                }
            }
            NodeEvent::Adopted {
                stage,
                round,
                theta,
                ..
            } => {
                self.on_round(i, *stage, *round, theta, t);
                self.adoptions += 1;
            }
            NodeEvent::Evidence {
                bytes,
                audit_ms,
                busy_ms,
                ..
            } => {
                self.evidence_max = self.evidence_max.max(*bytes);
                if let (Some(a), Some(b)) = (audit_ms, busy_ms) {
                    self.audit_busy.insert(i, (*a, *b));
                }
            }
            NodeEvent::Audit { outcome, kind, .. } => {
                let class = outcome.split(':').next().unwrap_or_default().to_string();
                if kind == "offer" {
                    *self.offer_audits.entry(class.clone()).or_default() += 1;
                }
                *self.audits.entry(class).or_default() += 1;
            }
            NodeEvent::Ledger {
                kind: Some(kind), ..
            } if kind == "audit fee" => {
                *self.fees.entry(i).or_default() += 1;
            }
            NodeEvent::Jury { guilty, .. } => {
                let finding = if *guilty { "guilty" } else { "served" };
                *self.juries.entry(finding.into()).or_default() += 1;
            }
            NodeEvent::Warning { .. } | NodeEvent::Dropped { .. } => {
                tracing::debug!("node {i}: {ev:?}");
            }
            _ => {}
        }
    }

    /// A replica ended `round` of `stage` with outer state `theta`.
    fn on_round(&mut self, i: usize, stage: usize, round: u64, theta: &str, t: u64) {
        self.thetas
            .entry((stage, round))
            .or_default()
            .insert(i, theta.to_string());
        self.last_round_ms = self.last_round_ms.max(t);
    }

    /// A node's `stopped` event: its final counters and ledger.
    pub fn on_stopped(&mut self, i: usize, ev: &NodeEvent) {
        if let NodeEvent::Stopped { net, ledger, .. } = ev {
            if let Some(n) = net.as_deref().copied() {
                self.stopped_net.insert(i, n);
            }
            self.on_ledger(i, ledger);
        }
    }

    fn on_ledger(&mut self, i: usize, ledger: &LedgerSummary) {
        let since = match self.ledgers.get(&i) {
            Some((old, t)) if old.state_hash == ledger.state_hash => *t,
            _ => now_ms(),
        };
        self.ledgers.insert(i, (ledger.clone(), since));
    }

    /// The chaos soak's verdict (None: not a soak): every check passed.
    pub fn soak_passed(&self) -> Option<bool> {
        self.soak.bounds?;
        Some(
            self.soak
                .checks(self.initial_val, self.final_val)
                .iter()
                .all(|c| c.ok),
        )
    }

    pub fn stage_of(&self, i: usize) -> Option<usize> {
        self.stages.get(&i).copied()
    }

    /// Every live node reports the same ledger, unchanged for a few seconds, with none of its
    /// training claims waiting for finality to settle their rounds (what it earned is then
    /// paid), and no replica ended a round for as long (a round under way, or two outcomes
    /// being reconciled, would otherwise be cut short by the stop and leave replicas on
    /// different θ₀).
    pub fn settled(&self, live: &[usize], now: u64) -> bool {
        if now.saturating_sub(self.last_round_ms) < QUIET_MS {
            return false;
        }
        let mut hashes = live.iter().map(|i| self.ledgers.get(i));
        let Some(Some((first, _))) = hashes.next() else {
            return false;
        };
        let quiet = live
            .iter()
            .filter_map(|i| self.ledgers.get(i))
            .all(|(l, t)| now.saturating_sub(*t) >= QUIET_MS && l.pending == 0);
        quiet && hashes.all(|h| h.is_some_and(|(l, _)| l.state_hash == first.state_hash))
    }

    /// Rounds in which every replica of the stage that finished the round holds one θ₀.
    pub(crate) fn sync_figures(&self) -> Value {
        let agree = |m: &BTreeMap<usize, String>| {
            let mut v = m.values();
            v.next().is_none_or(|first| v.all(|t| t == first))
        };
        let multi: Vec<_> = self.thetas.iter().filter(|(_, m)| m.len() > 1).collect();
        let disagreeing: Vec<Value> = multi
            .iter()
            .filter(|(_, m)| !agree(m))
            .map(|((s, r), m)| json!({"stage": s, "round": r, "thetas": m}))
            .collect();
        let n = self.syncs.len().max(1) as f64;
        let mean = |f: fn(&SyncSample) -> f64| self.syncs.iter().map(f).sum::<f64>() / n;
        let sent = mean(|s| s.sent as f64);
        let dense = mean(|s| s.dense as f64);
        let mut walls: Vec<f64> = self.syncs.iter().map(|s| s.wall_ms).collect();
        walls.sort_by(f64::total_cmp);
        json!({
            "rounds": self.thetas.len(),
            "rounds_all_replicas_agree": self.thetas.values().filter(|m| agree(m)).count(),
            "rounds_with_several_replicas": multi.len(),
            "rounds_disagreeing": disagreeing,
            "aggregations": self.syncs.len(),
            "adoptions": self.adoptions,
            "audits": self.audits,
            "offer_audits": self.offer_audits,
            "juries": self.juries,
            // Every ledger pays the fees finalized epochs hold: nodes differ only by the
            // epochs they finalized before stopping.
            "audit_fees_min_per_ledger": self.fees.values().min(),
            "audit_fees_max_per_ledger": self.fees.values().max(),
            "max_evidence_bytes_per_replica": self.evidence_max,
            "audit_compute_share": self.audit_share(),
            "mean_sent_bytes_per_replica": sent,
            "mean_dense_bytes_per_replica": dense,
            "compression_ratio": if sent > 0.0 { dense / sent } else { 0.0 },
            "mean_wall_ms": mean(|s| s.wall_ms),
            "median_wall_ms": walls.get(walls.len() / 2),
            "max_wall_ms": walls.last(),
            "mean_contributors": mean(|s| s.contributors as f64),
            "mean_expected": mean(|s| s.expected as f64),
        })
    }

    pub(crate) fn ledger_figures(&self) -> Value {
        let hashes: HashSet<&str> = self
            .ledgers
            .values()
            .map(|(l, _)| l.state_hash.as_str())
            .collect();
        let per_node: BTreeMap<String, Value> = self
            .ledgers
            .iter()
            .map(|(i, (l, _))| {
                let figures = json!({
                    "state_hash": l.state_hash,
                    "proofs": l.proofs,
                    "neuro": neuroshard_ledger::format_neuro(l.balance),
                    "balance_units": l.balance,
                    "pending_rounds": l.pending,
                    "stake_units": l.stake,
                });
                (i.to_string(), figures)
            })
            .collect();
        json!({ "all_equal": hashes.len() == 1, "per_node": per_node })
    }

    /// Ledger finality: each node's finalized height and state, whether every node that
    /// reached an epoch holds one state there, and the latency of finalization.
    pub(crate) fn finality_figures(&self) -> Value {
        let mut by_epoch: BTreeMap<u64, HashSet<&str>> = BTreeMap::new();
        for epochs in self.finalized.values() {
            for (e, h) in epochs {
                by_epoch.entry(*e).or_default().insert(h.as_str());
            }
        }
        let per_node: BTreeMap<String, Value> = self
            .finalized
            .iter()
            .filter_map(|(i, epochs)| {
                let (e, h) = epochs.last_key_value()?;
                Some((i.to_string(), json!({ "epoch": e, "state_hash": h })))
            })
            .collect();
        let mut ms = self.finality_ms.clone();
        ms.sort_by(f64::total_cmp);
        let pick =
            |q: f64| (!ms.is_empty()).then(|| ms[((ms.len() - 1) as f64 * q).round() as usize]);
        json!({
            "per_node": per_node,
            "epochs": by_epoch.len(),
            "agree": by_epoch.values().all(|h| h.len() == 1),
            "latency_ms": { "median": pick(0.5), "p95": pick(0.95), "n": ms.len() },
        })
    }

    fn join_figures(&self) -> Value {
        let Some((index, _)) = self.joiner else {
            return Value::Null;
        };
        json!({
            "node": index,
            "stage": self.stages.get(&index),
            "joined_round": self.joined.map(|j| j.0),
            "join_ms": self.joined.map(|j| j.1),
            "first_sync": self.joiner_first_sync.map(|(r, c)| json!({"round": r, "contributed": c})),
        })
    }

    pub fn max_driver_step(&self) -> u64 {
        self.losses
            .values()
            .filter_map(|v| v.last().map(|x| x.0))
            .max()
            .unwrap_or(0)
    }

    pub fn min_driver_step(&self, members: &[Member]) -> u64 {
        members
            .iter()
            .filter(|m| m.alive && m.stage == Some(0))
            .map(|m| {
                self.losses
                    .get(&m.index)
                    .and_then(|v| v.last())
                    .map_or(0, |x| x.0)
            })
            .min()
            .unwrap_or(0)
    }

    pub fn driver_steps_total(&self) -> u64 {
        self.losses.values().map(|v| v.len() as u64).sum()
    }

    fn recent_loss(&self) -> Option<f32> {
        let last: Vec<f32> = self
            .losses
            .values()
            .filter_map(|v| v.last().map(|x| x.1))
            .collect();
        (!last.is_empty()).then(|| last.iter().sum::<f32>() / last.len() as f32)
    }

    /// Training wall time: from the first driver step to the last, by the nodes' clocks.
    fn train_secs(&self) -> f64 {
        let times = self.losses.values().flatten().map(|x| x.2);
        let (lo, hi) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        if hi > lo { (hi - lo) as f64 / 1e3 } else { 0.0 }
    }

    fn tokens_per_s(&self) -> f64 {
        let secs = self.train_secs();
        if secs > 0.0 {
            self.tokens as f64 / secs
        } else {
            0.0
        }
    }

    pub fn progress_line(&self, members: &[Member], stages: usize) -> String {
        let mut replicas = vec![0usize; stages];
        for m in members.iter().filter(|m| m.alive) {
            if let Some(s) = m.stage.filter(|s| *s < stages) {
                replicas[s] += 1;
            }
        }
        let sent: u64 = self.latest_net.values().map(Counters::sent_bytes).sum();
        let recv: u64 = self.latest_net.values().map(Counters::received_bytes).sum();
        format!(
            "loss {} | {:.0} tok/s | sent {:.1} MB recv {:.1} MB | replicas per stage {:?}",
            self.recent_loss().map_or("…".into(), |l| format!("{l:.4}")),
            self.tokens_per_s(),
            sent as f64 / 1e6,
            recv as f64 / 1e6,
            replicas
        )
    }

    /// Failover after the first kill: the first re-route and the longest pause between two
    /// steps of a surviving driver around the kill.
    fn failover_figures(&self) -> Value {
        let Some(k0) = self.soak.kills.first() else {
            return json!({ "events": self.failovers.len() });
        };
        let kill = k0.killed_ms;
        let after: Vec<&FailoverSample> = self.failovers.iter().filter(|f| f.0 >= kill).collect();
        let first = after.first().map(|f| f.0.saturating_sub(kill));
        let mut stall = 0u64;
        for (i, v) in &self.losses {
            if *i == k0.node {
                continue;
            }
            for w in v.windows(2) {
                if w[1].2 >= kill && w[0].2 <= kill {
                    stall = stall.max(w[1].2 - w[0].2);
                }
            }
        }
        let mut gaps: Vec<u64> = self
            .losses
            .values()
            .flat_map(|v| {
                v.windows(2)
                    .map(|w| w[1].2.saturating_sub(w[0].2))
                    .collect::<Vec<_>>()
            })
            .collect();
        gaps.sort_unstable();
        json!({
            "killed_node": k0.node,
            "events": self.failovers.len(),
            "first_reroute_after_kill_ms": first,
            "reroute_ms": after.iter().map(|f| f.1).collect::<Vec<_>>(),
            "reasons": after.iter().map(|f| f.2.clone()).collect::<Vec<_>>(),
            "step_gap_across_kill_ms": stall,
            "restart": k0.restarted_ms.map(|r| json!({
                "resumed_step": k0.resumed_step,
                "ready_after_restart_ms": k0.ready_ms.map(|t| t.saturating_sub(r)),
                "first_step_after_restart_ms": k0.recovery_ms(),
                "caught_up_with_stage_after_restart_ms": k0.caught_up_ms.map(|t| t.saturating_sub(r)),
            })),
            "median_step_gap_ms": gaps.get(gaps.len() / 2),
        })
    }

    /// Per node: the fraction of wall time its engine computed, from its first optimizer step
    /// to its latest (the training window, without start-up and the settling at the end).
    fn node_utilization(&self) -> BTreeMap<usize, (usize, f64)> {
        self.busy
            .iter()
            .filter(|(_, (_, a, b))| b.0 > a.0)
            .map(|(i, (stage, a, b))| (*i, (*stage, (b.1 - a.1) / (b.0 - a.0) as f64)))
            .collect()
    }

    /// Mean utilization of each stage's replicas.
    pub fn stage_utilization(&self) -> BTreeMap<usize, f64> {
        let mut sums: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
        for (stage, u) in self.node_utilization().into_values() {
            let e = sums.entry(stage).or_default();
            e.0 += u;
            e.1 += 1;
        }
        sums.into_iter()
            .map(|(s, (sum, n))| (s, sum / n as f64))
            .collect()
    }

    fn bytes_per_step(&self) -> Option<f64> {
        let steps = self.driver_steps_total();
        let sent: u64 = self.stopped_net.values().map(Counters::sent_bytes).sum();
        (steps > 0 && sent > 0).then(|| sent as f64 / steps as f64)
    }

    pub fn to_json(&self, assembly: &Assembly) -> Value {
        let losses: BTreeMap<String, Vec<f32>> = self
            .losses
            .iter()
            .map(|(i, v)| (i.to_string(), v.iter().map(|x| x.1).collect()))
            .collect();
        json!({
            "target_steps": self.steps,
            "startup_s": self.startup.as_secs_f64(),
            "train_s": self.train_secs(),
            "driver_steps": self.driver_steps_total(),
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s(),
            "utilization": {
                "per_stage": self.stage_utilization(),
                "per_node": self.node_utilization().into_iter()
                    .map(|(i, (stage, u))| (i.to_string(), json!({"stage": stage, "busy": u})))
                    .collect::<BTreeMap<_, _>>(),
            },
            "losses": losses,
            "network_validation": self.validation.iter()
                .map(|(i, v)| (i.to_string(), v.iter()
                    .map(|(round, step, loss)| json!({
                        "round": round,
                        "step": step,
                        "loss": loss,
                        // The architecture version this driver trained at that step.
                        "version": self.architecture.version_at(*i, *step),
                    }))
                    .collect::<Vec<_>>()))
                .collect::<BTreeMap<_, _>>(),
            "initial_val_loss": self.initial_val,
            "final_val_loss": self.final_val,
            "bytes_sent_per_driver_step": self.bytes_per_step(),
            "net_per_node": self.stopped_net,
            "failover": self.failover_figures(),
            "sync": self.sync_figures(),
            "ledger": self.ledger_figures(),
            "finality": self.finality_figures(),
            "architecture": self.architecture.figures(),
            "join": self.join_figures(),
            "soak": self.soak.to_json(self.initial_val, self.final_val),
            "timed_out": self.timed_out,
            "model": {
                "checkpoint": assembly.out.display().to_string(),
                "model_hash": assembly.model_hash,
                "from": assembly.sources,
            },
            "sample": self.sample,
        })
    }

    /// The end-of-run summary, one line each, for the caller to print.
    pub fn summary_lines(&self, assembly: &Assembly) -> Vec<String> {
        let mut out = vec![format!(
            "done: {} driver steps, {} tokens in {:.1} s ({:.0} tokens/s over the network)",
            self.driver_steps_total(),
            self.tokens,
            self.train_secs(),
            self.tokens_per_s()
        )];
        let util = self.stage_utilization();
        if !util.is_empty() {
            let parts: Vec<String> = util
                .iter()
                .map(|(s, u)| format!("stage {s} {:.0}%", u * 100.0))
                .collect();
            out.push(format!(
                "compute utilization (engine busy / wall time, mean of each stage's replicas): {}",
                parts.join(", ")
            ));
        }
        if let (Some(a), Some(b)) = (self.initial_val, self.final_val) {
            out.push(format!("validation loss {a:.4} → {b:.4}"));
        }
        for (i, v) in &self.validation {
            if let (Some(first), Some(last)) = (v.first(), v.last()) {
                out.push(format!(
                    "node {i}'s validation loss through the network: {:.4} (round {}) → {:.4} (round {}), {} evaluations",
                    first.2,
                    first.0,
                    last.2,
                    last.0,
                    v.len()
                ));
            }
        }
        if let Some(b) = self.bytes_per_step() {
            out.push(format!(
                "bytes on the wire per driver step: {b:.0} ({:.2} MB)",
                b / 1e6
            ));
        }
        if !self.soak.kills.is_empty() {
            out.push(format!("failover: {}", self.failover_figures()));
        }
        if !self.syncs.is_empty() {
            out.push(format!("DiLoCo: {}", self.sync_figures()));
        }
        if self.joiner.is_some() {
            out.push(format!("join: {}", self.join_figures()));
        }
        for (i, (l, _)) in &self.ledgers {
            let hash = &l.state_hash[..l.state_hash.len().min(16)];
            out.push(format!(
                "node {i}: {}, stake {}, {} proofs in its ledger, {} rounds waiting to settle, \
                 state {hash}",
                neuroshard_ledger::format_neuro(l.balance),
                neuroshard_ledger::format_neuro(l.stake),
                l.proofs,
                l.pending,
            ));
        }
        for (i, epochs) in &self.finalized {
            if let Some((e, h)) = epochs.last_key_value() {
                out.push(format!(
                    "node {i}: finalized epoch {e}, state {}",
                    &h[..h.len().min(16)]
                ));
            }
        }
        if !self.finalized.is_empty() {
            out.push(format!("finality: {}", self.finality_figures()));
        }
        out.extend(self.architecture.lines());
        for c in self.soak.checks(self.initial_val, self.final_val) {
            let verdict = if c.ok { "ok" } else { "FAILED" };
            out.push(format!("soak check {}: {verdict} {}", c.name, c.detail));
        }
        if let Some(s) = &self.sample {
            out.push(format!("sample: {s}"));
        }
        out.push(format!("model written to {}", assembly.out.display()));
        out
    }
}
