//! Norm bounds on the tensors peers send a stage: forward activations and output gradients.
//!
//! The codec already refuses non-finite values and values beyond its magnitude limit, but a
//! tensor scaled by 10⁴ passes both. Trained in, an output gradient that large inflates
//! AdamW's second moment, so the stage's steps shrink by that factor until the moment decays
//! (hundreds of steps at β₂ = 0.95), and the stage sends the scaled gradient on to every stage
//! before it. So each kind keeps the norms of the last [`WINDOW`] tensors it took; once it
//! holds [`MIN_SAMPLES`], a tensor above [`CLIP`] × their median is scaled down to that bound
//! (an honest spike still trains, as gradient clipping would let it), and one above
//! [`REFUSE`] × the median is refused and its sender penalised. A sender's share of a stage's
//! traffic is its share of the routing, so while it sends fewer than half of the tensors it
//! cannot move the median far.

use std::collections::VecDeque;

/// Norms remembered per kind.
pub const WINDOW: usize = 64;
/// Tensors taken on trust before the bounds apply.
pub const MIN_SAMPLES: usize = 4;
/// Above this many times the median norm a tensor is scaled down to it.
pub const CLIP: f64 = 8.0;
/// Above this many times the median norm a tensor is refused.
pub const REFUSE: f64 = 64.0;

/// A tensor far above the norms of those before it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind} norm {norm:.3e} is over {REFUSE}× the median of recent ones ({median:.3e})")]
pub struct NormOutlier {
    pub kind: &'static str,
    pub norm: f64,
    pub median: f64,
}

/// What [`NormWindow::admit`] did to a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admitted {
    Within,
    /// Scaled down from `norm` to `bound`.
    Clipped {
        norm: f64,
        bound: f64,
    },
}

/// The recent norms of one kind of tensor a stage takes.
#[derive(Debug)]
pub struct NormWindow {
    kind: &'static str,
    recent: VecDeque<f64>,
}

fn l2(data: &[f32]) -> f64 {
    data.iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt()
}

impl NormWindow {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            recent: VecDeque::with_capacity(WINDOW),
        }
    }

    /// The median of the remembered norms (the upper middle one of an even count).
    pub fn median(&self) -> Option<f64> {
        if self.recent.len() < MIN_SAMPLES {
            return None;
        }
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied()
    }

    /// Judges a finite tensor against the window without changing it: refused above the
    /// refusal bound, otherwise the norm it will have once [`Judged::apply`] scaled it.
    pub fn judge(&self, data: &[f32]) -> Result<Judged, NormOutlier> {
        let norm = l2(data);
        let Some(median) = self.median() else {
            return Ok(Judged { norm, bound: None });
        };
        if norm > REFUSE * median {
            return Err(NormOutlier {
                kind: self.kind,
                norm,
                median,
            });
        }
        let bound = CLIP * median;
        Ok(Judged {
            norm,
            bound: (norm > bound).then_some(bound),
        })
    }

    /// Remembers a judged tensor the stage took. Only taken tensors count: one refused for
    /// another reason, answered busy or repeated would otherwise let a sender pull the median
    /// down at no cost, and every honest tensor would then be refused.
    pub fn remember(&mut self, judged: &Judged) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        // The clipped norm, so that a sender of large tensors walks the median up no faster
        // than the bound allows.
        self.recent.push_back(judged.bound.unwrap_or(judged.norm));
    }

    /// Judges, scales and remembers a tensor taken whatever else holds; a refused tensor
    /// leaves the window as it was.
    pub fn admit(&mut self, data: &mut [f32]) -> Result<Admitted, NormOutlier> {
        let judged = self.judge(data)?;
        let admitted = judged.apply(data);
        self.remember(&judged);
        Ok(admitted)
    }
}

/// A tensor's norm against the window, before the stage takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    norm: f64,
    /// The bound it is scaled down to, when it is above it.
    bound: Option<f64>,
}

impl Judged {
    /// Scales `data` (the tensor judged) down to the bound when it is above it.
    pub fn apply(&self, data: &mut [f32]) -> Admitted {
        let Some(bound) = self.bound else {
            return Admitted::Within;
        };
        let scale = (bound / self.norm) as f32;
        for x in data.iter_mut() {
            *x *= scale;
        }
        Admitted::Clipped {
            norm: self.norm,
            bound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tensor(norm: f32) -> Vec<f32> {
        // Four equal values: L2 norm = 2 × value.
        vec![norm / 2.0; 4]
    }

    #[test]
    fn the_first_tensors_set_the_reference_then_outliers_are_clipped_or_refused() {
        let mut w = NormWindow::new("gradient");
        for n in [1.0, 1.2, 0.8, 1.1] {
            assert_eq!(w.admit(&mut tensor(n)).unwrap(), Admitted::Within);
        }
        assert_eq!(w.admit(&mut tensor(7.0)).unwrap(), Admitted::Within);
        let mut big = tensor(20.0);
        let Admitted::Clipped { bound, .. } = w.admit(&mut big).unwrap() else {
            panic!("not clipped");
        };
        assert!((l2(&big) - bound).abs() < 1e-4 * bound);
        let before = w.recent.clone();
        let err = w.admit(&mut tensor(1e4)).unwrap_err();
        assert_eq!(err.kind, "gradient");
        assert_eq!(w.recent, before, "a refused tensor is not remembered");
    }

    #[test]
    fn a_minority_of_huge_tensors_does_not_move_the_median() {
        let mut w = NormWindow::new("activations");
        for _ in 0..8 {
            w.admit(&mut tensor(1.0)).unwrap();
        }
        for (i, n) in [1e6, 20.0, 9.0].iter().cycle().take(300).enumerate() {
            let mut huge = tensor(*n);
            if w.admit(&mut huge).is_ok() {
                assert!(l2(&huge) <= CLIP * 1.0 + 1e-3, "{i}: {}", l2(&huge));
            }
            for _ in 0..4 {
                assert_eq!(w.admit(&mut tensor(1.0)).unwrap(), Admitted::Within);
            }
        }
        assert!((w.median().unwrap() - 1.0).abs() < 1e-6);
    }

    proptest! {
        /// Whatever arrives, what is admitted is within CLIP × the median it was judged by.
        #[test]
        fn admitted_tensors_are_within_the_bound(norms in proptest::collection::vec(1e-3f32..1e6, 1..100)) {
            let mut w = NormWindow::new("x");
            for n in norms {
                let median = w.median();
                let mut t = tensor(n);
                if w.admit(&mut t).is_ok() && let Some(m) = median {
                    prop_assert!(l2(&t) <= CLIP * m * (1.0 + 1e-5));
                }
            }
        }
    }
}
