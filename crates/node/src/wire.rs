//! Messages between stage replicas (request–response) and their canonical encoding.
//!
//! Activations and gradients travel as raw little-endian f32; every decoded tensor is checked
//! for shape and NaN/Inf by the receiver before it reaches the engine.

use neuroshard_model::{Activations, Tokens};
use neuroshard_proof::{Canonical, CodecError, Reader, Writer};

/// Largest tensor a message may carry (elements); the transport frame limit is the real cap.
const MAX_ELEMS: usize = 1 << 26;
const MAX_REASON: usize = 1024;

/// One micro-batch of one driver step, named the same at every stage it passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MicroBatchId {
    /// Node id of the driver that created it.
    pub origin: [u8; 32],
    pub step: u64,
    pub index: u32,
}

impl MicroBatchId {
    fn encode(&self, w: &mut Writer) {
        w.fixed(&self.origin);
        w.u64(self.step);
        w.u32(self.index);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            origin: r.array()?,
            step: r.u64()?,
            index: r.u32()?,
        })
    }

    pub fn short(&self) -> String {
        format!(
            "{}:{}:{}",
            hex::encode(&self.origin[..4]),
            self.step,
            self.index
        )
    }
}

/// What flows into a stage: token ids (first stage) or hidden states.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Tokens(Tokens),
    Hidden(Activations),
}

/// A request from one replica to another.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// Forward pass input for the receiver's layers; `targets` ride along for the last stage.
    Forward {
        mb: MicroBatchId,
        input: Payload,
        targets: Vec<u32>,
    },
    /// Gradient of the loss with respect to the output the receiver sent for `mb`, and the
    /// micro-batch loss measured by the last stage.
    Backward {
        mb: MicroBatchId,
        grad: Activations,
        loss: f32,
    },
}

impl Msg {
    pub fn mb(&self) -> MicroBatchId {
        match self {
            Msg::Forward { mb, .. } | Msg::Backward { mb, .. } => *mb,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Forward { .. } => "forward",
            Msg::Backward { .. } => "backward",
        }
    }
}

/// The receiver's immediate answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    Accepted,
    /// The receiver's queue is full: try another replica or later.
    Busy,
    /// Refused for a reason (bad shape, wrong stage, unknown micro-batch...).
    Rejected(String),
}

/// Same bytes as `w.bytes(le_bytes)`, without building the intermediate buffer.
fn put_f32s(w: &mut Writer, v: &[f32]) {
    w.len(v.len() * 4);
    for x in v {
        w.fixed(&x.to_le_bytes());
    }
}

fn get_f32s(r: &mut Reader<'_>) -> Result<Vec<f32>, CodecError> {
    let bytes = r.bytes(MAX_ELEMS * 4)?;
    if bytes.len() % 4 != 0 {
        return Err(CodecError::Invalid {
            field: "f32 data",
            reason: format!("{} bytes is not a multiple of 4", bytes.len()),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn put_u32s(w: &mut Writer, v: &[u32]) {
    w.len(v.len());
    for x in v {
        w.u32(*x);
    }
}

fn get_u32s(r: &mut Reader<'_>) -> Result<Vec<u32>, CodecError> {
    let n = r.len(MAX_ELEMS)?;
    (0..n).map(|_| r.u32()).collect()
}

fn dim(r: &mut Reader<'_>, field: &'static str) -> Result<usize, CodecError> {
    let v = r.u32()? as usize;
    if v == 0 {
        return Err(CodecError::Invalid {
            field,
            reason: "zero".into(),
        });
    }
    Ok(v)
}

fn put_acts(w: &mut Writer, a: &Activations) {
    w.u32(a.batch as u32);
    w.u32(a.seq as u32);
    w.u32(a.dim as u32);
    put_f32s(w, &a.data);
}

fn get_acts(r: &mut Reader<'_>) -> Result<Activations, CodecError> {
    let (batch, seq, d) = (dim(r, "batch")?, dim(r, "seq")?, dim(r, "dim")?);
    let data = get_f32s(r)?;
    if batch.checked_mul(seq).and_then(|x| x.checked_mul(d)) != Some(data.len()) {
        return Err(CodecError::Invalid {
            field: "activations",
            reason: format!("{} values for shape [{batch}, {seq}, {d}]", data.len()),
        });
    }
    Ok(Activations {
        batch,
        seq,
        dim: d,
        data,
    })
}

impl Canonical for Msg {
    const DOMAIN: &'static str = "neuroshard/pipe/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Msg::Forward { mb, input, targets } => {
                w.u8(1);
                mb.encode(w);
                match input {
                    Payload::Tokens(t) => {
                        w.u8(0);
                        w.u32(t.batch as u32);
                        w.u32(t.seq as u32);
                        put_u32s(w, &t.ids);
                    }
                    Payload::Hidden(a) => {
                        w.u8(1);
                        put_acts(w, a);
                    }
                }
                put_u32s(w, targets);
            }
            Msg::Backward { mb, grad, loss } => {
                w.u8(2);
                mb.encode(w);
                put_acts(w, grad);
                w.u32(loss.to_bits());
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            1 => {
                let mb = MicroBatchId::decode(r)?;
                let input = match r.u8()? {
                    0 => {
                        let (batch, seq) = (dim(r, "batch")?, dim(r, "seq")?);
                        let ids = get_u32s(r)?;
                        if batch.checked_mul(seq) != Some(ids.len()) {
                            return Err(CodecError::Invalid {
                                field: "tokens",
                                reason: format!("{} ids for [{batch}, {seq}]", ids.len()),
                            });
                        }
                        Payload::Tokens(Tokens { batch, seq, ids })
                    }
                    1 => Payload::Hidden(get_acts(r)?),
                    k => {
                        return Err(CodecError::Invalid {
                            field: "payload kind",
                            reason: format!("{k}"),
                        });
                    }
                };
                let targets = get_u32s(r)?;
                Ok(Msg::Forward { mb, input, targets })
            }
            2 => {
                let mb = MicroBatchId::decode(r)?;
                let grad = get_acts(r)?;
                let loss = f32::from_bits(r.u32()?);
                Ok(Msg::Backward { mb, grad, loss })
            }
            k => Err(CodecError::Invalid {
                field: "message kind",
                reason: format!("{k}"),
            }),
        }
    }
}

impl Canonical for Ack {
    const DOMAIN: &'static str = "neuroshard/ack/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Ack::Accepted => w.u8(0),
            Ack::Busy => w.u8(1),
            Ack::Rejected(why) => {
                w.u8(2);
                w.bytes(&why.as_bytes()[..why.len().min(MAX_REASON)]);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            0 => Ok(Ack::Accepted),
            1 => Ok(Ack::Busy),
            2 => Ok(Ack::Rejected(
                String::from_utf8_lossy(r.bytes(MAX_REASON)?).into_owned(),
            )),
            k => Err(CodecError::Invalid {
                field: "ack",
                reason: format!("{k}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mb() -> MicroBatchId {
        MicroBatchId {
            origin: [7; 32],
            step: 3,
            index: 1,
        }
    }

    #[test]
    fn messages_round_trip() {
        let msgs = [
            Msg::Forward {
                mb: mb(),
                input: Payload::Tokens(Tokens {
                    batch: 2,
                    seq: 3,
                    ids: vec![1, 2, 3, 4, 5, 6],
                }),
                targets: vec![2, 3, 4, 5, 6, 7],
            },
            Msg::Backward {
                mb: mb(),
                grad: Activations {
                    batch: 1,
                    seq: 2,
                    dim: 2,
                    data: vec![0.5, -1.0, 2.0, 1e-9],
                },
                loss: 3.25,
            },
        ];
        for m in msgs {
            let bytes = m.to_canonical_bytes();
            assert_eq!(Msg::from_canonical_bytes(&bytes), Ok(m));
        }
        for a in [Ack::Accepted, Ack::Busy, Ack::Rejected("no".into())] {
            assert_eq!(Ack::from_canonical_bytes(&a.to_canonical_bytes()), Ok(a));
        }
    }

    #[test]
    fn shape_mismatch_is_refused() {
        let m = Msg::Backward {
            mb: mb(),
            grad: Activations {
                batch: 1,
                seq: 2,
                dim: 3,
                data: vec![0.0; 5],
            },
            loss: 1.0,
        };
        assert!(Msg::from_canonical_bytes(&m.to_canonical_bytes()).is_err());
    }

    // Mutated valid messages: tests/decode_mutations.rs.
    proptest! {
        #[test]
        fn truncations_are_errors(cut in 0usize..60) {
            let bytes = Msg::Backward {
                mb: mb(),
                grad: Activations { batch: 1, seq: 1, dim: 2, data: vec![1.0, 2.0] },
                loss: 0.5,
            }.to_canonical_bytes();
            let cut = cut.min(bytes.len() - 1);
            prop_assert!(Msg::from_canonical_bytes(&bytes[..cut]).is_err());
        }
    }
}
