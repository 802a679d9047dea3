//! Inference messages between a stream's coordinator and the stage replicas that serve it,
//! and their canonical encoding.
//!
//! Hidden states travel as raw `f32`, never in the network's activation scheme: one token's
//! row is small, and only exact values let the network generate what one process generates.
//! Decoding checks list lengths against limits before it allocates, and reads floats from one
//! length-checked byte slice; widths, positions and finiteness are the receiver's checks
//! (`core/serve.rs`), which know the model.

use neuroshard_proof::{Canonical, CodecError, Reader, Writer};

/// Largest number of values one message may carry; the transport frame is the real cap.
pub const MAX_VALUES: usize = 1 << 24;
/// Most chunks one step may replay (a new replica gets a stream's whole history at once).
pub const MAX_CHUNKS: usize = 1 << 16;
const MAX_REASON: usize = 1024;
/// Largest signed receipt (fixed fields plus the envelope).
const MAX_RECEIPT: usize = 512;

/// Sampling rules the sampler refuses.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("temperature {0} outside [0, 100]")]
    Temperature(f32),
    #[error("top_p {0} outside (0, 1]")]
    TopP(f32),
    #[error("top_k {top_k} above the vocabulary {vocab}")]
    TopK { top_k: u32, vocab: usize },
}

/// How the last stage draws the next token. `draws` is the position of the stream's
/// ChaCha8 generator (seeded with `seed`), so any replica continues the same sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    /// 0: greedy.
    pub temperature: f32,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub top_k: u32,
    pub seed: u64,
    pub draws: u64,
}

impl SampleSpec {
    /// Whether the values are ones the sampler accepts.
    pub fn check(&self, vocab: usize) -> Result<(), SampleError> {
        if !(self.temperature.is_finite() && (0.0..=100.0).contains(&self.temperature)) {
            return Err(SampleError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SampleError::TopP(self.top_p));
        }
        if self.top_k as usize > vocab {
            return Err(SampleError::TopK {
                top_k: self.top_k,
                vocab,
            });
        }
        Ok(())
    }

    pub fn sampling(&self) -> neuroshard_model::Sampling {
        neuroshard_model::Sampling {
            temperature: self.temperature,
            top_k: (self.top_k > 0).then_some(self.top_k as usize),
            top_p: (self.top_p < 1.0).then_some(self.top_p),
            seed: self.seed,
            stop_token: None,
        }
    }
}

/// What the stage with the head does with the step: draw the next token, or score `targets`,
/// one per position of the step's last chunk (a held-out window, for the validation loss).
#[derive(Debug, Clone, PartialEq)]
pub enum Head {
    Sample(SampleSpec),
    Score(Vec<u32>),
}

/// New positions for one stage: token ids (stage 0) or `[n, d_model]` hidden states.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    Tokens(Vec<u32>),
    Hidden(Vec<f32>),
}

impl Chunk {
    /// Positions the chunk covers (`None` when hidden values are not rows of `dim`).
    pub fn rows(&self, dim: usize) -> Option<usize> {
        match self {
            Chunk::Tokens(t) => Some(t.len()),
            Chunk::Hidden(h) => (dim > 0 && h.len() % dim == 0).then(|| h.len() / dim),
        }
    }
}

/// A coordinator's request to a stage replica. The stream is named by its coordinator, which
/// is the sender: no one can feed or close another node's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum InferMsg {
    /// Feed `chunks` in order at position `pos` of the stream's cache (0 opens it afresh).
    /// The last stage samples one token or scores targets, as `head` says.
    Step {
        stream: u64,
        pos: u32,
        chunks: Vec<Chunk>,
        head: Option<Head>,
    },
    /// The stream ended: drop its cache.
    Close { stream: u64 },
    /// A paid stream ended: sign a receipt for the positions served of request `request`,
    /// then drop the cache.
    Settle { stream: u64, request: [u8; 32] },
}

/// A replica's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum InferReply {
    /// Hidden states of the last chunk's positions; `pos` is the cache's length after it.
    Hidden {
        stream: u64,
        pos: u32,
        data: Vec<f32>,
    },
    /// The sampled token and the generator's new position.
    Token {
        stream: u64,
        pos: u32,
        token: u32,
        draws: u64,
    },
    /// The summed cross-entropy (nats) of the step's targets.
    Scored {
        stream: u64,
        pos: u32,
        nll: f64,
    },
    /// The replica holds `have` positions of the stream, not the step's `pos`: send the
    /// history from 0.
    Restart {
        stream: u64,
        have: u32,
    },
    Closed,
    /// Too many streams or queued steps: try another replica.
    Busy,
    Rejected(String),
    /// A signed [`neuroshard_ledger::ServeReceipt`] (answer to `Settle`).
    Receipt(Vec<u8>),
}

fn put_u32s(w: &mut Writer, v: &[u32]) {
    w.len(v.len() * 4);
    v.iter().for_each(|x| w.fixed(&x.to_le_bytes()));
}

fn put_f32s(w: &mut Writer, v: &[f32]) {
    w.len(v.len() * 4);
    v.iter().for_each(|x| w.fixed(&x.to_le_bytes()));
}

/// Four-byte words from one length-checked slice: the allocation is exactly the input's.
fn words(r: &mut Reader<'_>) -> Result<impl Iterator<Item = [u8; 4]>, CodecError> {
    let b = r.bytes(MAX_VALUES * 4)?;
    if b.len() % 4 != 0 {
        return Err(CodecError::Invalid {
            field: "values",
            reason: format!("{} bytes are not 4-byte words", b.len()),
        });
    }
    Ok(b.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]))
}

fn get_u32s(r: &mut Reader<'_>) -> Result<Vec<u32>, CodecError> {
    Ok(words(r)?.map(u32::from_le_bytes).collect())
}

fn get_f32s(r: &mut Reader<'_>) -> Result<Vec<f32>, CodecError> {
    Ok(words(r)?.map(f32::from_le_bytes).collect())
}

fn invalid(field: &'static str, k: u8) -> CodecError {
    CodecError::Invalid {
        field,
        reason: format!("{k}"),
    }
}

impl Canonical for InferMsg {
    const DOMAIN: &'static str = "neuroshard/infer/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            InferMsg::Step {
                stream,
                pos,
                chunks,
                head,
            } => {
                w.u8(1);
                w.u64(*stream);
                w.u32(*pos);
                w.len(chunks.len());
                for c in chunks {
                    match c {
                        Chunk::Tokens(t) => {
                            w.u8(0);
                            put_u32s(w, t);
                        }
                        Chunk::Hidden(h) => {
                            w.u8(1);
                            put_f32s(w, h);
                        }
                    }
                }
                match head {
                    None => w.u8(0),
                    Some(Head::Sample(s)) => {
                        w.u8(1);
                        w.u32(s.temperature.to_bits());
                        w.u32(s.top_p.to_bits());
                        w.u32(s.top_k);
                        w.u64(s.seed);
                        w.u64(s.draws);
                    }
                    Some(Head::Score(targets)) => {
                        w.u8(2);
                        put_u32s(w, targets);
                    }
                }
            }
            InferMsg::Close { stream } => {
                w.u8(2);
                w.u64(*stream);
            }
            InferMsg::Settle { stream, request } => {
                w.u8(3);
                w.u64(*stream);
                w.fixed(request);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            1 => {
                let stream = r.u64()?;
                let pos = r.u32()?;
                let n = r.len(MAX_CHUNKS)?;
                let mut chunks = Vec::new();
                for _ in 0..n {
                    chunks.push(match r.u8()? {
                        0 => Chunk::Tokens(get_u32s(r)?),
                        1 => Chunk::Hidden(get_f32s(r)?),
                        k => return Err(invalid("chunk kind", k)),
                    });
                }
                let head = match r.u8()? {
                    0 => None,
                    1 => Some(Head::Sample(SampleSpec {
                        temperature: f32::from_bits(r.u32()?),
                        top_p: f32::from_bits(r.u32()?),
                        top_k: r.u32()?,
                        seed: r.u64()?,
                        draws: r.u64()?,
                    })),
                    2 => Some(Head::Score(get_u32s(r)?)),
                    k => return Err(invalid("head kind", k)),
                };
                Ok(InferMsg::Step {
                    stream,
                    pos,
                    chunks,
                    head,
                })
            }
            2 => Ok(InferMsg::Close { stream: r.u64()? }),
            3 => Ok(InferMsg::Settle {
                stream: r.u64()?,
                request: r.array()?,
            }),
            k => Err(invalid("inference message kind", k)),
        }
    }
}

impl Canonical for InferReply {
    const DOMAIN: &'static str = "neuroshard/infer-reply/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            InferReply::Hidden { stream, pos, data } => {
                w.u8(1);
                w.u64(*stream);
                w.u32(*pos);
                put_f32s(w, data);
            }
            InferReply::Token {
                stream,
                pos,
                token,
                draws,
            } => {
                w.u8(2);
                w.u64(*stream);
                w.u32(*pos);
                w.u32(*token);
                w.u64(*draws);
            }
            InferReply::Restart { stream, have } => {
                w.u8(3);
                w.u64(*stream);
                w.u32(*have);
            }
            InferReply::Closed => w.u8(4),
            InferReply::Busy => w.u8(5),
            InferReply::Rejected(why) => {
                w.u8(6);
                w.bytes(&why.as_bytes()[..why.len().min(MAX_REASON)]);
            }
            InferReply::Receipt(bytes) => {
                w.u8(7);
                w.bytes(bytes);
            }
            InferReply::Scored { stream, pos, nll } => {
                w.u8(8);
                w.u64(*stream);
                w.u32(*pos);
                w.u64(nll.to_bits());
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            1 => Ok(InferReply::Hidden {
                stream: r.u64()?,
                pos: r.u32()?,
                data: get_f32s(r)?,
            }),
            2 => Ok(InferReply::Token {
                stream: r.u64()?,
                pos: r.u32()?,
                token: r.u32()?,
                draws: r.u64()?,
            }),
            3 => Ok(InferReply::Restart {
                stream: r.u64()?,
                have: r.u32()?,
            }),
            4 => Ok(InferReply::Closed),
            5 => Ok(InferReply::Busy),
            6 => Ok(InferReply::Rejected(
                String::from_utf8_lossy(r.bytes(MAX_REASON)?).into_owned(),
            )),
            7 => Ok(InferReply::Receipt(r.bytes(MAX_RECEIPT)?.to_vec())),
            8 => Ok(InferReply::Scored {
                stream: r.u64()?,
                pos: r.u32()?,
                nll: f64::from_bits(r.u64()?),
            }),
            k => Err(invalid("inference reply kind", k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn samples() -> (Vec<InferMsg>, Vec<InferReply>) {
        let sample = SampleSpec {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 5,
            seed: 9,
            draws: 4,
        };
        let msgs = vec![
            InferMsg::Step {
                stream: 3,
                pos: 0,
                chunks: vec![Chunk::Tokens(vec![1, 2, 3]), Chunk::Tokens(vec![4])],
                head: None,
            },
            InferMsg::Step {
                stream: u64::MAX,
                pos: 7,
                chunks: vec![Chunk::Hidden(vec![0.5, -1.0, 3.25, 0.0])],
                head: Some(Head::Sample(sample)),
            },
            InferMsg::Step {
                stream: 4,
                pos: 0,
                chunks: vec![Chunk::Hidden(vec![0.5, -1.0])],
                head: Some(Head::Score(vec![7, 0])),
            },
            InferMsg::Close { stream: 3 },
            InferMsg::Settle {
                stream: 3,
                request: [9; 32],
            },
        ];
        let replies = vec![
            InferReply::Hidden {
                stream: 3,
                pos: 4,
                data: vec![1.0, 2.0],
            },
            InferReply::Token {
                stream: 3,
                pos: 5,
                token: 17,
                draws: 6,
            },
            InferReply::Restart { stream: 3, have: 0 },
            InferReply::Closed,
            InferReply::Busy,
            InferReply::Rejected("no".into()),
            InferReply::Receipt(vec![1, 2, 3]),
            InferReply::Scored {
                stream: 4,
                pos: 2,
                nll: 3.5,
            },
        ];
        (msgs, replies)
    }

    #[test]
    fn messages_round_trip_and_odd_byte_counts_are_refused() {
        let (msgs, replies) = samples();
        for m in msgs {
            assert_eq!(
                InferMsg::from_canonical_bytes(&m.to_canonical_bytes()),
                Ok(m)
            );
        }
        for r in replies {
            assert_eq!(
                InferReply::from_canonical_bytes(&r.to_canonical_bytes()),
                Ok(r)
            );
        }
        let mut w = Writer::new();
        w.bytes(InferReply::DOMAIN.as_bytes());
        w.u8(1);
        w.u64(1);
        w.u32(1);
        w.bytes(&[0, 0, 128]);
        assert!(InferReply::from_canonical_bytes(&w.into_bytes()).is_err());
    }
}
