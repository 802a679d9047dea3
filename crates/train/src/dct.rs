//! Blockwise orthonormal DCT-II (DeMo's chunk transform) for pseudo-gradient compression.
//!
//! Neighbouring coordinates of a pseudo-gradient (one row of a weight matrix) move together, so
//! in the cosine basis its energy gathers in few coefficients: on the experiment model the top 1%
//! of coefficients per chunk held 21–46% of a Δ's energy against 3–8% of its raw coordinates.
//! Each chunk is cut into blocks of [`BLOCK`] values; a shorter tail stays as it is. The basis is
//! orthonormal, so the inverse is the transpose and residual norms are preserved.

use std::sync::OnceLock;

/// Values per transformed block.
pub const BLOCK: usize = 64;

/// Row k, column i: s_k · cos(π/N · (i + ½) · k), computed in f64 once.
fn basis() -> &'static [f32] {
    static BASIS: OnceLock<Vec<f32>> = OnceLock::new();
    BASIS.get_or_init(|| {
        let n = BLOCK as f64;
        let mut m = vec![0.0f32; BLOCK * BLOCK];
        for k in 0..BLOCK {
            let s = if k == 0 {
                (1.0 / n).sqrt()
            } else {
                (2.0 / n).sqrt()
            };
            for i in 0..BLOCK {
                let angle = std::f64::consts::PI / n * (i as f64 + 0.5) * k as f64;
                m[k * BLOCK + i] = (s * angle.cos()) as f32;
            }
        }
        m
    })
}

/// Transforms every full block of `chunk` in place (`inverse`: back to coordinates).
/// Sums run in a fixed order, so sender and receivers compute the same bits.
pub fn transform(chunk: &mut [f32], inverse: bool) {
    let m = basis();
    let mut out = [0.0f32; BLOCK];
    for block in chunk.chunks_exact_mut(BLOCK) {
        for (k, o) in out.iter_mut().enumerate() {
            *o = (0..BLOCK)
                .map(|i| {
                    let w = if inverse {
                        m[i * BLOCK + k]
                    } else {
                        m[k * BLOCK + i]
                    };
                    w * block[i]
                })
                .sum();
        }
        block.copy_from_slice(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_energy() {
        let x: Vec<f32> = (0..BLOCK * 3 + 5)
            .map(|i| ((i * 37 % 23) as f32) - 11.0)
            .collect();
        let mut y = x.clone();
        transform(&mut y, false);
        // The tail past the last full block is untouched.
        assert_eq!(y[BLOCK * 3..], x[BLOCK * 3..]);
        let energy = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>();
        assert!((energy(&y) - energy(&x)).abs() < 1e-3 * energy(&x));
        transform(&mut y, true);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn constant_block_is_one_coefficient() {
        let mut y = vec![2.0f32; BLOCK];
        transform(&mut y, false);
        assert!((y[0] - 2.0 * (BLOCK as f32).sqrt()).abs() < 1e-4);
        assert!(y[1..].iter().all(|c| c.abs() < 1e-5));
    }
}
