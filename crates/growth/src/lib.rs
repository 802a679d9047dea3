//! The scaler: which model the network should train, from what its nodes announce.
//!
//! Pure and deterministic, so every node computes the same target from the same
//! announcements: no clock, no randomness, no floating point on peer-supplied numbers.
//!
//! - [`shape`]: model shapes, their parameter counts (from the shape, with checked
//!   arithmetic) and the ladder of widths the scaler chooses from;
//! - [`claims`]: announced memory and throughput, sanitised and counted robustly (a few keys
//!   announcing huge numbers count for nothing);
//! - [`scaler`]: the target shape under the memory and compute rules, and the upgrade rule
//!   (evaluated every K joins, taken only for a large enough step);
//! - [`network`]: a network's architecture (version, shape, stage layout) as part of its
//!   ledger state, advanced at the end of every finalized epoch.

pub mod claims;
mod error;
pub mod network;
pub mod scaler;
pub mod shape;

pub use claims::{Capacity, Claim, ClaimLimits};
pub use error::GrowthError;
pub use network::{
    Architecture, Evaluated, GrowthPolicy, MAX_STAGES, NetworkGrowth, StageLayout, Upgrade,
};
pub use scaler::{Candidates, Decision, ScalerConfig, Target, UpgradeRule, decide, target};
pub use shape::Shape;
