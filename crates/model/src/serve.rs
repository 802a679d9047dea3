//! Incremental inference through one pipeline stage: a stage's weights uploaded once, and a
//! key/value cache per generation stream, so every new token costs one token's forward pass.
//!
//! Chaining [`StageRunner`]s of a split model over the same inputs gives bit for bit the
//! hidden states and logits of [`crate::Generator`] on the whole model: the blocks run the same
//! operations on the same values, only cut at stage boundaries (hidden states cross them as
//! plain `f32`, never compressed).

use burn::prelude::*;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::params::{ParamSet, StageSpec};
use crate::transformer::{Ctx, KvCache, Weights, ids_tensor};

/// The keys and values one stream has fed through one stage.
pub struct StreamCache {
    cache: KvCache,
}

impl StreamCache {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one incremental step feeds a stage: token ids (the embedding stage) or the previous
/// stage's hidden states, `[n, d_model]` row-major, for `n` new positions.
#[derive(Debug, Clone, Copy)]
pub enum StepInput<'a> {
    Tokens(&'a [u32]),
    Hidden(&'a [f32]),
}

/// What a step yields: hidden states of every new position (`[n, d_model]`, for the next
/// stage to cache), or the last position's logits (the stage with the head).
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    Hidden(Vec<f32>),
    Logits(Vec<f32>),
}

/// One stage's weights on the engine's device, ready for incremental forward passes.
pub struct StageRunner {
    config: ModelConfig,
    spec: StageSpec,
    weights: Weights,
    device: Device,
}

impl StageRunner {
    /// Uploads `params`, which must follow `spec`'s canonical order.
    pub fn new(
        config: ModelConfig,
        spec: StageSpec,
        params: &ParamSet,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        spec.validate(&config)?;
        let want = spec.param_specs(&config);
        if want.len() != params.specs().len()
            || want
                .iter()
                .zip(params.specs())
                .any(|(a, b)| a.name != b.name || a.shape != b.shape)
        {
            return Err(ModelError::Input(
                "parameters do not match the stage's tensors".into(),
            ));
        }
        let device = crate::engine::device();
        let weights = Weights::upload(&config, &spec, params, &device, false);
        Ok(Self {
            config,
            spec,
            weights,
            device,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }

    /// An empty cache for a new stream.
    pub fn new_cache(&self) -> StreamCache {
        StreamCache {
            cache: KvCache::new(self.spec.end_layer - self.spec.first_layer),
        }
    }

    /// Feeds `input` at the cache's position and appends its keys and values. The input is
    /// checked first (kind, shape, vocabulary, finite values, room before `max_seq`), so a
    /// refused step leaves the cache as it was.
    pub fn step(
        &self,
        cache: &mut StreamCache,
        input: StepInput<'_>,
    ) -> Result<StepOutput, ModelError> {
        let n = self.check(cache, input)?;
        let h = self.feed(cache, input, n)?;
        if self.spec.head {
            let last = h.narrow(1, n - 1, 1);
            let logits = self.weights.logits(&self.config, last).into_data();
            Ok(StepOutput::Logits(crate::engine::to_vec(logits)?))
        } else {
            Ok(StepOutput::Hidden(crate::engine::to_vec(h.into_data())?))
        }
    }

    /// Like [`Self::step`] at the stage with the head, but instead of the last position's
    /// logits, the summed cross-entropy (nats) of `targets`, one per new position: how a
    /// held-out window is scored, with the per-token loss `neuroshard eval` uses.
    pub fn score(
        &self,
        cache: &mut StreamCache,
        input: StepInput<'_>,
        targets: &[u32],
    ) -> Result<f64, ModelError> {
        if !self.spec.head {
            return Err(ModelError::Input(
                "only the stage with the head scores targets".into(),
            ));
        }
        let n = self.check(cache, input)?;
        if targets.len() != n {
            return Err(ModelError::Input(format!(
                "{} targets for {n} positions",
                targets.len()
            )));
        }
        let vocab = self.config.vocab;
        if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "target {t} is outside the vocabulary of {vocab}"
            )));
        }
        let h = self.feed(cache, input, n)?;
        let logits = crate::engine::to_vec(self.weights.logits(&self.config, h).into_data())?;
        let losses = crate::loss::token_losses(&logits, targets, vocab);
        Ok(losses.iter().map(|&l| f64::from(l)).sum())
    }

    /// Positions `input` adds, after checking it fits this stage and the cache.
    fn check(&self, cache: &StreamCache, input: StepInput<'_>) -> Result<usize, ModelError> {
        let d = self.config.d_model;
        let n = match (input, self.spec.embed) {
            (StepInput::Tokens(ids), true) => {
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= self.config.vocab) {
                    return Err(ModelError::Input(format!(
                        "token id {t} is outside the vocabulary of {}",
                        self.config.vocab
                    )));
                }
                ids.len()
            }
            (StepInput::Hidden(h), false) => {
                if h.len() % d != 0 {
                    return Err(ModelError::Input(format!(
                        "{} hidden values are not rows of d_model {d}",
                        h.len()
                    )));
                }
                if h.iter().any(|x| !x.is_finite()) {
                    return Err(ModelError::Input("non-finite hidden state".into()));
                }
                h.len() / d
            }
            (StepInput::Tokens(_), false) => {
                return Err(ModelError::Input(
                    "this stage takes hidden states, not token ids".into(),
                ));
            }
            (StepInput::Hidden(_), true) => {
                return Err(ModelError::Input(
                    "this stage holds the embedding and takes token ids".into(),
                ));
            }
        };
        let offset = cache.len();
        if n == 0
            || offset
                .checked_add(n)
                .is_none_or(|end| end > self.config.max_seq)
        {
            return Err(ModelError::Input(format!(
                "{n} new positions after {offset} do not fit max_seq {}",
                self.config.max_seq
            )));
        }
        Ok(n)
    }

    /// The blocks' output for `n` checked new positions, appended to the cache.
    fn feed(
        &self,
        cache: &mut StreamCache,
        input: StepInput<'_>,
        n: usize,
    ) -> Result<Tensor<3>, ModelError> {
        let d = self.config.d_model;
        let x = match input {
            StepInput::Tokens(ids) => self.weights.embed(ids_tensor(ids, 1, n, &self.device)),
            StepInput::Hidden(h) => {
                Tensor::<3>::from_data(TensorData::new(h.to_vec(), [1, n, d]), &self.device)
            }
        };
        let ctx = Ctx::new(&self.config, cache.len(), n, &self.device);
        self.weights
            .blocks(&self.config, x, &ctx, Some(&mut cache.cache))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Generator, Sampling, sample};
    use crate::stage::Stage;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn config() -> ModelConfig {
        ModelConfig {
            layers: 3,
            d_model: 16,
            heads: 2,
            kv_heads: 1,
            ffn: 24,
            max_seq: 24,
            ..ModelConfig::tiny(40)
        }
    }

    /// Runs `prompt` through the stages one token at a time after the prompt, sampling at the
    /// last stage, as the network does.
    fn pipeline_generate(
        runners: &[StageRunner],
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
    ) -> Vec<u32> {
        let mut caches: Vec<StreamCache> = runners.iter().map(StageRunner::new_cache).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        let mut feed = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < max_tokens {
            let mut hidden = Vec::new();
            let mut logits = Vec::new();
            for (i, (r, c)) in runners.iter().zip(&mut caches).enumerate() {
                let input = if i == 0 {
                    StepInput::Tokens(&feed)
                } else {
                    StepInput::Hidden(&hidden)
                };
                match r.step(c, input).unwrap() {
                    StepOutput::Hidden(h) => hidden = h,
                    StepOutput::Logits(l) => logits = l,
                }
            }
            let next = sample(&logits, sampling, &mut rng);
            out.push(next);
            feed = vec![next];
        }
        out
    }

    #[test]
    fn three_stage_runners_generate_what_the_whole_model_generates() {
        let config = config();
        let full = Stage::init(config.clone(), StageSpec::full(&config), 5).unwrap();
        let generator = Generator::new(full).unwrap();
        let runners: Vec<StageRunner> = StageSpec::split(&config, 3)
            .unwrap()
            .into_iter()
            .map(|spec| {
                let s = Stage::init(config.clone(), spec, 5).unwrap();
                StageRunner::new(config.clone(), spec, s.params()).unwrap()
            })
            .collect();
        let prompt = [3, 17, 9, 1];
        for temperature in [0.0, 0.9] {
            let sampling = Sampling {
                temperature,
                top_k: None,
                top_p: Some(0.9),
                seed: 42,
                stop_token: None,
            };
            let want = generator.generate(&prompt, 12, &sampling).unwrap();
            assert_eq!(pipeline_generate(&runners, &prompt, 12, &sampling), want);
        }
    }

    #[test]
    fn refused_steps_leave_the_cache_alone() {
        let config = config();
        let spec = StageSpec::split(&config, 2).unwrap()[1];
        let s = Stage::init(config.clone(), spec, 1).unwrap();
        let r = StageRunner::new(config.clone(), spec, s.params()).unwrap();
        let mut c = r.new_cache();
        let d = config.d_model;
        r.step(&mut c, StepInput::Hidden(&vec![0.5; 3 * d]))
            .unwrap();
        assert_eq!(c.len(), 3);
        let mut nan = vec![0.5; d];
        nan[2] = f32::NAN;
        assert!(r.step(&mut c, StepInput::Hidden(&nan)).is_err());
        assert!(r.step(&mut c, StepInput::Hidden(&[0.5; 5])).is_err());
        assert!(r.step(&mut c, StepInput::Tokens(&[1])).is_err());
        // Beyond max_seq: 3 cached + 22 new > 24.
        assert!(
            r.step(&mut c, StepInput::Hidden(&vec![0.5; 22 * d]))
                .is_err()
        );
        assert_eq!(c.len(), 3);
        r.step(&mut c, StepInput::Hidden(&vec![0.5; 21 * d]))
            .unwrap();
        assert_eq!(c.len(), 24);
    }

    #[test]
    fn scoring_through_stages_gives_the_whole_models_loss() {
        let config = config();
        let full = Stage::init(config.clone(), StageSpec::full(&config), 9).unwrap();
        let window: Vec<u32> = (0..13).map(|i| (i * 7 + 3) % 40).collect();
        let (inputs, targets) = (&window[..12], &window[1..]);
        let want: f64 = full
            .token_losses(
                &crate::stage::StageInput::Tokens(crate::stage::Tokens {
                    ids: inputs.to_vec(),
                    batch: 1,
                    seq: 12,
                }),
                targets,
            )
            .unwrap()
            .iter()
            .map(|&l| f64::from(l))
            .sum();
        let runners: Vec<StageRunner> = StageSpec::split(&config, 3)
            .unwrap()
            .into_iter()
            .map(|spec| {
                let s = Stage::init(config.clone(), spec, 9).unwrap();
                StageRunner::new(config.clone(), spec, s.params()).unwrap()
            })
            .collect();
        let mut caches: Vec<StreamCache> = runners.iter().map(StageRunner::new_cache).collect();
        let StepOutput::Hidden(h0) = runners[0]
            .step(&mut caches[0], StepInput::Tokens(inputs))
            .unwrap()
        else {
            panic!("stage 0 has no head")
        };
        let StepOutput::Hidden(h1) = runners[1]
            .step(&mut caches[1], StepInput::Hidden(&h0))
            .unwrap()
        else {
            panic!("stage 1 has no head")
        };
        // Wrong target count or vocabulary, and a stage without the head: refused, cache kept.
        let last = &runners[2];
        assert!(
            last.score(&mut caches[2], StepInput::Hidden(&h1), &targets[1..])
                .is_err()
        );
        let mut bad = targets.to_vec();
        bad[3] = 40;
        assert!(
            last.score(&mut caches[2], StepInput::Hidden(&h1), &bad)
                .is_err()
        );
        assert!(caches[2].is_empty());
        let mut c = runners[1].new_cache();
        assert!(
            runners[1]
                .score(&mut c, StepInput::Hidden(&h0), targets)
                .is_err()
        );
        let got = last
            .score(&mut caches[2], StepInput::Hidden(&h1), targets)
            .unwrap();
        assert!(
            (got - want).abs() <= 1e-4 * want.abs(),
            "scored {got}, whole model {want}"
        );
    }
}
