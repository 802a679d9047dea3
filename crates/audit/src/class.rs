//! Determinism classes: which peers must agree bit for bit, and how far others may differ.
//!
//! The engine's steps are bitwise identical run to run and across thread counts, but only
//! within one class: the same build (engine, features), the same instruction set the kernels
//! dispatch to, the same cache geometry (the matrix kernels size their blocks from it, which
//! changes the order of sums) and the same micro-batch count (which changes how gradients are
//! summed into a step). Peers of one class compare hashes; peers of different classes can only
//! compare values within a [`Tolerance`], which never suffices to slash.

use neuroshard_proof::{CodecError, Hash32, Reader, Writer};

/// The vector instruction level the kernels run at, as detected on the machine. Recorded
/// conservatively: two machines that would give the same bits but report different levels
/// are merely sent to the tolerance path, never slashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IsaLevel {
    /// No vector extension the kernels use.
    Baseline = 0,
    /// x86-64-v2 (SSE4.2).
    X86V2 = 1,
    /// x86-64-v3 (AVX2 and FMA).
    X86V3 = 2,
    /// x86-64-v4 (AVX-512F).
    X86V4 = 3,
    /// AArch64 with NEON.
    Neon = 4,
}

impl IsaLevel {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        Ok(match v {
            0 => Self::Baseline,
            1 => Self::X86V2,
            2 => Self::X86V3,
            3 => Self::X86V4,
            4 => Self::Neon,
            _ => {
                return Err(CodecError::Invalid {
                    field: "isa level",
                    reason: format!("unknown level {v}"),
                });
            }
        })
    }
}

/// What a commitment names so that a replay knows whether its bits must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeterminismClass {
    /// Hash of the build: engine name and version, kernel features, target.
    pub build: Hash32,
    pub isa: IsaLevel,
    /// L1d, L2 and L3 sizes in bytes as the matrix kernels see them.
    pub cache_bytes: [u64; 3],
    /// Micro-batches per optimizer step.
    pub micro_batches: u16,
}

impl DeterminismClass {
    pub fn encode(&self, w: &mut Writer) {
        w.fixed(&self.build);
        w.u8(self.isa as u8);
        for c in self.cache_bytes {
            w.u64(c);
        }
        w.u16(self.micro_batches);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            build: r.array()?,
            isa: IsaLevel::from_u8(r.u8()?)?,
            cache_bytes: [r.u64()?, r.u64()?, r.u64()?],
            micro_batches: r.u16()?,
        })
    }

    /// Whether a replay in `self` must reproduce a job of `other` bit for bit. The
    /// micro-batch count does not change a single job's bits (only how a step sums them), so
    /// it is left out here; round-level checks compare it separately.
    pub fn job_bits_comparable(&self, other: &Self) -> bool {
        self.build == other.build && self.isa == other.isa && self.cache_bytes == other.cache_bytes
    }
}

/// How far a replay of another class may differ from a committed tensor and still count as
/// the same computation: `max |a − b| ≤ abs + rel · max |b|`. Honest cross-class differences
/// come from summation order (relative 1e-6 to 1e-5 in f32); a skipped layer or random output
/// differs by order one. Passing this never clears a worker and failing it never slashes: it
/// only decides whether a same-class auditor is needed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub abs: f32,
    pub rel: f32,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            abs: 1e-4,
            rel: 1e-3,
        }
    }
}

impl Tolerance {
    /// The largest absolute difference, and whether it is within the bound. Tensors of
    /// different lengths are never within it.
    pub fn compare(&self, replayed: &[f32], committed: &[f32]) -> (f32, bool) {
        if replayed.len() != committed.len() {
            return (f32::INFINITY, false);
        }
        let mut max_diff = 0f32;
        let mut max_ref = 0f32;
        for (a, b) in replayed.iter().zip(committed) {
            // NaN compares false everywhere, so fold it into an infinite difference.
            let d = (a - b).abs();
            max_diff = if d.is_nan() {
                f32::INFINITY
            } else {
                max_diff.max(d)
            };
            max_ref = max_ref.max(b.abs());
        }
        (max_diff, max_diff <= self.abs + self.rel * max_ref)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn class(build: u8) -> DeterminismClass {
        DeterminismClass {
            build: [build; 32],
            isa: IsaLevel::X86V3,
            cache_bytes: [32 << 10, 1 << 20, 32 << 20],
            micro_batches: 2,
        }
    }

    #[test]
    fn class_round_trips_and_refuses_unknown_isa() {
        let c = class(7);
        let mut w = Writer::new();
        c.encode(&mut w);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(DeterminismClass::decode(&mut r), Ok(c));
        assert_eq!(r.finish(), Ok(()));
        let mut bad = bytes.clone();
        bad[32] = 9;
        assert!(DeterminismClass::decode(&mut Reader::new(&bad)).is_err());
    }

    #[test]
    fn bits_are_comparable_only_within_build_isa_and_cache() {
        let a = class(1);
        let mut b = a;
        b.micro_batches = 4;
        assert!(a.job_bits_comparable(&b));
        b.isa = IsaLevel::X86V4;
        assert!(!a.job_bits_comparable(&b));
        let mut c = a;
        c.cache_bytes[1] = 2 << 20;
        assert!(!a.job_bits_comparable(&c));
        assert!(!a.job_bits_comparable(&class(2)));
    }

    #[test]
    fn tolerance_accepts_rounding_and_refuses_nan_or_gross_differences() {
        let t = Tolerance::default();
        let x = [1.0f32, -2.0, 3.0];
        assert!(t.compare(&[1.000_001, -2.0, 3.0], &x).1);
        assert!(!t.compare(&[1.5, -2.0, 3.0], &x).1);
        assert!(!t.compare(&[f32::NAN, -2.0, 3.0], &x).1);
        assert!(!t.compare(&[1.0, -2.0], &x).1);
    }
}
