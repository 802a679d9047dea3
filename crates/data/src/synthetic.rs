//! The built-in synthetic corpus: a seeded second-order Markov chain over a few hundred
//! made-up words, with its exact entropy rate (the loss floor).
//!
//! # Source
//! Documents start in context `(START, START)`. In context `(a, b)` the next symbol is drawn
//! from [`MarkovSource::next_distribution`]: word `b` (or `START`) has a fixed list of
//! `successors` distinct follower words with fixed weights, and the previous word `a` rotates
//! which follower gets which weight, so the chain is genuinely second order. After the first
//! word, `END` has probability `1 / mean_doc_words`; `END` closes the document and becomes the
//! end-of-text token. A document's text is `" w1 w2 … wn"` (a space before every word).
//!
//! # Why the floor is per model token
//! Words are lowercase letters only, so the byte-level pre-tokenizer splits the text exactly
//! into the pieces `" w"`, and BPE training (which only merges within pieces and stops when no
//! pair is left) gives every piece its own token when the vocabulary has room. The build
//! checks this after training (every `" w"` must encode to one token) and re-checks that each
//! document encodes to exactly its word sequence. So the token stream is the symbol stream
//! under a bijection (words ↔ tokens, END ↔ end-of-text), and the two have the same entropy
//! rate.
//!
//! # The number
//! Documents are independent and self-delimiting, so by the renewal-reward theorem the
//! entropy rate of the concatenated stream is `E[H(document)] / E[tokens per document]`.
//! Both are sums over the expected number of visits `v(s)` to each context `s` before `END`:
//! `E[H] = Σ v(s)·H(next | s)` and `E[len] = Σ v(s)` (each visit emits one token, `END`
//! included). `v` is computed by pushing probability mass through the chain until less than
//! 1e-15 remains, so the floor is exact to f64 rounding. A model that sees the whole
//! context cannot beat it; one that sees the two previous tokens can reach it (the first two
//! positions of a training window, lacking context, sit slightly above it).

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Invalid synthetic-corpus settings.
#[derive(Debug, Error, PartialEq)]
pub enum SyntheticError {
    #[error("synthetic words must be between {min} and {max}, got {got}")]
    Words { got: u32, min: u32, max: u32 },
    #[error("successors per word must be between 1 and the word count ({words}), got {got}")]
    Successors { got: u32, words: u32 },
    #[error("mean document length must be between 2 and 4096 words, got {got}")]
    DocLength { got: u32 },
    #[error("synthetic token target must be positive")]
    NoTokens,
}

/// Settings of the synthetic source; all of them go into the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    pub seed: u64,
    /// Stop generating documents once this many tokens (words plus end-of-text) exist.
    pub tokens: u64,
    pub words: u32,
    pub successors: u32,
    pub mean_doc_words: u32,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            seed: 0,
            tokens: 1_000_000,
            words: 256,
            successors: 6,
            mean_doc_words: 64,
        }
    }
}

/// The loss floor written into the manifest for synthetic builds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyFloor {
    /// True entropy rate of the token stream, nats per token.
    pub nats_per_token: f64,
    /// Same, in bits.
    pub bits_per_token: f64,
    /// Expected tokens per document, end-of-text included.
    pub mean_doc_tokens: f64,
}

/// A context word: a word index, or `START` (`== words`) at the beginning of a document.
pub type Ctx = u32;

/// The chain itself: word spellings and transition tables, all derived from the seed.
#[derive(Debug, Clone)]
pub struct MarkovSource {
    config: SyntheticConfig,
    words: Vec<String>,
    /// Followers of each context word; index `words` is START.
    followers: Vec<Vec<u32>>,
    weights: Vec<Vec<f64>>,
    /// How far word `a` rotates the weights when it is the older context word.
    rotation: Vec<u32>,
}

const CONSONANTS: &[u8] = b"bcdfghjklmnprstvz";
const VOWELS: &[u8] = b"aeiou";

impl MarkovSource {
    pub fn new(config: SyntheticConfig) -> Result<MarkovSource, SyntheticError> {
        let (min, max) = (2, 2000);
        if !(min..=max).contains(&config.words) {
            return Err(SyntheticError::Words {
                got: config.words,
                min,
                max,
            });
        }
        if config.successors == 0 || config.successors > config.words {
            return Err(SyntheticError::Successors {
                got: config.successors,
                words: config.words,
            });
        }
        if !(2..=4096).contains(&config.mean_doc_words) {
            return Err(SyntheticError::DocLength {
                got: config.mean_doc_words,
            });
        }
        if config.tokens == 0 {
            return Err(SyntheticError::NoTokens);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let n = config.words as usize;
        let mut words = Vec::with_capacity(n);
        let mut seen = std::collections::HashSet::new();
        while words.len() < n {
            let syllables = rng.random_range(1..=3);
            let mut w = String::new();
            for _ in 0..syllables {
                w.push(CONSONANTS[rng.random_range(0..CONSONANTS.len())] as char);
                w.push(VOWELS[rng.random_range(0..VOWELS.len())] as char);
            }
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let k = config.successors as usize;
        let mut followers = Vec::with_capacity(n + 1);
        let mut weights = Vec::with_capacity(n + 1);
        for _ in 0..=n {
            let mut pool: Vec<u32> = (0..config.words).collect();
            for i in 0..k {
                let j = rng.random_range(i..n);
                pool.swap(i, j);
            }
            pool.truncate(k);
            followers.push(pool);
            // Squared uniforms give a skewed, learnable distribution; the floor keeps it
            // away from zero so every follower really occurs.
            weights.push(
                (0..k)
                    .map(|_| {
                        let u: f64 = rng.random();
                        u * u + 0.02
                    })
                    .collect(),
            );
        }
        let rotation = (0..n).map(|_| rng.random_range(0..k as u32)).collect();
        Ok(MarkovSource {
            config,
            words,
            followers,
            weights,
            rotation,
        })
    }

    pub fn config(&self) -> &SyntheticConfig {
        &self.config
    }

    /// The START context value.
    pub fn start(&self) -> Ctx {
        self.config.words
    }

    /// Spelling of each word, indexed by word id.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Distribution of the next symbol in context `(older, newer)`: `(Some(word), p)` or
    /// `(None, p)` for END. Sampling and the entropy computation both use this one function.
    pub fn next_distribution(&self, older: Ctx, newer: Ctx) -> Vec<(Option<u32>, f64)> {
        let start = self.start();
        let newer_i = newer.min(start) as usize;
        let k = self.followers[newer_i].len();
        let rot = if older >= start {
            0
        } else {
            self.rotation[older as usize] as usize
        };
        let w = &self.weights[newer_i];
        let total: f64 = w.iter().sum();
        let p_end = if newer >= start {
            0.0
        } else {
            1.0 / f64::from(self.config.mean_doc_words)
        };
        let mut out: Vec<(Option<u32>, f64)> = self.followers[newer_i]
            .iter()
            .enumerate()
            .map(|(i, &f)| (Some(f), (1.0 - p_end) * w[(i + rot) % k] / total))
            .collect();
        if p_end > 0.0 {
            out.push((None, p_end));
        }
        out
    }

    /// Generates documents (word ids, END not included) until the token target is met.
    pub fn generate(&self) -> Vec<Vec<u32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed);
        rng.set_stream(1);
        let mut docs = Vec::new();
        let mut tokens = 0u64;
        while tokens < self.config.tokens {
            let mut doc = Vec::new();
            let (mut older, mut newer) = (self.start(), self.start());
            loop {
                let dist = self.next_distribution(older, newer);
                let u: f64 = rng.random();
                let mut acc = 0.0;
                // Rounding can leave `u` past the last cumulative sum: take the last entry.
                let mut pick = dist[dist.len() - 1].0;
                for &(sym, p) in &dist {
                    acc += p;
                    if u < acc {
                        pick = sym;
                        break;
                    }
                }
                match pick {
                    Some(w) => {
                        doc.push(w);
                        older = newer;
                        newer = w;
                    }
                    None => break,
                }
            }
            tokens += doc.len() as u64 + 1;
            docs.push(doc);
        }
        docs
    }

    /// Text of a document: a space before every word.
    pub fn doc_text(&self, doc: &[u32]) -> String {
        let mut s = String::new();
        for &w in doc {
            s.push(' ');
            s.push_str(&self.words[w as usize]);
        }
        s
    }

    /// The exact entropy rate of the token stream (see the module docs).
    pub fn entropy_floor(&self) -> EntropyFloor {
        // Enumerate reachable contexts and their transitions.
        let start = self.start();
        let mut index: HashMap<(Ctx, Ctx), usize> = HashMap::new();
        let mut states: Vec<(Ctx, Ctx)> = vec![(start, start)];
        index.insert((start, start), 0);
        let mut transitions: Vec<Vec<(usize, f64)>> = Vec::new();
        let mut entropies = Vec::new();
        let mut i = 0;
        while i < states.len() {
            let (older, newer) = states[i];
            let dist = self.next_distribution(older, newer);
            entropies.push(dist.iter().map(|&(_, p)| -p * p.ln()).sum::<f64>());
            let mut out = Vec::with_capacity(dist.len());
            for &(sym, p) in &dist {
                if let Some(w) = sym {
                    let next = (newer, w);
                    let j = *index.entry(next).or_insert_with(|| {
                        states.push(next);
                        states.len() - 1
                    });
                    out.push((j, p));
                }
            }
            transitions.push(out);
            i += 1;
        }
        // Expected visits before END: push mass until (almost) all of it has ended.
        let mut mass = vec![0.0f64; states.len()];
        mass[0] = 1.0;
        let mut visits = vec![0.0f64; states.len()];
        let mut next = vec![0.0f64; states.len()];
        loop {
            let alive: f64 = mass.iter().sum();
            if alive < 1e-15 {
                break;
            }
            for (v, m) in visits.iter_mut().zip(&mass) {
                *v += m;
            }
            next.iter_mut().for_each(|x| *x = 0.0);
            for (s, &m) in mass.iter().enumerate() {
                if m != 0.0 {
                    for &(j, p) in &transitions[s] {
                        next[j] += m * p;
                    }
                }
            }
            std::mem::swap(&mut mass, &mut next);
        }
        let doc_entropy: f64 = visits.iter().zip(&entropies).map(|(v, h)| v * h).sum();
        let doc_tokens: f64 = visits.iter().sum();
        let nats = doc_entropy / doc_tokens;
        EntropyFloor {
            nats_per_token: nats,
            bits_per_token: nats / std::f64::consts::LN_2,
            mean_doc_tokens: doc_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SyntheticConfig {
        SyntheticConfig {
            seed: 7,
            tokens: 200_000,
            words: 40,
            successors: 4,
            mean_doc_words: 20,
        }
    }

    #[test]
    fn distributions_sum_to_one() {
        let src = MarkovSource::new(small()).unwrap();
        for older in 0..=src.start() {
            for newer in 0..=src.start() {
                let total: f64 = src
                    .next_distribution(older, newer)
                    .iter()
                    .map(|x| x.1)
                    .sum();
                assert!(
                    (total - 1.0).abs() < 1e-12,
                    "({older},{newer}) sums to {total}"
                );
            }
        }
    }

    #[test]
    fn generation_is_deterministic_and_meets_the_target() {
        let src = MarkovSource::new(small()).unwrap();
        let a = src.generate();
        assert_eq!(a, MarkovSource::new(small()).unwrap().generate());
        let tokens: u64 = a.iter().map(|d| d.len() as u64 + 1).sum();
        assert!(tokens >= 200_000);
        assert!(a.iter().all(|d| !d.is_empty()));
        let other = MarkovSource::new(SyntheticConfig { seed: 8, ..small() }).unwrap();
        assert_ne!(a, other.generate());
    }

    #[test]
    fn words_are_distinct_lowercase() {
        let src = MarkovSource::new(SyntheticConfig::default()).unwrap();
        let set: std::collections::HashSet<_> = src.words().iter().collect();
        assert_eq!(set.len(), 256);
        assert!(
            src.words()
                .iter()
                .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
        );
    }

    /// The mean negative log-likelihood of generated data under the true model must match
    /// the computed floor (law of large numbers), and so must the mean document length.
    #[test]
    fn floor_matches_sampled_log_likelihood() {
        let src = MarkovSource::new(small()).unwrap();
        let floor = src.entropy_floor();
        let docs = src.generate();
        let (mut nll, mut n) = (0.0f64, 0u64);
        for doc in &docs {
            let (mut older, mut newer) = (src.start(), src.start());
            for sym in doc.iter().map(|&w| Some(w)).chain(std::iter::once(None)) {
                let dist = src.next_distribution(older, newer);
                let p = dist.iter().find(|x| x.0 == sym).map(|x| x.1).unwrap();
                nll -= p.ln();
                n += 1;
                if let Some(w) = sym {
                    older = newer;
                    newer = w;
                }
            }
        }
        let mean = nll / n as f64;
        assert!(
            (mean - floor.nats_per_token).abs() < 0.02,
            "sampled {mean} vs floor {}",
            floor.nats_per_token
        );
        let mean_len = n as f64 / docs.len() as f64;
        assert!(
            (mean_len - floor.mean_doc_tokens).abs() / floor.mean_doc_tokens < 0.05,
            "{mean_len} vs {}",
            floor.mean_doc_tokens
        );
        // A uniform choice among 4 followers is the ceiling of the word steps.
        assert!(floor.nats_per_token > 0.1 && floor.nats_per_token < (5f64).ln());
    }

    #[test]
    fn bad_settings_are_rejected() {
        assert!(matches!(
            MarkovSource::new(SyntheticConfig {
                words: 1,
                ..small()
            }),
            Err(SyntheticError::Words { .. })
        ));
        assert!(matches!(
            MarkovSource::new(SyntheticConfig {
                successors: 41,
                ..small()
            }),
            Err(SyntheticError::Successors { .. })
        ));
        assert!(matches!(
            MarkovSource::new(SyntheticConfig {
                mean_doc_words: 1,
                ..small()
            }),
            Err(SyntheticError::DocLength { .. })
        ));
        assert_eq!(
            MarkovSource::new(SyntheticConfig {
                tokens: 0,
                ..small()
            })
            .unwrap_err(),
            SyntheticError::NoTokens
        );
    }
}
