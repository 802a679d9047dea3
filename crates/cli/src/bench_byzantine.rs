//! `neuroshard bench byzantine`: ByzFL attacks from Sybil replicas in simulated networks on the
//! real engine; validation loss of the honest replicas' model against the clean run.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use neuroshard_aggregate::Attack;
use neuroshard_sim::byzfl::{self, Scenario};
use serde::Serialize;

#[derive(Args)]
pub struct ByzantineArgs {
    /// Shapes: `default` (2 stages × 2 replicas, 1 Sybil in stage 1: no robust rule exists
    /// for two, only the norm bound, so sign-flip and scale get through; `swarm` now runs 2 × 3),
    /// `2x3` (1 Sybil in stage 1: three inputs, where the clipped mean is their median), `2x4`
    /// (1 Sybil in stage 1: the first shape where the clipped mean clamps), `3x5` (2 Sybils in
    /// stage 1), `3x5-spread` (1 Sybil in stage 1 and 1 in stage 2), or `SxR:stage=k[/stage=k...]`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default,2x3,2x4,3x5-spread,3x5"
    )]
    scenarios: Vec<String>,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sign-flip,alie,ipm,scale:1000,gaussian"
    )]
    attacks: Vec<String>,
    /// Seeds per (scenario, attack); the figures are means over them.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Driver steps per run (at 150 the tiny model is still in its fast early descent, where
    /// any attack that shrinks the aggregate costs what a smaller outer step would).
    #[arg(long, default_value_t = 600)]
    steps: u64,
    /// Aggregator, declared Byzantine count and norm bound (default: the nodes' defaults).
    #[arg(long)]
    aggregator: Option<String>,
    #[arg(long)]
    byzantine: Option<usize>,
    #[arg(long)]
    norm_bound: Option<f64>,
    /// Outer step (default: the nodes' defaults).
    #[arg(long)]
    outer_lr: Option<f32>,
    #[arg(long)]
    outer_momentum: Option<f32>,
    /// Pseudo-gradient compression (default: the nodes' default), e.g. `randk:0.25:int2`.
    #[arg(long)]
    compression: Option<String>,
    /// Also run each attack against a plain mean with no norm bound (what the defence buys).
    #[arg(long)]
    baseline: bool,
    /// Largest loss increase over the clean run that counts as tolerated.
    #[arg(long, default_value_t = 0.05)]
    goal: f64,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    scenario: String,
    attack: String,
    clean_loss: f32,
    attacked_loss: f32,
    /// attacked / clean − 1.
    change: f64,
    within_goal: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline_loss: Option<f32>,
    /// Fewest DiLoCo rounds an honest replica finished, over the seeds.
    min_rounds: u64,
    /// Rounds the Sybils offered in, summed over the seeds.
    rounds_attacked: usize,
    /// Largest honest norm over the median honest norm in any round (clean runs).
    honest_norm_ratio: f64,
    /// Share of the clean runs' rounds in which an honest offer was over the norm bound.
    honest_clipped_share: f64,
}

#[derive(Serialize)]
struct Report {
    aggregator: String,
    byzantine: usize,
    norm_bound: f64,
    outer_lr: f32,
    outer_momentum: f32,
    compression: String,
    seeds: u64,
    steps: u64,
    goal: f64,
    rows: Vec<Row>,
    wall_s: f64,
}

fn scenario(name: &str) -> Result<Scenario> {
    Ok(match name {
        "default" => Scenario::new(2, 2).with_sybils(1, 1),
        "2x3" => Scenario::new(2, 3).with_sybils(1, 1),
        "2x4" => Scenario::new(2, 4).with_sybils(1, 1),
        "3x5" => Scenario::new(3, 5).with_sybils(1, 2),
        "3x5-spread" => Scenario::new(3, 5).with_sybils(1, 1).with_sybils(2, 1),
        other => {
            let (shape, sybils) = other.split_once(':').unwrap_or((other, ""));
            let Some((s, r)) = shape.split_once('x') else {
                bail!("unknown scenario {other:?}");
            };
            let mut sc = Scenario::new(s.parse()?, r.parse()?);
            for part in sybils.split('/').filter(|p| !p.is_empty()) {
                let Some((stage, k)) = part.split_once('=') else {
                    bail!("scenario {other:?}: expected stage=count, got {part:?}");
                };
                sc = sc.with_sybils(stage.parse()?, k.parse()?);
            }
            sc
        }
    })
}

struct Measured {
    loss: f32,
    rounds: u64,
    attacked: usize,
    ratio: f64,
    clipped_share: f64,
}

/// Mean validation loss over the seeds, the fewest rounds, the rounds attacked and the
/// largest honest norm ratio.
fn measure(sc: &Scenario, attack: Attack, seeds: u64) -> Result<Measured> {
    let mut m = Measured {
        loss: 0.0,
        rounds: u64::MAX,
        attacked: 0,
        ratio: 0.0,
        clipped_share: 0.0,
    };
    let mut loss = 0.0f64;
    let (mut rounds, mut over) = (0usize, 0usize);
    for seed in 1..=seeds {
        let o = byzfl::run(sc, attack, seed)?;
        loss += f64::from(o.validation_loss);
        m.rounds = m.rounds.min(o.min_honest_round);
        m.attacked += o.rounds_attacked;
        m.ratio = m.ratio.max(o.max_honest_norm_ratio);
        rounds += o.honest_rounds;
        over += o.honest_over_bound;
    }
    m.clipped_share = over as f64 / rounds.max(1) as f64;
    m.loss = (loss / seeds as f64) as f32;
    Ok(m)
}

pub fn run(args: ByzantineArgs) -> Result<()> {
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let attacks = args
        .attacks
        .iter()
        .map(|a| a.parse::<Attack>())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut defaults = Scenario::new(1, 1);
    for name in &args.scenarios {
        let mut sc = scenario(name)?;
        sc.steps = args.steps;
        if let Some(a) = &args.aggregator {
            sc.aggregator = a.clone();
        }
        sc.byzantine = args.byzantine.unwrap_or(sc.byzantine);
        sc.norm_bound = args.norm_bound.unwrap_or(sc.norm_bound);
        sc.outer_lr = args.outer_lr.unwrap_or(sc.outer_lr);
        sc.outer_momentum = args.outer_momentum.unwrap_or(sc.outer_momentum);
        if let Some(c) = &args.compression {
            sc.compression = c.clone();
        }
        defaults = sc.clone();
        let clean = measure(&sc, Attack::None, args.seeds)?;
        let naive = Scenario {
            aggregator: "mean".into(),
            norm_bound: 0.0,
            ..sc.clone()
        };
        for attack in &attacks {
            let attacked = measure(&sc, *attack, args.seeds)?;
            let baseline_loss = if args.baseline {
                Some(measure(&naive, *attack, args.seeds)?.loss)
            } else {
                None
            };
            let change = f64::from(attacked.loss) / f64::from(clean.loss) - 1.0;
            let row = Row {
                scenario: name.clone(),
                attack: attack.to_string(),
                clean_loss: clean.loss,
                attacked_loss: attacked.loss,
                change,
                within_goal: change <= args.goal,
                baseline_loss,
                min_rounds: attacked.rounds.min(clean.rounds),
                rounds_attacked: attacked.attacked,
                honest_norm_ratio: clean.ratio,
                honest_clipped_share: clean.clipped_share,
            };
            if !args.json {
                print_row(&row);
            }
            rows.push(row);
        }
    }
    let report = Report {
        aggregator: defaults.aggregator,
        byzantine: defaults.byzantine,
        norm_bound: defaults.norm_bound,
        outer_lr: defaults.outer_lr,
        outer_momentum: defaults.outer_momentum,
        compression: defaults.compression,
        seeds: args.seeds,
        steps: args.steps,
        goal: args.goal,
        rows,
        wall_s: started.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} rows in {:.0} s wall ({} seeds, {} steps, aggregator {}, byzantine {}, norm bound {}, outer lr {} momentum {}, compression {})",
            report.rows.len(),
            report.wall_s,
            report.seeds,
            report.steps,
            report.aggregator,
            report.byzantine,
            report.norm_bound,
            report.outer_lr,
            report.outer_momentum,
            report.compression
        );
    }
    Ok(())
}

fn print_row(r: &Row) {
    let baseline = r
        .baseline_loss
        .map_or(String::new(), |b| format!(", mean without bound {b:.4}"));
    println!(
        "{:<12} {:<12} clean {:.4} attacked {:.4} ({:+.1}%{}) rounds ≥ {}, {} attacked{}",
        r.scenario,
        r.attack,
        r.clean_loss,
        r.attacked_loss,
        100.0 * r.change,
        if r.within_goal { "" } else { ", over goal" },
        r.min_rounds,
        r.rounds_attacked,
        baseline
    );
}
