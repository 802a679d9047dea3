//! What `neuroshard swarm` learns from its nodes' event lines, the assembled model, and the
//! summary it prints and writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use neuroshard_data::Genesis;
use neuroshard_model::{ModelConfig, ParamSet, SpecialTokens, Stage, StageSpec, checkpoint};
use serde_json::{Value, json};

use crate::swarm::{Member, best_replicas};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn sent_bytes(net: &Value) -> u64 {
    ["request", "gossip", "blob"]
        .iter()
        .map(|k| net[k]["sent_bytes"].as_u64().unwrap_or(0))
        .sum()
}

/// One round a replica aggregated itself.
struct SyncSample {
    sent: u64,
    dense: u64,
    wall_ms: f64,
    contributors: u64,
    expected: u64,
}

#[derive(Default)]
pub struct Report {
    steps: u64,
    pub startup: Duration,
    /// Per driver: (step, loss, wall clock ms).
    losses: BTreeMap<usize, Vec<(u64, f32, u64)>>,
    /// Tokens of driver steps after each driver's first (that one has no start time).
    tokens: u64,
    pub finished: HashSet<usize>,
    /// (wall clock ms, failover ms, reason)
    failovers: Vec<(u64, f64, String)>,
    pub kill_time_ms: Option<u64>,
    pub restart_time_ms: Option<u64>,
    /// The restarted node: (its ready event, its first step) in wall clock ms.
    recovered: (Option<u64>, Option<u64>),
    resumed_step: Option<u64>,
    pub killed: Option<usize>,
    latest_net: HashMap<usize, Value>,
    stage_steps: HashMap<usize, u64>,
    stopped_net: BTreeMap<usize, Value>,
    pub initial_val: Option<f64>,
    pub final_val: Option<f64>,
    pub sample: Option<String>,
    pub timed_out: bool,
    /// The node started mid-run: (index, wall clock ms).
    pub joiner: Option<(usize, u64)>,
    joined: Option<Value>,
    /// The joiner's first round after joining: (round, it contributed).
    joiner_first_sync: Option<(u64, bool)>,
    stages: HashMap<usize, usize>,
    /// (stage, round) → node → the outer-state hash it ended the round with.
    thetas: BTreeMap<(u64, u64), BTreeMap<usize, String>>,
    syncs: Vec<SyncSample>,
    adoptions: u64,
    /// The restarted node's first round outcome after restarting (wall clock ms).
    caught_up: Option<u64>,
    /// Latest ledger summary per node, and when its state hash last changed.
    ledgers: BTreeMap<usize, (Value, u64)>,
}

impl Report {
    pub fn new(steps: u64) -> Self {
        Self {
            steps,
            ..Default::default()
        }
    }

    pub fn on_event(&mut self, i: usize, ev: &Value) {
        if self.restart_time_ms.is_some() && Some(i) == self.killed {
            let t = ev["time_ms"].as_u64();
            match ev["event"].as_str() {
                Some("ready") if self.recovered.0.is_none() => {
                    self.recovered.0 = t;
                    self.resumed_step = ev["resumed_step"].as_u64();
                }
                Some("step") if self.recovered.1.is_none() => self.recovered.1 = t,
                _ => {}
            }
        }
        match ev["event"].as_str() {
            Some("step") => {
                let step = ev["step"].as_u64().unwrap_or(0);
                self.stage_steps.insert(i, step);
                if let Some(loss) = ev["loss"].as_f64() {
                    let list = self.losses.entry(i).or_default();
                    if !list.is_empty() {
                        self.tokens += ev["tokens"].as_u64().unwrap_or(0);
                    }
                    list.push((step, loss as f32, ev["time_ms"].as_u64().unwrap_or(0)));
                }
            }
            Some("finished") => {
                self.finished.insert(i);
            }
            Some("failover") => self.failovers.push((
                ev["time_ms"].as_u64().unwrap_or(0),
                ev["ms"].as_f64().unwrap_or(f64::NAN),
                ev["reason"].as_str().unwrap_or("").to_string(),
            )),
            Some("stats") => {
                self.latest_net.insert(i, ev["net"].clone());
                self.on_ledger(i, &ev["ledger"]);
            }
            Some("ready") => {
                if let Some(s) = ev["stage"].as_u64() {
                    self.stages.insert(i, s as usize);
                }
                if self.joiner.is_some_and(|(j, _)| j == i) {
                    self.joined = Some(ev.clone());
                }
            }
            Some(kind @ ("sync" | "adopted")) => {
                let (Some(stage), Some(round), Some(theta)) = (
                    ev["stage"].as_u64(),
                    ev["round"].as_u64(),
                    ev["theta"].as_str(),
                ) else {
                    return;
                };
                self.thetas
                    .entry((stage, round))
                    .or_default()
                    .insert(i, theta.to_string());
                let included = ev["included_self"].as_bool().unwrap_or(false);
                if kind == "sync" {
                    let n = |k: &str| ev[k].as_u64().unwrap_or(0);
                    self.syncs.push(SyncSample {
                        sent: n("sent_bytes"),
                        dense: n("dense_bytes"),
                        wall_ms: ev["wall_ms"].as_f64().unwrap_or(0.0),
                        contributors: n("contributors"),
                        expected: n("expected"),
                    });
                } else {
                    self.adoptions += 1;
                }
                let joined_round = self
                    .joined
                    .as_ref()
                    .and_then(|j| j["joined_round"].as_u64());
                if self.joiner.is_some_and(|(j, _)| j == i)
                    && self.joiner_first_sync.is_none()
                    && kind == "sync"
                    && joined_round.is_none_or(|r| round > r)
                {
                    self.joiner_first_sync = Some((round, included));
                }
                if Some(i) == self.killed
                    && self.restart_time_ms.is_some()
                    && self.caught_up.is_none()
                {
                    self.caught_up = ev["time_ms"].as_u64();
                }
            }
            Some("warning") | Some("dropped") => {
                tracing::debug!("node {i}: {ev}");
            }
            _ => {}
        }
    }

    pub fn on_stopped(&mut self, i: usize, ev: &Value) {
        self.stopped_net.insert(i, ev["net"].clone());
        self.on_ledger(i, &ev["ledger"]);
    }

    fn on_ledger(&mut self, i: usize, ledger: &Value) {
        if !ledger.is_object() {
            return;
        }
        let changed = self
            .ledgers
            .get(&i)
            .is_none_or(|(old, _)| old["state_hash"] != ledger["state_hash"]);
        let since = if changed {
            now_ms()
        } else {
            self.ledgers.get(&i).map_or(0, |(_, t)| *t)
        };
        self.ledgers.insert(i, (ledger.clone(), since));
    }

    pub fn stage_of(&self, i: usize) -> Option<usize> {
        self.stages.get(&i).copied()
    }

    /// Every live node reports the same ledger, unchanged for a few seconds.
    pub fn ledgers_settled(&self, live: &[usize]) -> bool {
        let mut hashes = live.iter().map(|i| self.ledgers.get(i));
        let Some(Some((first, _))) = hashes.next() else {
            return false;
        };
        let quiet = live
            .iter()
            .filter_map(|i| self.ledgers.get(i))
            .all(|(_, t)| now_ms().saturating_sub(*t) >= 6_000);
        quiet && hashes.all(|h| h.is_some_and(|(l, _)| l["state_hash"] == first["state_hash"]))
    }

    /// Rounds in which every replica of the stage that finished the round holds one θ₀.
    fn sync_figures(&self) -> Value {
        let agreeing = self.thetas.values().filter(|m| {
            let mut v = m.values();
            v.next().is_none_or(|first| v.all(|t| t == first))
        });
        let rounds = self.thetas.len();
        let multi: Vec<_> = self.thetas.iter().filter(|(_, m)| m.len() > 1).collect();
        let n = self.syncs.len().max(1) as f64;
        let mean = |f: fn(&SyncSample) -> f64| self.syncs.iter().map(f).sum::<f64>() / n;
        let sent = mean(|s| s.sent as f64);
        let dense = mean(|s| s.dense as f64);
        let mut walls: Vec<f64> = self.syncs.iter().map(|s| s.wall_ms).collect();
        walls.sort_by(f64::total_cmp);
        json!({
            "rounds": rounds,
            "rounds_all_replicas_agree": agreeing.count(),
            "rounds_with_several_replicas": multi.len(),
            "rounds_disagreeing": multi.iter().filter(|(_, m)| { let mut v = m.values(); let f = v.next(); v.any(|t| Some(t) != f) }).map(|((s, r), m)| json!({"stage": s, "round": r, "thetas": m})).collect::<Vec<_>>(),
            "aggregations": self.syncs.len(),
            "adoptions": self.adoptions,
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

    fn ledger_figures(&self) -> Value {
        let hashes: HashSet<&Value> = self
            .ledgers
            .values()
            .map(|(l, _)| &l["state_hash"])
            .collect();
        json!({
            "all_equal": hashes.len() == 1,
            "per_node": self.ledgers.iter().map(|(i, (l, _))| (i.to_string(), json!({
                "state_hash": l["state_hash"],
                "proofs": l["proofs"],
                "neuro": l["balance"].as_u64().map(neuroshard_ledger::format_neuro),
                "balance_units": l["balance"],
            }))).collect::<BTreeMap<_, _>>(),
        })
    }

    fn join_figures(&self) -> Value {
        let Some((index, _)) = self.joiner else {
            return Value::Null;
        };
        json!({
            "node": index,
            "stage": self.stages.get(&index),
            "joined_round": self.joined.as_ref().map(|j| j["joined_round"].clone()),
            "join_ms": self.joined.as_ref().map(|j| j["join_ms"].clone()),
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
        let (sent, recv): (u64, u64) = self.latest_net.values().fold((0, 0), |(s, r), n| {
            let rx: u64 = ["request", "gossip", "blob"]
                .iter()
                .map(|k| n[k]["received_bytes"].as_u64().unwrap_or(0))
                .sum();
            (s + sent_bytes(n), r + rx)
        });
        format!(
            "loss {} | {:.0} tok/s | sent {:.1} MB recv {:.1} MB | replicas per stage {:?}",
            self.recent_loss().map_or("…".into(), |l| format!("{l:.4}")),
            self.tokens_per_s(),
            sent as f64 / 1e6,
            recv as f64 / 1e6,
            replicas
        )
    }

    /// Failover after the chaos kill: the first re-route and the longest pause between two
    /// steps of a surviving driver around the kill.
    fn failover_figures(&self) -> Value {
        let Some(kill) = self.kill_time_ms else {
            return json!({ "events": self.failovers.len() });
        };
        let after: Vec<&(u64, f64, String)> =
            self.failovers.iter().filter(|f| f.0 >= kill).collect();
        let first = after.first().map(|f| f.0.saturating_sub(kill));
        let mut stall = 0u64;
        for (i, v) in &self.losses {
            if Some(*i) == self.killed {
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
            "killed_node": self.killed,
            "events": self.failovers.len(),
            "first_reroute_after_kill_ms": first,
            "reroute_ms": after.iter().map(|f| f.1).collect::<Vec<_>>(),
            "reasons": after.iter().map(|f| f.2.clone()).collect::<Vec<_>>(),
            "step_gap_across_kill_ms": stall,
            "restart": self.restart_time_ms.map(|r| json!({
                "resumed_step": self.resumed_step,
                "ready_after_restart_ms": self.recovered.0.map(|t| t.saturating_sub(r)),
                "first_step_after_restart_ms": self.recovered.1.map(|t| t.saturating_sub(r)),
                "caught_up_with_stage_after_restart_ms": self.caught_up.map(|t| t.saturating_sub(r)),
            })),
            "median_step_gap_ms": gaps.get(gaps.len() / 2),
        })
    }

    fn bytes_per_step(&self) -> Option<f64> {
        let steps = self.driver_steps_total();
        let sent: u64 = self.stopped_net.values().map(sent_bytes).sum();
        (steps > 0 && sent > 0).then(|| sent as f64 / steps as f64)
    }

    pub fn to_json(&self, assembly: &Assembly) -> Value {
        json!({
            "target_steps": self.steps,
            "startup_s": self.startup.as_secs_f64(),
            "train_s": self.train_secs(),
            "driver_steps": self.driver_steps_total(),
            "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s(),
            "losses": self.losses.iter().map(|(i, v)| (i.to_string(), v.iter().map(|x| x.1).collect::<Vec<_>>())).collect::<BTreeMap<_, _>>(),
            "initial_val_loss": self.initial_val,
            "final_val_loss": self.final_val,
            "bytes_sent_per_driver_step": self.bytes_per_step(),
            "net_per_node": self.stopped_net,
            "failover": self.failover_figures(),
            "sync": self.sync_figures(),
            "ledger": self.ledger_figures(),
            "join": self.join_figures(),
            "timed_out": self.timed_out,
            "model": {
                "checkpoint": assembly.out.display().to_string(),
                "model_hash": assembly.model_hash,
                "from": assembly.sources,
            },
            "sample": self.sample,
        })
    }

    pub fn print(&self, out: &Path) {
        println!(
            "done: {} driver steps, {} tokens in {:.1} s ({:.0} tokens/s over the network)",
            self.driver_steps_total(),
            self.tokens,
            self.train_secs(),
            self.tokens_per_s()
        );
        if let (Some(a), Some(b)) = (self.initial_val, self.final_val) {
            println!("validation loss {a:.4} → {b:.4}");
        }
        if let Some(b) = self.bytes_per_step() {
            println!(
                "bytes on the wire per driver step: {:.0} ({:.2} MB)",
                b,
                b / 1e6
            );
        }
        if self.kill_time_ms.is_some() {
            println!("failover: {}", self.failover_figures());
        }
        if !self.syncs.is_empty() {
            println!("DiLoCo: {}", self.sync_figures());
        }
        if self.joiner.is_some() {
            println!("join: {}", self.join_figures());
        }
        for (i, (l, _)) in &self.ledgers {
            println!(
                "node {i}: {}, {} proofs in its ledger, state {}",
                l["balance"]
                    .as_u64()
                    .map_or("?".into(), neuroshard_ledger::format_neuro),
                l["proofs"],
                l["state_hash"]
                    .as_str()
                    .map_or("?", |h| &h[..h.len().min(16)])
            );
        }
        if let Some(s) = &self.sample {
            println!("sample: {s}");
        }
        println!("model written to {}", out.display());
    }
}

/// The whole model put together from one replica per stage.
pub struct Assembly {
    pub stage: Stage,
    pub out: PathBuf,
    pub model_hash: String,
    pub sources: BTreeMap<usize, String>,
}

/// Merges the best replica of every stage into one checkpoint in `out`, with the tokenizer.
pub fn assemble(
    members: &[Member],
    config: &ModelConfig,
    out: &Path,
    genesis: &Genesis,
    stages: usize,
) -> Result<Assembly> {
    let best = best_replicas(members, stages)?;
    let mut values: HashMap<String, Vec<f32>> = HashMap::new();
    let mut step = 0;
    for dir in best.values() {
        let ck = checkpoint::load(dir).with_context(|| format!("loading {}", dir.display()))?;
        if ck.meta.model != *config {
            anyhow::bail!("{} holds another model", dir.display());
        }
        step = step.max(ck.meta.step);
        let mut params = ck.stage.params().clone();
        // With DiLoCo the stage's model is its θ₀, the point every honest replica agrees on.
        if let Ok(bytes) = std::fs::read(dir.join(neuroshard_node::compute::DILOCO_FILE)) {
            let (round, theta) = neuroshard_node::replica::outer_theta(&bytes, params.numel())
                .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
            if round > 0 {
                params.set_flat(&theta)?;
            }
        }
        for (spec, v) in params.specs().iter().zip(params.values()) {
            values.insert(spec.name.clone(), v.clone());
        }
    }
    let full = StageSpec::full(config);
    let specs = full.param_specs(config);
    let ordered = specs
        .iter()
        .map(|s| {
            values
                .remove(&s.name)
                .with_context(|| format!("no replica saved {}", s.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let stage = Stage::from_params(config.clone(), full, ParamSet::from_values(specs, ordered)?)?;
    let tok = genesis.tokenizer();
    let special = SpecialTokens {
        bos: Some(tok.bos_id()),
        eos: Some(tok.eos_id()),
        pad: Some(tok.pad_id()),
    };
    let sources: BTreeMap<usize, String> = best
        .iter()
        .map(|(s, p)| (*s, p.display().to_string()))
        .collect();
    let extra = json!({
        "tokens": special,
        "dataset": { "root": hex::encode(genesis.root()), "name": genesis.manifest().name },
        "assembled_from": sources,
    });
    let meta = checkpoint::save(out, &stage, None, step, extra)?;
    std::fs::copy(
        genesis.tokenizer_path(),
        out.join(checkpoint::TOKENIZER_FILE),
    )
    .with_context(|| format!("copying the tokenizer into {}", out.display()))?;
    Ok(Assembly {
        stage,
        out: out.to_path_buf(),
        model_hash: meta.model_hash,
        sources,
    })
}
