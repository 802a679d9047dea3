//! Single-process training: the whole model as one stage plus its AdamW state.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::optim::{AdamW, AdamWConfig, StepStats};
use crate::params::StageSpec;
use crate::stage::{Stage, StageInput, Tokens, Upstream};

/// One next-token batch: `inputs[i]` predicts `targets[i]`, both `[batch, seq]` row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub batch: usize,
    pub seq: usize,
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

impl Batch {
    /// Cuts `batch` windows of `seq + 1` tokens into inputs and shifted targets.
    pub fn from_windows(windows: &[Vec<u32>], seq: usize) -> Result<Self, ModelError> {
        let mut inputs = Vec::with_capacity(windows.len() * seq);
        let mut targets = Vec::with_capacity(windows.len() * seq);
        for w in windows {
            if w.len() != seq + 1 {
                return Err(ModelError::Input(format!(
                    "window of {} tokens, need seq + 1 = {}",
                    w.len(),
                    seq + 1
                )));
            }
            inputs.extend_from_slice(&w[..seq]);
            targets.extend_from_slice(&w[1..]);
        }
        Ok(Self {
            batch: windows.len(),
            seq,
            inputs,
            targets,
        })
    }

    pub fn input(&self) -> StageInput {
        StageInput::Tokens(Tokens {
            batch: self.batch,
            seq: self.seq,
            ids: self.inputs.clone(),
        })
    }
}

/// Loss and optimizer statistics of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainStep {
    pub loss: f32,
    pub stats: StepStats,
}

/// The whole model and its optimizer.
#[derive(Debug, Clone)]
pub struct Trainer {
    pub stage: Stage,
    pub optimizer: AdamW,
}

impl Trainer {
    pub fn new(config: ModelConfig, optim: AdamWConfig, seed: u64) -> Result<Self, ModelError> {
        let spec = StageSpec::full(&config);
        let stage = Stage::init(config, spec, seed)?;
        let optimizer = AdamW::new(optim, stage.params());
        Ok(Self { stage, optimizer })
    }

    /// Forward, loss, backward and one AdamW update.
    pub fn step(&mut self, batch: &Batch) -> Result<TrainStep, ModelError> {
        let grads = self
            .stage
            .backward(&batch.input(), &Upstream::Targets(batch.targets.clone()))?;
        let loss = grads
            .loss
            .ok_or_else(|| ModelError::Engine("the full model returned no loss".into()))?;
        if !loss.is_finite() {
            return Err(ModelError::Engine(format!("training loss is {loss}")));
        }
        let stats = self.optimizer.step(self.stage.params_mut(), &grads.params)?;
        Ok(TrainStep { loss, stats })
    }

    /// Mean loss on a batch without updating anything.
    pub fn eval_loss(&self, batch: &Batch) -> Result<f32, ModelError> {
        let losses = self.stage.token_losses(&batch.input(), &batch.targets)?;
        Ok(losses.iter().sum::<f32>() / losses.len() as f32)
    }
}
