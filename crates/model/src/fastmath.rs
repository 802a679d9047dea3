//! Elementwise kernels on plain slices that the engine would otherwise run one scalar `expf`
//! at a time: the exponential behind softmax cross-entropy and the SwiGLU activation.
//!
//! Every operation is a single IEEE-rounded one (Rust never fuses them), so the AVX2 and
//! portable paths give the same bits, and elementwise work splits over threads without changing
//! any result.

use rayon::prelude::*;

/// e^x for x ≤ 0 (inputs are shifted by the row maximum), in plain arithmetic the compiler
/// vectorises: 2^n · p(r) with x = n·ln 2 + r, |r| ≤ ln2/2, and a degree-6 polynomial for e^r
/// (relative error about 2e-7). Below −87.3 it returns 0, as f32's e^x underflows there.
/// Every operation is a single IEEE-rounded one (Rust never fuses them), so the bits are the
/// same at any vector width.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const LOW: f32 = -87.3;
    // Adding 1.5·2²³ rounds to an integer (ties to even) and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // Not `max`, which would turn NaN into LOW: NaN must come out as NaN.
    let clamped = if x < LOW { LOW } else { x };
    let shifted = clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n ∈ [−126, 0]: 2^n is the float with exponent field n + 127.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < LOW { 0.0 } else { p * scale }
}

/// Folds `xs` with `f` in 8 interleaved lanes, then the lanes in order: a fixed order the
/// compiler can vectorise (a single running value would serialise on `f`'s latency).
#[inline(always)]
pub(crate) fn lanes(xs: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = f(*a, x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = f(*a, x);
    }
    acc.into_iter().fold(init, f)
}

/// σ(x) from e^(−|x|), so neither tail overflows.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 { r } else { e * r }
}

/// Softmax of attention scores, `[rows, keys]` row-major, scaled by `scale`, under the causal
/// mask: row r is query position `offset + r % queries` and sees keys up to and including it;
/// later keys get exactly 0.
pub(crate) fn causal_softmax(
    scores: &[f32],
    keys: usize,
    queries: usize,
    offset: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0f32; scores.len()];
    let rows_per_task = (CHUNK / keys.max(1)).max(1);
    out.par_chunks_mut(rows_per_task * keys)
        .zip(scores.par_chunks(rows_per_task * keys))
        .enumerate()
        .for_each(|(task, (o, x))| {
            for (i, (o, x)) in o.chunks_mut(keys).zip(x.chunks(keys)).enumerate() {
                let query = (task * rows_per_task + i) % queries;
                let seen = (offset + query + 1).min(keys);
                softmax_row(&mut o[..seen], &x[..seen], scale);
            }
        });
    out
}

fn softmax_row(out: &mut [f32], xs: &[f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { softmax_row_avx2(out, xs, scale) };
        return;
    }
    softmax_row_any(out, xs, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn softmax_row_avx2(out: &mut [f32], xs: &[f32], scale: f32) {
    softmax_row_any(out, xs, scale);
}

#[inline(always)]
fn softmax_row_any(out: &mut [f32], xs: &[f32], scale: f32) {
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = x * scale;
    }
    let max = lanes(out, f32::NEG_INFINITY, f32::max);
    for o in out.iter_mut() {
        *o = exp_nonpositive(*o - max);
    }
    let inv = 1.0 / lanes(out, 0.0, |a, b| a + b);
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Elements per parallel task: large enough that scheduling is noise.
const CHUNK: usize = 16 * 1024;

/// SwiGLU's value `silu(g) · u`, for passes that need no gradient.
pub(crate) fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; g.len()];
    out.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|(o, (g, u))| swiglu_chunk(o, g, u));
    out
}

/// For training: `silu(g)` and `silu'(g) · u`, the two factors SwiGLU's gradient needs
/// (∂/∂u = silu(g), ∂/∂g = silu'(g)·u). `u · silu(g)` has the same bits as [`swiglu`].
pub(crate) fn swiglu_factors(g: &[f32], u: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut act = vec![0.0f32; g.len()];
    let mut slope = vec![0.0f32; g.len()];
    act.par_chunks_mut(CHUNK)
        .zip(slope.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|((a, s), (g, u))| factors_chunk(a, s, g, u));
    (act, slope)
}

fn swiglu_chunk(out: &mut [f32], g: &[f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { swiglu_avx2(out, g, u) };
        return;
    }
    swiglu_any(out, g, u);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn swiglu_avx2(out: &mut [f32], g: &[f32], u: &[f32]) {
    swiglu_any(out, g, u);
}

#[inline(always)]
fn swiglu_any(out: &mut [f32], g: &[f32], u: &[f32]) {
    for ((o, &x), &u) in out.iter_mut().zip(g).zip(u) {
        *o = x * sigmoid(x) * u;
    }
}

fn factors_chunk(act: &mut [f32], slope: &mut [f32], g: &[f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { factors_avx2(act, slope, g, u) };
        return;
    }
    factors_any(act, slope, g, u);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn factors_avx2(act: &mut [f32], slope: &mut [f32], g: &[f32], u: &[f32]) {
    factors_any(act, slope, g, u);
}

/// silu(x) = x·σ(x); silu'(x) = σ(x)·(1 + x·(1 − σ(x))).
#[inline(always)]
fn factors_any(act: &mut [f32], slope: &mut [f32], g: &[f32], u: &[f32]) {
    for (((a, s), &x), &u) in act.iter_mut().zip(slope.iter_mut()).zip(g).zip(u) {
        let sig = sigmoid(x);
        *a = x * sig;
        *s = sig * (1.0 + x * (1.0 - sig)) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_closely() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -(i as f32) * 87.0 / 200_000.0;
            let (ours, std) = (f64::from(exp_nonpositive(x)), f64::from(x.exp()));
            worst = worst.max((ours - std).abs() / std);
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
        let g = (0..n)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
            .collect();
        let u = (0..n)
            .map(|i| ((i * 104_729 % 997) as f32 - 498.0) / 211.0)
            .collect();
        (g, u)
    }

    #[test]
    fn swiglu_matches_f64_and_its_derivative() {
        let (g, u) = inputs(5_000);
        let value = swiglu(&g, &u);
        let (act, slope) = swiglu_factors(&g, &u);
        for i in 0..g.len() {
            let (x, w) = (f64::from(g[i]), f64::from(u[i]));
            let sig = 1.0 / (1.0 + (-x).exp());
            let want = x * sig;
            assert!(
                (f64::from(act[i]) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{x}"
            );
            // Central difference of silu against the analytic slope.
            let h = 1e-4;
            let silu = |x: f64| x / (1.0 + (-x).exp());
            let numeric = (silu(x + h) - silu(x - h)) / (2.0 * h) * w;
            assert!((f64::from(slope[i]) - numeric).abs() <= 1e-5 * (1.0 + numeric.abs()));
            // The training path's value u·silu(g) has the inference path's bits.
            assert_eq!((u[i] * act[i]).to_bits(), value[i].to_bits());
        }
        let ends = swiglu(&[f32::INFINITY, -200.0, 200.0, f32::NAN], &[1.0; 4]);
        assert_eq!(ends[..3], [f32::INFINITY, -0.0, 200.0]);
        assert!(ends[3].is_nan());
    }

    #[test]
    fn swiglu_same_bits_for_any_thread_count() {
        let (g, u) = inputs(100_003);
        let run = |t| crate::engine::with_threads(t, || swiglu_factors(&g, &u)).unwrap();
        let (a, b) = (run(1), run(3));
        let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same(&a.0, &b.0) && same(&a.1, &b.1));
        let mut plain = vec![0.0; g.len()];
        swiglu_any(&mut plain, &g, &u);
        assert!(same(&plain, &swiglu(&g, &u)));
    }

    #[test]
    fn causal_softmax_by_hand() {
        // Two queries at positions 1 and 2 (offset 1) over three keys, scores scaled by 2.
        let scores = [1.0f32, 2.0, 3.0, 0.5, 0.5, 1.0];
        let p = causal_softmax(&scores, 3, 2, 1, 2.0);
        let (a, b) = ((2.0f64).exp(), (4.0f64).exp());
        let (c, d) = ((1.0f64).exp(), (2.0f64).exp());
        let want = [
            a / (a + b),
            b / (a + b),
            0.0,
            c / (2.0 * c + d),
            c / (2.0 * c + d),
            d / (2.0 * c + d),
        ];
        for (x, w) in p.iter().zip(want) {
            assert!((f64::from(*x) - w).abs() < 1e-6, "{p:?}");
        }
        // Offset 0 is the plain causal mask; a NaN score poisons only its own row.
        let p = causal_softmax(&[0.0, f32::NAN, f32::NAN, 1.0], 2, 2, 0, 1.0);
        assert_eq!(p[..2], [1.0, 0.0]);
        assert!(p[2].is_nan() && p[3].is_nan());
    }
}
