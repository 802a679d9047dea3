//! How well a model predicts text it never saw: cross-entropy per token and bits per byte
//! (tokenizer-independent), over a genesis's validation split or over raw text scored by
//! windows that predict every token but the first exactly once. Used by `neuroshard eval`,
//! `train`'s validation loss, the swarm's report and `experiment diloco`.

use neuroshard_data::{DataError, Genesis, GenesisTokenizer, TokenizerError};
use neuroshard_model::{Batch, ModelError, Stage};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("nothing to evaluate: the input is shorter than one window")]
    Empty,
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// `texts` as one token stream for [`text_batches`], each text closed by end-of-text.
pub fn text_stream(tokenizer: &GenesisTokenizer, texts: &[String]) -> Result<Vec<u32>, EvalError> {
    let mut stream = Vec::new();
    for text in texts {
        stream.extend(tokenizer.encode(text)?);
        stream.push(tokenizer.eos_id());
    }
    Ok(stream)
}

/// Scores batches of text windows, each with the targets its row skips (see
/// [`text_batches`]).
pub fn evaluate_windows(
    stage: &Stage,
    tokenizer: &GenesisTokenizer,
    batches: &[(Batch, Vec<usize>)],
) -> Result<EvalReport, EvalError> {
    let mut tally = Tally::new(tokenizer);
    for (batch, skip) in batches {
        tally.add(stage, batch, skip)?;
    }
    tally.report()
}

#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// Targets scored.
    pub tokens: u64,
    /// UTF-8 bytes of text the scored targets stand for.
    pub bytes: u64,
    pub windows: u64,
    /// Mean cross-entropy per token, in nats, over every scored target.
    pub loss: f64,
    /// Cross-entropy of the targets that stand for text, in bits, per byte of that text.
    /// End-of-text targets stand for no byte and are left out, so the figure depends on the
    /// text alone and compares across tokenizers.
    pub bits_per_byte: f64,
    pub perplexity: f64,
    /// Scored targets that stand for no text (end-of-text between files or documents).
    pub special_tokens: u64,
}

/// Accumulates per-token losses and the bytes their targets stand for.
pub struct Tally {
    byte_len: Vec<u32>,
    nats: f64,
    /// Nats of targets with at least one byte: the numerator of bits per byte.
    text_nats: f64,
    tokens: u64,
    special_tokens: u64,
    bytes: u64,
    windows: u64,
}

impl Tally {
    pub fn new(tokenizer: &GenesisTokenizer) -> Self {
        Tally {
            byte_len: tokenizer.token_byte_lengths(),
            nats: 0.0,
            text_nats: 0.0,
            tokens: 0,
            special_tokens: 0,
            bytes: 0,
            windows: 0,
        }
    }

    /// Scores `batch`, leaving out the first `skip[row]` targets of each row (already scored
    /// by an overlapping window); a missing entry skips nothing.
    pub fn add(&mut self, stage: &Stage, batch: &Batch, skip: &[usize]) -> Result<(), EvalError> {
        let losses = stage.token_losses(&batch.input(), &batch.targets)?;
        for (i, (&loss, &target)) in losses.iter().zip(&batch.targets).enumerate() {
            let (row, pos) = (i / batch.seq, i % batch.seq);
            if pos < skip.get(row).copied().unwrap_or(0) {
                continue;
            }
            let nats = f64::from(loss);
            let bytes = self.byte_len.get(target as usize).copied().unwrap_or(0);
            self.nats += nats;
            self.tokens += 1;
            if bytes == 0 {
                self.special_tokens += 1;
            } else {
                self.text_nats += nats;
                self.bytes += u64::from(bytes);
            }
        }
        self.windows += batch.batch as u64;
        Ok(())
    }

    pub fn report(&self) -> Result<EvalReport, EvalError> {
        if self.tokens == 0 {
            return Err(EvalError::Empty);
        }
        let loss = self.nats / self.tokens as f64;
        Ok(EvalReport {
            tokens: self.tokens,
            bytes: self.bytes,
            windows: self.windows,
            loss,
            bits_per_byte: if self.bytes > 0 {
                self.text_nats / std::f64::consts::LN_2 / self.bytes as f64
            } else {
                f64::NAN
            },
            perplexity: loss.exp(),
            special_tokens: self.special_tokens,
        })
    }
}

/// Evaluates `stage` on batches (every target scored): `train`'s validation loss, the swarm's
/// assembled model, `experiment diloco`.
pub fn evaluate(
    stage: &Stage,
    tokenizer: &GenesisTokenizer,
    batches: &[Batch],
) -> Result<EvalReport, EvalError> {
    let mut tally = Tally::new(tokenizer);
    for batch in batches {
        tally.add(stage, batch, &[])?;
    }
    tally.report()
}

/// Windows of `seq + 1` tokens over a stream of `len` tokens that score every token but the
/// first exactly once, as `(start, skip)`: starts `0, seq, 2·seq, …` (a window's first token
/// is the previous one's last target), then, if targets are left, one window ending at the
/// stream's end whose first `skip` targets the previous windows already scored.
/// Needs `len ≥ seq + 1` (else nothing).
pub fn text_windows(len: usize, seq: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if seq == 0 || len < seq + 1 {
        return out;
    }
    let mut start = 0;
    while start + seq < len {
        out.push((start, 0));
        start += seq;
    }
    // Targets 1..=start are scored; a tail window from len - seq - 1 < start covers the rest.
    if start + 1 < len {
        let tail = len - seq - 1;
        out.push((tail, start - tail));
    }
    out
}

/// `text_windows` of `stream` in batches of `rows`, with the skip of each row; at most `max`
/// windows. Streams shorter than `seq + 1` tokens are scored in one shorter window.
pub fn text_batches(
    stream: &[u32],
    seq: usize,
    rows: usize,
    max: usize,
) -> Result<Vec<(Batch, Vec<usize>)>, EvalError> {
    let seq = seq.min(stream.len().saturating_sub(1));
    let windows: Vec<(Vec<u32>, usize)> = text_windows(stream.len(), seq)
        .into_iter()
        .take(max)
        .map(|(start, skip)| (stream[start..start + seq + 1].to_vec(), skip))
        .collect();
    windows
        .chunks(rows.max(1))
        .map(|c| {
            let rows: Vec<Vec<u32>> = c.iter().map(|(w, _)| w.clone()).collect();
            Ok((
                Batch::from_windows(&rows, seq)?,
                c.iter().map(|&(_, skip)| skip).collect(),
            ))
        })
        .collect()
}

/// The validation split as model batches (at most `max` batches of `rows` windows).
pub fn val_batches(
    genesis: &Genesis,
    rows: usize,
    seq: usize,
    max: usize,
) -> Result<Vec<Batch>, EvalError> {
    Ok(genesis
        .val_batches(rows, seq, max)?
        .into_iter()
        .map(|b| to_model_batch(b, seq))
        .collect())
}

/// A genesis batch as the model takes it.
pub fn to_model_batch(b: neuroshard_data::Batch, seq: usize) -> Batch {
    Batch {
        batch: b.rows,
        seq,
        inputs: b.inputs,
        targets: b.targets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_model::{ModelConfig, StageSpec};

    #[test]
    fn text_windows_score_every_token_but_the_first_once() {
        for len in 0..40 {
            for seq in 1..9 {
                let mut scored = vec![0u32; len];
                for (start, skip) in text_windows(len, seq) {
                    assert!(start + seq < len && skip < seq, "len {len} seq {seq}");
                    for n in &mut scored[start + 1 + skip..=start + seq] {
                        *n += 1;
                    }
                }
                if len > seq {
                    assert_eq!(scored[0], 0);
                    assert!(
                        scored[1..].iter().all(|&n| n == 1),
                        "len {len} seq {seq}: {scored:?}"
                    );
                } else {
                    assert!(scored.iter().all(|&n| n == 0));
                }
            }
        }
    }

    /// On a tiny model: the bytes counted are the text's bytes less the first token's (the
    /// only one never predicted), and bits/byte · bytes · ln 2 equals the nats of the text
    /// targets recomputed one window at a time.
    #[test]
    fn bits_per_byte_covers_exactly_the_scored_text() {
        let text = "To be, or not to be, that is the question: whether 'tis nobler in the mind \
                    to suffer the slings and arrows of outrageous fortune. Café ☃ 🎭\n";
        let tokenizer = GenesisTokenizer::train(300, [text].into_iter()).unwrap();
        let vocab = tokenizer.vocab_size();
        let config = ModelConfig {
            layers: 1,
            d_model: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            max_seq: 128,
            ..ModelConfig::tiny(vocab)
        };
        let stage = Stage::init(config.clone(), StageSpec::full(&config), 4).unwrap();
        let lens = tokenizer.token_byte_lengths();
        let mut stream = tokenizer.encode(text).unwrap();
        stream.push(tokenizer.eos_id());
        for (seq, rows) in [(7, 3), (16, 2), (500, 1)] {
            let batches = text_batches(&stream, seq, rows, usize::MAX).unwrap();
            let mut tally = Tally::new(&tokenizer);
            for (batch, skip) in &batches {
                tally.add(&stage, batch, skip).unwrap();
            }
            let report = tally.report().unwrap();
            assert_eq!(
                report.bytes as usize,
                text.len() - lens[stream[0] as usize] as usize,
                "seq {seq}"
            );
            assert_eq!(report.tokens as usize, stream.len() - 1);
            assert_eq!(report.special_tokens, 1);
            let seq = seq.min(stream.len() - 1);
            let mut nats = 0.0;
            for (start, skip) in text_windows(stream.len(), seq) {
                let one =
                    Batch::from_windows(&[stream[start..=start + seq].to_vec()], seq).unwrap();
                let losses = stage.token_losses(&one.input(), &one.targets).unwrap();
                for (&l, &t) in losses.iter().zip(&one.targets).skip(skip) {
                    if lens[t as usize] > 0 {
                        nats += f64::from(l);
                    }
                }
            }
            let back = report.bits_per_byte * report.bytes as f64 * std::f64::consts::LN_2;
            assert!(
                (back - nats).abs() <= 1e-4 * nats,
                "seq {seq}: {back} vs {nats}"
            );
        }
    }
}
