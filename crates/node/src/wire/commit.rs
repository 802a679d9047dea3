//! Pipeline requests with the worker's signed job commitment, and answers with the receiver's
//! countersignature (verification by recomputation, `neuroshard_audit`).

use neuroshard_audit::{Countersign, SignedJob};
use neuroshard_proof::{Canonical, CodecError, EnvelopeError, Reader, Receipt, Signed, Writer};

use super::{Ack, Msg};

/// A job commitment or countersignature is a few hundred bytes; 4 KiB bounds it generously.
const MAX_ENVELOPE: usize = 4096;

/// A pipeline message as it travels: the tensor, and the sender's signed statement about the
/// job that produced it (weights, input and output hashes).
#[derive(Debug, Clone, PartialEq)]
pub struct PipeRequest {
    pub msg: Msg,
    pub job: SignedJob,
}

/// The receiver's answer: its ack, and when it accepted, its countersignature of the hash it
/// received, which the worker keeps as proof of delivery, and its signed tally of the jobs of
/// the worker's round it took (`economy/work.rs`), which the worker's proof carries.
#[derive(Debug, Clone, PartialEq)]
pub struct PipeAnswer {
    pub ack: Ack,
    pub countersign: Option<Signed<Countersign>>,
    pub tally: Option<Receipt>,
}

fn envelope<T: Canonical>(
    r: &mut Reader<'_>,
    field: &'static str,
) -> Result<Signed<T>, CodecError> {
    let bytes = r.bytes(MAX_ENVELOPE)?;
    Signed::from_bytes(bytes).map_err(|e: EnvelopeError| CodecError::Invalid {
        field,
        reason: e.to_string(),
    })
}

impl Canonical for PipeRequest {
    const DOMAIN: &'static str = "neuroshard/pipe/v6";

    fn encode_body(&self, w: &mut Writer) {
        self.msg.encode_body(w);
        w.bytes(&self.job.to_bytes());
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let msg = Msg::decode_body(r)?;
        let job = envelope(r, "job commitment")?;
        Ok(Self { msg, job })
    }
}

impl Canonical for PipeAnswer {
    const DOMAIN: &'static str = "neuroshard/pipe-answer/v2";

    fn encode_body(&self, w: &mut Writer) {
        self.ack.encode_body(w);
        match &self.countersign {
            None => w.u8(0),
            Some(c) => {
                w.u8(1);
                w.bytes(&c.to_bytes());
            }
        }
        match &self.tally {
            None => w.u8(0),
            Some(t) => {
                w.u8(1);
                t.encode(w);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let ack = Ack::decode_body(r)?;
        let countersign = match r.u8()? {
            0 => None,
            1 => Some(envelope(r, "countersignature")?),
            k => {
                return Err(CodecError::Invalid {
                    field: "countersignature flag",
                    reason: format!("{k}"),
                });
            }
        };
        let tally = match r.u8()? {
            0 => None,
            1 => Some(Receipt::decode(r)?),
            k => {
                return Err(CodecError::Invalid {
                    field: "tally flag",
                    reason: format!("{k}"),
                });
            }
        };
        Ok(Self {
            ack,
            countersign,
            tally,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MicroBatchId, Payload};
    use neuroshard_audit::{DeterminismClass, IsaLevel, JobCommitment, JobKind, MicroBatchRef};
    use neuroshard_model::Tokens;
    use neuroshard_proof::NodeId;
    use neuroshard_proof::fixtures::test_identity;

    fn job() -> SignedJob {
        let me = test_identity(1);
        JobCommitment {
            network: [1; 32],
            worker: me.node_id(),
            stage: 0,
            round: 2,
            step: 3,
            micro_batch: MicroBatchRef {
                origin: NodeId([4; 32]),
                step: 5,
                index: 6,
            },
            kind: JobKind::Forward,
            class: DeterminismClass {
                build: [7; 32],
                isa: IsaLevel::X86V3,
                cache_bytes: [1, 2, 3],
                micro_batches: 4,
            },
            weights_hash: [8; 32],
            input_hash: [9; 32],
            upstream_hash: [0; 32],
            output_hash: [10; 32],
            grads_hash: [0; 32],
            epoch: 0,
        }
        .sign(&me)
    }

    #[test]
    fn requests_and_answers_round_trip_and_truncations_fail() {
        let req = PipeRequest {
            msg: Msg::Forward {
                mb: MicroBatchId {
                    origin: [4; 32],
                    step: 5,
                    index: 6,
                },
                version: 0,
                stamp: None,
                route: Vec::new(),
                input: Payload::Tokens(Tokens {
                    batch: 1,
                    seq: 2,
                    ids: vec![1, 2],
                }),
                targets: vec![3, 4].into(),
            },
            job: job(),
        };
        let bytes = req.to_canonical_bytes();
        assert_eq!(PipeRequest::from_canonical_bytes(&bytes), Ok(req));
        for n in 0..bytes.len() {
            assert!(PipeRequest::from_canonical_bytes(&bytes[..n]).is_err());
        }
        let cs = neuroshard_audit::countersign(&test_identity(2), &job(), [10; 32]).unwrap();
        for answer in [
            PipeAnswer {
                ack: Ack::Accepted,
                countersign: Some(cs),
                tally: Some(neuroshard_proof::Receipt::sign(
                    &test_identity(2),
                    [1; 32],
                    test_identity(1).node_id(),
                    2,
                    neuroshard_proof::ReceiptKind::Activations,
                    neuroshard_proof::fixtures::work_tally(3),
                )),
            },
            PipeAnswer {
                ack: Ack::Busy,
                countersign: None,
                tally: None,
            },
        ] {
            let bytes = answer.to_canonical_bytes();
            assert_eq!(PipeAnswer::from_canonical_bytes(&bytes), Ok(answer.clone()));
            for n in 0..bytes.len() {
                assert!(PipeAnswer::from_canonical_bytes(&bytes[..n]).is_err());
            }
        }
        // A bare message (the previous protocol) is not a request.
        let bare = job().to_bytes();
        assert!(PipeRequest::from_canonical_bytes(&bare).is_err());
    }
}
