//! The tensor engine's device and thread pool, behind plain functions.

use burn::prelude::*;

use crate::error::ModelError;

/// The CPU device every computation runs on (burn's `flex` backend).
pub(crate) fn device() -> Device {
    Device::flex()
}

pub(crate) fn to_vec(data: TensorData) -> Result<Vec<f32>, ModelError> {
    data.try_into_vec::<f32>()
        .map_err(|e| ModelError::Engine(format!("reading tensor data: {e:?}")))
}

/// Runs `f` with the engine limited to `threads` worker threads.
///
/// Results are bitwise identical for any thread count (tested): the engine's reductions and
/// matrix kernels split work the same way whatever the pool size.
pub fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> Result<R, ModelError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| ModelError::Engine(format!("thread pool: {e}")))?;
    Ok(pool.install(f))
}
