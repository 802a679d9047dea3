//! `neuroshard scale`: the scaler's size table and the upgrades its rule predicts as nodes join.

use anyhow::{Result, bail};
use clap::Args;
use neuroshard_growth::claims::{Capacity, Claim, ClaimLimits};
use neuroshard_growth::scaler::{self, Candidates, Decision, ScalerConfig, UpgradeRule};
use neuroshard_growth::shape::Shape;

#[derive(Args)]
pub struct ScaleArgs {
    /// Print parameters, training memory and Chinchilla tokens of representative ladder rungs
    /// instead of a join trace.
    #[arg(long)]
    table: bool,
    /// Vocabulary of the model.
    #[arg(long, default_value_t = 4096)]
    vocab: u64,
    /// Starting depth and width (the ladder's shape of that width).
    #[arg(long, default_value_t = 4)]
    layers: u64,
    #[arg(long, default_value_t = 256)]
    d_model: u64,
    /// Nodes that join, one at a time.
    #[arg(long, default_value_t = 120)]
    joins: u64,
    /// Memory each joining node announces, GiB; a list is used in turn (e.g. 8,16,24).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    memory_gib: Vec<u64>,
    /// Throughput each joining node announces, TFLOP/s.
    #[arg(long, default_value_t = 2)]
    tflops: u64,
    /// Registered Sybil keys among the joiners (every 10th joiner until used), each
    /// announcing this much memory (GiB) and 10^19 FLOP/s.
    #[arg(long, default_value_t = 0)]
    sybils: u64,
    #[arg(long, default_value_t = 1 << 30)]
    sybil_memory_gib: u64,
    /// Evaluate the rule after every K joins.
    #[arg(long, default_value_t = 50)]
    every: u64,
    /// Upgrade only for at least this many percent more parameters.
    #[arg(long, default_value_t = 30)]
    min_gain: u64,
    /// Target at most this many percent of the current parameters.
    #[arg(long, default_value_t = 200)]
    max_growth: u64,
    /// Deepest model the depth-only scaler proposes.
    #[arg(long, default_value_t = 64)]
    max_layers: u64,
    #[arg(long, default_value_t = 3)]
    replicas: u64,
    /// Horizon of the compute rule, days.
    #[arg(long, default_value_t = 30)]
    horizon_days: u64,
    /// Propose any ladder shape, not only the current shape at other depths (only depth and
    /// MLP growth are exact; a new d_model would start from scratch).
    #[arg(long)]
    ladder: bool,
}

fn show(shape: &Shape) -> String {
    format!(
        "{}×{} (heads {}, ffn {})",
        shape.layers, shape.d_model, shape.heads, shape.ffn
    )
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

pub fn run(args: ScaleArgs) -> Result<()> {
    let config = ScalerConfig {
        replicas: args.replicas,
        horizon_s: args.horizon_days.saturating_mul(86_400),
        candidates: if args.ladder {
            Candidates::Ladder
        } else {
            Candidates::Depth {
                max_layers: args.max_layers,
            }
        },
        ..Default::default()
    };
    config.validate()?;
    if args.table {
        println!(
            "| layers × d_model | heads | ffn | parameters | training memory (28 B/param) | 20 tokens/param |"
        );
        println!("|---|---|---|---|---|---|");
        for (l, d) in [
            (4, 256),
            (8, 512),
            (16, 1024),
            (24, 2048),
            (32, 4096),
            (48, 5120),
            (64, 7168),
            (80, 8192),
            (120, 16384),
        ] {
            let s = Shape::ladder(d, l, args.vocab);
            let p = s.params().unwrap_or(u64::MAX);
            println!(
                "| {l} × {d} | {} | {} | {} | {:.1} GiB | {} |",
                s.heads,
                s.ffn,
                human(p),
                (u128::from(p) * u128::from(config.bytes_per_param)) as f64 / f64::from(1u32 << 30),
                human(p.saturating_mul(config.tokens_per_param)),
            );
        }
        return Ok(());
    }
    if args.memory_gib.is_empty() || args.every == 0 {
        bail!("--memory-gib needs a value and --every must be positive");
    }
    let rule = UpgradeRule {
        every_joins: args.every,
        min_gain_pct: args.min_gain,
        max_growth_pct: args.max_growth,
    };
    let mut current = Shape::ladder(args.d_model, args.layers, args.vocab);
    current.validate()?;
    let mut claims = Vec::new();
    let mut sybils_left = args.sybils;
    for joins in 1..=args.joins {
        let mut node = [0u8; 32];
        node[..8].copy_from_slice(&joins.to_le_bytes());
        let sybil = sybils_left > 0 && joins % 10 == 0;
        sybils_left -= u64::from(sybil);
        let claim = if sybil {
            Claim {
                node,
                memory_bytes: args.sybil_memory_gib.saturating_mul(1 << 30),
                flops_per_s: 10_000_000_000_000_000_000,
            }
        } else {
            let gib = args.memory_gib[(joins as usize - 1) % args.memory_gib.len()];
            Claim {
                node,
                memory_bytes: gib.saturating_mul(1 << 30),
                flops_per_s: args.tflops.saturating_mul(1_000_000_000_000),
            }
        };
        claims.push(claim);
        let capacity = Capacity::count(&claims, |_| true, &ClaimLimits::default());
        let decision = scaler::decide(&current, joins, &capacity, &config, &rule)?;
        let target = match &decision {
            Decision::NotDue => continue,
            Decision::Keep { target } => *target,
            Decision::Upgrade(t) => Some(*t),
        };
        println!(
            "joins {joins:>4}: {} nodes counted, {} trusted; {} ({}) → target {}{}",
            capacity.nodes,
            capacity.memory.len(),
            show(&current),
            human(current.params().unwrap_or(0)),
            target.map_or("none fits".into(), |t| format!(
                "{} ({}, {} stage(s) × {} replicas, {:.1} GiB a node)",
                show(&t.shape),
                human(t.params),
                t.stages,
                args.replicas,
                t.stage_bytes as f64 / (1u64 << 30) as f64
            )),
            match decision {
                Decision::Upgrade(_) => ": UPGRADE",
                _ => ": keep",
            }
        );
        if let Decision::Upgrade(t) = decision {
            current = t.shape;
        }
    }
    Ok(())
}
