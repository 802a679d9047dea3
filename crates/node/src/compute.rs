//! The compute engine of a replica: its stage, AdamW state and gradient accumulator, on a
//! thread of its own so the network stays responsive while a job runs.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

pub use audit::{DEFAULT_AUDIT_BUDGET, JobStore, Settle, codec_wire, decode_inputs, encode_inputs};
use neuroshard_audit::{GenesisTokens, JobInputs, JobKind, NO_HASH, StageData, WindowRef};
use neuroshard_model::replay::job_inputs;
use neuroshard_model::{AdamW, Kept, Stage, StageInput, checkpoint};
use neuroshard_proof::{Hash32, NodeId};
pub use offer::OfferHashes;
use tokio::sync::mpsc::UnboundedSender;

use crate::core::{Compute, EngineError, EngineJob, EngineOutput, JobHashes, Token};

use crate::pipeline::{Job, JobDone};
use crate::replica::{Applied, Diloco, encode_adamw};
use crate::serve::engine::{Serving, StepJob, StreamKey};
use crate::wire::MicroBatchId;

/// File of the DiLoCo outer state inside a checkpoint directory.
pub const DILOCO_FILE: &str = "diloco.bin";

/// The DiLoCo state saved with a checkpoint, checked against the hash in its metadata, so a
/// truncated or foreign file is refused with the reason.
pub fn load_diloco(
    dir: &Path,
    meta: &checkpoint::CheckpointMeta,
    cfg: crate::replica::DilocoConfig,
    len: usize,
) -> Result<Diloco, EngineError> {
    let path = dir.join(DILOCO_FILE);
    let bytes = std::fs::read(&path).map_err(|e| file_error(&path, e))?;
    let want = meta.extra["diloco"]["hash"].as_str().unwrap_or_default();
    let got = hex::encode(blake3::hash(&bytes).as_bytes());
    if want != got {
        return Err(EngineError::DilocoHash {
            path,
            got,
            want: want.to_string(),
        });
    }
    Diloco::restore(cfg, &bytes, len).map_err(|e| EngineError::DilocoState {
        path,
        source: Arc::new(e),
    })
}

fn file_error(path: &Path, e: std::io::Error) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

/// Forward passes an engine keeps for their backward passes at most (each holds one
/// micro-batch's intermediate activations); past it the oldest is dropped and its backward
/// pass recomputes it, with the same bits.
pub const KEPT_FORWARDS: usize = 8;

/// A forward pass kept for its backward pass: the weights it ran at, its input, its graph.
struct KeptForward {
    mb: MicroBatchId,
    weights: u64,
    input: StageInput,
    graph: Kept,
}

/// Owns the stage between jobs.
pub struct Engine {
    stage: Stage,
    /// The optimizer steps applied to `stage` (known once a step ran here; before that, jobs
    /// run at the weights it started with).
    version: Option<u64>,
    /// With a weight lag of 1: the weights before the last step, and that step, for the
    /// micro-batches computed one step behind (see `pipeline/schedule.rs`).
    previous: Option<(u64, Stage)>,
    keep_previous: bool,
    /// Forward passes whose graphs wait for their backward passes, oldest first: a backward
    /// pass then costs no recomputation of its forward.
    kept: VecDeque<KeptForward>,
    optimizer: AdamW,
    accum: Vec<Vec<f32>>,
    count: usize,
    diloco: Option<Diloco>,
    /// Where checkpoint jobs write, and the dataset root they record.
    checkpoint: Option<(PathBuf, [u8; 32])>,
    /// Inference caches, and the version of the weights they serve from: bumped whenever
    /// θ₀ changes (or, with DiLoCo off, the weights themselves).
    serving: Serving,
    serve_version: u64,
    /// Hashes of the weights jobs ran at, by step, since the weights last moved (hashing a
    /// stage's weights costs a few ms: once per step, not once per job).
    weight_hashes: Vec<(u64, Hash32)>,
    /// The hash of the last backward pass's parameter gradients and loss.
    last_grads_hash: Hash32,
    /// Evidence of this replica's jobs for auditors, and the codec replays hash through.
    store: Option<JobStore>,
    wire: neuroshard_model::replay::Wire,
    /// The test adversary of `swarm --lazy` (see `AuditSettings::lazy`).
    lazy: bool,
    /// The test adversary of `swarm --withhold` (see `AuditSettings::withhold`).
    withhold: bool,
}

/// Whether every value is finite, in one branch-free pass that vectorizes (`x · 0` is 0 for
/// a finite value and NaN for an infinite or NaN one; a scalar `is_finite` loop over each
/// backward pass's gradients was 1.5% of a swarm's CPU time).
fn all_finite(xs: &[f32]) -> bool {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x * 0.0;
        }
    }
    acc.iter().all(|a| *a == 0.0) && chunks.remainder().iter().all(|x| x.is_finite())
}

/// A job's weights step, kind and inputs as its commitment hashes them and evidence carries
/// them: token input with the genesis window of each row (the first stage), hidden states
/// as they are. None for an optimizer step, or a dimension past `u32`.
pub fn job_evidence(job: &Job) -> Option<(u64, JobKind, JobInputs)> {
    let (weights, kind, input, upstream, genesis) = match job {
        Job::Forward {
            input,
            weights,
            genesis,
            ..
        } => (*weights, JobKind::Forward, input, None, genesis),
        Job::Backward {
            input,
            upstream,
            weights,
            genesis,
            ..
        } => (*weights, JobKind::Backward, input, Some(upstream), genesis),
        Job::Step { .. } => return None,
    };
    let mut inputs = job_inputs(input, upstream)?;
    if let StageData::Tokens(tokens) = &inputs.input
        && !genesis.is_empty()
    {
        let windows = genesis
            .iter()
            .map(|w| WindowRef {
                shard: w.shard,
                window: w.window,
            })
            .collect();
        inputs.input = StageData::Genesis(GenesisTokens {
            tokens: tokens.clone(),
            windows,
        });
    }
    Some((weights, kind, inputs))
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
            version: None,
            previous: None,
            keep_previous: false,
            kept: VecDeque::new(),
            optimizer,
            accum,
            count: 0,
            diloco,
            checkpoint: None,
            serving: Serving::default(),
            serve_version: 0,
            weight_hashes: Vec::new(),
            last_grads_hash: NO_HASH,
            store: None,
            wire: Default::default(),
            lazy: false,
            withhold: false,
        }
    }

    /// Makes this engine the lazy worker of `swarm --lazy`: its forward outputs are noise.
    pub fn lazy(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// Makes this engine the withholding worker of `swarm --withhold`: it serves no evidence.
    pub fn withhold(mut self, withhold: bool) -> Self {
        self.withhold = withhold;
        self
    }

    /// Keeps the weights before each step for jobs one step behind (a weight lag of 1).
    pub fn with_weight_lag(mut self, lag: u64) -> Self {
        self.keep_previous = lag > 0;
        self
    }

    /// The weights of step `version`: the current ones or those kept from before the last
    /// step.
    fn weights(&self, version: u64) -> Result<&Stage, EngineError> {
        match (self.version, &self.previous) {
            (None, _) => Ok(&self.stage),
            (Some(v), _) if v == version => Ok(&self.stage),
            (_, Some((v, stage))) if *v == version => Ok(stage),
            (current, _) => Err(EngineError::WeightsNotHeld {
                version,
                current: current.unwrap_or_default(),
            }),
        }
    }

    /// Before a DiLoCo job moves the weights: kept forward passes ran at the old ones, and a
    /// backward pass after the move recomputes at the new ones, as it always did. Returns the
    /// current weights, flat, when older weights are kept that the job must move too.
    fn before_moving_weights(&mut self) -> Option<Vec<f32>> {
        self.kept.clear();
        self.weight_hashes.clear();
        self.previous
            .as_ref()
            .map(|_| self.stage.params().flatten())
    }

    fn keep(&mut self, forward: KeptForward) {
        self.kept.retain(|k| k.mb != forward.mb);
        while self.kept.len() >= KEPT_FORWARDS {
            self.kept.pop_front();
        }
        self.kept.push_back(forward);
    }

    /// The backward pass of `mb`: from its kept forward pass when that ran at these weights on
    /// this input, else recomputing the forward (the same bits either way).
    fn backward(
        &mut self,
        mb: MicroBatchId,
        input: &StageInput,
        upstream: &neuroshard_model::Upstream,
        weights: u64,
    ) -> Result<neuroshard_model::StageGrads, EngineError> {
        let kept = self
            .kept
            .iter()
            .position(|k| k.mb == mb)
            .and_then(|i| self.kept.remove(i))
            .filter(|k| k.weights == weights && k.input == *input);
        let stage = self.weights(weights)?;
        Ok(match kept {
            Some(k) => stage.backward_kept(k.graph, upstream),
            None => stage.backward(input, upstream),
        }?)
    }

    /// Moves the kept weights by what a DiLoCo job just did to the current ones (`before`
    /// them), so they stay the same step behind in the new outer frame.
    fn shift_previous(&mut self, before: Option<Vec<f32>>) {
        let (Some(before), Some((_, prev))) = (before, self.previous.as_mut()) else {
            return;
        };
        let after = self.stage.params().flatten();
        let mut flat = prev.params().flatten();
        for ((p, a), b) in flat.iter_mut().zip(&after).zip(&before) {
            *p += a - b;
        }
        if prev.params_mut().set_flat(&flat).is_err() {
            self.previous = None;
        }
    }

    /// Checkpoint jobs write into `dir` and name the dataset `root`.
    pub fn with_checkpoint_dir(mut self, dir: PathBuf, root: [u8; 32]) -> Self {
        self.checkpoint = Some((dir, root));
        self
    }

    pub fn params(&self) -> &neuroshard_model::ParamSet {
        self.stage.params()
    }

    pub fn diloco(&self) -> Option<&Diloco> {
        self.diloco.as_ref()
    }

    /// Streams whose inference caches the engine holds.
    pub fn cached_streams(&self) -> usize {
        self.serving.cached()
    }

    pub fn model_hash(&self) -> [u8; 32] {
        self.stage.model_hash()
    }

    /// The weights a stage serves: θ₀ when DiLoCo runs (identical on every replica of the
    /// stage, so any replica answers alike), else the current weights.
    fn serving_runner(&self) -> Result<neuroshard_model::StageRunner, EngineError> {
        let mut params = self.stage.params().clone();
        if let Some(d) = &self.diloco {
            params.set_flat(d.theta())?;
        }
        Ok(neuroshard_model::StageRunner::new(
            self.stage.config().clone(),
            *self.stage.spec(),
            &params,
        )?)
    }

    fn infer(&mut self, steps: Vec<StepJob>, evict: &[StreamKey]) -> EngineOutput {
        let version = self.serve_version;
        let mut serving = std::mem::take(&mut self.serving);
        let out = serving.run(version, || self.serving_runner(), steps, evict);
        self.serving = serving;
        EngineOutput::Inferred(out)
    }

    fn sync_apply(
        &mut self,
        round: u64,
        messages: Vec<(NodeId, Vec<u8>)>,
    ) -> Result<(Applied, Arc<Vec<u8>>), EngineError> {
        let d = self.diloco.as_mut().ok_or(EngineError::DilocoOff)?;
        let applied = d.apply(round, messages, self.stage.params_mut())?;
        Ok((applied, Arc::new(encode_adamw(&self.optimizer))))
    }

    fn sync_reapply(
        &mut self,
        round: u64,
        extra: Vec<(NodeId, Vec<u8>)>,
        set: &[NodeId],
    ) -> Result<(Applied, Arc<Vec<u8>>), EngineError> {
        let d = self.diloco.as_mut().ok_or(EngineError::DilocoOff)?;
        let applied = d.reapply(round, extra, set, self.stage.params_mut())?;
        Ok((applied, Arc::new(encode_adamw(&self.optimizer))))
    }

    fn sync_adopt(
        &mut self,
        round: u64,
        bytes: &[u8],
        included: bool,
    ) -> Result<[u8; 32], EngineError> {
        let d = self.diloco.as_mut().ok_or(EngineError::DilocoOff)?;
        Ok(d.adopt(round, bytes, included, self.stage.params_mut())?)
    }

    /// The hash of the weights of step `version`, computed once per step.
    fn weights_hash(&mut self, version: u64) -> Result<Hash32, EngineError> {
        if let Some((_, h)) = self.weight_hashes.iter().find(|(v, _)| *v == version) {
            return Ok(*h);
        }
        let h = self.weights(version)?.model_hash();
        self.weight_hashes.push((version, h));
        Ok(h)
    }

    /// Runs one job and, for a forward or backward pass that ran, the hashes its commitment
    /// names (the output is hashed by the pipeline, as it travels).
    pub fn run_hashed(&mut self, job: Job) -> (JobDone, Option<JobHashes>) {
        // The job's inputs as evidence carries them: one copy, taken before the job consumes
        // them, that the hashes and the store both use.
        let hashed = job_evidence(&job);
        let weights = hashed.as_ref().map(|(w, ..)| self.weights_hash(*w));
        let done = self.run(job);
        if let JobDone::Step {
            step, model_hash, ..
        } = &done
        {
            // The weights moved to version `step + 1`, whose hash the step just computed
            // (hashing them again for the next job was a sixth of the engine's hashing);
            // version `step` stays valid only while it is kept for a lagging job.
            let kept = self.previous.as_ref().map(|(v, _)| *v);
            self.weight_hashes.retain(|(v, _)| Some(*v) == kept);
            self.weight_hashes
                .push((step.saturating_add(1), *model_hash));
        }
        let (Some((step, kind, inputs)), Some(Ok(weights))) = (hashed, weights) else {
            return (done, None);
        };
        let (mb, grads) = match &done {
            JobDone::Backward { mb, .. } => (*mb, self.last_grads_hash),
            JobDone::Forward { mb, .. } => (*mb, NO_HASH),
            _ => return (done, None),
        };
        let hashes = JobHashes {
            step,
            weights,
            input: inputs.input.hash(),
            upstream: inputs.upstream.hash(),
            grads,
        };
        // Without its evidence the job is still done; an auditor who asks gets a refusal.
        let _ = self.keep_evidence(&mb, kind, step, &weights, &inputs);
        (done, Some(hashes))
    }

    /// Runs one job; errors become `JobDone::Failed`, never a panic.
    pub fn run(&mut self, job: Job) -> JobDone {
        match job {
            Job::Forward {
                mb, input, weights, ..
            } => {
                match self
                    .weights(weights)
                    .and_then(|w| Ok(w.forward_kept(&input)?))
                {
                    Ok((mut output, graph)) => {
                        if self.lazy {
                            for (i, x) in output.data.iter_mut().enumerate() {
                                *x = ((i as f32) * 0.37 + mb.step as f32).sin();
                            }
                        }
                        self.keep(KeptForward {
                            mb,
                            weights,
                            input,
                            graph,
                        });
                        JobDone::Forward { mb, output }
                    }
                    Err(error) => JobDone::Failed {
                        mb: Some(mb),
                        error: error.to_string(),
                    },
                }
            }
            Job::Backward {
                mb,
                input,
                upstream,
                weights,
                ..
            } => match self.backward(mb, &input, &upstream, weights) {
                Ok(g) => {
                    if !g.params.iter().all(|v| all_finite(v)) {
                        return JobDone::Failed {
                            mb: Some(mb),
                            error: EngineError::NonFiniteGradient.to_string(),
                        };
                    }
                    self.last_grads_hash = neuroshard_audit::grads_hash(g.loss, &g.params);
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
                Err(error) => JobDone::Failed {
                    mb: Some(mb),
                    error: error.to_string(),
                },
            },
            Job::Step { step } => {
                let n = self.count.max(1) as f32;
                // The mean in place: the same bits as a divided copy, without 10 MB of fresh
                // pages a step.
                self.accum
                    .iter_mut()
                    .for_each(|v| v.iter_mut().for_each(|x| *x /= n));
                self.count = 0;
                let before = self.keep_previous.then(|| self.stage.clone());
                let stepped = self.optimizer.step(self.stage.params_mut(), &self.accum);
                self.accum.iter_mut().for_each(|v| v.fill(0.0));
                match stepped {
                    Ok(stats) => {
                        self.previous = before.map(|b| (step, b));
                        self.version = Some(step.saturating_add(1));
                        JobDone::Step {
                            step,
                            lr: stats.lr,
                            grad_norm: stats.grad_norm,
                            model_hash: self.stage.model_hash(),
                        }
                    }
                    Err(e) => JobDone::Failed {
                        mb: None,
                        error: EngineError::Optimizer {
                            step,
                            source: Arc::new(e),
                        }
                        .to_string(),
                    },
                }
            }
        }
    }

    /// Writes the checkpoint as a whole: into `<dir>.new`, then swapped in by two renames, so
    /// a crash at any moment leaves either the previous or the new checkpoint complete.
    fn save(&self, dir: &Path, step: u64, extra: serde_json::Value) -> Result<String, EngineError> {
        let fresh = sibling(dir, "new");
        let old = sibling(dir, "old");
        let _ = std::fs::remove_dir_all(&fresh);
        let mut extra = extra;
        if let Some(d) = &self.diloco {
            // Written before meta.json, whose presence marks a complete checkpoint.
            std::fs::create_dir_all(&fresh).map_err(|e| file_error(&fresh, e))?;
            checkpoint::write_atomic(&fresh.join(DILOCO_FILE), &d.outer_bytes())?;
            if let Some(obj) = extra.as_object_mut() {
                obj.insert(
                    "diloco".into(),
                    serde_json::json!({"round": d.round(), "hash": hex::encode(d.hash())}),
                );
            }
        }
        let meta = checkpoint::save(&fresh, &self.stage, Some(&self.optimizer), step, extra)?;
        let swap = || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&old);
            if dir.exists() {
                std::fs::rename(dir, &old)?;
            }
            std::fs::rename(&fresh, dir)?;
            let _ = std::fs::remove_dir_all(&old);
            Ok(())
        };
        swap().map_err(|e| file_error(dir, e))?;
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

impl Compute for Engine {
    fn execute(&mut self, job: EngineJob) -> EngineOutput {
        match job {
            EngineJob::Run(job) => {
                if matches!(job, Job::Step { .. }) && self.diloco.is_none() {
                    self.serve_version += 1;
                }
                let (done, hashes) = self.run_hashed(job);
                EngineOutput::Job(done, hashes)
            }
            EngineJob::Infer { steps, evict } => self.infer(steps, &evict),
            EngineJob::Evidence { .. } if self.withhold => EngineOutput::Evidence(Err(
                EngineError::NoEvidence("withheld (swarm --withhold)".into()),
            )),
            EngineJob::Evidence { mb, kind, weights } => {
                EngineOutput::Evidence(self.evidence(&mb, kind, &weights))
            }
            EngineJob::Replay {
                spec,
                job,
                inputs,
                weights,
            } => EngineOutput::Replayed(self.replay(spec, &job, &inputs, &weights)),
            EngineJob::ForgetEvidence { before } => {
                self.forget_evidence_before(before);
                let (bytes, budget) = self.evidence_bytes().unwrap_or((0, 0));
                EngineOutput::EvidenceHeld { bytes, budget }
            }
            EngineJob::Settle { settle, weights } => {
                EngineOutput::Settled(self.settle(&settle, &weights).map_err(Arc::new))
            }
            EngineJob::SyncPrepare { round } => EngineOutput::Prepared(self.sync_prepare(round)),
            EngineJob::SyncApply { round, messages } => {
                self.serve_version += 1;
                let before = self.before_moving_weights();
                let out = self.sync_apply(round, messages);
                self.shift_previous(before);
                EngineOutput::Applied(out)
            }
            EngineJob::SyncReapply { round, extra, set } => {
                self.serve_version += 1;
                let before = self.before_moving_weights();
                let out = self.sync_reapply(round, extra, &set);
                self.shift_previous(before);
                EngineOutput::Applied(out)
            }
            EngineJob::SyncAdopt {
                round,
                bytes,
                included,
            } => {
                self.serve_version += 1;
                let before = self.before_moving_weights();
                let out = self.sync_adopt(round, &bytes, included);
                self.shift_previous(before);
                EngineOutput::Adopted(out)
            }
            EngineJob::Checkpoint { step, mut extra } => {
                let Some((dir, root)) = self.checkpoint.clone() else {
                    return EngineOutput::Saved(Err(EngineError::NoCheckpointDir));
                };
                if let Some(obj) = extra.as_object_mut() {
                    obj.insert(
                        "dataset".into(),
                        serde_json::json!({ "root": hex::encode(root) }),
                    );
                }
                EngineOutput::Saved(self.save(&dir, step, extra))
            }
        }
    }
}

/// Nanoseconds an engine thread has spent executing jobs, and the part of it spent on audit
/// work, shared with whoever reports them.
#[derive(Debug, Clone, Default)]
pub struct BusyTime(Arc<(AtomicU64, AtomicU64)>);

impl BusyTime {
    pub fn add(&self, d: std::time::Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.0.fetch_add(ns, Ordering::Relaxed);
    }

    /// Time spent on a job of the audits (a replay, a settlement, evidence served).
    pub fn add_audit(&self, d: std::time::Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.1.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn ms(&self) -> f64 {
        self.0.0.load(Ordering::Relaxed) as f64 / 1e6
    }

    pub fn audit_ms(&self) -> f64 {
        self.0.1.load(Ordering::Relaxed) as f64 / 1e6
    }
}

/// Starts the engine thread: jobs in, results out, one at a time; among the jobs waiting, an
/// inference step goes first (see [`next_job`]). `busy` counts the time spent in jobs (the
/// node's compute utilization).
pub fn spawn<C: Compute + Send + 'static>(
    mut engine: C,
    threads: usize,
    done: UnboundedSender<(Token, EngineOutput)>,
    busy: BusyTime,
) -> std::io::Result<mpsc::Sender<(Token, EngineJob)>> {
    let (tx, rx) = mpsc::channel::<(Token, EngineJob)>();
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            neuroshard_model::with_threads(threads, move || {
                let mut waiting = VecDeque::new();
                loop {
                    if waiting.is_empty() {
                        match rx.recv() {
                            Ok(job) => waiting.push_back(job),
                            Err(_) => break,
                        }
                    }
                    waiting.extend(rx.try_iter());
                    let Some((token, job)) = next_job(&mut waiting) else {
                        continue;
                    };
                    let audit = matches!(
                        job,
                        EngineJob::Replay { .. }
                            | EngineJob::Settle { .. }
                            | EngineJob::Evidence { .. }
                    );
                    let started = std::time::Instant::now();
                    let out = engine.execute(job);
                    let took = started.elapsed();
                    busy.add(took);
                    if audit {
                        busy.add_audit(took);
                    }
                    if done.send((token, out)).is_err() {
                        break;
                    }
                }
            })
        })?;
    Ok(tx)
}

/// The job to run next: the oldest inference step if one waits, else the oldest job. A
/// stream's token then waits for at most the one training job already running, not for every
/// forward and backward queued before it. Training jobs keep their order among themselves,
/// and an inference step reads only the serving weights and its caches, so the training
/// result is the same bits whatever ran in between.
pub fn next_job(waiting: &mut VecDeque<(Token, EngineJob)>) -> Option<(Token, EngineJob)> {
    let infer = waiting
        .iter()
        .position(|(_, j)| matches!(j, EngineJob::Infer { .. }));
    match infer {
        Some(i) => waiting.remove(i),
        None => waiting.pop_front(),
    }
}

mod audit;
mod offer;
#[cfg(test)]
mod tests;
mod uncached;
