//! DiLoCo outer loop and pseudo-gradient compression, as pure types over flat f32 vectors.
//!
//! A replica trains H inner steps from the shared θ₀, sends Δᵢ = θ₀ − θᵢ (optionally compressed
//! with error feedback), and every node applies the same aggregate-then-Nesterov step.

mod compress;
mod dct;
pub mod lowrank;
mod outer;
mod varint;

pub use compress::{
    CompressError, CompressSpec, Compressor, DecodeError, Selection, SpecError, ValueCoding,
    decode, decode_for, mask_seed,
};
pub use outer::{DilocoError, DilocoRound, OuterOptimizer, RoundOutcome};
