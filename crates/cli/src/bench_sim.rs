//! `neuroshard bench sim`: a simulated network of N nodes (stand-in compute) running DiLoCo
//! rounds, with the simulator's cost figures.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model};
use serde::Serialize;

#[derive(Args)]
pub struct SimArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Pipeline stages (replicas per stage = nodes / stages).
    #[arg(long, default_value_t = 4, conflicts_with = "replicas")]
    stages: usize,
    /// Replicas per stage instead of a stage count: stages = nodes / replicas, the way a
    /// network grows by adding stages.
    #[arg(long)]
    replicas: Option<usize>,
    /// DiLoCo rounds every stage must complete.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// Inner steps per round (H).
    #[arg(long, default_value_t = 5)]
    sync_every: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Pseudo-gradient compression of the simulated replicas.
    #[arg(long, default_value = "fp32")]
    compression: String,
    /// Give up after this much virtual time (seconds).
    #[arg(long, default_value_t = 3600)]
    max_virtual_secs: u64,
    #[arg(long)]
    json: bool,
    /// Print the round events (aggregated, adopted) of this stage's replicas, in virtual
    /// time, to stderr: why a stage falls behind.
    #[arg(long)]
    trace_stage: Option<usize>,
}

#[derive(Serialize)]
struct SimReport {
    nodes: usize,
    stages: usize,
    rounds: u64,
    wall_s: f64,
    virtual_s: f64,
    messages: u64,
    bytes: u64,
    messages_per_node_per_round: f64,
    bytes_per_node_per_round: f64,
    /// Per node per virtual second: the rate a peer's link and CPU see, whatever a round lasts.
    messages_per_node_per_s: f64,
    bytes_per_node_per_s: f64,
    /// Messages per round against n·log2(n).
    messages_per_round_over_n_log_n: f64,
    messages_by_kind_per_round: std::collections::BTreeMap<String, f64>,
    bytes_by_kind_per_round: std::collections::BTreeMap<String, f64>,
    peak_rss_mib: f64,
    /// Stages where two replicas at the same round hold different outer states at the end:
    /// replicas on separate lines of θ₀ that share no rounds (should be 0).
    split_stages: usize,
}

pub fn run(mut args: SimArgs) -> Result<()> {
    if let Some(r) = args.replicas {
        if r < 2 {
            bail!("need at least 2 replicas per stage");
        }
        args.stages = args.nodes / r;
    }
    if args.nodes < 2 * args.stages || args.stages == 0 {
        bail!(
            "need at least 2 replicas per stage ({} nodes, {} stages)",
            args.nodes,
            args.stages
        );
    }
    // One layer per stage at least: the stand-in keeps the model's real parameter layout.
    let mut model = tiny_model();
    model.layers = model.layers.max(args.stages);
    let mut s = settings(model, args.stages, args.nodes / args.stages);
    s.sync.every = args.sync_every;
    s.sync.compression = args.compression.clone();
    s.checkpoint_secs = 0;
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(
        args.seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    // Only start-up warnings (and round events when tracing) are read below; one event per
    // applied proof would be n² per round.
    if args.trace_stage.is_some() {
        sim.keep_events(|e| {
            matches!(
                e,
                NodeEvent::Warning { .. } | NodeEvent::Sync { .. } | NodeEvent::Adopted { .. }
            )
        });
    } else {
        sim.keep_events(|e| matches!(e, NodeEvent::Warning { .. }));
    }
    for i in 0..args.nodes {
        sim.add_node(i % args.stages, Duration::from_millis(i as u64 % 1000));
    }
    let started = Instant::now();
    sim.run_until(Duration::ZERO);
    if let Some(e) = (0..sim.len()).find_map(|i| {
        sim.events(i).iter().find_map(|e| match e {
            NodeEvent::Warning { message, .. } => Some(message.clone()),
            _ => None,
        })
    }) {
        bail!("a simulated node did not start: {e}");
    }
    let mut t = 0;
    let done = |sim: &Sim| {
        (0..args.stages).all(|stage| {
            (0..sim.len())
                .filter_map(|i| sim.core(i))
                .filter(|c| c.stage() == stage)
                .map(|c| c.sync_round())
                .min()
                .is_some_and(|r| r >= args.rounds)
        })
    };
    while !done(&sim) {
        if t >= args.max_virtual_secs {
            if let Some(stage) = args.trace_stage {
                eprint!("{}", round_trace(&sim, stage));
            }
            bail!(
                "{} rounds not reached in {t} virtual seconds; {}",
                args.rounds,
                laggards(&sim, args.stages, args.rounds)
            );
        }
        t += 1;
        sim.run_until(Duration::from_secs(t));
    }
    let wall = started.elapsed().as_secs_f64();
    if let Some(stage) = args.trace_stage {
        eprint!("{}", round_trace(&sim, stage));
    }
    let traffic = sim.traffic();
    let per_round = |x: u64| x as f64 / args.rounds as f64;
    let n = args.nodes as f64;
    let virtual_s = sim.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    let report = SimReport {
        nodes: args.nodes,
        stages: args.stages,
        rounds: args.rounds,
        wall_s: wall,
        virtual_s,
        messages: traffic.messages,
        bytes: traffic.bytes,
        messages_per_node_per_round: per_round(traffic.messages) / n,
        bytes_per_node_per_round: per_round(traffic.bytes) / n,
        messages_per_node_per_s: traffic.messages as f64 / n / virtual_s,
        bytes_per_node_per_s: traffic.bytes as f64 / n / virtual_s,
        messages_per_round_over_n_log_n: per_round(traffic.messages) / (n * n.log2()),
        messages_by_kind_per_round: traffic
            .by_kind
            .iter()
            .map(|(k, v)| (k.clone(), per_round(*v)))
            .collect(),
        bytes_by_kind_per_round: traffic
            .bytes_by_kind
            .iter()
            .map(|(k, v)| (k.clone(), per_round(*v)))
            .collect(),
        peak_rss_mib: peak_rss_mib(),
        split_stages: (0..args.stages).filter(|s| split(&sim, *s)).count(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} nodes, {} stages, {} rounds: {:.1} s wall ({:.0} s virtual); per node per round {:.0} messages, {:.0} bytes; per node per virtual second {:.1} messages, {:.0} bytes; messages/round = {:.2} × n·log2 n; peak RSS {:.0} MiB; {} stages split",
            report.nodes,
            report.stages,
            report.rounds,
            report.wall_s,
            report.virtual_s,
            report.messages_per_node_per_round,
            report.bytes_per_node_per_round,
            report.messages_per_node_per_s,
            report.bytes_per_node_per_s,
            report.messages_per_round_over_n_log_n,
            report.peak_rss_mib,
            report.split_stages
        );
        for (k, v) in &report.messages_by_kind_per_round {
            let bytes = report
                .bytes_by_kind_per_round
                .get(k)
                .copied()
                .unwrap_or(0.0);
            println!("  {k}: {v:.0} messages, {bytes:.0} bytes per round");
        }
    }
    Ok(())
}

/// Peak resident memory of this process (Linux), 0 where unknown.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Per stage, the replicas below `rounds`: what held a run up.
fn laggards(sim: &Sim, stages: usize, rounds: u64) -> String {
    (0..stages)
        .map(|stage| {
            let behind: Vec<String> = (0..sim.len())
                .filter_map(|i| Some((i, sim.core(i)?)))
                .filter(|(_, c)| c.stage() == stage && c.sync_round() < rounds)
                .map(|(i, c)| {
                    format!(
                        "node {i} (round {}, step {})",
                        c.sync_round(),
                        c.steps_done()
                    )
                })
                .collect();
            format!(
                "stage {stage}: {} behind [{}]",
                behind.len(),
                behind.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The round events of `stage`'s replicas in virtual-time order, one line each.
fn round_trace(sim: &Sim, stage: usize) -> String {
    let mut lines: Vec<(u64, String)> = Vec::new();
    for i in (0..sim.len()).filter(|i| sim.core(*i).is_some_and(|c| c.stage() == stage)) {
        for e in sim.events(i) {
            match e {
                NodeEvent::Sync {
                    round,
                    theta,
                    contributors,
                    expected,
                    time_ms,
                    ..
                } => lines.push((
                    *time_ms,
                    format!(
                        "node {i} aggregated round {round} → {:.8} ({contributors} of {expected})",
                        theta
                    ),
                )),
                NodeEvent::Adopted {
                    round,
                    theta,
                    reason,
                    time_ms,
                    ..
                } => lines.push((
                    *time_ms,
                    format!("node {i} adopted round {round} → {:.8} ({reason})", theta),
                )),
                _ => {}
            }
        }
    }
    lines.sort();
    let t0 = lines.first().map_or(0, |(t, _)| *t);
    lines
        .into_iter()
        .map(|(t, l)| format!("{:>9.3} s  {l}\n", t.saturating_sub(t0) as f64 / 1e3))
        .collect()
}

/// Whether two replicas of `stage` at the same round hold different outer states.
fn split(sim: &Sim, stage: usize) -> bool {
    let mut seen = std::collections::BTreeMap::new();
    (0..sim.len())
        .filter_map(|i| sim.core(i))
        .filter(|c| c.stage() == stage)
        .any(|c| *seen.entry(c.sync_round()).or_insert(c.theta()) != c.theta())
}
