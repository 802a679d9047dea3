//! Messages between stage replicas (request–response) and their canonical encoding.
//!
//! Activations and gradients travel packed in the network's scheme ([`crate::act_codec`]);
//! decoding here checks only that the byte count fits the declared shape. The receiving stage
//! unpacks against the micro-batch shape it expects, and checks the values, before anything
//! reaches its engine.

use neuroshard_model::Tokens;
use neuroshard_proof::{Canonical, CodecError, Hash32, Reader, Signed, Writer};

use crate::act_codec::{Packed, Scheme};
pub use audit::{
    AuditAnswer, AuditDemand, AuditRequest, FeeClaims, FraudReport, MAX_DEMAND_JOBS,
    MAX_FEE_CLAIMS, MAX_LISTED_JOBS,
};
pub use commit::{PipeAnswer, PipeRequest};
pub use route::{Handoff, RouteError, check_route};

mod audit;
mod commit;
mod route;

/// Largest tensor a message may carry (elements, bytes); the transport frame limit is the
/// real cap.
const MAX_ELEMS: usize = 1 << 26;
const MAX_BYTES: usize = MAX_ELEMS * 4;
const MAX_REASON: usize = 1024;

/// One micro-batch of one driver step, named the same at every stage it passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MicroBatchId {
    /// Node id of the driver that created it.
    pub origin: [u8; 32],
    pub step: u64,
    pub index: u32,
}

/// A commitment names a micro-batch as the audit crate does: the same three fields.
impl From<neuroshard_audit::MicroBatchRef> for MicroBatchId {
    fn from(mb: neuroshard_audit::MicroBatchRef) -> Self {
        Self {
            origin: mb.origin.0,
            step: mb.step,
            index: mb.index,
        }
    }
}

impl From<MicroBatchId> for neuroshard_audit::MicroBatchRef {
    fn from(mb: MicroBatchId) -> Self {
        Self {
            origin: neuroshard_proof::NodeId(mb.origin),
            step: mb.step,
            index: mb.index,
        }
    }
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

/// A window of the genesis training split: shard index and window index within it (what
/// `neuroshard_data::WindowRef` names for the train split).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetWindow {
    pub shard: u32,
    pub window: u64,
}

/// Next-token targets of a micro-batch, row-major, and the genesis window each row was read
/// from, so the last stage can check them against its own copy of the data: targets that
/// are no genesis text are refused, whoever forwards them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    pub ids: Vec<u32>,
    pub windows: Vec<TargetWindow>,
}

impl Targets {
    pub fn new(ids: Vec<u32>, windows: Vec<TargetWindow>) -> Self {
        Self { ids, windows }
    }

    /// Rows `rows` of `seq` targets each (for a driver splitting its batch).
    pub fn rows(&self, rows: std::ops::Range<usize>, seq: usize) -> Self {
        let ids = self
            .ids
            .get(rows.start * seq..rows.end * seq)
            .unwrap_or_default()
            .to_vec();
        let windows = self.windows.get(rows).unwrap_or_default().to_vec();
        Self { ids, windows }
    }

    fn encode(&self, w: &mut Writer) {
        put_u32s(w, &self.ids);
        w.len(self.windows.len());
        for t in &self.windows {
            w.u32(t.shard);
            w.u64(t.window);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let ids = get_u32s(r)?;
        // A row has at least one target: more windows than targets is malformed.
        let n = r.len(ids.len())?;
        let windows = (0..n)
            .map(|_| {
                Ok(TargetWindow {
                    shard: r.u32()?,
                    window: r.u64()?,
                })
            })
            .collect::<Result<_, CodecError>>()?;
        Ok(Self { ids, windows })
    }
}

impl From<Vec<u32>> for Targets {
    /// Targets without their windows (tests, and stages before the last that get none).
    fn from(ids: Vec<u32>) -> Self {
        Self {
            ids,
            windows: Vec::new(),
        }
    }
}

/// What flows into a stage: token ids (first stage) or packed hidden states.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Tokens(Tokens),
    Hidden(Packed),
}

/// What a driver signs about each micro-batch it starts: which one, in which network, and
/// under which architecture version. Every stage checks it, so no stage on the way can
/// relabel a micro-batch's version (to send it past a new stage), and no key can claim a
/// version for a driver's micro-batches that the driver did not start them under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverStamp {
    pub network: Hash32,
    pub mb: MicroBatchId,
    pub version: u32,
}

impl Canonical for DriverStamp {
    const DOMAIN: &'static str = "neuroshard/driver-stamp/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        self.mb.encode(w);
        w.u32(self.version);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            mb: MicroBatchId::decode(r)?,
            version: r.u32()?,
        })
    }
}

/// A driver's stamp is a couple of hundred bytes; 1 KiB bounds it.
const MAX_STAMP: usize = 1024;

/// A request from one replica to another.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// Forward pass input for the receiver's layers; `targets` ride along for the last stage.
    Forward {
        mb: MicroBatchId,
        /// The architecture version its driver started it under: which stages it crosses,
        /// in which order (0 in a network that never grew).
        version: u32,
        /// The driver's signature of (network, `mb`, `version`). Required on the wire; None
        /// only inside the driver, whose node signs it as the message leaves.
        stamp: Option<Signed<DriverStamp>>,
        /// The hand-offs from its driver to the receiver, each signed by the replica that
        /// chose the next (`route.rs`); the sender's own is added as the message leaves.
        route: Vec<Signed<Handoff>>,
        input: Payload,
        targets: Targets,
    },
    /// Gradient of the loss with respect to the output the receiver sent for `mb`, and the
    /// micro-batch loss measured by the last stage.
    Backward {
        mb: MicroBatchId,
        grad: Packed,
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

fn put_packed(w: &mut Writer, p: &Packed) {
    let (batch, seq, dim) = p.shape();
    w.u8(p.scheme().id());
    w.u32(batch as u32);
    w.u32(seq as u32);
    w.u32(dim as u32);
    w.bytes(p.bytes());
}

fn get_packed(r: &mut Reader<'_>) -> Result<Packed, CodecError> {
    let invalid = |field, e: crate::act_codec::ActCodecError| CodecError::Invalid {
        field,
        reason: e.to_string(),
    };
    let scheme = Scheme::from_id(r.u8()?).map_err(|e| invalid("activation scheme", e))?;
    let (batch, seq, dim) = (dim(r, "batch")?, dim(r, "seq")?, dim(r, "dim")?);
    let bytes = r.bytes(MAX_BYTES)?.to_vec();
    Packed::from_parts(scheme, batch, seq, dim, bytes).map_err(|e| invalid("activations", e))
}

impl Canonical for Msg {
    const DOMAIN: &'static str = "neuroshard/pipe/v6";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Msg::Forward {
                mb,
                version,
                stamp,
                route,
                input,
                targets,
            } => {
                w.u8(1);
                mb.encode(w);
                w.u32(*version);
                match stamp {
                    None => w.u8(0),
                    Some(s) => {
                        w.u8(1);
                        w.bytes(&s.to_bytes());
                    }
                }
                route::put_route(w, route);
                match input {
                    Payload::Tokens(t) => {
                        w.u8(0);
                        w.u32(t.batch as u32);
                        w.u32(t.seq as u32);
                        put_u32s(w, &t.ids);
                    }
                    Payload::Hidden(a) => {
                        w.u8(1);
                        put_packed(w, a);
                    }
                }
                targets.encode(w);
            }
            Msg::Backward { mb, grad, loss } => {
                w.u8(2);
                mb.encode(w);
                put_packed(w, grad);
                w.u32(loss.to_bits());
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            1 => {
                let mb = MicroBatchId::decode(r)?;
                let version = r.u32()?;
                let stamp = match r.u8()? {
                    0 => None,
                    1 => Some(Signed::from_bytes(r.bytes(MAX_STAMP)?).map_err(|e| {
                        CodecError::Invalid {
                            field: "driver stamp",
                            reason: e.to_string(),
                        }
                    })?),
                    k => {
                        return Err(CodecError::Invalid {
                            field: "driver stamp flag",
                            reason: format!("{k}"),
                        });
                    }
                };
                let route = route::get_route(r)?;
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
                    1 => Payload::Hidden(get_packed(r)?),
                    k => {
                        return Err(CodecError::Invalid {
                            field: "payload kind",
                            reason: format!("{k}"),
                        });
                    }
                };
                let targets = Targets::decode(r)?;
                Ok(Msg::Forward {
                    mb,
                    version,
                    stamp,
                    route,
                    input,
                    targets,
                })
            }
            2 => {
                let mb = MicroBatchId::decode(r)?;
                let grad = get_packed(r)?;
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

    fn grad(batch: usize, seq: usize, dim: usize, scheme: Scheme) -> Packed {
        let data = (0..batch * seq * dim).map(|i| i as f32 - 1.5).collect();
        let a = neuroshard_model::Activations {
            batch,
            seq,
            dim,
            data,
        };
        crate::act_codec::pack(&a, scheme).unwrap()
    }

    /// A backward message whose tensor fields are written by hand.
    fn raw_backward(scheme: u8, shape: [u32; 3], payload: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(Msg::DOMAIN.as_bytes());
        w.u8(2);
        mb().encode(&mut w);
        w.u8(scheme);
        shape.iter().for_each(|d| w.u32(*d));
        w.bytes(payload);
        w.u32(1f32.to_bits());
        w.into_bytes()
    }

    #[test]
    fn messages_round_trip() {
        let mut msgs = vec![Msg::Forward {
            mb: mb(),
            version: 0,
            stamp: None,
            route: Vec::new(),
            input: Payload::Tokens(Tokens {
                batch: 2,
                seq: 3,
                ids: vec![1, 2, 3, 4, 5, 6],
            }),
            targets: Targets::new(
                vec![2, 3, 4, 5, 6, 7],
                vec![TargetWindow {
                    shard: 1,
                    window: 9,
                }],
            ),
        }];
        for scheme in Scheme::ALL {
            msgs.push(Msg::Backward {
                mb: mb(),
                grad: grad(1, 2, 3, scheme),
                loss: 3.25,
            });
            msgs.push(Msg::Forward {
                mb: mb(),
                version: 0,
                stamp: None,
                route: Vec::new(),
                input: Payload::Hidden(grad(2, 1, 5, scheme)),
                targets: vec![1, 2].into(),
            });
        }
        let stamp = DriverStamp {
            network: [3; 32],
            mb: mb(),
            version: 4,
        };
        let signer = neuroshard_proof::fixtures::test_identity(2);
        msgs.push(Msg::Forward {
            mb: mb(),
            version: 4,
            stamp: Some(Signed::sign(&signer, &stamp)),
            route: vec![Signed::sign(
                &signer,
                &Handoff {
                    network: [3; 32],
                    mb: mb(),
                    version: 4,
                    to: neuroshard_proof::NodeId([5; 32]),
                },
            )],
            input: Payload::Hidden(grad(2, 1, 5, Scheme::F32)),
            targets: vec![1, 2].into(),
        });
        for m in msgs {
            let bytes = m.to_canonical_bytes();
            assert_eq!(Msg::from_canonical_bytes(&bytes), Ok(m));
        }
        for a in [Ack::Accepted, Ack::Busy, Ack::Rejected("no".into())] {
            assert_eq!(Ack::from_canonical_bytes(&a.to_canonical_bytes()), Ok(a));
        }
        // The hand-written form is the encoder's.
        let m = Msg::Backward {
            mb: mb(),
            grad: grad(1, 2, 3, Scheme::Int8),
            loss: 1.0,
        };
        let Msg::Backward { grad: g, .. } = &m else {
            unreachable!()
        };
        assert_eq!(
            raw_backward(2, [1, 2, 3], g.bytes()),
            m.to_canonical_bytes()
        );
    }

    #[test]
    fn shape_mismatch_and_unknown_schemes_are_refused() {
        let g = grad(1, 2, 3, Scheme::Int8);
        assert!(Msg::from_canonical_bytes(&raw_backward(2, [1, 2, 3], g.bytes())).is_ok());
        // Bytes for one shape declared as another, as a huge one, or as an empty one.
        for shape in [[1, 2, 4], [1, 3, 3], [u32::MAX, u32::MAX, 3], [0, 2, 3]] {
            assert!(Msg::from_canonical_bytes(&raw_backward(2, shape, g.bytes())).is_err());
        }
        // Scheme ids no build knows.
        for id in [5, 9, 255] {
            let err = Msg::from_canonical_bytes(&raw_backward(id, [1, 2, 3], g.bytes()));
            assert!(
                err.as_ref()
                    .is_err_and(|e| e.to_string().contains("activation scheme")),
                "{err:?}"
            );
        }
    }

    // Mutated valid messages: tests/decode_mutations.rs.
    proptest! {
        #[test]
        fn truncations_are_errors(cut in 0usize..60) {
            let bytes = Msg::Backward {
                mb: mb(),
                grad: grad(1, 1, 2, Scheme::F32),
                loss: 0.5,
            }.to_canonical_bytes();
            let cut = cut.min(bytes.len() - 1);
            prop_assert!(Msg::from_canonical_bytes(&bytes[..cut]).is_err());
        }
    }
}
