//! Errors of the model crate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("io error at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tensor engine: {0}")]
    Engine(String),
}

impl ModelError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
