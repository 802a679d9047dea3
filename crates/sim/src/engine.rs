//! Engines inside the simulator: the stand-in for scale, the real engine on a tiny model, and
//! the virtual time each job costs.

use std::time::Duration;

use neuroshard_model::{AdamW, AdamWConfig, ModelConfig, Stage, StageInput, StageSpec};
use neuroshard_node::act_codec::ActSpec;
use neuroshard_node::compute::{DEFAULT_AUDIT_BUDGET, Engine, JobStore, codec_wire};
use neuroshard_node::core::{Compute, EngineError, EngineJob, EngineOutput};
use neuroshard_node::pipeline::{Job, JobDone};
use neuroshard_node::replica::DilocoConfig;
use neuroshard_proof::Hash32;

use crate::sim::FactoryError;
use crate::standin::StandIn;

/// An engine the simulator can run, snapshot at checkpoints and restore after a crash.
pub trait SimEngine: Compute {
    /// The engine as its last checkpoint left it, if it ever wrote one.
    fn restore_saved(&self) -> Option<Box<dyn SimEngine>>;
    /// (round, θ₀ hash) of its DiLoCo state.
    fn sync_state(&self) -> (u64, Hash32);
    fn numel(&self) -> usize;
    fn spec(&self) -> StageSpec;
    /// A scalar summary of the parameters' distance from where training leads (stand-in:
    /// distance to the target; real engine: none).
    fn distance(&self) -> Option<f32> {
        None
    }
    /// θ₀, the stage's agreed outer parameters (None with DiLoCo off).
    fn theta(&self) -> Option<Vec<f32>>;
    /// An offer of the engine's next round, decoded as its DiLoCo state decodes it.
    fn decode_offer(&self, bytes: &[u8]) -> Option<Vec<f32>>;
    /// `delta` as an offer of the engine's next round, in the network's encoding.
    fn encode_offer(&self, delta: &[f32]) -> Option<Vec<u8>>;
}

impl SimEngine for StandIn {
    fn restore_saved(&self) -> Option<Box<dyn SimEngine>> {
        self.saved.as_ref().map(|s| s.clone() as Box<dyn SimEngine>)
    }

    fn sync_state(&self) -> (u64, Hash32) {
        self.diloco()
            .map_or((0, [0; 32]), |d| (d.round(), d.hash()))
    }

    fn numel(&self) -> usize {
        StandIn::numel(self)
    }

    fn spec(&self) -> StageSpec {
        StandIn::spec(self)
    }

    fn distance(&self) -> Option<f32> {
        Some(StandIn::distance(self))
    }

    fn theta(&self) -> Option<Vec<f32>> {
        self.diloco().map(|d| d.theta().to_vec())
    }

    fn decode_offer(&self, bytes: &[u8]) -> Option<Vec<f32>> {
        self.diloco()?.decode_offer(bytes, self.params()).ok()
    }

    fn encode_offer(&self, delta: &[f32]) -> Option<Vec<u8>> {
        self.diloco()?.encode_offer(delta, self.params()).ok()
    }
}

/// How a lazy worker cheats (the audits' adversaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cheat {
    /// Sends noise of the right shape as its forward output (and commits to it).
    Noise,
    /// Skips its layers: passes its input on as its forward output.
    PassThrough,
    /// Computes honestly but serves no evidence of its jobs to auditors.
    RefusesEvidence,
    /// Computes honestly, but as an auditor claims every replay it runs disagreed.
    AccusesFalsely,
    /// A driver that trains on text of its own (here: each token id mirrored in the
    /// vocabulary) while naming the genesis windows it was given and sending their genuine
    /// targets, so the last stage's target check passes.
    OtherData,
    /// Trains honestly but offers, each round, its previous round's pseudo-gradient (in this
    /// round's encoding), committed to as its offer of the weights it trained to.
    StaleOffer,
    /// Sends upstream every input gradient multiplied by −10⁴ (and commits to it): finite,
    /// within the codec's limits, and enough to take over AdamW's moments upstream.
    ScaledGradient,
}

/// The real engine over a tiny model (no crash recovery in the simulator: its checkpoints go
/// to disk), keeping its jobs' evidence in memory for auditors.
pub struct RealEngine {
    engine: Engine,
    spec: StageSpec,
    numel: usize,
    vocab: u32,
    cheat: Option<Cheat>,
    /// The genuine offer of the round before (for `Cheat::StaleOffer`).
    last_offer: Option<Vec<u8>>,
}

impl RealEngine {
    pub fn new(
        model: ModelConfig,
        spec: StageSpec,
        seed: u64,
        optim: AdamWConfig,
        diloco: Option<DilocoConfig>,
        weight_lag: u64,
        activations: ActSpec,
    ) -> Result<Self, FactoryError> {
        let store =
            JobStore::new(None, DEFAULT_AUDIT_BUDGET).map_err(|e| FactoryError(e.to_string()))?;
        let wire = codec_wire(activations, model.d_model);
        let vocab = u32::try_from(model.vocab).unwrap_or(u32::MAX);
        let stage = Stage::init(model, spec, seed).map_err(|e| FactoryError(e.to_string()))?;
        let numel = stage.params().numel();
        let opt = AdamW::new(optim, stage.params());
        let diloco = match diloco {
            Some(cfg) => Some(
                neuroshard_node::replica::Diloco::new(cfg, stage.params())
                    .map_err(|e| FactoryError(e.to_string()))?,
            ),
            None => None,
        };
        Ok(Self {
            engine: Engine::new(stage, opt, diloco)
                .with_weight_lag(weight_lag)
                .with_job_store(store, wire),
            spec,
            numel,
            vocab,
            cheat: None,
            last_offer: None,
        })
    }

    /// This worker cheats as `cheat` says.
    pub fn cheating(mut self, cheat: Option<Cheat>) -> Self {
        self.cheat = cheat;
        self
    }
}

impl Compute for RealEngine {
    fn execute(&mut self, mut job: EngineJob) -> EngineOutput {
        if self.cheat == Some(Cheat::OtherData)
            && let EngineJob::Run(Job::Forward { input, .. } | Job::Backward { input, .. }) =
                &mut job
            && let StageInput::Tokens(t) = input
        {
            for id in &mut t.ids {
                *id = self.vocab.saturating_sub(1).saturating_sub(*id);
            }
        }
        let input = match &job {
            EngineJob::Run(Job::Forward { input, .. }) => Some(input.clone()),
            _ => None,
        };
        match (self.cheat, self.engine.execute(job)) {
            (Some(Cheat::Noise), EngineOutput::Job(JobDone::Forward { mb, mut output }, h)) => {
                for (i, x) in output.data.iter_mut().enumerate() {
                    *x = ((i as f32) * 0.37 + mb.step as f32).sin();
                }
                EngineOutput::Job(JobDone::Forward { mb, output }, h)
            }
            (Some(Cheat::PassThrough), EngineOutput::Job(JobDone::Forward { mb, output }, h)) => {
                let output = match input {
                    Some(StageInput::Hidden(a)) => a,
                    _ => output,
                };
                EngineOutput::Job(JobDone::Forward { mb, output }, h)
            }
            (
                Some(Cheat::ScaledGradient),
                EngineOutput::Job(
                    JobDone::Backward {
                        mb,
                        input_grad: Some(mut g),
                        loss,
                    },
                    h,
                ),
            ) => {
                for x in &mut g.data {
                    *x *= -1e4;
                }
                let input_grad = Some(g);
                EngineOutput::Job(
                    JobDone::Backward {
                        mb,
                        input_grad,
                        loss,
                    },
                    h,
                )
            }
            (Some(Cheat::RefusesEvidence), EngineOutput::Evidence(_)) => {
                EngineOutput::Evidence(Err(EngineError::NoEvidence("not kept".into())))
            }
            (Some(Cheat::AccusesFalsely), EngineOutput::Replayed(Ok(mut r))) => {
                r.output_hash[0] ^= 1;
                EngineOutput::Replayed(Ok(r))
            }
            (Some(Cheat::StaleOffer), EngineOutput::Prepared(Ok((mut p, h)))) => {
                let genuine = p.blob.to_vec();
                let stale = self.last_offer.replace(genuine).and_then(|last| {
                    let delta = self.decode_offer(&last)?;
                    self.encode_offer(&delta)
                });
                if let Some(stale) = stale {
                    p.blob = std::sync::Arc::new(stale);
                }
                EngineOutput::Prepared(Ok((p, h)))
            }
            (_, out) => out,
        }
    }
}

impl SimEngine for RealEngine {
    fn restore_saved(&self) -> Option<Box<dyn SimEngine>> {
        None
    }

    fn sync_state(&self) -> (u64, Hash32) {
        self.engine
            .diloco()
            .map_or((0, [0; 32]), |d| (d.round(), d.hash()))
    }

    fn numel(&self) -> usize {
        self.numel
    }

    fn spec(&self) -> StageSpec {
        self.spec
    }

    fn theta(&self) -> Option<Vec<f32>> {
        self.engine.diloco().map(|d| d.theta().to_vec())
    }

    fn decode_offer(&self, bytes: &[u8]) -> Option<Vec<f32>> {
        let params = self.engine.params();
        self.engine.diloco()?.decode_offer(bytes, params).ok()
    }

    fn encode_offer(&self, delta: &[f32]) -> Option<Vec<u8>> {
        let params = self.engine.params();
        self.engine.diloco()?.encode_offer(delta, params).ok()
    }
}

/// Virtual time of each kind of engine job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineCosts {
    pub forward: Duration,
    pub backward: Duration,
    pub step: Duration,
    pub sync: Duration,
}

impl Default for EngineCosts {
    fn default() -> Self {
        Self {
            forward: Duration::from_millis(20),
            backward: Duration::from_millis(40),
            step: Duration::from_millis(5),
            sync: Duration::from_millis(20),
        }
    }
}

impl EngineCosts {
    pub fn of(&self, job: &EngineJob) -> Duration {
        match job {
            EngineJob::Run(Job::Forward { .. }) => self.forward,
            EngineJob::Run(Job::Backward { .. }) => self.backward,
            EngineJob::Run(Job::Step { .. }) => self.step,
            EngineJob::Checkpoint { .. } => self.step,
            _ => self.sync,
        }
    }
}
