//! Krum and Multi-Krum (Blanchard et al., 2017): pick the input(s) closest to their neighbours.

use crate::distance::{check_lengths, chunked_sums, find_non_finite, sq_dist};
use crate::{AggregateError, coord};

/// All pairwise squared distances as an n × n symmetric matrix (row-major), computed in one pass
/// over the coordinates.
fn pairwise_sq_dists<V: AsRef<[f32]> + Sync>(inputs: &[V]) -> Result<Vec<f64>, AggregateError> {
    let len = check_lengths(inputs)?;
    let n = inputs.len();
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    let sums = chunked_sums(len, pairs.len(), |s, e, out| {
        for (o, &(i, j)) in out.iter_mut().zip(&pairs) {
            *o += sq_dist(&inputs[i].as_ref()[s..e], &inputs[j].as_ref()[s..e]);
        }
    });
    if sums.iter().any(|d| !d.is_finite()) {
        find_non_finite(inputs)?;
    }
    let mut matrix = vec![0.0f64; n * n];
    for (&(i, j), &d) in pairs.iter().zip(&sums) {
        matrix[i * n + j] = d;
        matrix[j * n + i] = d;
    }
    Ok(matrix)
}

/// Krum score of every input: the sum of its n − f − 2 smallest squared distances to the
/// others. Requires n ≥ 2f + 3 so that honest inputs always have an honest neighbourhood.
pub fn krum_scores<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    f: usize,
) -> Result<Vec<f64>, AggregateError> {
    let n = inputs.len();
    if n < 2 * f + 3 {
        return Err(AggregateError::KrumTooFew { n, f });
    }
    let matrix = pairwise_sq_dists(inputs)?;
    let neighbours = n - f - 2;
    let mut row = Vec::with_capacity(n - 1);
    Ok((0..n)
        .map(|i| {
            row.clear();
            row.extend((0..n).filter(|&j| j != i).map(|j| matrix[i * n + j]));
            row.sort_unstable_by(f64::total_cmp);
            row[..neighbours].iter().sum()
        })
        .collect())
}

/// Indices of the m lowest scores, ties broken by the lower index.
fn best(scores: &[f64], m: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order.truncate(m);
    order
}

/// Krum: the single input with the lowest score.
pub fn krum<V: AsRef<[f32]> + Sync>(inputs: &[V], f: usize) -> Result<Vec<f32>, AggregateError> {
    let scores = krum_scores(inputs, f)?;
    let chosen = best(&scores, 1)[0];
    Ok(inputs[chosen].as_ref().to_vec())
}

/// Multi-Krum: the mean of the m inputs with the lowest scores.
pub fn multi_krum<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    f: usize,
    m: usize,
) -> Result<Vec<f32>, AggregateError> {
    let n = inputs.len();
    if m == 0 || m > n {
        return Err(AggregateError::MultiKrumSelection { m, n });
    }
    let scores = krum_scores(inputs, f)?;
    let mut chosen = best(&scores, m);
    // Mean in ascending peer order so the result does not depend on score ties.
    chosen.sort_unstable();
    let selected: Vec<&[f32]> = chosen.iter().map(|&i| inputs[i].as_ref()).collect();
    coord::mean(&selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_by_hand() {
        // 1-D points 0, 1, 2, 3, 100 with f = 1: each score sums n - f - 2 = 2 smallest sq. dists.
        let v: Vec<Vec<f32>> = [0.0f32, 1.0, 2.0, 3.0, 100.0]
            .iter()
            .map(|&x| vec![x])
            .collect();
        let s = krum_scores(&v, 1).unwrap();
        assert_eq!(s[..4], [1.0 + 4.0, 1.0 + 1.0, 1.0 + 1.0, 1.0 + 4.0]);
        assert_eq!(s[4], 97.0f64.powi(2) + 98.0f64.powi(2));
        // Tie between peers 1 and 2: the lower index wins.
        assert_eq!(krum(&v, 1).unwrap(), vec![1.0]);
        assert_eq!(multi_krum(&v, 1, 4).unwrap(), vec![1.5]);
    }

    #[test]
    fn rejects_too_few_and_bad_m() {
        let v = vec![vec![0.0f32; 3]; 4];
        assert_eq!(krum(&v, 1), Err(AggregateError::KrumTooFew { n: 4, f: 1 }));
        assert!(krum(&v, 0).is_ok());
        assert_eq!(
            multi_krum(&v, 0, 5),
            Err(AggregateError::MultiKrumSelection { m: 5, n: 4 })
        );
    }

    #[test]
    fn ignores_huge_outlier_and_names_nan() {
        let mut v = vec![vec![1.0f32; 40]; 6];
        v[5] = vec![3e38f32; 40];
        assert_eq!(krum(&v, 1).unwrap(), vec![1.0f32; 40]);
        v[3][17] = f32::NAN;
        assert!(matches!(
            krum(&v, 1),
            Err(AggregateError::NonFinite {
                peer: 3,
                index: 17,
                ..
            })
        ));
    }
}
