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
            }
            Some("warning") | Some("dropped") => {
                tracing::debug!("node {i}: {ev}");
            }
            _ => {}
        }
    }

    pub fn on_stopped(&mut self, i: usize, ev: &Value) {
        self.stopped_net.insert(i, ev["net"].clone());
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
        let params = ck.stage.params();
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
