use thiserror::Error;

/// Why a set of inputs could not be aggregated.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AggregateError {
    #[error("no inputs to aggregate")]
    Empty,
    #[error("peer {peer} sent {len} values, expected {expected}")]
    LengthMismatch {
        peer: usize,
        len: usize,
        expected: usize,
    },
    #[error("peer {peer} sent a non-finite value ({value}) at index {index}")]
    NonFinite {
        peer: usize,
        index: usize,
        value: f32,
    },
    #[error("reference vector has {len} values, expected {expected}")]
    ReferenceLength { len: usize, expected: usize },
    #[error("reference vector has a non-finite value at index {index}")]
    ReferenceNonFinite { index: usize },
    #[error("trimmed mean: trimming {k} per side leaves nothing of {n} inputs")]
    TrimTooLarge { k: usize, n: usize },
    #[error("{n} inputs cannot outvote {f} Byzantine ones (need n >= 2f + 1)")]
    TooFewInputs { n: usize, f: usize },
    #[error("krum needs n >= 2f + 3 inputs, got n = {n} with f = {f}")]
    KrumTooFew { n: usize, f: usize },
    #[error("multi-krum: m = {m} must be between 1 and {n}")]
    MultiKrumSelection { m: usize, n: usize },
    #[error("invalid parameter {name} = {value}: {reason}")]
    InvalidParameter {
        name: &'static str,
        value: f64,
        reason: &'static str,
    },
}
