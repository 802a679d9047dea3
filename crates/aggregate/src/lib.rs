//! Byzantine-robust aggregation of n flat f32 vectors into one, and the attacks used to test it.
//!
//! Every aggregator is a pure function over equal-length inputs. Work is split into fixed-size
//! coordinate chunks processed in parallel with rayon; reductions over coordinates (distances,
//! norms) add the per-chunk partial sums in chunk order, so results do not depend on the number
//! of threads.

mod attack;
mod config;
mod coord;
mod distance;
mod error;
mod krum;
mod membership;
mod norm;
mod weiszfeld;

pub use attack::{Attack, AttackParseError, alie_z, inverse_normal_cdf};
pub use config::{Aggregator, DEFAULT_CLIP_WIDTH, ParseError};
pub use coord::{clipped_mean, mean, median, trim_count, trimmed_mean};
pub use error::AggregateError;
pub use krum::{krum, krum_scores, multi_krum};
pub use membership::{byzantine_count, check_quorum};
pub use norm::{Clipped, clip_to_median_norm, l2_norm};
pub use weiszfeld::{CenteredClipping, GeometricMedian, centered_clipping, geometric_median};

/// Coordinates per parallel work item. Fixed so that the order of floating-point reductions is
/// the same on every machine and thread count.
pub const CHUNK: usize = 8192;
