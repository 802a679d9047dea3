//! Softmax cross-entropy over plain logit rows, with its gradient in the same pass.
//!
//! The engine's autodiff builds log-softmax from a dozen whole-tensor ops (max, shift, exp, sum,
//! log, gather and their backward passes) over a `[tokens, vocab]` matrix, the largest tensor of
//! a step. Here each row is read twice and written once, with an exponential the compiler can
//! vectorise; the last stage then back-propagates `Σ logits · grad`. Rows are independent and
//! summed in a fixed order, so results do not depend on the thread count.

use rayon::prelude::*;

use crate::fastmath::{exp_nonpositive, lanes};

/// `out[i] = e^(xs[i] − max)`, 8 lanes wide where the CPU has AVX2 (same bits either way).
fn fill_exp(out: &mut [f32], xs: &[f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { fill_exp_avx2(out, xs, max) };
        return;
    }
    fill_exp_any(out, xs, max);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fill_exp_avx2(out: &mut [f32], xs: &[f32], max: f32) {
    fill_exp_any(out, xs, max);
}

#[inline(always)]
fn fill_exp_any(out: &mut [f32], xs: &[f32], max: f32) {
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = exp_nonpositive(x - max);
    }
}

/// Per-row loss `logsumexp(row) − row[target]` and, in `grad`, the row's softmax scaled by
/// `weight` minus `weight` at the target: the gradient of `weight · loss`.
fn row(logits: &[f32], target: usize, weight: f32, grad: &mut [f32]) -> f64 {
    let max = lanes(logits, f32::NEG_INFINITY, f32::max);
    fill_exp(grad, logits, max);
    let sum = lanes(grad, 0.0, |a, b| a + b);
    let scale = weight / sum;
    grad.iter_mut().for_each(|g| *g *= scale);
    grad[target] -= weight;
    f64::from(max) + f64::from(sum).ln() - f64::from(logits[target])
}

/// Mean cross-entropy (nats) of `logits` (`[targets.len(), vocab]` row-major) and its gradient
/// with respect to the logits. Targets must be `< vocab` (checked by the caller).
pub(crate) fn cross_entropy(logits: &[f32], targets: &[u32], vocab: usize) -> (f32, Vec<f32>) {
    let n = targets.len();
    let mut grad = vec![0.0f32; logits.len()];
    let weight = 1.0 / n as f32;
    let losses: Vec<f64> = grad
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .zip(targets.par_iter())
        .map(|((g, l), &t)| row(l, t as usize, weight, g))
        .collect();
    ((losses.iter().sum::<f64>() / n as f64) as f32, grad)
}

/// Per-position cross-entropy (nats), for evaluation.
pub(crate) fn token_losses(logits: &[f32], targets: &[u32], vocab: usize) -> Vec<f32> {
    logits
        .par_chunks(vocab)
        .zip(targets.par_iter())
        .map_init(
            || vec![0.0f32; vocab],
            |scratch, (l, &t)| row(l, t as usize, 0.0, scratch) as f32,
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_and_scalar_paths_agree_bitwise() {
        let xs: Vec<f32> = (0..10_007)
            .map(|i| -((i * 7919 % 10_007) as f32) / 97.0)
            .collect();
        let (mut wide, mut plain) = (vec![0.0; xs.len()], vec![0.0; xs.len()]);
        fill_exp(&mut wide, &xs, 0.5);
        for (o, &x) in plain.iter_mut().zip(&xs) {
            *o = exp_nonpositive(x - 0.5);
        }
        assert!(
            wide.iter()
                .zip(&plain)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn loss_and_gradient_by_hand() {
        // Two rows over a vocabulary of 3.
        let logits = [1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0];
        let (loss, grad) = cross_entropy(&logits, &[2, 0], 3);
        let z: f64 = [1.0f64, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        let expected = ((z.ln() - 3.0) + 3f64.ln()) / 2.0;
        assert!((f64::from(loss) - expected).abs() < 1e-6);
        let p = |x: f64| x.exp() / z;
        let want = [
            p(1.0) / 2.0,
            p(2.0) / 2.0,
            (p(3.0) - 1.0) / 2.0,
            (1.0 / 3.0 - 1.0) / 2.0,
            1.0 / 6.0,
            1.0 / 6.0,
        ];
        for (g, w) in grad.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{grad:?}");
        }
        let per = token_losses(&logits, &[2, 0], 3);
        assert!((f64::from(per[1]) - 3f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn same_bits_for_any_thread_count() {
        let logits: Vec<f32> = (0..64 * 97)
            .map(|i| ((i * 37 % 101) as f32) / 7.0)
            .collect();
        let targets: Vec<u32> = (0..64).map(|i| (i * 13 % 97) as u32).collect();
        let run =
            |t| crate::engine::with_threads(t, || cross_entropy(&logits, &targets, 97)).unwrap();
        let (a, b) = (run(1), run(3));
        assert_eq!(a.0.to_bits(), b.0.to_bits());
        assert!(
            a.1.iter()
                .zip(&b.1)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }
}
