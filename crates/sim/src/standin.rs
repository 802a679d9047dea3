//! A cheap deterministic stand-in for the engine, for scale runs: activations of the right
//! shapes from a few arithmetic operations, and "training" that pulls the stage's parameters
//! toward a fixed target with per-micro-batch noise. The DiLoCo side (compression, robust
//! aggregation, outer Nesterov, hashes) is the real [`Diloco`] on the stage's real
//! parameter layout, so rounds behave as in a real node.

use std::sync::Arc;

use neuroshard_model::{
    Activations, AdamW, AdamWConfig, ModelConfig, ParamSet, StageInput, StageSpec, Upstream,
};
use neuroshard_node::core::{Compute, EngineError, EngineJob, EngineOutput, JobHashes};
use neuroshard_node::pipeline::{Job, JobDone};
use neuroshard_node::replica::{Diloco, DilocoConfig, encode_adamw};
use neuroshard_node::wire::MicroBatchId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Learning rate of the stand-in's inner steps.
const LR: f32 = 0.05;

/// The stand-in engine of one replica.
#[derive(Clone)]
pub struct StandIn {
    config: ModelConfig,
    spec: StageSpec,
    params: ParamSet,
    target: Vec<f32>,
    accum: Vec<f32>,
    count: usize,
    diloco: Option<Diloco>,
    optimizer_blob: Arc<Vec<u8>>,
    /// What the last checkpoint job saved (the simulator's "disk").
    pub saved: Option<Box<StandIn>>,
}

impl StandIn {
    /// A replica of `spec`; every replica of a stage starts from the same parameters and
    /// pulls toward the same target, as replicas of a real stage share their init.
    pub fn new(
        config: ModelConfig,
        spec: StageSpec,
        seed: u64,
        diloco: Option<DilocoConfig>,
    ) -> Result<Self, EngineError> {
        let params = ParamSet::init(spec.param_specs(&config), seed);
        let n = params.numel();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (spec.first_layer as u64) << 32 ^ 0x7a);
        let target = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
        let diloco = match diloco {
            Some(cfg) => Some(Diloco::new(cfg, &params)?),
            None => None,
        };
        let optimizer_blob = Arc::new(encode_adamw(&AdamW::new(AdamWConfig::default(), &params)));
        Ok(Self {
            config,
            spec,
            params,
            target,
            accum: vec![0.0; n],
            count: 0,
            diloco,
            optimizer_blob,
            saved: None,
        })
    }

    pub fn numel(&self) -> usize {
        self.params.numel()
    }

    pub fn spec(&self) -> StageSpec {
        self.spec
    }

    pub fn params(&self) -> &ParamSet {
        &self.params
    }

    pub fn diloco(&self) -> Option<&Diloco> {
        self.diloco.as_ref()
    }

    /// Half the mean squared distance to the target: what "loss" means here.
    pub fn distance(&self) -> f32 {
        let flat = self.params.flatten();
        let sum: f64 = flat
            .iter()
            .zip(&self.target)
            .map(|(p, t)| f64::from(p - t).powi(2))
            .sum();
        (0.5 * sum / flat.len().max(1) as f64) as f32
    }

    fn noise(mb: &MicroBatchId, n: usize) -> Vec<f32> {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&mb.step.to_le_bytes());
        seed[8..12].copy_from_slice(&mb.index.to_le_bytes());
        for (s, o) in seed[12..].iter_mut().zip(&mb.origin) {
            *s = *o;
        }
        let mut rng = ChaCha8Rng::from_seed(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    fn forward(&self, input: &StageInput) -> Activations {
        let d = self.config.d_model;
        let theta = self.params.values().first().map_or(&[][..], |v| &v[..]);
        let w = |i: usize| theta.get(i % theta.len().max(1)).copied().unwrap_or(0.0);
        match input {
            StageInput::Tokens(t) => Activations {
                batch: t.batch,
                seq: t.seq,
                dim: d,
                data: (0..t.batch * t.seq * d)
                    .map(|i| (t.ids[i / d] as f32 * 0.01 + w(i)).tanh())
                    .collect(),
            },
            StageInput::Hidden(a) => Activations {
                batch: a.batch,
                seq: a.seq,
                dim: d,
                data: a
                    .data
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (x + 0.1 * w(i)).tanh())
                    .collect(),
            },
        }
    }

    /// What a real engine attests about a job, from the stand-in's own data: its weights, the
    /// job's inputs, and (backward) a hash standing for its gradients, which depend on the
    /// weights and the micro-batch only.
    fn hashes(&self, job: &Job) -> Option<JobHashes> {
        let (weights, _, inputs) = neuroshard_node::compute::job_evidence(job)?;
        let (Job::Forward { mb, .. } | Job::Backward { mb, .. }) = job else {
            return None;
        };
        let upstream = matches!(job, Job::Backward { .. }).then_some(());
        let weights_hash = self.params.hash();
        let grads = match upstream {
            None => neuroshard_audit::NO_HASH,
            Some(_) => *blake3::Hasher::new()
                .update(b"stand-in grads")
                .update(&weights_hash)
                .update(&mb.origin)
                .update(&mb.step.to_le_bytes())
                .update(&mb.index.to_le_bytes())
                .finalize()
                .as_bytes(),
        };
        Some(JobHashes {
            step: weights,
            weights: weights_hash,
            input: inputs.input.hash(),
            upstream: inputs.upstream.hash(),
            grads,
        })
    }

    fn run(&mut self, job: Job) -> JobDone {
        match job {
            // The stand-in has no kept weights: every job runs at the current ones.
            Job::Forward { mb, input, .. } => JobDone::Forward {
                mb,
                output: self.forward(&input),
            },
            Job::Backward {
                mb,
                input,
                upstream,
                ..
            } => {
                let flat = self.params.flatten();
                let noise = Self::noise(&mb, flat.len());
                for ((a, (p, t)), z) in self
                    .accum
                    .iter_mut()
                    .zip(flat.iter().zip(&self.target))
                    .zip(&noise)
                {
                    *a += (p - t) + 0.5 * z;
                }
                self.count += 1;
                let input_grad = match &input {
                    StageInput::Tokens(_) => None,
                    StageInput::Hidden(a) => {
                        let scale = match &upstream {
                            Upstream::Grad(g) => g.data.first().copied().unwrap_or(0.0) * 0.5,
                            Upstream::Targets(_) => 0.01,
                        };
                        Some(Activations {
                            batch: a.batch,
                            seq: a.seq,
                            dim: a.dim,
                            data: vec![scale; a.data.len()],
                        })
                    }
                };
                let loss = matches!(upstream, Upstream::Targets(_)).then(|| self.distance());
                JobDone::Backward {
                    mb,
                    input_grad,
                    loss,
                }
            }
            Job::Step { step } => {
                let n = self.count.max(1) as f32;
                let mut flat = self.params.flatten();
                for (p, g) in flat.iter_mut().zip(&self.accum) {
                    *p -= LR * g / n;
                }
                self.accum.fill(0.0);
                self.count = 0;
                if let Err(e) = self.params.set_flat(&flat) {
                    return JobDone::Failed {
                        mb: None,
                        error: e.to_string(),
                    };
                }
                JobDone::Step {
                    step,
                    lr: f64::from(LR),
                    grad_norm: 0.0,
                    model_hash: self.params.hash(),
                }
            }
        }
    }

    fn diloco_mut(&mut self) -> Result<&mut Diloco, EngineError> {
        self.diloco.as_mut().ok_or(EngineError::DilocoOff)
    }
}

impl Compute for StandIn {
    fn execute(&mut self, job: EngineJob) -> EngineOutput {
        let opt = self.optimizer_blob.clone();
        match job {
            EngineJob::Run(job) => {
                let hashes = self.hashes(&job);
                EngineOutput::Job(self.run(job), hashes)
            }
            EngineJob::SyncPrepare { round } => {
                // The stand-in keeps no evidence (its audits are refused), but its offers
                // carry a commitment like any replica's.
                let params = self.params.clone();
                let adamw = *blake3::hash(&self.optimizer_blob).as_bytes();
                EngineOutput::Prepared(self.diloco_mut().and_then(|d| {
                    let prepared = d.prepare(round, &params)?;
                    let hashes = neuroshard_node::compute::OfferHashes {
                        step: round,
                        weights: params.hash(),
                        outer: d.hash(),
                        outer_len: d.outer_bytes().len() as u64,
                        adamw,
                    };
                    Ok((prepared, hashes))
                }))
            }
            EngineJob::SyncApply { round, messages } => {
                let mut params = self.params.clone();
                let r = self
                    .diloco_mut()
                    .and_then(|d| Ok(d.apply(round, messages, &mut params)?));
                self.params = params;
                EngineOutput::Applied(r.map(|a| (a, opt)))
            }
            EngineJob::SyncReapply { round, extra, set } => {
                let mut params = self.params.clone();
                let r = self
                    .diloco_mut()
                    .and_then(|d| Ok(d.reapply(round, extra, &set, &mut params)?));
                self.params = params;
                EngineOutput::Applied(r.map(|a| (a, opt)))
            }
            EngineJob::SyncAdopt {
                round,
                bytes,
                included,
            } => {
                let mut params = self.params.clone();
                let r = self
                    .diloco_mut()
                    .and_then(|d| Ok(d.adopt(round, &bytes, included, &mut params)?));
                self.params = params;
                EngineOutput::Adopted(r)
            }
            EngineJob::Infer { steps, .. } => {
                EngineOutput::Inferred(steps.iter().map(|_| Err(EngineError::NoModel)).collect())
            }
            // Its hashes stand for work it never did: nothing to replay, nothing to serve.
            EngineJob::Evidence { .. } => EngineOutput::Evidence(Err(EngineError::NoEvidence(
                "the stand-in engine keeps no evidence".into(),
            ))),
            EngineJob::Replay { .. } => EngineOutput::Replayed(Err(EngineError::NoEvidence(
                "the stand-in engine cannot replay".into(),
            ))),
            EngineJob::ForgetEvidence { .. } => EngineOutput::EvidenceHeld {
                bytes: 0,
                budget: 0,
            },
            EngineJob::Settle { .. } => EngineOutput::Settled(Err(Arc::new(
                neuroshard_audit::EvidenceError::Replay(Box::new(EngineError::NoEvidence(
                    "the stand-in engine cannot replay".into(),
                ))),
            ))),
            EngineJob::Checkpoint { .. } => {
                let mut copy = self.clone();
                copy.saved = None;
                self.saved = Some(Box::new(copy));
                EngineOutput::Saved(Ok(hex::encode(self.params.hash())))
            }
        }
    }
}
