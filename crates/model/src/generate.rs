//! Text generation with a key/value cache, and full-sequence logits for cross-checks.

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::ModelError;
use crate::stage::{Stage, Tokens};
use crate::transformer::{Ctx, KvCache, Weights, ids_tensor};

/// How the next token is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p.
    pub top_p: Option<f32>,
    pub seed: u64,
    /// Stop after this token (not included in the output).
    pub stop_token: Option<u32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            seed: 0,
            stop_token: None,
        }
    }
}

/// A whole model loaded for inference.
pub struct Generator {
    stage: Stage,
    weights: Weights,
    device: Device,
}

impl Generator {
    pub fn new(stage: Stage) -> Result<Self, ModelError> {
        if !(stage.spec().embed && stage.spec().head) {
            return Err(ModelError::Input(
                "generation needs the whole model (embedding and head)".into(),
            ));
        }
        let device = crate::engine::device();
        let weights = Weights::upload(stage.config(), stage.spec(), stage.params(), &device, false);
        Ok(Self {
            stage,
            weights,
            device,
        })
    }

    fn check_prompt(&self, prompt: &[u32]) -> Result<(), ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        if prompt.len() > self.stage.config().max_seq {
            return Err(ModelError::Input(format!(
                "prompt of {} tokens is longer than max_seq {}",
                prompt.len(),
                self.stage.config().max_seq
            )));
        }
        Tokens {
            batch: 1,
            seq: prompt.len(),
            ids: prompt.to_vec(),
        }
        .validate(self.stage.config())
    }

    /// Logits for every position of `tokens`, `[seq × vocab]` row-major (no cache).
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.check_prompt(tokens)?;
        let config = self.stage.config();
        let ctx = Ctx::new(config, 0, tokens.len(), &self.device);
        let x = self
            .weights
            .embed(ids_tensor(tokens, 1, tokens.len(), &self.device));
        let h = self.weights.blocks(config, x, &ctx, None)?;
        crate::engine::to_vec(self.weights.logits(config, h).into_data())
    }

    /// Feeds `tokens` at the cache's current position and returns the last position's logits.
    fn feed(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let config = self.stage.config();
        let offset = cache.len();
        let ctx = Ctx::new(config, offset, tokens.len(), &self.device);
        let x = self
            .weights
            .embed(ids_tensor(tokens, 1, tokens.len(), &self.device));
        let h = self.weights.blocks(config, x, &ctx, Some(cache))?;
        let last = h.narrow(1, tokens.len() - 1, 1);
        crate::engine::to_vec(self.weights.logits(config, last).into_data())
    }

    /// Continues `prompt` by up to `max_tokens` tokens (fewer at `max_seq` or a stop token).
    pub fn generate(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
    ) -> Result<Vec<u32>, ModelError> {
        self.check_prompt(prompt)?;
        if !(sampling.temperature.is_finite() && sampling.temperature >= 0.0) {
            return Err(ModelError::Input(format!(
                "temperature must be >= 0, got {}",
                sampling.temperature
            )));
        }
        if let Some(p) = sampling.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ModelError::Input(format!(
                "top_p must be in (0, 1], got {p}"
            )));
        }
        let max_seq = self.stage.config().max_seq;
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        let mut cache = KvCache::new(self.stage.spec().end_layer - self.stage.spec().first_layer);
        let mut logits = self.feed(&mut cache, prompt)?;
        let mut out = Vec::new();
        while out.len() < max_tokens && prompt.len() + out.len() < max_seq {
            let next = sample(&logits, sampling, &mut rng);
            if Some(next) == sampling.stop_token {
                break;
            }
            out.push(next);
            if out.len() == max_tokens || prompt.len() + out.len() == max_seq {
                break;
            }
            logits = self.feed(&mut cache, &[next])?;
        }
        Ok(out)
    }
}

/// Draws a token id from logits under the sampling rules.
pub fn sample(logits: &[f32], sampling: &Sampling, rng: &mut impl Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 { (i, x) } else { best }
            })
            .0 as u32
    };
    if sampling.temperature == 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if let Some(k) = sampling.top_k {
        order.truncate(k.max(1));
    }
    let max = logits[order[0]];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i] - max) / f64::from(sampling.temperature)).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(top_p) = sampling.top_p {
        let mut cum = 0.0;
        let keep = probs
            .iter()
            .position(|p| {
                cum += p;
                cum >= f64::from(top_p)
            })
            .map_or(probs.len(), |i| i + 1);
        order.truncate(keep);
        probs.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut draw = rng.random::<f64>() * total;
    for (i, p) in order.iter().zip(&probs) {
        if draw < *p {
            return *i as u32;
        }
        draw -= p;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_and_top_k_one_is_greedy() {
        let logits = [0.1, 2.0, -1.0, 1.9];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let greedy = Sampling {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(sample(&logits, &greedy, &mut rng), 1);
        let k1 = Sampling {
            temperature: 1.0,
            top_k: Some(1),
            top_p: None,
            ..Default::default()
        };
        for _ in 0..20 {
            assert_eq!(sample(&logits, &k1, &mut rng), 1);
        }
    }

    #[test]
    fn top_p_excludes_the_tail() {
        let logits = [5.0, 5.0, -10.0, -10.0];
        let s = Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.9),
            ..Default::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut seen = [0; 4];
        for _ in 0..200 {
            seen[sample(&logits, &s, &mut rng) as usize] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    }
}
