//! The target architecture and the upgrade rule.
//!
//! **Memory rule.** A node holds one pipeline stage: its weights, gradient, AdamW moments and
//! DiLoCo state (`bytes_per_param` per parameter, 28 by default: f32 weights, gradient, two
//! moments, θ₀, outer momentum and the pseudo-gradient buffer) plus a fixed overhead for
//! activations and the runtime. A shape of P parameters fits with S stages when at least
//! S · `replicas` trusted nodes announce ⌈P / S⌉ · `bytes_per_param` + overhead or more, with
//! 1 ≤ S ≤ layers. Stages are assumed balanced by parameter count (the stage holding the
//! embedding holds fewer blocks).
//!
//! **Compute rule** (Chinchilla, ~20 tokens per parameter). The trusted throughput F over the
//! horizon H at utilisation u trains D = F·H·u / (6P) tokens; the shape is capped where
//! D = `tokens_per_param` · P, i.e. 6 · `tokens_per_param` · P² ≤ F·H·u. The largest model the
//! network can hold is not the best one it can train in reasonable time.
//!
//! **Target**: the shape of most parameters that passes both rules, among the ladder
//! ([`crate::shape::WIDTHS`] × [`crate::shape::depth_range`]) or, with
//! [`Candidates::Depth`], among the current shape at other depths (only depth growth is exact
//! today).
//!
//! **Upgrade rule**: evaluated when the number of joins is a positive multiple of
//! `every_joins` (50 by default); the target is searched among shapes of at most
//! `max_growth_pct` (200 by default) percent of the current parameters — growth steps above
//! ~2× lose to training from scratch (G_stack, arXiv:2405.15319) — and taken only when it has
//! at least `min_gain_pct` (30 by default) percent more parameters than the current model.

use serde::{Deserialize, Serialize};

use crate::claims::Capacity;
use crate::error::GrowthError;
use crate::shape::{Shape, WIDTHS, depth_range};

/// Which shapes the scaler may propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Candidates {
    /// Any rung of the ladder (width and depth).
    Ladder,
    /// The current shape at any depth up to `max_layers` (what exact growth can reach).
    Depth { max_layers: u64 },
}

/// The scaler's settings; every node of a network must use the same (they belong in the
/// genesis).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalerConfig {
    pub bytes_per_param: u64,
    /// Per node, for activations and the runtime.
    pub node_overhead_bytes: u64,
    /// Replicas every stage must have (3 tolerate one Byzantine replica).
    pub replicas: u64,
    pub tokens_per_param: u64,
    /// Seconds over which the compute rule counts throughput.
    pub horizon_s: u64,
    /// Share of announced throughput that becomes training, in percent.
    pub utilization_pct: u64,
    pub candidates: Candidates,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        Self {
            bytes_per_param: 28,
            node_overhead_bytes: 512 << 20,
            replicas: 3,
            tokens_per_param: 20,
            horizon_s: 30 * 24 * 3600,
            utilization_pct: 40,
            candidates: Candidates::Ladder,
        }
    }
}

impl ScalerConfig {
    pub fn validate(&self) -> Result<(), GrowthError> {
        let positive = [
            ("bytes_per_param", self.bytes_per_param),
            ("replicas", self.replicas),
            ("tokens_per_param", self.tokens_per_param),
            ("horizon_s", self.horizon_s),
            ("utilization_pct", self.utilization_pct),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(GrowthError::Config(format!("{name} must be positive")));
        }
        if self.utilization_pct > 100 {
            return Err(GrowthError::Config("utilization_pct is at most 100".into()));
        }
        if let Candidates::Depth { max_layers: 0 } = self.candidates {
            return Err(GrowthError::Config("max_layers must be positive".into()));
        }
        Ok(())
    }
}

/// A shape that fits, with its size and the stages it splits into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub shape: Shape,
    pub params: u64,
    /// Fewest stages that fit.
    pub stages: u64,
    /// Bytes one node of a stage needs.
    pub stage_bytes: u64,
}

/// Bytes a node holding one of `stages` stages of `params` parameters needs.
pub fn stage_bytes(params: u64, stages: u64, config: &ScalerConfig) -> Option<u64> {
    params
        .div_ceil(stages)
        .checked_mul(config.bytes_per_param)?
        .checked_add(config.node_overhead_bytes)
}

/// The fewest stages with which `shape` fits the trusted memory, if any.
pub fn fits_memory(shape: &Shape, capacity: &Capacity, config: &ScalerConfig) -> Option<Target> {
    let params = shape.params()?;
    let most = shape
        .layers
        .min(capacity.memory.len() as u64 / config.replicas);
    (1..=most).find_map(|stages| {
        let bytes = stage_bytes(params, stages, config)?;
        (capacity.nodes_with(bytes) >= stages.checked_mul(config.replicas)?).then_some(Target {
            shape: *shape,
            params,
            stages,
            stage_bytes: bytes,
        })
    })
}

/// Whether `params` respects the compute rule: 6 · tokens_per_param · P² ≤ F · H · u.
pub fn within_compute(params: u64, capacity: &Capacity, config: &ScalerConfig) -> bool {
    let p = u128::from(params);
    let need = p
        .checked_mul(p)
        .and_then(|p2| p2.checked_mul(6 * u128::from(config.tokens_per_param)));
    let budget = capacity
        .flops_per_s
        .checked_mul(u128::from(config.horizon_s))
        .and_then(|b| b.checked_mul(u128::from(config.utilization_pct)))
        .map(|b| b / 100);
    match (need, budget) {
        (Some(need), Some(budget)) => need <= budget,
        // An overflowing need is beyond any budget; an overflowing budget (over 10^38 FLOP)
        // covers any need that did not overflow.
        (None, _) => false,
        (Some(_), None) => true,
    }
}

/// The largest shape (by parameters) that fits both rules; `None` if not even the smallest
/// candidate does. `current` gives the vocabulary (and, for [`Candidates::Depth`], the width).
pub fn target(current: &Shape, capacity: &Capacity, config: &ScalerConfig) -> Option<Target> {
    target_within(current, capacity, config, u64::MAX)
}

/// [`target`] among shapes of at most `ceiling` parameters.
pub fn target_within(
    current: &Shape,
    capacity: &Capacity,
    config: &ScalerConfig,
    ceiling: u64,
) -> Option<Target> {
    let shapes: Vec<Shape> = match config.candidates {
        Candidates::Ladder => WIDTHS
            .iter()
            .flat_map(|&d| depth_range(d).map(move |l| Shape::ladder(d, l, current.vocab)))
            .collect(),
        Candidates::Depth { max_layers } => (1..=max_layers)
            .map(|layers| Shape { layers, ..*current })
            .collect(),
    };
    shapes
        .iter()
        .filter(|s| s.validate().is_ok() && s.params().is_some_and(|p| p <= ceiling))
        .filter_map(|s| fits_memory(s, capacity, config))
        .filter(|t| within_compute(t.params, capacity, config))
        // Most parameters; among equals the narrower (then shallower) shape, so the choice is
        // a total order and every node picks the same.
        .max_by_key(|t| {
            (
                t.params,
                std::cmp::Reverse(t.shape.d_model),
                std::cmp::Reverse(t.shape.layers),
            )
        })
}

/// When the network evaluates the scaler, and how large a step must be to be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRule {
    pub every_joins: u64,
    pub min_gain_pct: u64,
    /// Largest target, in percent of the current parameters.
    pub max_growth_pct: u64,
}

impl Default for UpgradeRule {
    fn default() -> Self {
        Self {
            every_joins: 50,
            min_gain_pct: 30,
            max_growth_pct: 200,
        }
    }
}

/// What the rule says after a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not an evaluation point (joins not a positive multiple of `every_joins`).
    NotDue,
    /// Evaluated; the target (if any fits) is not enough larger.
    Keep { target: Option<Target> },
    /// Evaluated; move to this shape.
    Upgrade(Target),
}

/// The upgrade rule after `joins` joins in total.
pub fn decide(
    current: &Shape,
    joins: u64,
    capacity: &Capacity,
    config: &ScalerConfig,
    rule: &UpgradeRule,
) -> Result<Decision, GrowthError> {
    config.validate()?;
    if rule.every_joins == 0 {
        return Err(GrowthError::Config("every_joins must be positive".into()));
    }
    if u128::from(rule.max_growth_pct) < 100 + u128::from(rule.min_gain_pct) {
        return Err(GrowthError::Config(format!(
            "max_growth_pct {} leaves no room for a gain of {}%",
            rule.max_growth_pct, rule.min_gain_pct
        )));
    }
    current.validate()?;
    if joins == 0 || !joins.is_multiple_of(rule.every_joins) {
        return Ok(Decision::NotDue);
    }
    let now = u128::from(current.params().unwrap_or(u64::MAX));
    let ceiling = u64::try_from(now * u128::from(rule.max_growth_pct) / 100).unwrap_or(u64::MAX);
    let found = target_within(current, capacity, config, ceiling);
    Ok(match found {
        Some(t)
            if now
                .checked_mul(100 + u128::from(rule.min_gain_pct))
                .is_some_and(|need| u128::from(t.params) * 100 >= need) =>
        {
            Decision::Upgrade(t)
        }
        _ => Decision::Keep { target: found },
    })
}
