//! The engine side of serving: the stage's θ₀ uploaded once per version, a key/value cache
//! per stream, and sampling at the last stage. The core decides what runs and what is
//! dropped; this only executes, on the engine thread, between training jobs.

use std::collections::HashMap;

use neuroshard_model::{StageRunner, StepInput, StepOutput, StreamCache};
use neuroshard_proof::NodeId;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::wire::{Chunk, Head};
use crate::core::EngineError;

/// A stream as a replica knows it: its coordinator and the coordinator's number for it.
pub type StreamKey = (NodeId, u64);

/// One stream's step: feed `chunks` (into a fresh cache when `fresh`); the stage with the
/// head samples or scores as `head` says.
#[derive(Debug, Clone, PartialEq)]
pub struct StepJob {
    pub key: StreamKey,
    pub fresh: bool,
    pub chunks: Vec<Chunk>,
    pub head: Option<Head>,
}

/// A step's result: the last chunk's hidden states, or the drawn token and the generator's
/// new position.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    Hidden(Vec<f32>),
    Token {
        token: u32,
        draws: u64,
    },
    /// The summed cross-entropy of the scored targets.
    Scored {
        nll: f64,
    },
}

/// Caches and the runner of the weights they were computed with.
#[derive(Default)]
pub struct Serving {
    runner: Option<(u64, StageRunner)>,
    caches: HashMap<StreamKey, StreamCache>,
}

impl Serving {
    /// Streams with a cache.
    pub fn cached(&self) -> usize {
        self.caches.len()
    }

    /// Runs `steps` in order after dropping `evict`. `version` names the serving weights;
    /// `build` uploads them when it differs from the runner's. A stream keeps its cache
    /// across a version change: its earlier keys and values stay those of the older θ₀.
    pub fn run(
        &mut self,
        version: u64,
        build: impl FnOnce() -> Result<StageRunner, EngineError>,
        steps: Vec<StepJob>,
        evict: &[StreamKey],
    ) -> Vec<Result<StepResult, EngineError>> {
        for k in evict {
            self.caches.remove(k);
        }
        if steps.is_empty() {
            return Vec::new();
        }
        if self.runner.as_ref().is_none_or(|(v, _)| *v != version) {
            match build() {
                Ok(r) => self.runner = Some((version, r)),
                Err(e) => return steps.iter().map(|_| Err(e.clone())).collect(),
            }
        }
        let Some((_, runner)) = &self.runner else {
            return steps
                .iter()
                .map(|_| Err(EngineError::NoServingWeights))
                .collect();
        };
        steps
            .into_iter()
            .map(|job| {
                let mut cache = match self.caches.remove(&job.key) {
                    Some(c) if !job.fresh => c,
                    _ => runner.new_cache(),
                };
                // A failed step leaves a cache fed only partly: it is dropped (the core forgets
                // the stream too), never reused.
                let out = feed(runner, &mut cache, &job)?;
                self.caches.insert(job.key, cache);
                Ok(out)
            })
            .collect()
    }
}

fn feed<'a>(
    runner: &StageRunner,
    cache: &mut StreamCache,
    job: &'a StepJob,
) -> Result<StepResult, EngineError> {
    let Some((last, earlier)) = job.chunks.split_last() else {
        return Err(EngineError::EmptyStep);
    };
    let input = |c: &'a Chunk| match c {
        Chunk::Tokens(t) => StepInput::Tokens(t),
        Chunk::Hidden(h) => StepInput::Hidden(h),
    };
    for chunk in earlier {
        runner.step(cache, input(chunk))?;
    }
    if let Some(Head::Score(targets)) = &job.head {
        let nll = runner.score(cache, input(last), targets)?;
        return Ok(StepResult::Scored { nll });
    }
    match (runner.step(cache, input(last))?, &job.head) {
        (StepOutput::Hidden(h), _) => Ok(StepResult::Hidden(h)),
        (StepOutput::Logits(l), Some(Head::Sample(s))) => {
            s.check(runner.config().vocab)?;
            let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
            rng.set_word_pos(u128::from(s.draws));
            let token = neuroshard_model::sample(&l, &s.sampling(), &mut rng);
            let draws =
                u64::try_from(rng.get_word_pos()).map_err(|_| EngineError::SamplerPosition)?;
            Ok(StepResult::Token { token, draws })
        }
        (StepOutput::Logits(_), _) => Err(EngineError::NoSampling),
    }
}
