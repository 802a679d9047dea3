//! AdamW with linear warmup, cosine decay and global-norm clipping, on plain `f32` buffers.
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
    /// Step at which the cosine reaches `min_lr_ratio · lr`; constant after it.
    pub total_steps: u64,
    pub min_lr_ratio: f64,
    /// Clip the global gradient norm to this value (None: no clipping).
    pub clip_norm: Option<f64>,
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
        }
    }
}

impl AdamWConfig {
    /// Learning rate for the (0-based) step: linear warmup then cosine decay.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
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
