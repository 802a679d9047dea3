//! The compute engine of a replica: its stage, AdamW state and gradient accumulator, on a
//! thread of its own so the network stays responsive while a job runs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use neuroshard_model::{AdamW, Stage, checkpoint};
use neuroshard_proof::NodeId;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::pipeline::{Job, JobDone};
use crate::replica::{Applied, Diloco, Prepared, encode_adamw};

/// File of the DiLoCo outer state inside a checkpoint directory.
pub const DILOCO_FILE: &str = "diloco.bin";

/// Where the engine thread answers a request.
pub type Reply<T> = oneshot::Sender<Result<T, String>>;

/// Sends a request to the engine thread at once (so it queues behind the jobs already sent);
/// [`Pending::answer`] waits for the reply.
pub fn ask<T>(
    engine: &mpsc::Sender<EngineRequest>,
    make: impl FnOnce(Reply<T>) -> EngineRequest,
) -> Pending<T> {
    let (reply, rx) = oneshot::channel();
    Pending(engine.send(make(reply)).is_ok().then_some(rx))
}

/// A request the engine thread has (or, if it stopped, never got).
pub struct Pending<T>(Option<oneshot::Receiver<Result<T, String>>>);

impl<T> Pending<T> {
    /// The engine's answer; a stopped engine is an error like any other.
    pub async fn answer(self) -> Result<T, String> {
        match self.0 {
            Some(rx) => rx.await.unwrap_or_else(|_| Err("engine stopped".into())),
            None => Err("engine stopped".into()),
        }
    }
}

const DILOCO_OFF: &str = "DiLoCo is off";

/// The DiLoCo state saved with a checkpoint, checked against the hash in its metadata, so a
/// truncated or foreign file is refused with the reason.
pub fn load_diloco(
    dir: &Path,
    meta: &checkpoint::CheckpointMeta,
    cfg: crate::replica::DilocoConfig,
    len: usize,
) -> Result<Diloco, String> {
    let path = dir.join(DILOCO_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let want = meta.extra["diloco"]["hash"].as_str().unwrap_or_default();
    let got = hex::encode(blake3::hash(&bytes).as_bytes());
    if want != got {
        return Err(format!(
            "{}: hash {got} differs from the checkpoint's {want:?}",
            path.display()
        ));
    }
    Diloco::restore(cfg, &bytes, len).map_err(|e| format!("{}: {e}", path.display()))
}

/// Requests to the engine thread.
pub enum EngineRequest {
    Run(Job),
    /// Write a checkpoint (weights, optimizer, step) and answer with its model hash.
    Save {
        dir: PathBuf,
        step: u64,
        extra: serde_json::Value,
        reply: Reply<String>,
    },
    /// Compute and compress this replica's pseudo-gradient of `round`.
    SyncPrepare {
        round: u64,
        reply: Reply<Prepared>,
    },
    /// Aggregate `round` and apply the outer step; answers with the optimizer blob too.
    SyncApply {
        round: u64,
        messages: Vec<(NodeId, Vec<u8>)>,
        reply: Reply<(Applied, Arc<Vec<u8>>)>,
    },
    /// Recompute `round` over the contributor set `set`, with the messages in `extra` added.
    SyncReapply {
        round: u64,
        extra: Vec<(NodeId, Vec<u8>)>,
        set: Vec<NodeId>,
        reply: Reply<(Applied, Arc<Vec<u8>>)>,
    },
    /// Take a peer's outer state of `round`.
    SyncAdopt {
        round: u64,
        bytes: Vec<u8>,
        included: bool,
        reply: Reply<[u8; 32]>,
    },
}

/// Owns the stage between jobs.
pub struct Engine {
    stage: Stage,
    optimizer: AdamW,
    accum: Vec<Vec<f32>>,
    count: usize,
    diloco: Option<Diloco>,
}

impl Engine {
    pub fn new(stage: Stage, optimizer: AdamW, diloco: Option<Diloco>) -> Self {
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
            diloco,
        }
    }

    pub fn params(&self) -> &neuroshard_model::ParamSet {
        self.stage.params()
    }

    pub fn model_hash(&self) -> [u8; 32] {
        self.stage.model_hash()
    }

    fn sync_prepare(&mut self, round: u64) -> Result<Prepared, String> {
        let d = self.diloco.as_mut().ok_or(DILOCO_OFF)?;
        d.prepare(round, self.stage.params())
    }

    fn sync_apply(
        &mut self,
        round: u64,
        messages: Vec<(NodeId, Vec<u8>)>,
    ) -> Result<(Applied, Arc<Vec<u8>>), String> {
        let d = self.diloco.as_mut().ok_or(DILOCO_OFF)?;
        let applied = d.apply(round, messages, self.stage.params_mut())?;
        Ok((applied, Arc::new(encode_adamw(&self.optimizer))))
    }

    fn sync_reapply(
        &mut self,
        round: u64,
        extra: Vec<(NodeId, Vec<u8>)>,
        set: &[NodeId],
    ) -> Result<(Applied, Arc<Vec<u8>>), String> {
        let d = self.diloco.as_mut().ok_or(DILOCO_OFF)?;
        let applied = d.reapply(round, extra, set, self.stage.params_mut())?;
        Ok((applied, Arc::new(encode_adamw(&self.optimizer))))
    }

    fn sync_adopt(&mut self, round: u64, bytes: &[u8], included: bool) -> Result<[u8; 32], String> {
        let d = self.diloco.as_mut().ok_or(DILOCO_OFF)?;
        d.adopt(round, bytes, included, self.stage.params_mut())
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
        let mut extra = extra;
        if let Some(d) = &self.diloco {
            // Written before meta.json, whose presence marks a complete checkpoint.
            std::fs::create_dir_all(&fresh).map_err(|e| e.to_string())?;
            checkpoint::write_atomic(&fresh.join(DILOCO_FILE), &d.outer_bytes())
                .map_err(|e| e.to_string())?;
            if let Some(obj) = extra.as_object_mut() {
                obj.insert(
                    "diloco".into(),
                    serde_json::json!({"round": d.round(), "hash": hex::encode(d.hash())}),
                );
            }
        }
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
                        EngineRequest::SyncPrepare { round, reply } => {
                            let _ = reply.send(engine.sync_prepare(round));
                        }
                        EngineRequest::SyncApply {
                            round,
                            messages,
                            reply,
                        } => {
                            let _ = reply.send(engine.sync_apply(round, messages));
                        }
                        EngineRequest::SyncReapply {
                            round,
                            extra,
                            set,
                            reply,
                        } => {
                            let _ = reply.send(engine.sync_reapply(round, extra, &set));
                        }
                        EngineRequest::SyncAdopt {
                            round,
                            bytes,
                            included,
                            reply,
                        } => {
                            let _ = reply.send(engine.sync_adopt(round, &bytes, included));
                        }
                    }
                }
            })
        })?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::tests::{cfg, tiny_config};
    use neuroshard_model::{AdamWConfig, StageSpec};

    fn dcfg() -> crate::replica::DilocoConfig {
        cfg(1, "randk:0.25:sign")
    }

    #[test]
    fn checkpoints_carry_the_outer_state_and_refuse_a_damaged_one() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("checkpoint");
        let stage = Stage::init(tiny_config(), StageSpec::full(&tiny_config()), 3).unwrap();
        let opt = AdamW::new(AdamWConfig::default(), stage.params());
        let diloco = Diloco::new(dcfg(), stage.params()).unwrap();
        let hash = diloco.hash();
        let engine = Engine::new(stage, opt, Some(diloco));
        engine
            .save(&ck, 7, serde_json::json!({"node": "test"}))
            .unwrap();
        let meta = checkpoint::read_meta(&ck).unwrap();
        assert_eq!(meta.step, 7);
        let n = engine.params().numel();
        let back = load_diloco(&ck, &meta, dcfg(), n).unwrap();
        assert_eq!(back.hash(), hash);
        // Another stage size, a truncated file, a missing file: each refused with the reason.
        assert!(
            load_diloco(&ck, &meta, dcfg(), n + 1)
                .err()
                .unwrap()
                .contains("values")
        );
        let file = ck.join(DILOCO_FILE);
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        assert!(
            load_diloco(&ck, &meta, dcfg(), n)
                .err()
                .unwrap()
                .contains("differs")
        );
        std::fs::remove_file(&file).unwrap();
        assert!(load_diloco(&ck, &meta, dcfg(), n).is_err());
        assert_eq!(latest_checkpoint(&ck), Some(ck.clone()));
    }
}
