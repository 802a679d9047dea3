//! The compute engine of a replica: its stage, AdamW state and gradient accumulator, on a
//! thread of its own so the network stays responsive while a job runs.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use neuroshard_model::{AdamW, Stage, checkpoint};
use tokio::sync::mpsc::UnboundedSender;

use crate::pipeline::{Job, JobDone};

/// Requests to the engine thread.
pub enum EngineRequest {
    Run(Job),
    /// Write a checkpoint (weights, optimizer, step) and answer with its model hash.
    Save {
        dir: PathBuf,
        step: u64,
        extra: serde_json::Value,
        reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    },
}

/// Owns the stage between jobs.
pub struct Engine {
    stage: Stage,
    optimizer: AdamW,
    accum: Vec<Vec<f32>>,
    count: usize,
}

impl Engine {
    pub fn new(stage: Stage, optimizer: AdamW) -> Self {
        let accum = stage
            .params()
            .values()
            .iter()
            .map(|v| vec![0.0; v.len()])
            .collect();
        Self {
            stage,
            optimizer,
            accum,
            count: 0,
        }
    }

    pub fn params(&self) -> &neuroshard_model::ParamSet {
        self.stage.params()
    }

    pub fn model_hash(&self) -> [u8; 32] {
        self.stage.model_hash()
    }

    /// Runs one job; errors become `JobDone::Failed`, never a panic.
    pub fn run(&mut self, job: Job) -> JobDone {
        match job {
            Job::Forward { mb, input } => match self.stage.forward(&input) {
                Ok(output) => JobDone::Forward { mb, output },
                Err(e) => JobDone::Failed {
                    mb: Some(mb),
                    error: e.to_string(),
                },
            },
            Job::Backward {
                mb,
                input,
                upstream,
            } => match self.stage.backward(&input, &upstream) {
                Ok(g) => {
                    if g.params.iter().flatten().any(|x| !x.is_finite()) {
                        return JobDone::Failed {
                            mb: Some(mb),
                            error: "non-finite parameter gradient".into(),
                        };
                    }
                    for (acc, v) in self.accum.iter_mut().zip(&g.params) {
                        acc.iter_mut().zip(v).for_each(|(a, x)| *a += x);
                    }
                    self.count += 1;
                    JobDone::Backward {
                        mb,
                        input_grad: g.input_grad,
                        loss: g.loss,
                    }
                }
                Err(e) => JobDone::Failed {
                    mb: Some(mb),
                    error: e.to_string(),
                },
            },
            Job::Step { step } => {
                let n = self.count.max(1) as f32;
                let grads: Vec<Vec<f32>> = self
                    .accum
                    .iter()
                    .map(|v| v.iter().map(|x| x / n).collect())
                    .collect();
                self.accum.iter_mut().for_each(|v| v.fill(0.0));
                self.count = 0;
                match self.optimizer.step(self.stage.params_mut(), &grads) {
                    Ok(stats) => JobDone::Step {
                        step,
                        lr: stats.lr,
                        grad_norm: stats.grad_norm,
                        model_hash: self.stage.model_hash(),
                    },
                    Err(e) => JobDone::Failed {
                        mb: None,
                        error: format!("optimizer step {step}: {e}"),
                    },
                }
            }
        }
    }

    /// Writes the checkpoint as a whole: into `<dir>.new`, then swapped in by two renames, so
    /// a crash at any moment leaves either the previous or the new checkpoint complete.
    fn save(&self, dir: &Path, step: u64, extra: serde_json::Value) -> Result<String, String> {
        let fresh = sibling(dir, "new");
        let old = sibling(dir, "old");
        let _ = std::fs::remove_dir_all(&fresh);
        let meta = checkpoint::save(&fresh, &self.stage, Some(&self.optimizer), step, extra)
            .map_err(|e| e.to_string())?;
        let swap = || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&old);
            if dir.exists() {
                std::fs::rename(dir, &old)?;
            }
            std::fs::rename(&fresh, dir)?;
            let _ = std::fs::remove_dir_all(&old);
            Ok(())
        };
        swap().map_err(|e| format!("installing {}: {e}", dir.display()))?;
        Ok(meta.model_hash)
    }
}

/// `<dir>.<suffix>`.
pub fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

/// The latest complete checkpoint: `dir`, or `<dir>.old` when a crash hit between the renames.
pub fn latest_checkpoint(dir: &Path) -> Option<PathBuf> {
    [dir.to_path_buf(), sibling(dir, "old")]
        .into_iter()
        .find(|d| checkpoint::read_meta(d).is_ok())
}

/// Starts the engine thread; finished jobs arrive on `done`.
pub fn spawn(
    mut engine: Engine,
    threads: usize,
    done: UnboundedSender<JobDone>,
) -> std::io::Result<mpsc::Sender<EngineRequest>> {
    let (tx, rx) = mpsc::channel::<EngineRequest>();
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            neuroshard_model::with_threads(threads, move || {
                while let Ok(req) = rx.recv() {
                    match req {
                        EngineRequest::Run(job) => {
                            if done.send(engine.run(job)).is_err() {
                                break;
                            }
                        }
                        EngineRequest::Save {
                            dir,
                            step,
                            extra,
                            reply,
                        } => {
                            let _ = reply.send(engine.save(&dir, step, extra));
                        }
                    }
                }
            })
        })?;
    Ok(tx)
}
