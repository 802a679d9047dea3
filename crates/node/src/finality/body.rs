//! What travels for ledger finality beside Malachite's own messages: an epoch's body (the
//! items its value names, each with its signed bytes, so that anyone can check and apply
//! them), and what a node that fell behind asks for (a body by its contents hash; certified
//! epochs from a height on).

use neuroshard_finality::CertifiedEpoch;
use neuroshard_ledger::{EpochItem, VerifiedAuditFee, VerifiedVerdict, decode_op};
use neuroshard_proof::{
    Canonical, CodecError, Hash32, NodeId, ProofVerifier, PublicKey, Reader, SignedProof, Writer,
};

/// Items one epoch holds at most; the rest wait for the next epoch.
pub const MAX_BODY_ITEMS: usize = 1024;
/// Bytes of signed items one body carries at most (it is gossiped: the transport takes 1 MiB).
pub const MAX_BODY_BYTES: usize = 768 * 1024;
/// One item's signed bytes at most (an envelope's payload limit and its framing).
const MAX_ITEM_BYTES: usize = neuroshard_proof::envelope::MAX_PAYLOAD_LEN + 1024;
/// Certified epochs one chain answer carries at most.
pub const MAX_CHAIN_LINKS: usize = 256;

/// One item of a body as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemWire {
    /// A signed account op (or inference settlement), as gossiped.
    Op(Vec<u8>),
    /// A signed proof, as gossiped.
    Proof(Vec<u8>),
    /// Two conflicting consensus messages of one validator (`ConsensusWire` bytes): a slash,
    /// paid to `reporter`.
    Equivocation {
        reporter: NodeId,
        first: Vec<u8>,
        second: Vec<u8>,
    },
    /// An audit verdict: what a node reaches by replaying the job, so its fields travel (a
    /// validator votes for it only if its own replay reached the same).
    Verdict(VerifiedVerdict),
    /// A validator's fee: an `neuroshard_audit::AuditFeeClaim`'s canonical bytes (the
    /// worker's two signatures travel; a validator admits it only where the job's beacon
    /// assigned the job to the auditor it pays, see `Economy::admit`).
    AuditFee(Vec<u8>),
}

/// Looks a node's key up (in the finalized state): what consensus evidence is checked with.
pub type KeyOf<'a> = &'a dyn Fn(&NodeId) -> Option<PublicKey>;

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("item {at}: {reason}")]
    Item { at: usize, reason: String },
    #[error("{0} items, an epoch holds at most {MAX_BODY_ITEMS}")]
    TooMany(usize),
}

impl ItemWire {
    /// The signed bytes it adds to a body (a verdict's fixed fields count too).
    pub fn size(&self) -> usize {
        match self {
            Self::Op(w) | Self::Proof(w) | Self::AuditFee(w) => w.len(),
            Self::Equivocation { first, second, .. } => 32 + first.len() + second.len(),
            Self::Verdict(_) => 136,
        }
    }

    /// Checks the signature and builds the ledger's item. Content-only, so every node decides
    /// alike: a proof's clock and rate limits, which depend on when a node saw it, are not
    /// judged here (`ProofVerifier::check_content` with no "now").
    pub fn verify(
        &self,
        verifier: &mut ProofVerifier,
        key_of: KeyOf<'_>,
    ) -> Result<EpochItem, String> {
        match self {
            Self::Equivocation {
                reporter,
                first,
                second,
            } => super::evidence::equivocation_slash(*reporter, first, second, key_of)
                .map(EpochItem::Slash),
            Self::Op(w) => decode_op(w).map(EpochItem::Op).map_err(|e| e.to_string()),
            Self::Proof(w) => {
                let signed = SignedProof::from_bytes(w).map_err(|e| e.to_string())?;
                verifier
                    .check_content(&signed, u64::MAX)
                    .map(EpochItem::Proof)
                    .map_err(|e| e.to_string())
            }
            Self::Verdict(v) => Ok(EpochItem::Verdict(*v)),
            Self::AuditFee(w) => neuroshard_audit::AuditFeeClaim::from_canonical_bytes(w)
                .map_err(|e| e.to_string())
                .and_then(|c| VerifiedAuditFee::from_claim(&c).map_err(|e| e.to_string()))
                .map(EpochItem::AuditFee),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            Self::Op(b) => {
                w.u8(0);
                w.bytes(b);
            }
            Self::Proof(b) => {
                w.u8(1);
                w.bytes(b);
            }
            Self::Equivocation {
                reporter,
                first,
                second,
            } => {
                w.u8(2);
                w.fixed(&reporter.0);
                w.bytes(first);
                w.bytes(second);
            }
            Self::Verdict(v) => {
                w.u8(3);
                w.fixed(&v.job);
                w.fixed(&v.offender.0);
                w.fixed(&v.beneficiary.0);
                w.fixed(&v.evidence_hash);
                w.u64(v.timestamp_ms);
            }
            Self::AuditFee(b) => {
                w.u8(4);
                w.bytes(b);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8()? {
            0 => Self::Op(r.bytes(MAX_ITEM_BYTES)?.to_vec()),
            1 => Self::Proof(r.bytes(MAX_ITEM_BYTES)?.to_vec()),
            2 => Self::Equivocation {
                reporter: NodeId(r.array()?),
                first: r
                    .bytes(neuroshard_finality::machine::MAX_MESSAGE_BYTES)?
                    .to_vec(),
                second: r
                    .bytes(neuroshard_finality::machine::MAX_MESSAGE_BYTES)?
                    .to_vec(),
            },
            3 => Self::Verdict(VerifiedVerdict {
                job: r.array()?,
                offender: neuroshard_proof::NodeId(r.array()?),
                beneficiary: neuroshard_proof::NodeId(r.array()?),
                evidence_hash: r.array()?,
                timestamp_ms: r.u64()?,
            }),
            4 => Self::AuditFee(r.bytes(MAX_ITEM_BYTES)?.to_vec()),
            other => {
                return Err(CodecError::Invalid {
                    field: "epoch item kind",
                    reason: other.to_string(),
                });
            }
        })
    }
}

/// The items of one epoch's value (any order: applying sorts them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpochBody {
    pub epoch: u64,
    pub items: Vec<ItemWire>,
}

impl EpochBody {
    /// Every item checked and built, or the first that fails.
    pub fn verify(
        &self,
        verifier: &mut ProofVerifier,
        key_of: KeyOf<'_>,
    ) -> Result<Vec<EpochItem>, BodyError> {
        if self.items.len() > MAX_BODY_ITEMS {
            return Err(BodyError::TooMany(self.items.len()));
        }
        self.items
            .iter()
            .enumerate()
            .map(|(at, i)| {
                i.verify(verifier, key_of)
                    .map_err(|reason| BodyError::Item { at, reason })
            })
            .collect()
    }

    fn encode(&self, w: &mut Writer) {
        w.u64(self.epoch);
        w.len(self.items.len());
        for i in &self.items {
            i.encode(w);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let epoch = r.u64()?;
        let n = r.len(MAX_BODY_ITEMS)?;
        let mut items = Vec::with_capacity(n);
        let mut bytes = 0usize;
        for _ in 0..n {
            let item = ItemWire::decode(r)?;
            bytes = bytes.saturating_add(item.size());
            if bytes > MAX_BODY_BYTES {
                return Err(CodecError::TooLong {
                    got: bytes,
                    max: MAX_BODY_BYTES,
                });
            }
            items.push(item);
        }
        Ok(Self { epoch, items })
    }
}

/// What the finality topic carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalityGossip {
    /// One of Malachite's messages (`neuroshard_finality::ConsensusWire` bytes).
    Consensus(Vec<u8>),
    /// The body of a value its proposer proposes.
    Body(EpochBody),
    /// Double-sign evidence (two `ConsensusWire` messages), for every node's next body.
    Evidence { first: Vec<u8>, second: Vec<u8> },
    /// A validator waiting to start the network's first epoch says it runs (the count tells
    /// its repeats apart: gossip drops a message it has seen).
    Present { count: u64 },
}

impl Canonical for FinalityGossip {
    const DOMAIN: &'static str = "neuroshard/finality-gossip/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Self::Consensus(b) => {
                w.u8(0);
                w.bytes(b);
            }
            Self::Body(b) => {
                w.u8(1);
                b.encode(w);
            }
            Self::Evidence { first, second } => {
                w.u8(2);
                w.bytes(first);
                w.bytes(second);
            }
            Self::Present { count } => {
                w.u8(3);
                w.u64(*count);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let max = neuroshard_finality::machine::MAX_MESSAGE_BYTES;
        Ok(match r.u8()? {
            2 => Self::Evidence {
                first: r.bytes(max)?.to_vec(),
                second: r.bytes(max)?.to_vec(),
            },
            0 => Self::Consensus(
                r.bytes(neuroshard_finality::machine::MAX_MESSAGE_BYTES)?
                    .to_vec(),
            ),
            1 => Self::Body(EpochBody::decode(r)?),
            3 => Self::Present { count: r.u64()? },
            other => {
                return Err(CodecError::Invalid {
                    field: "finality gossip kind",
                    reason: other.to_string(),
                });
            }
        })
    }
}

/// One finalized epoch with its body: what a node behind replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainLink {
    pub certified: CertifiedEpoch,
    pub body: EpochBody,
}

impl Canonical for ChainLink {
    const DOMAIN: &'static str = "neuroshard/finality-link/v1";

    fn encode_body(&self, w: &mut Writer) {
        self.certified.encode(w);
        self.body.encode(w);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            certified: CertifiedEpoch::decode(r)?,
            body: EpochBody::decode(r)?,
        })
    }
}

/// Requests of the finality protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalityRequest {
    /// The body whose contents hash is `contents`.
    Body { network: Hash32, contents: Hash32 },
    /// Finalized epochs `from`, `from + 1`, … (at most `max`).
    Chain {
        network: Hash32,
        from: u64,
        max: u32,
    },
}

impl Canonical for FinalityRequest {
    const DOMAIN: &'static str = "neuroshard/finality-request/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Self::Body { network, contents } => {
                w.u8(0);
                w.fixed(network);
                w.fixed(contents);
            }
            Self::Chain { network, from, max } => {
                w.u8(1);
                w.fixed(network);
                w.u64(*from);
                w.u32(*max);
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8()? {
            0 => Self::Body {
                network: r.array()?,
                contents: r.array()?,
            },
            1 => Self::Chain {
                network: r.array()?,
                from: r.u64()?,
                max: r.u32()?,
            },
            other => {
                return Err(CodecError::Invalid {
                    field: "finality request kind",
                    reason: other.to_string(),
                });
            }
        })
    }
}

/// Answers to [`FinalityRequest`]s: what the peer holds (possibly nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalityAnswer {
    Body(Option<EpochBody>),
    Chain(Vec<ChainLink>),
}

impl Canonical for FinalityAnswer {
    const DOMAIN: &'static str = "neuroshard/finality-answer/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Self::Body(b) => {
                w.u8(0);
                match b {
                    Some(b) => {
                        w.u8(1);
                        b.encode(w);
                    }
                    None => w.u8(0),
                }
            }
            Self::Chain(links) => {
                w.u8(1);
                w.len(links.len());
                for l in links {
                    l.encode_body(w);
                }
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8()? {
            0 => Self::Body(match r.u8()? {
                0 => None,
                _ => Some(EpochBody::decode(r)?),
            }),
            1 => {
                let n = r.len(MAX_CHAIN_LINKS)?;
                let mut links = Vec::with_capacity(n);
                for _ in 0..n {
                    links.push(ChainLink::decode_body(r)?);
                }
                Self::Chain(links)
            }
            other => {
                return Err(CodecError::Invalid {
                    field: "finality answer kind",
                    reason: other.to_string(),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict() -> VerifiedVerdict {
        VerifiedVerdict {
            job: [1; 32],
            offender: neuroshard_proof::NodeId([2; 32]),
            beneficiary: neuroshard_proof::NodeId([3; 32]),
            evidence_hash: [4; 32],
            timestamp_ms: 5,
        }
    }

    #[test]
    fn gossip_requests_and_answers_round_trip() {
        let body = EpochBody {
            epoch: 7,
            items: vec![
                ItemWire::Op(vec![9; 40]),
                ItemWire::Proof(vec![8; 50]),
                ItemWire::Verdict(verdict()),
                ItemWire::AuditFee(vec![7; 60]),
            ],
        };
        let g = FinalityGossip::Body(body.clone());
        assert_eq!(
            FinalityGossip::from_canonical_bytes(&g.to_canonical_bytes()).unwrap(),
            g
        );
        let c = FinalityGossip::Consensus(vec![1, 2, 3]);
        assert_eq!(
            FinalityGossip::from_canonical_bytes(&c.to_canonical_bytes()).unwrap(),
            c
        );
        for r in [
            FinalityRequest::Body {
                network: [1; 32],
                contents: [2; 32],
            },
            FinalityRequest::Chain {
                network: [1; 32],
                from: 3,
                max: 4,
            },
        ] {
            assert_eq!(
                FinalityRequest::from_canonical_bytes(&r.to_canonical_bytes()).unwrap(),
                r
            );
        }
        for a in [FinalityAnswer::Body(None), FinalityAnswer::Body(Some(body))] {
            assert_eq!(
                FinalityAnswer::from_canonical_bytes(&a.to_canonical_bytes()).unwrap(),
                a
            );
        }
    }

    #[test]
    fn a_body_beyond_its_byte_budget_or_of_unknown_kind_is_refused() {
        let big = EpochBody {
            epoch: 1,
            items: (0..3)
                .map(|_| ItemWire::Op(vec![0; MAX_BODY_BYTES / 2]))
                .collect(),
        };
        let bytes = FinalityGossip::Body(big).to_canonical_bytes();
        assert!(FinalityGossip::from_canonical_bytes(&bytes).is_err());
        let mut w = Writer::new();
        w.u64(1);
        w.len(1);
        w.u8(2);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert!(EpochBody::decode(&mut r).is_err());
    }

    #[test]
    fn a_forged_item_fails_verification_and_names_its_place() {
        let body = EpochBody {
            epoch: 1,
            items: vec![ItemWire::Verdict(verdict()), ItemWire::Proof(vec![7; 64])],
        };
        let err = body
            .verify(&mut ProofVerifier::new(), &|_| None)
            .unwrap_err();
        assert!(matches!(err, BodyError::Item { at: 1, .. }), "{err}");
    }
}
