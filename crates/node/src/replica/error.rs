//! Why a replica's round or a peer's state blob was refused.

use neuroshard_aggregate::{AggregateError, ParseError};
use neuroshard_model::ModelError;
use neuroshard_train::lowrank::LayoutError;
use neuroshard_train::{CompressError, DecodeError, DilocoError};
use thiserror::Error;

use super::{MAX_ADAMW_STEP, MAX_ROUND};

#[derive(Debug, Error)]
pub enum ReplicaError {
    #[error("truncated: {left} bytes left, {needed} needed")]
    Truncated { left: usize, needed: usize },
    #[error("length overflow")]
    LengthOverflow,
    #[error("not a NeuroShard state blob of this kind")]
    Magic,
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("bad flag {0}")]
    Flag(u8),
    #[error("{what} has {got} values, this stage has {expected}")]
    StateLength {
        what: &'static str,
        got: u64,
        expected: usize,
    },
    #[error("{what}: non-finite value at {index}")]
    NonFinite { what: &'static str, index: usize },
    #[error("second moment: negative value at {index}")]
    NegativeSecondMoment { index: usize },
    #[error("first moment {m} at {index} is larger than its second moment {v} allows")]
    FirstMoment { index: usize, m: f32, v: f32 },
    #[error("optimizer step count {0} is implausible (at most {MAX_ADAMW_STEP})")]
    StepCount(u64),
    #[error("outer round {0} is implausible (at most {MAX_ROUND})")]
    Round(u64),
    #[error("round {round} does not follow our round {ours}")]
    NotNext { round: u64, ours: u64 },
    #[error("round {0} is not the round we aggregated last")]
    NotLast(u64),
    #[error("we moved on from round {0}")]
    MovedOn(u64),
    #[error("cannot rebuild the set: {missing} messages missing, {malformed} malformed")]
    CannotRebuild { missing: usize, malformed: usize },
    #[error("no usable pseudo-gradient")]
    NoInput,
    #[error("outer state is round {got}, expected {expected} (we are at {ours})")]
    WrongRound { got: u64, expected: u64, ours: u64 },
    #[error("attack produced nothing")]
    Attack,
    #[error("aggregator: {0}")]
    Parse(#[from] ParseError),
    #[error("aggregation refused: {0}")]
    Aggregate(#[from] AggregateError),
    #[error("outer step: {0}")]
    Outer(#[from] DilocoError),
    #[error("compression: {0}")]
    Compress(#[from] CompressError),
    #[error("our own message: {0}")]
    Decode(#[from] DecodeError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("low-rank compression: {0}")]
    Layout(#[from] LayoutError),
}
