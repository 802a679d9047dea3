//! NeuroLLM: the decoder-only transformer NeuroShard trains, cut into pipeline stages.
//!
//! Burn's types stay inside this crate; callers see [`ParamSet`], [`Activations`] and plain
//! vectors.

pub mod checkpoint;
mod config;
mod engine;
mod error;
mod export;
mod fastmath;
mod generate;
pub mod grow;
pub mod grow_pipeline;
mod loss;
mod optim;
mod params;
pub mod replay;
mod serve;
mod stage;
mod trainer;
mod transformer;

pub use checkpoint::{Checkpoint, CheckpointMeta};
pub use config::ModelConfig;
pub use engine::{engine_name, with_threads};
pub use error::ModelError;
pub use export::{ExportReport, SpecialTokens, export_hf};
pub use generate::{Generator, Sampling, sample};
pub use grow::{Architecture, FfnGrowth, Growth};
pub use optim::{
    AdamW, AdamWConfig, BETA2_MEMORY_TOKENS, BETA2_RANGE, Beta2Error, LrSchedule, StepStats,
};
pub use params::{ParamKind, ParamSet, ParamSpec, StageSpec};
pub use replay::{EngineReplayer, ReplayError, Wire, determinism_class};
pub use serve::{StageRunner, StepInput, StepOutput, StreamCache};
pub use stage::{Activations, Kept, Stage, StageGrads, StageInput, Tokens, Upstream};
pub use trainer::{Batch, TrainStep, Trainer};
