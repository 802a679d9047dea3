//! Errors of the scaler.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum GrowthError {
    #[error("invalid shape: {0}")]
    Shape(String),
    #[error("invalid scaler settings: {0}")]
    Config(String),
}
