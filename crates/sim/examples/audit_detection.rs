//! How soon the default audits catch a lazy worker, and that they never slash an honest one:
//! 3 stages × 2 replicas on the real engine (tiny model), DiLoCo every 4 steps, one cheating
//! replica of stage 1 (its co-replica its only auditor; a driver for the data cheat), over seeds.
//!
//!   cargo run --release -p neuroshard-sim --example audit_detection [SEEDS] [STEPS] [RATE] [ONLY]
//!
//! ONLY (a substring of a cheat's name, or "honest") runs that row alone.
//!
//! Per cheat: the share of rounds in which an audit found it out (the false accuser: in which
//! it accused), the round of the first such audit (mean over seeds; the audit runs once the
//! stage is two rounds further and the job's beacon epoch, 4 after its own, is final), the
//! virtual seconds from the start to the first verdict on the last ledger to apply one, and
//! on how many seeds every ledger slashed it; for honest runs, the verdicts applied anywhere
//! (must be 0). Epochs at the default 10 s; no offline stake.

use std::time::Duration;

use neuroshard_node::events::NodeEvent;
use neuroshard_sim::{
    Cheat, EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model,
};

const WORKER: usize = 1;
const AUDITOR: usize = 4;

fn run(seed: u64, steps: u64, per_million: u32, cheat: Option<(usize, Cheat)>) -> Sim {
    let mut s = settings(tiny_model(), 3, 2);
    s.steps = steps;
    s.sync.every = 4;
    s.audit.per_million = per_million;
    let factory = Factory::new(s.clone(), EngineKind::Real);
    let cheats = factory.cheats.clone();
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    // Every staked key runs: offline stake would count against finality's quorum.
    sim.set_spare_keys(0);
    for i in 0..6 {
        sim.add_node(i % 3, Duration::from_millis(10 * i as u64));
    }
    if let Some((i, c)) = cheat {
        cheats.lock().unwrap().insert(sim.node_id(i), c);
    }
    sim.run_until(Duration::from_secs(steps * 3 + 60));
    sim
}

/// Virtual seconds from the start to the first verdict on the last ledger to apply one
/// (None: some ledger applied none).
fn slashed_after_s(sim: &Sim) -> Option<f64> {
    let start = neuroshard_sim::UNIX_START_MS;
    let mut last = 0;
    for i in 0..6 {
        let first = sim.events(i).iter().find_map(|e| match e {
            NodeEvent::Ledger {
                kind: Some(k),
                time_ms,
                ..
            } if k.starts_with("verdict") => Some(*time_ms),
            _ => None,
        })?;
        last = last.max(first);
    }
    Some(last.saturating_sub(start) as f64 / 1e3)
}

fn verdicts(sim: &Sim, i: usize) -> usize {
    sim.events(i)
        .iter()
        .filter(
            |e| matches!(e, NodeEvent::Ledger { kind: Some(k), .. } if k.starts_with("verdict")),
        )
        .count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seeds: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(50);
    let steps: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(80);
    let rate: f64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0.05);
    let per_million = (rate * 1e6) as u32;
    let only = args.get(4).cloned().unwrap_or_default();
    println!("{seeds} seeds, {steps} steps (DiLoCo every 4), audit rate {rate}");

    let mut honest_verdicts = 0;
    let mut honest_audits = 0;
    let mut honest_juries = [0usize; 2];
    let honest_seeds = if only.is_empty() || only == "honest" {
        seeds
    } else {
        0
    };
    for seed in 1..=honest_seeds {
        let sim = run(seed, steps, per_million, None);
        honest_verdicts += (0..6).map(|i| verdicts(&sim, i)).sum::<usize>();
        honest_audits += (0..6)
            .flat_map(|i| sim.events(i))
            .filter(|e| matches!(e, NodeEvent::Audit { .. }))
            .count();
        for e in (0..6).flat_map(|i| sim.events(i)) {
            if let NodeEvent::Jury { guilty, .. } = e {
                honest_juries[usize::from(*guilty)] += 1;
            }
        }
    }
    println!(
        "honest: {honest_audits} audits, {honest_verdicts} verdicts applied (any node); juror \
         checks of demands: {} found served, {} found guilty",
        honest_juries[0], honest_juries[1]
    );

    // (what, how, the worker audited, its auditor, who cheats). Nodes 0 and 3 drive.
    for (name, cheat, worker, auditor, offender) in [
        ("noise", Cheat::Noise, WORKER, AUDITOR, WORKER),
        (
            "skips its layers",
            Cheat::PassThrough,
            WORKER,
            AUDITOR,
            WORKER,
        ),
        ("trains on other text (a driver)", Cheat::OtherData, 0, 3, 0),
        (
            "serves no evidence",
            Cheat::RefusesEvidence,
            WORKER,
            AUDITOR,
            WORKER,
        ),
        (
            "offers last round's pseudo-gradient",
            Cheat::StaleOffer,
            WORKER,
            AUDITOR,
            WORKER,
        ),
        (
            "false accuser",
            Cheat::AccusesFalsely,
            WORKER,
            AUDITOR,
            AUDITOR,
        ),
    ] {
        if !name.contains(only.as_str()) || only == "honest" {
            continue;
        }
        let (mut rounds, mut caught_rounds, mut first_sum, mut first_n, mut slashed) =
            (0usize, 0usize, 0u64, 0u64, 0u64);
        let mut after = Vec::new();
        for seed in 1..=seeds {
            let sim = run(seed, steps, per_million, Some((offender, cheat)));
            let worker = sim.node_id(worker).to_string();
            // Rounds the auditor audited anyone in: those the cheater could be caught in.
            let mut audited = std::collections::BTreeSet::new();
            let mut caught = std::collections::BTreeSet::new();
            for e in sim.events(auditor) {
                if let NodeEvent::Audit {
                    worker: w,
                    round,
                    outcome,
                    ..
                } = e
                {
                    audited.insert(*round);
                    if *w == worker && outcome != "passed" {
                        caught.insert(*round);
                    }
                }
            }
            let eligible = audited.last().map_or(0, |r| *r as usize + 1);
            rounds += eligible;
            caught_rounds += caught.len();
            if let Some(r) = caught.first() {
                first_sum += r;
                first_n += 1;
            }
            if (0..6).all(|i| verdicts(&sim, i) > 0) {
                slashed += 1;
            }
            after.extend(slashed_after_s(&sim));
        }
        let share = caught_rounds as f64 / rounds.max(1) as f64;
        let first = if first_n > 0 {
            format!("{:.1}", first_sum as f64 / first_n as f64)
        } else {
            "never".into()
        };
        let after = if after.is_empty() {
            "never".into()
        } else {
            format!("{:.0} s", after.iter().sum::<f64>() / after.len() as f64)
        };
        println!(
            "{name}: {caught_rounds} of {rounds} rounds with an audit that found it out \
             ({share:.2} a round); first in round {first} (mean of {first_n} seeds); every \
             ledger's first verdict {after} into the run (mean); slashed on every ledger in \
             {slashed} of {seeds} seeds"
        );
    }
}
