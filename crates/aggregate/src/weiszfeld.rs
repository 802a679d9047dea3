//! Distance-weighted aggregators: smoothed geometric median (Weiszfeld) and centered clipping.

use rayon::prelude::*;

use crate::distance::{check_lengths, check_reference, find_non_finite, sq_dists_to};
use crate::{AggregateError, CHUNK, coord};

/// Smoothed Weiszfeld iteration for the geometric median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeometricMedian {
    /// Distances below ν count as ν, so an input sitting on the estimate cannot take all weight.
    pub nu: f64,
    pub max_iter: usize,
    /// Stop once the estimate moves less than `tol` × its norm.
    pub tol: f64,
}

impl Default for GeometricMedian {
    fn default() -> Self {
        Self {
            nu: 1e-6,
            max_iter: 100,
            tol: 1e-6,
        }
    }
}

/// Centered clipping (Karimireddy et al., 2021): starting from a reference v, repeat
/// v ← v + mean_i(clip_τ(x_i − v)), where clip_τ scales a vector down to norm at most τ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CenteredClipping {
    /// Clipping radius; `None` uses the median distance of the inputs to the reference, which
    /// adapts to the scale of the updates.
    pub tau: Option<f64>,
    pub iters: usize,
}

impl Default for CenteredClipping {
    fn default() -> Self {
        Self {
            tau: None,
            iters: 3,
        }
    }
}

/// Per-input distances to `center`, reporting non-finite inputs by peer.
fn dists_to<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    center: &[f32],
) -> Result<Vec<f64>, AggregateError> {
    let d2 = sq_dists_to(inputs, center);
    if d2.iter().any(|d| !d.is_finite()) {
        find_non_finite(inputs)?;
    }
    Ok(d2.into_iter().map(f64::sqrt).collect())
}

/// Writes `out[j] = base[j] + Σ_i w_i (x_i[j] − base[j])` (with `base = 0` when absent) and
/// returns ‖out − prev‖ and ‖out‖, both reduced in chunk order.
fn weighted_update<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    weights: &[f64],
    base: Option<&[f32]>,
    prev: &[f32],
) -> (Vec<f32>, f64, f64) {
    let mut out = vec![0.0f32; prev.len()];
    let partials: Vec<(f64, f64)> = out
        .par_chunks_mut(CHUNK)
        .enumerate()
        .map(|(c, out)| {
            let start = c * CHUNK;
            let end = start + out.len();
            let mut acc = vec![0.0f64; out.len()];
            if let Some(base) = base {
                for (a, b) in acc.iter_mut().zip(&base[start..end]) {
                    *a = f64::from(*b);
                }
            }
            for (v, &w) in inputs.iter().zip(weights) {
                let x = &v.as_ref()[start..end];
                match base {
                    Some(base) => {
                        for ((a, x), b) in acc.iter_mut().zip(x).zip(&base[start..end]) {
                            *a += w * (f64::from(*x) - f64::from(*b));
                        }
                    }
                    None => {
                        for (a, x) in acc.iter_mut().zip(x) {
                            *a += w * f64::from(*x);
                        }
                    }
                }
            }
            let (mut moved, mut norm) = (0.0f64, 0.0f64);
            for ((o, a), p) in out.iter_mut().zip(&acc).zip(&prev[start..end]) {
                *o = *a as f32;
                moved += (f64::from(*o) - f64::from(*p)).powi(2);
                norm += f64::from(*o).powi(2);
            }
            (moved, norm)
        })
        .collect();
    let (moved, norm) = partials
        .iter()
        .fold((0.0, 0.0), |(m, n), (pm, pn)| (m + pm, n + pn));
    (out, moved.sqrt(), norm.sqrt())
}

/// Geometric median by smoothed Weiszfeld iterations, started at the mean:
/// z ← Σ_i w_i x_i / Σ_i w_i with w_i = 1 / max(‖x_i − z‖, ν).
pub fn geometric_median<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    config: &GeometricMedian,
) -> Result<Vec<f32>, AggregateError> {
    if config.nu.is_nan() || config.nu <= 0.0 {
        return Err(AggregateError::InvalidParameter {
            name: "nu",
            value: config.nu,
            reason: "must be > 0",
        });
    }
    if config.tol.is_nan() || config.tol < 0.0 {
        return Err(AggregateError::InvalidParameter {
            name: "tol",
            value: config.tol,
            reason: "must be >= 0",
        });
    }
    let mut z = coord::mean(inputs)?;
    for _ in 0..config.max_iter {
        let dists = dists_to(inputs, &z)?;
        let raw: Vec<f64> = dists.iter().map(|d| 1.0 / d.max(config.nu)).collect();
        let total: f64 = raw.iter().sum();
        let weights: Vec<f64> = raw.iter().map(|w| w / total).collect();
        let (next, moved, norm) = weighted_update(inputs, &weights, None, &z);
        z = next;
        if moved <= config.tol * norm {
            break;
        }
    }
    Ok(z)
}

/// Centered clipping around `reference` (zeros when absent).
pub fn centered_clipping<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    reference: Option<&[f32]>,
    config: &CenteredClipping,
) -> Result<Vec<f32>, AggregateError> {
    let len = check_lengths(inputs)?;
    if let Some(tau) = config.tau
        && !(tau > 0.0 && tau.is_finite())
    {
        return Err(AggregateError::InvalidParameter {
            name: "tau",
            value: tau,
            reason: "must be finite and > 0",
        });
    }
    let mut v = match reference {
        Some(r) => {
            check_reference(r, len)?;
            r.to_vec()
        }
        None => vec![0.0f32; len],
    };
    let n = inputs.len() as f64;
    let mut tau = config.tau;
    for _ in 0..config.iters {
        let dists = dists_to(inputs, &v)?;
        let radius = *tau.get_or_insert_with(|| {
            let mut sorted = dists.clone();
            sorted.sort_unstable_by(f64::total_cmp);
            let mid = sorted.len() / 2;
            if sorted.len() % 2 == 1 {
                sorted[mid]
            } else {
                (sorted[mid - 1] + sorted[mid]) / 2.0
            }
        });
        let weights: Vec<f64> = dists
            .iter()
            .map(|&d| if d > radius { radius / d / n } else { 1.0 / n })
            .collect();
        let (next, _, _) = weighted_update(inputs, &weights, Some(&v), &v);
        v = next;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometric_median_resists_outlier() {
        // Three points at the corners of a small triangle plus one far away: the geometric
        // median stays near the triangle, the mean does not.
        let v = vec![
            vec![0.0f32, 0.0],
            vec![1.0, 0.0],
            vec![0.0, 1.0],
            vec![1000.0, 1000.0],
        ];
        let gm = geometric_median(&v, &GeometricMedian::default()).unwrap();
        assert!(gm[0] < 1.0 && gm[1] < 1.0, "{gm:?}");
        let same = vec![vec![2.5f32, -1.0]; 5];
        assert_eq!(
            geometric_median(&same, &GeometricMedian::default()).unwrap(),
            vec![2.5, -1.0]
        );
    }

    #[test]
    fn geometric_median_of_collinear_points_is_middle() {
        let v: Vec<Vec<f32>> = [0.0f32, 1.0, 2.0, 10.0, 50.0]
            .iter()
            .map(|&x| vec![x])
            .collect();
        let cfg = GeometricMedian {
            nu: 1e-9,
            max_iter: 2000,
            tol: 1e-12,
        };
        let gm = geometric_median(&v, &cfg).unwrap();
        assert!((gm[0] - 2.0).abs() < 1e-3, "{gm:?}");
    }

    #[test]
    fn centered_clipping_by_hand() {
        // Reference 0, τ = 1: (3, 4) has norm 5 → clipped to (0.6, 0.8); (0.5, 0) is kept.
        let v = vec![vec![3.0f32, 4.0], vec![0.5, 0.0]];
        let cfg = CenteredClipping {
            tau: Some(1.0),
            iters: 1,
        };
        let out = centered_clipping(&v, None, &cfg).unwrap();
        assert!(
            (out[0] - 0.55).abs() < 1e-6 && (out[1] - 0.4).abs() < 1e-6,
            "{out:?}"
        );
        // A large τ makes one iteration equal to the mean.
        let wide = CenteredClipping {
            tau: Some(1e9),
            iters: 1,
        };
        assert_eq!(centered_clipping(&v, None, &wide).unwrap(), vec![1.75, 2.0]);
    }

    #[test]
    fn centered_clipping_checks_reference_and_inputs() {
        let v = vec![vec![1.0f32; 3], vec![1.0; 3]];
        let cfg = CenteredClipping::default();
        assert_eq!(
            centered_clipping(&v, Some(&[0.0; 2]), &cfg),
            Err(AggregateError::ReferenceLength {
                len: 2,
                expected: 3
            })
        );
        let bad = vec![vec![1.0f32; 3], vec![1.0, f32::INFINITY, 1.0]];
        assert!(matches!(
            centered_clipping(&bad, None, &cfg),
            Err(AggregateError::NonFinite {
                peer: 1,
                index: 1,
                ..
            })
        ));
        assert!(geometric_median(&bad, &GeometricMedian::default()).is_err());
    }

    #[test]
    fn distance_rules_do_not_depend_on_thread_count() {
        let inputs: Vec<Vec<f32>> = (0..7)
            .map(|p| {
                (0..3 * CHUNK + 5)
                    .map(|i| ((i * (p + 2)) as f32 * 0.01).sin())
                    .collect()
            })
            .collect();
        let run = || {
            (
                geometric_median(
                    &inputs,
                    &GeometricMedian {
                        nu: 1e-6,
                        max_iter: 5,
                        tol: 0.0,
                    },
                ),
                centered_clipping(&inputs, None, &CenteredClipping::default()),
                crate::krum::multi_krum(&inputs, 2, 3),
            )
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let pool3 = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        assert_eq!(pool.install(run), pool3.install(run));
    }
}
