//! AdamW with linear warmup, a learning-rate schedule (cosine, constant or warmup–stable–decay)
//! and global-norm clipping, on plain `f32` buffers.
//!
//! Done outside the engine on purpose: the update is elementwise (so bitwise identical for any
//! thread count), the state is plain vectors that checkpoints and DiLoCo can carry, and weight
//! decay can skip norm gains without a second optimizer.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::params::ParamSet;

/// Hyper-parameters of the inner optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Peak learning rate.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay (matrices only; never norm gains).
    pub weight_decay: f64,
    /// Linear warmup length in steps.
    pub warmup_steps: u64,
    /// Step at which the cosine reaches `min_lr_ratio · lr`; constant after it. Read only by
    /// [`LrSchedule::Cosine`].
    pub total_steps: u64,
    /// Floor of every decay, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Clip the global gradient norm to this value (None: no clipping).
    pub clip_norm: Option<f64>,
    /// Shape after the warmup. Absent in configs written before it existed, which were cosine.
    #[serde(default)]
    pub schedule: LrSchedule,
}

/// What the learning rate does after the linear warmup.
///
/// Serialised as `{"kind": "cosine"}`, `{"kind": "constant"}` or
/// `{"kind": "wsd", "decay_start": 5000, "decay_steps": 1000}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    /// Cosine from `lr` to `min_lr_ratio · lr` at `total_steps`: needs the run's length.
    #[default]
    Cosine,
    /// `lr` forever: for runs that do not know their end.
    Constant,
    /// Warmup–stable–decay: `lr` until `decay_start`, then linear to `min_lr_ratio · lr` over
    /// `decay_steps`, constant after. `decay_start: None` is the stable phase of a run whose end
    /// is not decided yet; set it (e.g. with [`LrSchedule::start_decay`]) once it is.
    Wsd {
        #[serde(default)]
        decay_start: Option<u64>,
        decay_steps: u64,
    },
}

impl LrSchedule {
    /// Schedules the decay of a run that did not know its end: a constant schedule or a WSD
    /// still in its stable phase becomes `Wsd { decay_start: Some(step), decay_steps }`.
    /// Returns false and changes nothing for a cosine, whose end is already set, or a WSD whose
    /// decay is already scheduled (so a repeated trigger cannot restart the decay).
    pub fn start_decay(&mut self, step: u64, decay_steps: u64) -> bool {
        match self {
            LrSchedule::Constant
            | LrSchedule::Wsd {
                decay_start: None, ..
            } => {
                *self = LrSchedule::Wsd {
                    decay_start: Some(step),
                    decay_steps,
                };
                true
            }
            LrSchedule::Cosine
            | LrSchedule::Wsd {
                decay_start: Some(_),
                ..
            } => false,
        }
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            warmup_steps: 20,
            total_steps: 1000,
            min_lr_ratio: 0.1,
            clip_norm: Some(1.0),
            schedule: LrSchedule::Cosine,
        }
    }
}

/// Tokens the second moment should remember: 1 − β₂ = tokens per step / this. On Shakespeare
/// (seq 128, 983k tokens) one process learned best at β₂ 0.975 with 8 rows a step (−1.1%
/// against 0.95) and two DiLoCo replicas of 4 rows at 0.99 (+1.3% against that one process,
/// +3.2% at 0.95): in both the average of g² spans about 40k tokens. A replica that steps on a
/// share of the batch estimates g² from fewer tokens, so it needs the longer memory
/// (crates/node/README.md, "Replicas that share one process's batch").
pub const BETA2_MEMORY_TOKENS: f64 = 40_960.0;
/// β₂ stays within these: large batches keep the usual 0.95 (LLaMA, GPT-3), and small ones
/// at most 0.99. A longer memory is a target: at 0.999 an attacker who moves θ₀ makes the
/// gradients outgrow a second moment that remembers 1,000 steps, and the steps it scales blow
/// up (in the simulator's ByzFL runs, two scaling Sybils among five replicas took the loss
/// from 0.41 to 1.82; within 5% at 0.99 and 0.95).
pub const BETA2_RANGE: (f64, f64) = (0.95, 0.99);

/// A β₂ that no AdamW can run: at 1 the second moment's bias correction divides by zero and
/// every weight becomes NaN at the first step.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("must be in [0, 1), not {0}")]
pub struct Beta2Error(pub f64);

impl AdamWConfig {
    /// The second-moment decay for steps of `rows` rows of `seq` tokens (see
    /// [`BETA2_MEMORY_TOKENS`]); the result is always inside [`BETA2_RANGE`].
    pub fn beta2_for(rows: usize, seq: usize) -> f64 {
        let tokens = rows as f64 * seq as f64;
        (1.0 - tokens / BETA2_MEMORY_TOKENS).clamp(BETA2_RANGE.0, BETA2_RANGE.1)
    }

    /// The β₂ a user set, checked, or else [`Self::beta2_for`] `rows` rows of `seq` tokens.
    pub fn beta2_or_rule(set: Option<f64>, rows: usize, seq: usize) -> Result<f64, Beta2Error> {
        match set {
            Some(b) if (0.0..1.0).contains(&b) => Ok(b),
            Some(b) => Err(Beta2Error(b)),
            None => Ok(Self::beta2_for(rows, seq)),
        }
    }

    /// Learning rate for the (0-based) step: linear warmup, then the [`LrSchedule`].
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            LrSchedule::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
            }
            LrSchedule::Constant
            | LrSchedule::Wsd {
                decay_start: None, ..
            } => self.lr,
            LrSchedule::Wsd {
                decay_start: Some(start),
                decay_steps,
            } => {
                // A decay set to start inside the warmup begins where the warmup ends, so the
                // rate never jumps above the warmup line.
                let start = start.max(self.warmup_steps);
                if step < start {
                    return self.lr;
                }
                let progress = if decay_steps == 0 {
                    1.0
                } else {
                    ((step - start) as f64 / decay_steps as f64).min(1.0)
                };
                self.lr * (1.0 - (1.0 - self.min_lr_ratio) * progress)
            }
        }
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub clipped: bool,
}

/// AdamW state: first and second moments per parameter tensor and the step counter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    pub config: AdamWConfig,
    step: u64,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Elements per parallel task: fixed so the work split never depends on the thread count.
const CHUNK: usize = 1 << 14;

/// Σ x² in f64 over 4 interleaved lanes, then the lanes in order: a fixed order that does not
/// serialise on one accumulator. NaN or ±∞ anywhere makes the sum non-finite.
fn sum_of_squares(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut chunks = xs.chunks_exact(4);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f64::from(x) * f64::from(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f64::from(x) * f64::from(x);
    }
    acc.iter().sum()
}

impl AdamW {
    pub fn new(config: AdamWConfig, params: &ParamSet) -> Self {
        let zeros = || params.values().iter().map(|v| vec![0.0; v.len()]).collect();
        Self {
            config,
            step: 0,
            m: zeros(),
            v: zeros(),
        }
    }

    /// Restores saved moments; shapes must match `params`.
    pub fn from_state(
        config: AdamWConfig,
        params: &ParamSet,
        step: u64,
        m: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    ) -> Result<Self, ModelError> {
        for (what, state) in [("first moment", &m), ("second moment", &v)] {
            if state.len() != params.values().len() {
                return Err(ModelError::Checkpoint(format!(
                    "optimizer {what}: {} tensors for {} parameters",
                    state.len(),
                    params.values().len()
                )));
            }
            for (s, spec) in state.iter().zip(params.specs()) {
                if s.len() != spec.numel() {
                    return Err(ModelError::Checkpoint(format!(
                        "optimizer {what} of {}: {} values, expected {}",
                        spec.name,
                        s.len(),
                        spec.numel()
                    )));
                }
            }
        }
        Ok(Self { config, step, m, v })
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn moments(&self) -> (&[Vec<f32>], &[Vec<f32>]) {
        (&self.m, &self.v)
    }

    /// Applies one update. Gradients with NaN/Inf are rejected and nothing changes.
    pub fn step(
        &mut self,
        params: &mut ParamSet,
        grads: &[Vec<f32>],
    ) -> Result<StepStats, ModelError> {
        if grads.len() != params.values().len() {
            return Err(ModelError::Input(format!(
                "{} gradient tensors for {} parameters",
                grads.len(),
                params.values().len()
            )));
        }
        let mut sum_sq = 0.0f64;
        for (g, spec) in grads.iter().zip(params.specs()) {
            if g.len() != spec.numel() {
                return Err(ModelError::Input(format!(
                    "gradient of {} has {} values, expected {}",
                    spec.name,
                    g.len(),
                    spec.numel()
                )));
            }
            // Chunk sums in parallel, combined in chunk order: the same bits on any thread count.
            let partial: Vec<f64> = g.par_chunks(CHUNK).map(sum_of_squares).collect();
            let total = partial.iter().sum::<f64>();
            if !total.is_finite() {
                let (i, x) = g
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !x.is_finite())
                    .map_or((0, f32::NAN), |(i, x)| (i, *x));
                return Err(ModelError::Input(format!(
                    "gradient of {} is not finite at index {i} ({x})",
                    spec.name
                )));
            }
            sum_sq += total;
        }
        let grad_norm = sum_sq.sqrt();
        let scale = match self.config.clip_norm {
            Some(max) if grad_norm > max => max / (grad_norm + 1e-6),
            _ => 1.0,
        };
        let lr = self.config.lr_at(self.step);
        self.step += 1;
        let t = self.step as i32;
        let c = &self.config;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
        let step_size = (lr / bc1) as f32;
        let bc2_sqrt = bc2.sqrt() as f32;
        let scale = scale as f32;
        let specs = params.specs().to_vec();
        for (i, p) in params.values_mut().iter_mut().enumerate() {
            let decay = if specs[i].kind.decays() {
                (1.0 - lr * c.weight_decay) as f32
            } else {
                1.0
            };
            p.par_chunks_mut(CHUNK)
                .zip(self.m[i].par_chunks_mut(CHUNK))
                .zip(self.v[i].par_chunks_mut(CHUNK))
                .zip(grads[i].par_chunks(CHUNK))
                .for_each(|(((p, m), v), g)| {
                    // Zipped, not indexed: no bounds checks, so the loop vectorises.
                    for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
                        let g = g * scale;
                        *m = b1 * *m + (1.0 - b1) * g;
                        *v = b2 * *v + (1.0 - b2) * g * g;
                        let denom = v.sqrt() / bc2_sqrt + eps;
                        *p = *p * decay - step_size * *m / denom;
                    }
                });
        }
        Ok(StepStats {
            lr,
            grad_norm,
            clipped: scale < 1.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::params::StageSpec;

    #[test]
    fn beta2_remembers_the_same_tokens_at_any_batch_within_its_range() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // The measured points: 8 rows of 128 tokens, and a replica's share of them.
        assert!(close(AdamWConfig::beta2_for(8, 128), 0.975));
        assert!(close(AdamWConfig::beta2_for(4, 128), 0.9875));
        // Fewer tokens stop at the ceiling: 2 rows would be 0.99375.
        assert!(close(AdamWConfig::beta2_for(2, 128), 0.99));
        assert!(close(AdamWConfig::beta2_for(4, 256), 0.975));
        // Large batches keep the usual value.
        assert!(close(AdamWConfig::beta2_for(64, 128), 0.95));
        assert!(close(AdamWConfig::beta2_for(usize::MAX, usize::MAX), 0.95));
        assert!(close(AdamWConfig::beta2_for(1, 1), 0.99));
        assert!(close(AdamWConfig::beta2_for(0, 128), 0.99));
        // A set value is kept unless no AdamW can run it.
        assert_eq!(AdamWConfig::beta2_or_rule(Some(0.9), 8, 128), Ok(0.9));
        assert!(close(
            AdamWConfig::beta2_or_rule(None, 8, 128).unwrap(),
            0.975
        ));
        for bad in [1.0, 1.5, -0.1, f64::INFINITY] {
            assert_eq!(
                AdamWConfig::beta2_or_rule(Some(bad), 8, 128),
                Err(Beta2Error(bad))
            );
        }
        assert!(AdamWConfig::beta2_or_rule(Some(f64::NAN), 8, 128).is_err());
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let c = AdamWConfig {
            lr: 1.0,
            warmup_steps: 10,
            total_steps: 110,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        assert!((c.lr_at(0) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(9) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(60) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(110) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(500) - 0.1).abs() < 1e-12);
    }

    fn assert_monotone_warmup(c: &AdamWConfig) {
        let mut last = 0.0;
        for step in 0..c.warmup_steps {
            let lr = c.lr_at(step);
            assert!(lr > last && lr <= c.lr, "step {step}: {lr} after {last}");
            last = lr;
        }
        assert_eq!(c.lr_at(c.warmup_steps.saturating_sub(1)), c.lr);
    }

    #[test]
    fn cosine_with_zero_or_tiny_totals_stays_finite() {
        for (warmup, total) in [(0, 0), (0, 1), (5, 0), (5, 3), (5, 5)] {
            let c = AdamWConfig {
                lr: 1.0,
                warmup_steps: warmup,
                total_steps: total,
                ..Default::default()
            };
            for step in 0..20 {
                let lr = c.lr_at(step);
                assert!(
                    lr.is_finite() && lr > 0.0 && lr <= 1.0,
                    "{warmup}/{total}@{step}: {lr}"
                );
            }
        }
    }

    #[test]
    fn constant_schedule_warms_up_then_holds_the_peak_forever() {
        let c = AdamWConfig {
            lr: 2e-3,
            warmup_steps: 10,
            total_steps: 0,
            schedule: LrSchedule::Constant,
            ..Default::default()
        };
        assert_monotone_warmup(&c);
        assert!((c.lr_at(0) - 2e-4).abs() < 1e-15);
        for step in [10, 11, 1_000, 1 << 40, u64::MAX] {
            assert_eq!(c.lr_at(step), 2e-3, "step {step}");
        }
        let no_warmup = AdamWConfig {
            warmup_steps: 0,
            ..c
        };
        assert_eq!(no_warmup.lr_at(0), 2e-3);
    }

    #[test]
    fn wsd_is_stable_until_its_decay_is_scheduled_then_decays_linearly() {
        let mut c = AdamWConfig {
            lr: 1.0,
            warmup_steps: 10,
            total_steps: 0,
            min_lr_ratio: 0.1,
            schedule: LrSchedule::Wsd {
                decay_start: None,
                decay_steps: 100,
            },
            ..Default::default()
        };
        assert_monotone_warmup(&c);
        assert_eq!(c.lr_at(5_000), 1.0);
        assert!(c.schedule.start_decay(1_000, 100));
        // A second trigger must not move a decay already under way.
        assert!(!c.schedule.start_decay(2_000, 5));
        assert_eq!(c.lr_at(999), 1.0);
        assert_eq!(c.lr_at(1_000), 1.0);
        assert!((c.lr_at(1_050) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(1_100) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(u64::MAX) - 0.1).abs() < 1e-12);
        let mut last = f64::INFINITY;
        for step in 1_000..1_200 {
            let lr = c.lr_at(step);
            assert!(lr <= last && lr >= 0.1 - 1e-12, "step {step}: {lr}");
            last = lr;
        }
    }

    #[test]
    fn wsd_edge_cases_never_divide_by_zero_or_exceed_the_warmup() {
        let c = AdamWConfig {
            lr: 1.0,
            warmup_steps: 10,
            min_lr_ratio: 0.1,
            schedule: LrSchedule::Wsd {
                decay_start: Some(3),
                decay_steps: 0,
            },
            ..Default::default()
        };
        // Decay asked for inside the warmup: the warmup runs out, then the floor at once.
        assert_monotone_warmup(&c);
        assert!((c.lr_at(10) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(11) - 0.1).abs() < 1e-12);
        let mut constant = LrSchedule::Constant;
        assert!(constant.start_decay(0, 0));
        let c = AdamWConfig {
            warmup_steps: 0,
            schedule: constant,
            ..c
        };
        assert!((c.lr_at(0) - 0.1).abs() < 1e-12);
        let mut cosine = LrSchedule::Cosine;
        assert!(!cosine.start_decay(5, 5));
        assert_eq!(cosine, LrSchedule::Cosine);
    }

    #[test]
    fn configs_without_a_schedule_load_as_cosine_and_schedules_round_trip() {
        let old = r#"{"lr":0.001,"beta1":0.9,"beta2":0.95,"eps":1e-8,"weight_decay":0.1,
            "warmup_steps":20,"total_steps":1000,"min_lr_ratio":0.1,"clip_norm":1.0}"#;
        let c: AdamWConfig = serde_json::from_str(old).unwrap();
        assert_eq!(c, AdamWConfig::default());
        for schedule in [
            LrSchedule::Cosine,
            LrSchedule::Constant,
            LrSchedule::Wsd {
                decay_start: None,
                decay_steps: 7,
            },
            LrSchedule::Wsd {
                decay_start: Some(3),
                decay_steps: 7,
            },
        ] {
            let c = AdamWConfig {
                schedule,
                ..Default::default()
            };
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(
                serde_json::from_str::<AdamWConfig>(&json).unwrap(),
                c,
                "{json}"
            );
        }
        let wsd: LrSchedule = serde_json::from_str(r#"{"kind":"wsd","decay_steps":4}"#).unwrap();
        assert_eq!(
            wsd,
            LrSchedule::Wsd {
                decay_start: None,
                decay_steps: 4
            }
        );
    }

    #[test]
    fn first_step_matches_hand_computation_and_skips_decay_on_norms() {
        let cfg = ModelConfig::tiny(16);
        let mut params = ParamSet::init(StageSpec::full(&cfg).param_specs(&cfg), 0);
        let before = params.clone();
        let grads: Vec<Vec<f32>> = params.values().iter().map(|v| vec![0.5; v.len()]).collect();
        let config = AdamWConfig {
            lr: 0.01,
            warmup_steps: 0,
            clip_norm: None,
            ..Default::default()
        };
        let mut opt = AdamW::new(config, &params);
        opt.step(&mut params, &grads).unwrap();
        // Step 1: m̂ = g, v̂ = g², update = lr · g / (|g| + eps) ≈ lr.
        for (spec, (a, b)) in params
            .specs()
            .iter()
            .zip(params.values().iter().zip(before.values()))
        {
            let decay = if spec.kind.decays() {
                1.0 - 0.01 * 0.1
            } else {
                1.0
            };
            let want = b[0] * decay - 0.01 * 0.5 / (0.5 + 1e-8);
            assert!(
                (a[0] - want).abs() < 1e-6,
                "{}: {} vs {want}",
                spec.name,
                a[0]
            );
        }
    }

    #[test]
    fn rejects_nan_gradient_without_changing_anything() {
        let cfg = ModelConfig::tiny(16);
        let mut params = ParamSet::init(StageSpec::full(&cfg).param_specs(&cfg), 0);
        let before = params.clone();
        let mut grads: Vec<Vec<f32>> = params.values().iter().map(|v| vec![0.1; v.len()]).collect();
        grads[2][5] = f32::NAN;
        let mut opt = AdamW::new(AdamWConfig::default(), &params);
        let err = opt.step(&mut params, &grads).unwrap_err().to_string();
        assert!(err.contains("not finite"), "{err}");
        assert_eq!(params, before);
        assert_eq!(opt.step_count(), 0);
    }

    #[test]
    fn clipping_bounds_the_update_direction_norm() {
        let cfg = ModelConfig::tiny(16);
        let mut params = ParamSet::init(StageSpec::full(&cfg).param_specs(&cfg), 0);
        let grads: Vec<Vec<f32>> = params
            .values()
            .iter()
            .map(|v| vec![10.0; v.len()])
            .collect();
        let mut opt = AdamW::new(AdamWConfig::default(), &params);
        let stats = opt.step(&mut params, &grads).unwrap();
        assert!(stats.clipped);
        assert!(stats.grad_norm > 1.0);
    }
}
