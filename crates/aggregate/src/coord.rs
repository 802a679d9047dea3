//! Coordinate-wise aggregators: mean, trimmed mean, median and clipped mean.

use rayon::prelude::*;

use crate::distance::{check_lengths, find_non_finite};
use crate::{AggregateError, CHUNK};

/// Coordinates sorted together: n rows of `BLOCK` f32 stay in L1 for n up to ~32.
const BLOCK: usize = 256;

/// Comparators (i, j), i < j, of Batcher's odd–even merge sort for n inputs (any n).
pub(crate) fn sorting_network(n: usize) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    let mut p = 1;
    while p < n {
        let mut k = p;
        while k >= 1 {
            let mut j = k % p;
            while j + k < n {
                for i in 0..k.min(n - j - k) {
                    if (i + j) / (2 * p) == (i + j + k) / (2 * p) {
                        pairs.push((i + j, i + j + k));
                    }
                }
                j += 2 * k;
            }
            k /= 2;
        }
        p *= 2;
    }
    pairs
}

/// Sorts every coordinate's n values with a sorting network applied row-wise: the block holds
/// n rows of up to `BLOCK` coordinates and each comparator is an element-wise min/max of two
/// rows, which vectorises, with no per-coordinate branching or allocation. `reduce(rows, b,
/// out)` then turns the sorted rows (row i = i-th smallest) into `out[..b]`. Non-finite inputs
/// are noticed while copying and reported (naming the peer) afterwards.
fn sort_coordinates<V, F>(inputs: &[V], reduce: F) -> Result<Vec<f32>, AggregateError>
where
    V: AsRef<[f32]> + Sync,
    F: Fn(&[f32], usize, &mut [f32]) + Sync,
{
    let len = check_lengths(inputs)?;
    let n = inputs.len();
    let network = sorting_network(n);
    let mut out = vec![0.0f32; len];
    let clean = out
        .par_chunks_mut(CHUNK)
        .enumerate()
        .try_for_each(|(c, out)| {
            let mut rows = vec![0.0f32; n * BLOCK];
            for (blk, out) in out.chunks_mut(BLOCK).enumerate() {
                let start = c * CHUNK + blk * BLOCK;
                let b = out.len();
                for (row, v) in rows.chunks_exact_mut(BLOCK).zip(inputs) {
                    let src = &v.as_ref()[start..start + b];
                    if !src.iter().all(|x| x.is_finite()) {
                        return Err(());
                    }
                    row[..b].copy_from_slice(src);
                }
                for &(i, j) in &network {
                    let (lo, hi) = rows.split_at_mut(j * BLOCK);
                    let (a, z) = (&mut lo[i * BLOCK..i * BLOCK + b], &mut hi[..b]);
                    for (x, y) in a.iter_mut().zip(z.iter_mut()) {
                        let (p, q) = (*x, *y);
                        *x = p.min(q);
                        *y = p.max(q);
                    }
                }
                reduce(&rows, b, out);
            }
            Ok(())
        });
    if clean.is_err() {
        find_non_finite(inputs)?;
    }
    Ok(out)
}

/// Arithmetic mean, accumulated in f64 per coordinate.
pub fn mean<V: AsRef<[f32]> + Sync>(inputs: &[V]) -> Result<Vec<f32>, AggregateError> {
    let len = check_lengths(inputs)?;
    let inv = 1.0 / inputs.len() as f64;
    let mut out = vec![0.0f32; len];
    let clean = out
        .par_chunks_mut(CHUNK)
        .enumerate()
        .try_for_each(|(c, out)| {
            // Sub-blocks keep the f64 accumulators in L1 while the n inputs stream past.
            let mut acc = [0.0f64; BLOCK];
            let mut finite = true;
            for (blk, out) in out.chunks_mut(BLOCK).enumerate() {
                let start = c * CHUNK + blk * BLOCK;
                let acc = &mut acc[..out.len()];
                acc.fill(0.0);
                for v in inputs {
                    for (a, x) in acc.iter_mut().zip(&v.as_ref()[start..start + out.len()]) {
                        *a += f64::from(*x);
                    }
                }
                // A sum of finite f32 values cannot overflow f64, so a non-finite sum means a
                // non-finite input; naming it is left to the slow path below.
                for (o, a) in out.iter_mut().zip(acc.iter()) {
                    finite &= a.is_finite();
                    *o = (a * inv) as f32;
                }
            }
            if finite { Ok(()) } else { Err(()) }
        });
    if clean.is_err() {
        find_non_finite(inputs)?;
    }
    Ok(out)
}

/// Number trimmed from each side: k = max(⌈β·n⌉, f). Errors if nothing would remain (2k ≥ n).
pub fn trim_count(n: usize, beta: f64, f: usize) -> Result<usize, AggregateError> {
    if !(0.0..0.5).contains(&beta) {
        return Err(AggregateError::InvalidParameter {
            name: "beta",
            value: beta,
            reason: "trim fraction must be in [0, 0.5)",
        });
    }
    // The small epsilon keeps exact products such as 0.1 * 10 from rounding up to 2.
    let by_fraction = (beta * n as f64 - 1e-9).ceil().max(0.0) as usize;
    let k = by_fraction.max(f);
    if 2 * k >= n {
        return Err(AggregateError::TrimTooLarge { k, n });
    }
    Ok(k)
}

/// Coordinate-wise trimmed mean: drop the k largest and k smallest values of each coordinate,
/// k = max(⌈β·n⌉, f), and average the rest.
pub fn trimmed_mean<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    beta: f64,
    f: usize,
) -> Result<Vec<f32>, AggregateError> {
    check_lengths(inputs)?;
    let n = inputs.len();
    let k = trim_count(n, beta, f)?;
    let kept = (n - 2 * k) as f64;
    sort_coordinates(inputs, |rows, b, out| {
        let mut acc = [0.0f64; BLOCK];
        for row in rows.chunks_exact(BLOCK).skip(k).take(n - 2 * k) {
            for (a, x) in acc.iter_mut().zip(&row[..b]) {
                *a += f64::from(*x);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = (a / kept) as f32;
        }
    })
}

/// Coordinate-wise median; for even n the mean of the two middle values.
pub fn median<V: AsRef<[f32]> + Sync>(inputs: &[V]) -> Result<Vec<f32>, AggregateError> {
    let n = inputs.len();
    sort_coordinates(inputs, |rows, b, out| {
        let hi = &rows[(n / 2) * BLOCK..(n / 2) * BLOCK + b];
        if n % 2 == 1 {
            out.copy_from_slice(hi);
        } else {
            let lo = &rows[(n / 2 - 1) * BLOCK..(n / 2 - 1) * BLOCK + b];
            for ((o, l), h) in out.iter_mut().zip(lo).zip(hi) {
                *o = ((f64::from(*l) + f64::from(*h)) / 2.0) as f32;
            }
        }
    })
}

/// Coordinate-wise clipped mean: every value is clamped to `median ± c·s` and all n are
/// averaged. Per coordinate, r is the radius about the median that holds n − f of the values
/// (the f farthest left out); `s` is r's root mean square over a block of `BLOCK` coordinates.
/// With at most f outliers the n − f nearest include an honest value at least as far as r, so
/// outliers can neither widen the band beyond the honest spread nor move its centre out of the
/// honest range.
///
/// Why not the trimmed mean: it drops 2f of n values in every coordinate, honest ones too,
/// which at n = 4 halves the inputs averaged and, with stochastically rounded offers (mostly
/// zeros and a few ±scale), biases each coordinate towards its median. Here an honest value
/// inside the band counts in full; an outlier counts with at most `c·s` beyond the median.
///
/// Where n − 2f < 2 (three inputs, f = 1) the n − f nearest values may hold a single honest
/// one, so r is one honest distance and the band c times that: a sign-flipping liar among
/// three replicas clamped there cost +13% in `bench byzantine` (`2x3`, c = 3), where the
/// median (the trimmed mean of three) stays within +2.5% under every attack. Those inputs get
/// the median.
pub fn clipped_mean<V: AsRef<[f32]> + Sync>(
    inputs: &[V],
    c: f64,
    f: usize,
) -> Result<Vec<f32>, AggregateError> {
    if !(c.is_finite() && c > 0.0) {
        return Err(AggregateError::InvalidParameter {
            name: "c",
            value: c,
            reason: "must be finite and > 0",
        });
    }
    check_lengths(inputs)?;
    let n = inputs.len();
    let k = trim_count(n, 0.0, f)?;
    if n - 2 * k < 2 {
        return median(inputs);
    }
    let kept = n - k;
    let inv = 1.0 / n as f64;
    sort_coordinates(inputs, |rows, b, out| {
        let row = |i: usize| &rows[i * BLOCK..i * BLOCK + b];
        let mut med = [0.0f64; BLOCK];
        for ((m, l), h) in med.iter_mut().zip(row((n - 1) / 2)).zip(row(n / 2)) {
            *m = (f64::from(*l) + f64::from(*h)) / 2.0;
        }
        // The n − k values nearest the median are a run of the sorted ones that holds it; the
        // narrowest such run gives r.
        let mut radius = [f64::INFINITY; BLOCK];
        for i in 0..=k {
            for (((r, lo), hi), m) in radius
                .iter_mut()
                .zip(row(i))
                .zip(row(i + kept - 1))
                .zip(&med)
            {
                *r = r.min((m - f64::from(*lo)).max(f64::from(*hi) - m));
            }
        }
        let squares: f64 = radius[..b].iter().map(|r| r * r).sum();
        let band = c * (squares / b as f64).sqrt();
        let mut acc = [0.0f64; BLOCK];
        for i in 0..n {
            for ((a, x), m) in acc.iter_mut().zip(row(i)).zip(&med) {
                *a += f64::from(*x).clamp(m - band, m + band);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = (a * inv) as f32;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_cases_by_hand() {
        let v = [
            vec![1.0f32, 10.0],
            vec![2.0, 20.0],
            vec![3.0, 30.0],
            vec![100.0, -5.0],
        ];
        assert_eq!(mean(&v).unwrap(), vec![26.5, 13.75]);
        assert_eq!(median(&v).unwrap(), vec![2.5, 15.0]);
        // k = max(ceil(0.1 * 4), 1) = 1: coordinate 0 keeps {2, 3}, coordinate 1 keeps {10, 20}.
        assert_eq!(trimmed_mean(&v, 0.1, 1).unwrap(), vec![2.5, 15.0]);
        assert_eq!(median(&v[..3]).unwrap(), vec![2.0, 20.0]);
        // f = 1: the three values nearest the medians 2.5 and 15 lie within r = 1.5 and 15, so
        // s² = (2.25 + 225) / 2 and c = 1 clamps 100 to 2.5 + s, -5 to 15 - s and 30 to 15 + s.
        let band = 113.625f64.sqrt();
        let want0 = ((1.0 + 2.0 + 3.0) + (2.5 + band)) / 4.0;
        let want1 = ((10.0 + 20.0) + (15.0 + band) + (15.0 - band)) / 4.0;
        let got = clipped_mean(&v, 1.0, 1).unwrap();
        assert!((f64::from(got[0]) - want0).abs() < 1e-5, "{got:?}");
        assert!((f64::from(got[1]) - want1).abs() < 1e-5, "{got:?}");
    }

    #[test]
    fn clipped_mean_is_the_mean_when_no_value_leaves_the_band() {
        let v = [
            vec![1.0f32, -1.0],
            vec![2.0, 1.0],
            vec![3.0, 0.0],
            vec![4.0, 0.5],
        ];
        assert_eq!(clipped_mean(&v, 100.0, 1).unwrap(), mean(&v).unwrap());
        // Two inputs clamp symmetrically about their midpoint: the mean, at any c.
        assert_eq!(
            clipped_mean(&v[..2], 0.1, 0).unwrap(),
            mean(&v[..2]).unwrap()
        );
        assert!(clipped_mean(&v, 0.0, 1).is_err());
        assert!(clipped_mean(&v, f64::NAN, 1).is_err());
        assert!(clipped_mean(&v, 1.0, 2).is_err());
        // Three with f = 1: the median, whatever c.
        assert_eq!(
            clipped_mean(&v[1..], 100.0, 1).unwrap(),
            median(&v[1..]).unwrap()
        );
    }

    #[test]
    fn sorting_network_sorts_everything() {
        // 0-1 principle: a comparator network sorts all inputs iff it sorts all 0/1 inputs.
        for n in 1..=12usize {
            let net = sorting_network(n);
            for bits in 0u32..(1 << n) {
                let mut v: Vec<u32> = (0..n).map(|i| (bits >> i) & 1).collect();
                for &(i, j) in &net {
                    if v[i] > v[j] {
                        v.swap(i, j);
                    }
                }
                assert!(v.windows(2).all(|w| w[0] <= w[1]), "n={n} bits={bits:b}");
            }
        }
        for n in [16usize, 17, 31, 33, 64, 100] {
            let net = sorting_network(n);
            let mut v: Vec<u64> = (0..n as u64).map(|i| (i * 7919 + 13) % 101).collect();
            for &(i, j) in &net {
                if v[i] > v[j] {
                    v.swap(i, j);
                }
            }
            assert!(v.windows(2).all(|w| w[0] <= w[1]), "n={n}");
        }
    }

    #[test]
    fn trim_count_rules() {
        assert_eq!(trim_count(10, 0.1, 0).unwrap(), 1);
        assert_eq!(trim_count(10, 0.0, 3).unwrap(), 3);
        assert_eq!(trim_count(8, 0.2, 2).unwrap(), 2);
        assert_eq!(
            trim_count(4, 0.0, 2),
            Err(AggregateError::TrimTooLarge { k: 2, n: 4 })
        );
        assert!(trim_count(4, 0.6, 0).is_err());
        assert!(trimmed_mean(&[vec![1.0f32], vec![2.0]], 0.0, 1).is_err());
    }

    #[test]
    fn non_finite_names_peer() {
        let mut bad = vec![0.0f32; 3 * CHUNK];
        bad[CHUNK + 5] = f32::NAN;
        let inputs = vec![vec![0.0f32; 3 * CHUNK], vec![1.0; 3 * CHUNK], bad];
        let want = |e: AggregateError| matches!(e, AggregateError::NonFinite { peer: 2, index, .. } if index == CHUNK + 5);
        assert!(want(mean(&inputs).unwrap_err()));
        assert!(want(median(&inputs).unwrap_err()));
        assert!(want(trimmed_mean(&inputs, 0.0, 0).unwrap_err()));
        assert!(want(clipped_mean(&inputs, 2.0, 1).unwrap_err()));
    }

    #[test]
    fn same_result_on_one_thread() {
        let inputs: Vec<Vec<f32>> = (0..5)
            .map(|p| {
                (0..3 * CHUNK + 17)
                    .map(|i| ((i * (p + 3)) as f32).sin())
                    .collect()
            })
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let single = pool.install(|| {
            (
                mean(&inputs),
                median(&inputs),
                trimmed_mean(&inputs, 0.2, 1),
                clipped_mean(&inputs, 2.0, 1),
            )
        });
        assert_eq!(
            single,
            (
                mean(&inputs),
                median(&inputs),
                trimmed_mean(&inputs, 0.2, 1),
                clipped_mean(&inputs, 2.0, 1)
            )
        );
    }

    /// Up to f outliers of any magnitude plus enough honest inputs that n >= 2f + 1.
    fn honest_and_outliers() -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<Vec<f32>>, usize)> {
        (1usize..4, 1usize..40, 0usize..4).prop_flat_map(|(f, dim, extra)| {
            (0..=f).prop_flat_map(move |o| {
                let h = (f + 1).max(2 * f + 1 - o) + extra;
                let honest = prop::collection::vec(prop::collection::vec(-10.0f32..10.0, dim), h);
                let outliers = prop::collection::vec(prop::collection::vec(-1e30f32..1e30, dim), o);
                (honest, outliers, Just(f))
            })
        })
    }

    fn within_honest_range(out: &[f32], honest: &[Vec<f32>]) -> bool {
        out.iter().enumerate().all(|(j, &x)| {
            let lo = honest.iter().map(|h| h[j]).fold(f32::INFINITY, f32::min);
            let hi = honest
                .iter()
                .map(|h| h[j])
                .fold(f32::NEG_INFINITY, f32::max);
            x >= lo - 1e-4 && x <= hi + 1e-4
        })
    }

    proptest! {
        #[test]
        fn robust_stays_in_honest_range((honest, outliers, f) in honest_and_outliers()) {
            let mut all = outliers.clone();
            all.extend(honest.iter().cloned());
            let med = median(&all).unwrap();
            prop_assert!(within_honest_range(&med, &honest));
            let tm = trimmed_mean(&all, 0.0, f).unwrap();
            prop_assert!(within_honest_range(&tm, &honest));
        }

        /// Each outlier moves a coordinate by at most c·s / n, and s is bounded by the honest
        /// values' spread: the band's centre and width are set by ranks the outliers cannot
        /// reach without an honest value beyond them.
        #[test]
        fn clipped_mean_bounds_what_outliers_add((honest, outliers, f) in honest_and_outliers(), c in 0.5f64..4.0) {
            let mut all = outliers.clone();
            all.extend(honest.iter().cloned());
            let n = all.len() as f64;
            let out = clipped_mean(&all, c, f).unwrap();
            let dim = honest[0].len();
            let spread = (0..dim)
                .map(|j| {
                    let (lo, hi) = honest.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
                        (l.min(f64::from(v[j])), h.max(f64::from(v[j])))
                    });
                    hi - lo
                })
                .fold(0.0f64, f64::max);
            for j in 0..dim {
                let (lo, hi) = honest.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
                    (l.min(f64::from(v[j])), h.max(f64::from(v[j])))
                });
                // Honest values average inside [lo, hi]; each of the o outliers adds at most
                // (the band's edge − lo or hi) / n, the edge within c·spread of the honest range.
                let reach = outliers.len() as f64 * (c * spread + spread) / n + 1e-3;
                let x = f64::from(out[j]);
                prop_assert!(x >= lo - reach && x <= hi + reach, "j {} x {} [{}, {}] reach {}", j, x, lo, hi, reach);
            }
        }

        #[test]
        fn identical_inputs_are_fixed_points(v in prop::collection::vec(-1e6f32..1e6, 1..50), n in 1usize..9) {
            let inputs = vec![v.clone(); n];
            prop_assert_eq!(mean(&inputs).unwrap(), v.clone());
            prop_assert_eq!(median(&inputs).unwrap(), v.clone());
            prop_assert_eq!(trimmed_mean(&inputs, 0.0, (n - 1) / 2).unwrap(), v.clone());
            prop_assert_eq!(clipped_mean(&inputs, 2.0, (n - 1) / 2).unwrap(), v);
        }

        #[test]
        fn mean_is_permutation_invariant(inputs in prop::collection::vec(prop::collection::vec(-1e3f32..1e3, 7), 1..8)) {
            let mut rev = inputs.clone();
            rev.reverse();
            prop_assert_eq!(mean(&inputs).unwrap(), mean(&rev).unwrap());
            prop_assert_eq!(median(&inputs).unwrap(), median(&rev).unwrap());
            let f = (inputs.len() - 1) / 2;
            prop_assert_eq!(clipped_mean(&inputs, 2.0, f).unwrap(), clipped_mean(&rev, 2.0, f).unwrap());
        }
    }
}
