//! Properties of the scaler: deterministic, monotone in memory, never beyond the memory the
//! trusted nodes announce nor the compute rule, consistent with the model crate's parameter
//! count, and unmoved by a few Sybil keys announcing huge numbers.

use neuroshard_growth::claims::{Capacity, Claim, ClaimLimits, tolerated};
use neuroshard_growth::scaler::{self, Candidates, Decision, ScalerConfig, UpgradeRule};
use neuroshard_growth::shape::{Shape, WIDTHS, depth_range};
use neuroshard_model::ModelConfig;
use proptest::prelude::*;

const GIB: u64 = 1 << 30;
const TFLOPS: u64 = 1_000_000_000_000;

fn claim(id: u16, memory_bytes: u64, flops_per_s: u64) -> Claim {
    let mut node = [0u8; 32];
    node[..2].copy_from_slice(&id.to_le_bytes());
    Claim {
        node,
        memory_bytes,
        flops_per_s,
    }
}

fn count(claims: &[Claim]) -> Capacity {
    Capacity::count(claims, |_| true, &ClaimLimits::default())
}

fn start() -> Shape {
    Shape::ladder(256, 4, 4096)
}

/// Claims with memory from a few hundred MiB to beyond any cap, throughput to 50 TFLOP/s.
fn claims() -> impl Strategy<Value = Vec<Claim>> {
    prop::collection::vec(
        (
            prop_oneof![0u64..64 * GIB, 0u64..(4 << 40), Just(u64::MAX)],
            0u64..50 * TFLOPS,
        ),
        0..40,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (m, f))| claim(i as u16, m, f))
            .collect()
    })
}

fn configs() -> impl Strategy<Value = ScalerConfig> {
    (1u64..5, 0u64..3, any::<bool>(), 1u64..2_000_000).prop_map(|(r, o, depth, h)| ScalerConfig {
        replicas: r,
        node_overhead_bytes: o * (256 << 20),
        horizon_s: h * 60,
        candidates: if depth {
            Candidates::Depth { max_layers: 96 }
        } else {
            Candidates::Ladder
        },
        ..Default::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn deterministic_and_independent_of_claim_order(c in claims(), cfg in configs()) {
        let a = scaler::target(&start(), &count(&c), &cfg);
        let mut rev = c.clone();
        rev.reverse();
        prop_assert_eq!(a, scaler::target(&start(), &count(&rev), &cfg));
    }

    #[test]
    fn monotone_in_memory(c in claims(), cfg in configs(), who in any::<prop::sample::Index>(),
                          more in 0u64..(1 << 40)) {
        prop_assume!(!c.is_empty());
        let before = scaler::target(&start(), &count(&c), &cfg).map_or(0, |t| t.params);
        let mut richer = c.clone();
        let i = who.index(c.len());
        richer[i].memory_bytes = richer[i].memory_bytes.saturating_add(more);
        let after = scaler::target(&start(), &count(&richer), &cfg).map_or(0, |t| t.params);
        prop_assert!(after >= before, "{} < {}", after, before);
    }

    #[test]
    fn never_exceeds_memory_or_the_compute_cap(c in claims(), cfg in configs()) {
        let cap = count(&c);
        if let Some(t) = scaler::target(&start(), &cap, &cfg) {
            // S · R distinct registered nodes whose (capped) claims hold a stage each.
            let limits = ClaimLimits::default();
            let holders = c.iter()
                .filter(|x| x.memory_bytes.min(limits.node_memory_cap) >= t.stage_bytes)
                .count() as u64;
            prop_assert!(holders >= t.stages * cfg.replicas);
            prop_assert!(t.stages >= 1 && t.stages <= t.shape.layers);
            let per_node = t.params.div_ceil(t.stages) * cfg.bytes_per_param;
            prop_assert!(per_node + cfg.node_overhead_bytes <= t.stage_bytes);
            // Compute: 6 · 20 · P² ≤ F · H · u, in exact integers.
            let p = u128::from(t.params);
            let budget = cap.flops_per_s * u128::from(cfg.horizon_s)
                * u128::from(cfg.utilization_pct) / 100;
            prop_assert!(6 * u128::from(cfg.tokens_per_param) * p * p <= budget);
        }
    }

    /// k ≤ f registered Sybils announcing anything cannot produce a target that the honest
    /// nodes alone cannot hold: every stage's R replicas exist among honest nodes.
    #[test]
    fn sybils_cannot_force_a_target_honest_memory_cannot_hold(
        honest in prop::collection::vec(1u64..32, 4..30),
        lie in prop_oneof![Just(u64::MAX), 32u64 * GIB..(1 << 50)],
        frac in 0u64..=100,
        cfg in configs(),
    ) {
        let n_honest = honest.len() as u64;
        // Largest k with k ≤ ⌊(n_honest + k − 1)/3⌋.
        let most = (0..=n_honest).filter(|&k| k <= tolerated(n_honest + k)).max().unwrap();
        let k = most * frac / 100;
        let mut c: Vec<Claim> = honest.iter().enumerate()
            .map(|(i, &g)| claim(i as u16, g * GIB, TFLOPS)).collect();
        c.extend((0..k).map(|j| claim(1000 + j as u16, lie, u64::MAX)));
        if let Some(t) = scaler::target(&start(), &count(&c), &cfg) {
            let honest_holders = honest.iter().filter(|&&g| g * GIB >= t.stage_bytes).count() as u64;
            prop_assert!(honest_holders >= t.stages * cfg.replicas,
                "{} honest holders for {} stages × {}", honest_holders, t.stages, cfg.replicas);
            let p = u128::from(t.params);
            let honest_budget = u128::from(n_honest * TFLOPS) * u128::from(cfg.horizon_s)
                * u128::from(cfg.utilization_pct) / 100;
            prop_assert!(6 * u128::from(cfg.tokens_per_param) * p * p <= honest_budget);
        }
    }
}

#[test]
fn parameter_counts_match_the_model_crate() {
    for d in WIDTHS {
        for layers in [*depth_range(d).start(), *depth_range(d).end()] {
            let s = Shape::ladder(d, layers, 50_000);
            if s.validate().is_err() {
                continue;
            }
            let config = ModelConfig {
                layers: layers as usize,
                d_model: d as usize,
                heads: s.heads as usize,
                kv_heads: s.kv_heads as usize,
                ffn: s.ffn as usize,
                vocab: 50_000,
                max_seq: 2048,
                tie_embeddings: false,
                rope_theta: 10_000.0,
                norm_eps: 1e-6,
            };
            config.validate().unwrap();
            assert_eq!(s.params().unwrap(), config.num_params() as u64, "{s:?}");
        }
    }
}

/// 40 honest home nodes of 16 GiB; three registered Sybils announce 4 PiB and 10^19 FLOP/s.
/// They are capped, then dropped as the largest claims: the lie buys exactly what three
/// ordinary nodes would have (each key still costs a registration's stake), nothing more.
#[test]
fn three_sybils_announcing_petabytes_change_nothing() {
    let honest: Vec<Claim> = (0..40).map(|i| claim(i, 16 * GIB, 20 * TFLOPS)).collect();
    let mut attacked = honest.clone();
    attacked.extend((0..3).map(|j| claim(500 + j, 4 << 50, 10_000_000_000_000_000_000)));
    let cfg = ScalerConfig::default();
    let mut ordinary = honest.clone();
    ordinary.extend((0..3).map(|j| claim(500 + j, 16 * GIB, 20 * TFLOPS)));
    let clean = scaler::target(&start(), &count(&ordinary), &cfg).unwrap();
    let dirty = scaler::target(&start(), &count(&attacked), &cfg).unwrap();
    assert_eq!(dirty, clean);
    assert!(dirty.stage_bytes <= 16 * GIB);
    // Unregistered keys count for nothing at all.
    let unregistered = Capacity::count(
        &attacked,
        |n| n[1] == 0 && n[0] < 40,
        &ClaimLimits::default(),
    );
    assert_eq!(unregistered, count(&honest));
}

/// The upgrade rule: evaluated only every K joins, taken only for ≥ 30% more parameters.
#[test]
fn upgrades_follow_the_joins_and_the_gain_threshold() {
    let cfg = ScalerConfig {
        candidates: Candidates::Depth { max_layers: 64 },
        ..Default::default()
    };
    let rule = UpgradeRule {
        every_joins: 10,
        min_gain_pct: 30,
        max_growth_pct: 200,
    };
    // Nodes of 1 GiB: a stage of the 256-wide model holds a few layers.
    let nodes = |n: u16| -> Capacity {
        count(
            &(0..n)
                .map(|i| claim(i, GIB, 5 * TFLOPS))
                .collect::<Vec<_>>(),
        )
    };
    let mut current = start();
    let mut trace = Vec::new();
    for joins in 1..=120u64 {
        match scaler::decide(&current, joins, &nodes(joins as u16), &cfg, &rule).unwrap() {
            Decision::NotDue => assert!(!joins.is_multiple_of(10)),
            Decision::Keep { target } => {
                assert!(joins.is_multiple_of(10));
                if let Some(t) = target {
                    assert!(t.params * 100 < current.params().unwrap() * 130);
                }
            }
            Decision::Upgrade(t) => {
                assert!(joins.is_multiple_of(10));
                assert!(t.params * 100 >= current.params().unwrap() * 130);
                assert!(
                    t.params <= current.params().unwrap() * 2,
                    "at most 2× a step"
                );
                assert_eq!((t.shape.d_model, t.shape.vocab), (256, 4096));
                trace.push((joins, current.layers, t.shape.layers));
                current = t.shape;
            }
        }
    }
    assert!(trace.len() >= 2, "{trace:?}");
    assert!(trace.windows(2).all(|w| w[0].2 < w[1].2));
    assert!(scaler::decide(&current, 0, &nodes(5), &cfg, &rule).unwrap() == Decision::NotDue);
    let zero = UpgradeRule {
        every_joins: 0,
        ..rule
    };
    assert!(scaler::decide(&current, 10, &nodes(5), &cfg, &zero).is_err());
}
