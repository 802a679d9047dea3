//! The tensor engine's device and thread pool, behind plain functions.

use burn::prelude::*;

use crate::error::ModelError;

/// Which device computations run on: burn's `flex` CPU backend, or a GPU when the binary was
/// built with `cuda`/`wgpu` and `NEUROSHARD_DEVICE` asks for it (`cuda`, `wgpu`).
fn selected() -> &'static str {
    match std::env::var("NEUROSHARD_DEVICE").as_deref() {
        #[cfg(feature = "cuda")]
        Ok("cuda") => "cuda",
        #[cfg(feature = "wgpu")]
        Ok("wgpu") => "wgpu",
        _ => "flex",
    }
}

pub(crate) fn device() -> Device {
    match selected() {
        #[cfg(feature = "cuda")]
        "cuda" => Device::cuda(0),
        #[cfg(feature = "wgpu")]
        "wgpu" => Device::wgpu(Default::default()),
        _ => Device::flex(),
    }
}

/// Engine, device and kernel class in use, for reports and proofs: steps are bit-comparable only
/// within one class.
pub fn engine_name() -> String {
    let class = if cfg!(feature = "x86-v4") {
        "x86-v4"
    } else {
        "portable"
    };
    format!("burn-0.22.1/{}/{class}", selected())
}

pub(crate) fn to_vec(data: TensorData) -> Result<Vec<f32>, ModelError> {
    data.try_into_vec::<f32>()
        .map_err(|e| ModelError::Engine(format!("reading tensor data: {e:?}")))
}

/// Runs `f` with the engine limited to `threads` worker threads.
///
/// Results are bitwise identical for any thread count (tested): the engine's reductions and
/// matrix kernels split work the same way whatever the pool size.
pub fn with_threads<R: Send>(
    threads: usize,
    f: impl FnOnce() -> R + Send,
) -> Result<R, ModelError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| ModelError::Engine(format!("thread pool: {e}")))?;
    Ok(pool.install(f))
}
