//! A per-input norm bound applied before a robust rule: no single input may be longer than a
//! multiple of the round's median input norm.
//!
//! Relative, not absolute: honest pseudo-gradients shrink as training converges and scale with
//! the learning rate and H, so any fixed bound is either loose late or clips honest inputs
//! early. The lower median of the norms is at most the largest honest norm whenever the
//! Byzantine inputs are no more than ⌈(n − 1)/2⌉ (for two inputs, one liar: the bound is a
//! multiple of the honest norm), so a scaled input cannot raise its own bound. Clipped, not
//! refused: the input keeps its direction and its sender stays a contributor, so refusing
//! cannot be turned into a way of dropping honest replicas that simply trained more.

use rayon::prelude::*;

use crate::{AggregateError, CHUNK};

/// An input that was shortened.
#[derive(Debug, Clone, PartialEq)]
pub struct Clipped {
    /// Index of the input.
    pub index: usize,
    /// Its L2 norm before clipping.
    pub norm: f64,
    /// The norm it was clipped to.
    pub bound: f64,
}

/// L2 norm, summed per fixed chunk in f64 and the chunks added in order (thread-independent).
pub fn l2_norm(v: &[f32]) -> f64 {
    v.par_chunks(CHUNK)
        .map(|c| c.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>())
        .collect::<Vec<f64>>()
        .iter()
        .sum::<f64>()
        .sqrt()
}

/// Clips every input whose L2 norm exceeds `multiple` × the lower median of the inputs' norms
/// down to that bound, and returns which were clipped. `multiple` must be finite and ≥ 1 (a
/// smaller one would clip the median input itself); inputs must be finite.
pub fn clip_to_median_norm(
    inputs: &mut [Vec<f32>],
    multiple: f64,
) -> Result<Vec<Clipped>, AggregateError> {
    if !(multiple.is_finite() && multiple >= 1.0) {
        return Err(AggregateError::InvalidParameter {
            name: "norm bound",
            value: multiple,
            reason: "must be a finite multiple of at least 1",
        });
    }
    if inputs.is_empty() {
        return Err(AggregateError::Empty);
    }
    for (peer, v) in inputs.iter().enumerate() {
        if let Some(index) = v.iter().position(|x| !x.is_finite()) {
            let value = v[index];
            return Err(AggregateError::NonFinite { peer, index, value });
        }
    }
    let norms: Vec<f64> = inputs.iter().map(|v| l2_norm(v)).collect();
    let mut sorted = norms.clone();
    sorted.sort_by(f64::total_cmp);
    let bound = sorted[(sorted.len() - 1) / 2] * multiple;
    let mut clipped = Vec::new();
    for (index, (v, &norm)) in inputs.iter_mut().zip(&norms).enumerate() {
        if norm > bound {
            let scale = if norm > 0.0 { bound / norm } else { 0.0 };
            v.par_chunks_mut(CHUNK).for_each(|c| {
                for x in c {
                    *x = (f64::from(*x) * scale) as f32;
                }
            });
            clipped.push(Clipped { index, norm, bound });
        }
    }
    Ok(clipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaled_input_is_clipped_to_a_multiple_of_the_median_norm() {
        let mut inputs = vec![vec![3.0f32, 4.0], vec![-3e6, -4e6], vec![0.0, 5.0]];
        let clipped = clip_to_median_norm(&mut inputs, 2.0).unwrap();
        // Norms 5, 5e6, 5: median 5, bound 10.
        assert_eq!(clipped.len(), 1);
        assert_eq!(clipped[0].index, 1);
        assert_eq!(clipped[0].bound, 10.0);
        assert!((l2_norm(&inputs[1]) - 10.0).abs() < 1e-4);
        assert_eq!(inputs[1], vec![-6.0, -8.0]);
        // The others are untouched.
        assert_eq!(inputs[0], vec![3.0, 4.0]);
        assert_eq!(inputs[2], vec![0.0, 5.0]);
    }

    #[test]
    fn with_two_inputs_the_longer_is_bounded_by_the_shorter() {
        let mut inputs = vec![vec![1e6f32; 4], vec![1.0; 4]];
        clip_to_median_norm(&mut inputs, 3.0).unwrap();
        assert!((l2_norm(&inputs[0]) - 6.0).abs() < 1e-4);
        // Equal norms: nothing to clip.
        let mut equal = vec![vec![1.0f32, 0.0], vec![0.0, -1.0]];
        assert!(clip_to_median_norm(&mut equal, 1.0).unwrap().is_empty());
    }

    #[test]
    fn bad_multiples_and_empty_rounds_are_refused() {
        for m in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(clip_to_median_norm(&mut [vec![1.0]], m).is_err(), "{m}");
        }
        assert_eq!(
            clip_to_median_norm(&mut [], 2.0),
            Err(AggregateError::Empty)
        );
        // All-zero inputs: the bound is 0 and nothing is longer than it.
        let mut zeros = vec![vec![0.0f32; 3]; 3];
        assert!(clip_to_median_norm(&mut zeros, 2.0).unwrap().is_empty());
    }
}
