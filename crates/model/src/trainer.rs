//! Single-process training: the whole model as one stage plus its AdamW state.

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::grow::{Architecture, Growth};
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

    /// Splits the rows into `parts` contiguous groups as evenly as possible (at most one per row).
    pub fn split_rows(&self, parts: usize) -> Vec<Batch> {
        let parts = parts.clamp(1, self.batch.max(1));
        if parts == 1 {
            return vec![self.clone()];
        }
        let (base, extra) = (self.batch / parts, self.batch % parts);
        let mut row = 0;
        (0..parts)
            .map(|i| {
                let rows = base + usize::from(i < extra);
                let span = row * self.seq..(row + rows) * self.seq;
                row += rows;
                Batch {
                    batch: rows,
                    seq: self.seq,
                    inputs: self.inputs[span.clone()].to_vec(),
                    targets: self.targets[span].to_vec(),
                }
            })
            .collect()
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
    /// Rows of a batch are split into this many micro-batches whose gradients are computed
    /// concurrently and summed in a fixed order, so the bits depend on this number but never on
    /// the thread count. 1 computes the batch in one pass.
    pub micro_batches: usize,
    /// Version and growth history of the model's shape (saved with checkpoints).
    pub architecture: Architecture,
    /// Optimizer steps the weights a gradient is computed at lag behind the weights it is
    /// applied to: 0 (plain training) or 1, where step t applies the gradient of batch t at
    /// the weights before step t − 1 (PipeDream-2BW). An overlapped pipeline
    /// (`--weight-lag 1`) computes exactly this, so this is its one-process reference.
    pub weight_lag: usize,
    /// The weights before the last step, kept while `weight_lag` is 1.
    previous: Option<Stage>,
}

impl Trainer {
    pub fn new(config: ModelConfig, optim: AdamWConfig, seed: u64) -> Result<Self, ModelError> {
        let spec = StageSpec::full(&config);
        let stage = Stage::init(config, spec, seed)?;
        let optimizer = AdamW::new(optim, stage.params());
        Ok(Self {
            stage,
            optimizer,
            micro_batches: 1,
            architecture: Architecture::default(),
            weight_lag: 0,
            previous: None,
        })
    }

    /// A trainer over a loaded stage and optimizer (e.g. from a checkpoint), one micro-batch
    /// per step and no weight lag until set.
    pub fn resume(stage: Stage, optimizer: AdamW, architecture: Architecture) -> Self {
        Self {
            stage,
            optimizer,
            micro_batches: 1,
            architecture,
            weight_lag: 0,
            previous: None,
        }
    }

    /// Grows the model in depth by identity blocks inserted before the old layers
    /// `positions` (see [`crate::grow::grow_depth`]): the function is unchanged, the new
    /// tensors' AdamW moments start at zero and the architecture version goes up by one.
    pub fn grow_depth(&mut self, positions: &[usize]) -> Result<Growth, ModelError> {
        let grown = crate::grow::grow_depth(
            &self.stage,
            &self.optimizer,
            positions,
            self.optimizer.step_count(),
        )?;
        self.adopt(grown)
    }

    /// Widens every block's MLP to `ffn` hidden units (see [`crate::grow::grow_ffn`]; `seed`
    /// draws the new units' input columns): the function is unchanged bit for bit.
    pub fn grow_ffn(&mut self, ffn: usize, seed: u64) -> Result<Growth, ModelError> {
        let grown = crate::grow::grow_ffn(
            &self.stage,
            &self.optimizer,
            ffn,
            seed,
            self.optimizer.step_count(),
        )?;
        self.adopt(grown)
    }

    fn adopt(&mut self, grown: crate::grow::Grown) -> Result<Growth, ModelError> {
        let version = self.architecture.version.checked_add(1).ok_or_else(|| {
            ModelError::Config("the architecture version cannot grow further".into())
        })?;
        self.stage = grown.stage;
        self.optimizer = grown.optimizer;
        // The kept weights have the old shape; the first step after growth is not delayed.
        self.previous = None;
        self.architecture.version = version;
        self.architecture.history.push(grown.growth.clone());
        Ok(grown.growth)
    }

    /// Mean loss and its parameter gradients over the batch.
    pub fn gradients(&self, batch: &Batch) -> Result<(f32, Vec<Vec<f32>>), ModelError> {
        self.gradients_at(&self.stage, batch)
    }

    fn gradients_at(&self, at: &Stage, batch: &Batch) -> Result<(f32, Vec<Vec<f32>>), ModelError> {
        let parts = batch.split_rows(self.micro_batches);
        let results: Vec<_> = parts
            .par_iter()
            .map(|b| at.backward(&b.input(), &Upstream::Targets(b.targets.clone())))
            .collect();
        let mut loss = 0.0f32;
        let mut grads: Vec<Vec<f32>> = Vec::new();
        for (part, result) in parts.iter().zip(results) {
            let g = result?;
            let part_loss = g
                .loss
                .ok_or_else(|| ModelError::Engine("the full model returned no loss".into()))?;
            if parts.len() == 1 {
                return Ok((part_loss, g.params));
            }
            let w = part.batch as f32 / batch.batch as f32;
            loss += w * part_loss;
            if grads.is_empty() {
                grads = g
                    .params
                    .into_iter()
                    .map(|v| v.iter().map(|x| w * x).collect())
                    .collect();
            } else {
                for (acc, v) in grads.iter_mut().zip(&g.params) {
                    acc.iter_mut().zip(v).for_each(|(a, x)| *a += w * x);
                }
            }
        }
        Ok((loss, grads))
    }

    /// Forward, loss, backward and one AdamW update. With a weight lag of 1 the gradient is
    /// taken at the weights before the previous step (at the current ones on the first step).
    pub fn step(&mut self, batch: &Batch) -> Result<TrainStep, ModelError> {
        if self.weight_lag > 1 {
            return Err(ModelError::Config(format!(
                "weight lag {} (0 or 1)",
                self.weight_lag
            )));
        }
        let at = match &self.previous {
            Some(previous) if self.weight_lag == 1 => previous,
            _ => &self.stage,
        };
        let (loss, grads) = self.gradients_at(at, batch)?;
        if !loss.is_finite() {
            return Err(ModelError::Engine(format!("training loss is {loss}")));
        }
        if self.weight_lag == 1 {
            self.previous = Some(self.stage.clone());
        }
        let stats = self.optimizer.step(self.stage.params_mut(), &grads)?;
        Ok(TrainStep { loss, stats })
    }
}
