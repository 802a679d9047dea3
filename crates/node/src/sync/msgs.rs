//! What replicas of a stage gossip to run a DiLoCo round, and the DHT record of a stage's
//! latest θ₀. Every message travels in a signed envelope whose signer must be the gossip author.

use neuroshard_audit::{
    CommitError, JobCommitment, JobKind, NO_HASH, SignedJob, offer_micro_batch, verify_job,
};
use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, Identity, NodeId, Reader, Receipt, Signed, Writer,
};

/// Largest signed commitment an offer carries (one job commitment is a few hundred bytes).
const MAX_ENVELOPE: usize = 4096;

/// Most contributors (and receipts) one round lists.
pub const MAX_CONTRIBUTORS: usize = 256;

/// "My pseudo-gradient of `round`, computed against θ₀ `base`, is the blob `blob`."
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOffer {
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    /// Hash of the outer state the pseudo-gradient is relative to.
    pub base: Hash32,
    /// BLAKE3 of the compressed pseudo-gradient, served by the blob protocol.
    pub blob: Hash32,
    pub bytes: u64,
    /// What the same pseudo-gradient costs uncompressed (f32).
    pub dense_bytes: u64,
    /// The offer as an audited job ([`JobKind::Offer`]): the weights it was taken from, its
    /// base as input, its blob as output, and the round's state. An offer without it is
    /// refused, so every offer that reaches an average can be replayed.
    pub commitment: Option<Box<SignedJob>>,
}

/// Why an offer's commitment does not make it its sender's offer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferCommitError {
    #[error("an offer without its commitment")]
    Missing,
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("the commitment is not an offer of this sender, round, base and blob")]
    Mismatch,
    /// Its epoch is long final here, so its worker could know its beacon, and whether the
    /// offer is audited, when it signed. Not a penalty: an honest replica may lag.
    #[error("the commitment names epoch {epoch}, more than two before ours ({head})")]
    Stale { epoch: u64, head: u64 },
}

impl OfferCommitError {
    /// Whether the sender is at fault (a stale epoch may be an honest replica's lag).
    pub fn blames_sender(&self) -> bool {
        !matches!(self, Self::Stale { .. })
    }
}

impl SyncOffer {
    /// This offer with `blob` (of `bytes`) in its place, its commitment re-signed by
    /// `identity` to name it: what a replica that lies about its pseudo-gradient sends (the
    /// simulator's and the Byzantine bench's adversaries). Only an audit of the offer tells.
    pub fn recommitted(&self, identity: &Identity, blob: Hash32, bytes: u64) -> Self {
        let worker = identity.node_id();
        let commitment = self
            .commitment
            .as_ref()
            .and_then(|c| c.verify().ok())
            .map(|c| {
                let round = self.round.saturating_sub(1);
                let c = JobCommitment {
                    worker,
                    round,
                    micro_batch: offer_micro_batch(worker, round),
                    output_hash: blob,
                    ..c
                };
                Box::new(c.sign(identity))
            });
        Self {
            blob,
            bytes,
            commitment,
            ..self.clone()
        }
    }

    /// The offer's commitment, checked against the offer and its signer `from`: the worker's
    /// own, an offer of this network and stage, of the jobs' round before this one (the
    /// round its jobs carry), naming the offer's base as input and its blob as output.
    /// Returns what it says and the signed commitment.
    pub fn commitment(
        &self,
        from: NodeId,
    ) -> Result<(JobCommitment, &SignedJob), OfferCommitError> {
        let signed = self.commitment.as_ref().ok_or(OfferCommitError::Missing)?;
        let c = verify_job(signed)?;
        let matches = c.worker == from
            && c.kind == JobKind::Offer
            && c.network == self.network
            && c.stage == self.stage
            && c.round.checked_add(1) == Some(self.round)
            && c.micro_batch == offer_micro_batch(from, c.round)
            && c.input_hash == self.base
            && c.output_hash == self.blob
            && c.upstream_hash == NO_HASH;
        if matches {
            Ok((c, signed))
        } else {
            Err(OfferCommitError::Mismatch)
        }
    }
}

/// "I applied `round` with these contributors' offers; my outer state now hashes to `theta`."
/// `blobs[i]` is the pseudo-gradient of `contributors[i]` that went in: a replica can sign
/// two offers of one round (it restarted, it retried, it lies), so an outcome names which one
/// it used, and a co-replica recomputes it from exactly those. The receipts countersign each
/// contributor's pseudo-gradient for its proofs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncDone {
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    pub theta: Hash32,
    pub contributors: Vec<NodeId>,
    pub blobs: Vec<Hash32>,
    pub receipts: Vec<(NodeId, Receipt)>,
}

impl SyncDone {
    /// Each contributor with the offer (blob) of it that went in.
    pub fn named(&self) -> impl Iterator<Item = (NodeId, Hash32)> + '_ {
        self.contributors
            .iter()
            .copied()
            .zip(self.blobs.iter().copied())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncMsg {
    Offer(SyncOffer),
    Done(SyncDone),
}

impl SyncMsg {
    pub fn network(&self) -> &Hash32 {
        match self {
            SyncMsg::Offer(o) => &o.network,
            SyncMsg::Done(d) => &d.network,
        }
    }

    pub fn stage(&self) -> u16 {
        match self {
            SyncMsg::Offer(o) => o.stage,
            SyncMsg::Done(d) => d.stage,
        }
    }

    pub fn round(&self) -> u64 {
        match self {
            SyncMsg::Offer(o) => o.round,
            SyncMsg::Done(d) => d.round,
        }
    }
}

impl Canonical for SyncMsg {
    const DOMAIN: &'static str = "neuroshard/sync/v3";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            SyncMsg::Offer(o) => {
                w.u8(0);
                w.fixed(&o.network);
                w.u16(o.stage);
                w.u64(o.round);
                w.fixed(&o.base);
                w.fixed(&o.blob);
                w.u64(o.bytes);
                w.u64(o.dense_bytes);
                match &o.commitment {
                    Some(c) => {
                        w.u8(1);
                        w.bytes(&c.to_bytes());
                    }
                    None => w.u8(0),
                }
            }
            SyncMsg::Done(d) => {
                w.u8(1);
                w.fixed(&d.network);
                w.u16(d.stage);
                w.u64(d.round);
                w.fixed(&d.theta);
                // Encoded as pairs: a contributor without a named offer is not sent.
                let named: Vec<(NodeId, Hash32)> = d.named().collect();
                w.len(named.len());
                for (c, blob) in named {
                    w.fixed(&c.0);
                    w.fixed(&blob);
                }
                w.len(d.receipts.len());
                for (prover, receipt) in &d.receipts {
                    w.fixed(&prover.0);
                    receipt.encode(w);
                }
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        match r.u8()? {
            0 => Ok(SyncMsg::Offer(SyncOffer {
                network: r.array()?,
                stage: r.u16()?,
                round: r.u64()?,
                base: r.array()?,
                blob: r.array()?,
                bytes: r.u64()?,
                dense_bytes: r.u64()?,
                commitment: match r.u8()? {
                    0 => None,
                    1 => Some(Box::new(
                        Signed::from_bytes(r.bytes(MAX_ENVELOPE)?).map_err(
                            |e: EnvelopeError| CodecError::Invalid {
                                field: "offer commitment",
                                reason: e.to_string(),
                            },
                        )?,
                    )),
                    v => {
                        return Err(CodecError::Invalid {
                            field: "offer commitment",
                            reason: format!("flag {v}"),
                        });
                    }
                },
            })),
            1 => {
                let network = r.array()?;
                let stage = r.u16()?;
                let round = r.u64()?;
                let theta = r.array()?;
                let n = r.len(MAX_CONTRIBUTORS)?;
                let mut contributors = Vec::with_capacity(n);
                let mut blobs = Vec::with_capacity(n);
                for _ in 0..n {
                    contributors.push(NodeId(r.array()?));
                    blobs.push(r.array()?);
                }
                let n = r.len(MAX_CONTRIBUTORS)?;
                let receipts = (0..n)
                    .map(|_| Ok((NodeId(r.array()?), Receipt::decode(r)?)))
                    .collect::<Result<Vec<_>, CodecError>>()?;
                Ok(SyncMsg::Done(SyncDone {
                    network,
                    stage,
                    round,
                    theta,
                    contributors,
                    blobs,
                    receipts,
                }))
            }
            other => Err(CodecError::Invalid {
                field: "sync message",
                reason: format!("unknown tag {other}"),
            }),
        }
    }
}

/// DHT record `neuroshard/theta/<network>/<stage>`: where a newcomer fetches the stage's θ₀
/// and a replica's optimizer moments. Signed by the publishing replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThetaRecord {
    pub node: NodeId,
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    /// Hash of the outer-state blob.
    pub theta: Hash32,
    /// Hash of the optimizer blob (AdamW moments and step) of the publisher.
    pub optimizer: Hash32,
    pub expires_ms: u64,
}

impl Canonical for ThetaRecord {
    const DOMAIN: &'static str = "neuroshard/theta-record/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.node.0);
        w.fixed(&self.network);
        w.u16(self.stage);
        w.u64(self.round);
        w.fixed(&self.theta);
        w.fixed(&self.optimizer);
        w.u64(self.expires_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            node: NodeId(r.array()?),
            network: r.array()?,
            stage: r.u16()?,
            round: r.u64()?,
            theta: r.array()?,
            optimizer: r.array()?,
            expires_ms: r.u64()?,
        })
    }
}

/// The DHT key of a stage's θ₀ record.
pub fn theta_key(network: &Hash32, stage: usize) -> Vec<u8> {
    format!("neuroshard/theta/{}/{stage}", hex::encode(network)).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_proof::{Identity, ReceiptKind};

    /// `a`'s receipt for the gradients of node 7 in round 3 of network 1.
    fn receipt_by(a: &Identity) -> Receipt {
        Receipt::sign(
            a,
            [1; 32],
            NodeId([7; 32]),
            3,
            ReceiptKind::Gradients,
            [9; 32],
        )
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let a = Identity::generate();
        let receipt = receipt_by(&a);
        let msgs = [
            SyncMsg::Offer(SyncOffer {
                network: [1; 32],
                stage: 1,
                round: 3,
                base: [2; 32],
                blob: [3; 32],
                bytes: 100,
                dense_bytes: 12_800,
                commitment: None,
            }),
            SyncMsg::Done(SyncDone {
                network: [1; 32],
                stage: 0,
                round: 3,
                theta: [4; 32],
                contributors: vec![NodeId([7; 32]), a.node_id()],
                blobs: vec![[8; 32], [9; 32]],
                receipts: vec![(NodeId([7; 32]), receipt)],
            }),
        ];
        for m in msgs {
            let bytes = m.to_canonical_bytes();
            assert_eq!(SyncMsg::from_canonical_bytes(&bytes).unwrap(), m);
            assert!(SyncMsg::from_canonical_bytes(&bytes[..bytes.len() - 1]).is_err());
        }
        let rec = ThetaRecord {
            node: a.node_id(),
            network: [1; 32],
            stage: 2,
            round: 5,
            theta: [5; 32],
            optimizer: [6; 32],
            expires_ms: 99,
        };
        let bytes = rec.to_canonical_bytes();
        assert_eq!(ThetaRecord::from_canonical_bytes(&bytes).unwrap(), rec);
        assert!(SyncMsg::from_canonical_bytes(&[0xff; 40]).is_err());
    }

    /// Receipt signers are framed, not decompressed, when a round outcome is decoded (every
    /// replica decodes every co-replica's receipts, most of them for others); a signer that is
    /// no curve point is caught where a receipt is used: its signature check fails cleanly.
    #[test]
    fn a_receipt_signer_off_the_curve_decodes_but_never_verifies() {
        let a = Identity::generate();
        let receipt = receipt_by(&a);
        let mut off_curve = [0xff; 33];
        off_curve[0] = 0x02;
        let done = SyncMsg::Done(SyncDone {
            network: [1; 32],
            stage: 0,
            round: 3,
            theta: [4; 32],
            contributors: vec![NodeId([7; 32])],
            blobs: vec![[8; 32]],
            receipts: vec![(NodeId([7; 32]), receipt)],
        });
        let mut bytes = done.to_canonical_bytes();
        let at = bytes
            .windows(33)
            .position(|w| w == a.public_key().to_bytes())
            .expect("the signer is in the bytes");
        bytes[at..at + 33].copy_from_slice(&off_curve);
        let Ok(SyncMsg::Done(decoded)) = SyncMsg::from_canonical_bytes(&bytes) else {
            panic!("framing is valid");
        };
        let r = decoded.receipts[0].1;
        let signed = r.signed_bytes([1; 32], NodeId([7; 32]), 3);
        assert!(r.signer.verify(&signed, &r.signature).is_err());
        // A wrong SEC1 prefix is refused at decoding.
        bytes[at] = 0x05;
        assert!(SyncMsg::from_canonical_bytes(&bytes).is_err());
    }
}
