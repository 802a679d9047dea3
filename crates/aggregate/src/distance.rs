//! Input validation and deterministic chunked reductions shared by the aggregators.

use rayon::prelude::*;

use crate::{AggregateError, CHUNK};

/// Checks that there is at least one input and all have the same length; returns that length.
pub(crate) fn check_lengths<V: AsRef<[f32]>>(inputs: &[V]) -> Result<usize, AggregateError> {
    let expected = inputs.first().ok_or(AggregateError::Empty)?.as_ref().len();
    for (peer, v) in inputs.iter().enumerate() {
        let len = v.as_ref().len();
        if len != expected {
            return Err(AggregateError::LengthMismatch {
                peer,
                len,
                expected,
            });
        }
    }
    Ok(expected)
}

/// Finds the first non-finite value (lowest peer, then lowest index). Aggregators detect
/// non-finite input cheaply inside their main pass and call this only to name the culprit.
pub(crate) fn find_non_finite<V: AsRef<[f32]> + Sync>(inputs: &[V]) -> Result<(), AggregateError> {
    for (peer, v) in inputs.iter().enumerate() {
        let v = v.as_ref();
        let hit = v
            .par_chunks(CHUNK)
            .enumerate()
            .filter_map(|(c, chunk)| {
                chunk
                    .iter()
                    .position(|x| !x.is_finite())
                    .map(|p| c * CHUNK + p)
            })
            .min();
        if let Some(index) = hit {
            return Err(AggregateError::NonFinite {
                peer,
                index,
                value: v[index],
            });
        }
    }
    Ok(())
}

pub(crate) fn check_reference(reference: &[f32], expected: usize) -> Result<(), AggregateError> {
    if reference.len() != expected {
        return Err(AggregateError::ReferenceLength {
            len: reference.len(),
            expected,
        });
    }
    match reference.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(AggregateError::ReferenceNonFinite { index }),
        None => Ok(()),
    }
}

/// Sums `outputs` partial values over all coordinate chunks of `0..len`, in chunk order.
/// `f(start, end, partial)` adds the contribution of coordinates `start..end` into `partial`.
pub(crate) fn chunked_sums<F>(len: usize, outputs: usize, f: F) -> Vec<f64>
where
    F: Fn(usize, usize, &mut [f64]) + Sync,
{
    let chunks = len.div_ceil(CHUNK);
    let partials: Vec<Vec<f64>> = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let mut partial = vec![0.0f64; outputs];
            f(c * CHUNK, ((c + 1) * CHUNK).min(len), &mut partial);
            partial
        })
        .collect();
    let mut total = vec![0.0f64; outputs];
    for partial in &partials {
        for (t, p) in total.iter_mut().zip(partial) {
            *t += p;
        }
    }
    total
}

/// Squared Euclidean distance of two equal-length slices, accumulated in 16 f32 lanes (so the
/// compiler can vectorise) and finished in f64. The lane order is fixed, hence deterministic.
pub(crate) fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let mut ac = a.chunks_exact(LANES);
    let mut bc = b.chunks_exact(LANES);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for l in 0..LANES {
            let d = x[l] - y[l];
            acc[l] += d * d;
        }
    }
    let mut total: f64 = acc.iter().map(|&v| f64::from(v)).sum();
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        let d = f64::from(*x) - f64::from(*y);
        total += d * d;
    }
    if total.is_finite() {
        total
    } else {
        // Huge but finite values overflow f32 squares; f64 holds them. Non-finite inputs stay
        // non-finite here and are reported by the caller.
        a.iter()
            .zip(b)
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum()
    }
}

/// Squared distances of every input to `center`, one f64 per input.
pub(crate) fn sq_dists_to<V: AsRef<[f32]> + Sync>(inputs: &[V], center: &[f32]) -> Vec<f64> {
    chunked_sums(center.len(), inputs.len(), |s, e, out| {
        for (o, v) in out.iter_mut().zip(inputs) {
            *o += sq_dist(&v.as_ref()[s..e], &center[s..e]);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(inputs: &[Vec<f32>]) -> Result<usize, AggregateError> {
        let len = check_lengths(inputs)?;
        find_non_finite(inputs)?;
        Ok(len)
    }

    #[test]
    fn lengths_and_non_finite_are_named() {
        let a = [1.0f32; 5];
        let b = [1.0f32; 4];
        assert_eq!(
            check_lengths(&[&a[..], &b[..]]),
            Err(AggregateError::LengthMismatch {
                peer: 1,
                len: 4,
                expected: 5
            })
        );
        let mut c = vec![0.0f32; CHUNK * 3];
        c[CHUNK * 2 + 7] = f32::INFINITY;
        c[CHUNK * 2 + 9] = f32::NAN;
        let err = validate(&[vec![0.0f32; CHUNK * 3], c]).unwrap_err();
        assert!(
            matches!(err, AggregateError::NonFinite { peer: 1, index, .. } if index == CHUNK * 2 + 7)
        );
        assert_eq!(validate(&[]), Err(AggregateError::Empty));
    }

    #[test]
    fn sq_dist_matches_naive() {
        let a: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum();
        assert!((sq_dist(&a, &b) - naive).abs() < 1e-4 * naive);
    }
}
