//! Proof of Neural Work: what a node claims to have done, in one canonical, fully signed struct.
//!
//! Every field, receipts included, is inside the signed bytes (the Python original left reward
//! fields unsigned). The proof's identity for replay protection is the BLAKE3 hash of those
//! bytes, which excludes the signature, so a malleated signature cannot make a "new" proof.

use crate::codec::{Canonical, CodecError, Reader, Writer};
use crate::envelope::Signed;
use crate::identity::Identity;
use crate::keys::{NodeId, PUBLIC_KEY_LEN, PublicKey, SIGNATURE_LEN, Signature};

/// The only encoding version this build reads and writes.
pub const PROOF_VERSION: u16 = 2;
/// Most shards one proof may cover.
pub const MAX_SHARDS: usize = 256;
/// Most neighbour receipts one proof may carry: gradient receipts of co-replicas and work
/// tallies of other stages together.
pub const MAX_RECEIPTS: usize = 24;
/// Most work tallies ([`ReceiptKind::Activations`]) a node puts in one proof; the rest of
/// [`MAX_RECEIPTS`] is for gradient receipts.
pub const MAX_WORK_RECEIPTS: usize = 8;

/// A 32-byte content hash (BLAKE3 unless a field says otherwise).
pub type Hash32 = [u8; 32];

/// A signed proof as it travels and is stored.
pub type SignedProof = Signed<Proof>;

/// What kind of work is claimed; each kind has its own reward rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProofKind {
    Training = 0,
    Inference = 1,
    Uptime = 2,
    Verification = 3,
}

impl ProofKind {
    pub const ALL: [ProofKind; 4] = [
        ProofKind::Training,
        ProofKind::Inference,
        ProofKind::Uptime,
        ProofKind::Verification,
    ];

    fn from_u8(v: u8) -> Result<Self, CodecError> {
        Self::ALL
            .get(usize::from(v))
            .copied()
            .ok_or(CodecError::Invalid {
                field: "kind",
                reason: format!("unknown proof kind {v}"),
            })
    }
}

/// The hardware class a node declares; plausibility limits are looked up per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HardwareClass {
    Cpu = 0,
    ConsumerGpu = 1,
    DatacenterGpu = 2,
}

impl HardwareClass {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        match v {
            0 => Ok(Self::Cpu),
            1 => Ok(Self::ConsumerGpu),
            2 => Ok(Self::DatacenterGpu),
            _ => Err(CodecError::Invalid {
                field: "hardware",
                reason: format!("unknown hardware class {v}"),
            }),
        }
    }
}

/// Half-open range of transformer layers `[start, end)` the node held for this work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerRange {
    pub start: u32,
    pub end: u32,
}

impl LayerRange {
    /// Number of layers held; zero for an empty or inverted range.
    pub fn len(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Role bit set: which special parts of the model the node held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Roles(u8);

impl Roles {
    pub const NONE: Roles = Roles(0);
    pub const EMBEDDING: Roles = Roles(1);
    pub const LM_HEAD: Roles = Roles(2);
    const KNOWN: u8 = 0b11;

    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn contains(self, other: Roles) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, other: Roles) -> Roles {
        Roles(self.0 | other.0)
    }

    /// Unknown bits are refused so that one role set has exactly one encoding.
    pub fn from_bits(bits: u8) -> Result<Roles, CodecError> {
        if bits & !Self::KNOWN != 0 {
            return Err(CodecError::Invalid {
                field: "roles",
                reason: format!("unknown role bits {bits:#04x}"),
            });
        }
        Ok(Roles(bits))
    }
}

/// One data shard worked on, with the hash of the exact batch tokens taken from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardWork {
    pub shard_id: u64,
    pub batch_token_hash: Hash32,
}

/// Which of our outputs a neighbour acknowledges receiving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiptKind {
    /// A node of another stage received the outputs of our pipeline jobs of the round: hash =
    /// a [`crate::WorkTally`] of the distinct jobs it took (forward activations or input
    /// gradients, each countersigned when it arrived).
    Activations = 0,
    /// The aggregator received our pseudo-gradient: hash = `pseudo_gradient_hash`.
    Gradients = 1,
}

impl ReceiptKind {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        match v {
            0 => Ok(Self::Activations),
            1 => Ok(Self::Gradients),
            _ => Err(CodecError::Invalid {
                field: "receipt kind",
                reason: format!("unknown receipt kind {v}"),
            }),
        }
    }
}

/// What a neighbour signs: "in network `network`, I received `hash` of `kind` from `prover`
/// in `round`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptBody {
    pub network: Hash32,
    pub prover: NodeId,
    pub round: u64,
    pub kind: ReceiptKind,
    pub hash: Hash32,
}

impl Canonical for ReceiptBody {
    const DOMAIN: &'static str = "neuroshard/receipt/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.prover.0);
        w.u64(self.round);
        w.u8(self.kind as u8);
        w.fixed(&self.hash);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            prover: NodeId(r.array()?),
            round: r.u64()?,
            kind: ReceiptKind::from_u8(r.u8()?)?,
            hash: r.array()?,
        })
    }
}

/// A neighbour's signed acknowledgement, embedded in the proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    pub kind: ReceiptKind,
    pub signer: PublicKey,
    pub hash: Hash32,
    pub signature: Signature,
}

impl Receipt {
    /// Signs a receipt as the neighbour `signer` for work by `prover` in `round` of `network`.
    pub fn sign(
        signer: &Identity,
        network: Hash32,
        prover: NodeId,
        round: u64,
        kind: ReceiptKind,
        hash: Hash32,
    ) -> Receipt {
        let body = ReceiptBody {
            network,
            prover,
            round,
            kind,
            hash,
        };
        Receipt {
            kind,
            signer: signer.public_key(),
            hash,
            signature: signer.sign(&body.to_canonical_bytes()),
        }
    }

    /// Its wire form inside a proof or a round outcome: kind, signer, hash, signature.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.kind as u8);
        w.fixed(self.signer.as_bytes());
        w.fixed(&self.hash);
        w.fixed(&self.signature.0);
    }

    /// Reads [`Self::encode`]'s form. The signer is checked for framing only: whether it is
    /// a point on the curve is learnt when the signature is verified, which saves a point
    /// decompression per receipt on every node that merely relays or stores it.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Receipt {
            kind: ReceiptKind::from_u8(r.u8()?)?,
            signer: read_public_key(r, "receipt signer")?,
            hash: r.array()?,
            signature: Signature(r.array::<SIGNATURE_LEN>()?),
        })
    }

    /// The bytes the neighbour signed, rebuilt from the proof it sits in.
    pub fn signed_bytes(&self, network: Hash32, prover: NodeId, round: u64) -> Vec<u8> {
        ReceiptBody {
            network,
            prover,
            round,
            kind: self.kind,
            hash: self.hash,
        }
        .to_canonical_bytes()
    }
}

/// Proof of Neural Work, version [`PROOF_VERSION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The network the work was done in (a proof from another network is refused there).
    pub network: Hash32,
    pub node_id: NodeId,
    pub public_key: PublicKey,
    pub kind: ProofKind,
    pub round: u64,
    pub timestamp_ms: u64,
    /// Per-node counter; must increase with `timestamp_ms`.
    pub nonce: u64,
    pub layers: LayerRange,
    pub roles: Roles,
    pub hardware: HardwareClass,
    pub tokens: u64,
    pub batches: u64,
    pub shards: Vec<ShardWork>,
    pub input_activation_hash: Hash32,
    pub output_activation_hash: Hash32,
    pub model_hash_before: Hash32,
    pub model_hash_after: Hash32,
    pub pseudo_gradient_hash: Hash32,
    /// Training loss in millionths (integers only in signed data: one encoding per value).
    pub loss_micros: u64,
    pub claimed_duration_ms: u64,
    pub receipts: Vec<Receipt>,
}

impl Proof {
    /// Signs the canonical encoding with `identity`.
    pub fn sign(&self, identity: &Identity) -> SignedProof {
        Signed::sign(identity, self)
    }
}

impl Canonical for Proof {
    const DOMAIN: &'static str = "neuroshard/proof";

    fn encode_body(&self, w: &mut Writer) {
        w.u16(PROOF_VERSION);
        w.fixed(&self.network);
        w.fixed(&self.node_id.0);
        w.fixed(self.public_key.as_bytes());
        w.u8(self.kind as u8);
        w.u64(self.round);
        w.u64(self.timestamp_ms);
        w.u64(self.nonce);
        w.u32(self.layers.start);
        w.u32(self.layers.end);
        w.u8(self.roles.bits());
        w.u8(self.hardware as u8);
        w.u64(self.tokens);
        w.u64(self.batches);
        w.len(self.shards.len());
        for shard in &self.shards {
            w.u64(shard.shard_id);
            w.fixed(&shard.batch_token_hash);
        }
        w.fixed(&self.input_activation_hash);
        w.fixed(&self.output_activation_hash);
        w.fixed(&self.model_hash_before);
        w.fixed(&self.model_hash_after);
        w.fixed(&self.pseudo_gradient_hash);
        w.u64(self.loss_micros);
        w.u64(self.claimed_duration_ms);
        w.len(self.receipts.len());
        for receipt in &self.receipts {
            receipt.encode(w);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let version = r.u16()?;
        if version != PROOF_VERSION {
            return Err(CodecError::Version {
                got: version,
                supported: PROOF_VERSION,
            });
        }
        let network = r.array()?;
        let node_id = NodeId(r.array()?);
        let public_key = read_public_key(r, "public_key")?;
        let kind = ProofKind::from_u8(r.u8()?)?;
        let round = r.u64()?;
        let timestamp_ms = r.u64()?;
        let nonce = r.u64()?;
        let layers = LayerRange {
            start: r.u32()?,
            end: r.u32()?,
        };
        let roles = Roles::from_bits(r.u8()?)?;
        let hardware = HardwareClass::from_u8(r.u8()?)?;
        let tokens = r.u64()?;
        let batches = r.u64()?;
        let n_shards = r.len(MAX_SHARDS)?;
        let mut shards = Vec::with_capacity(n_shards);
        for _ in 0..n_shards {
            shards.push(ShardWork {
                shard_id: r.u64()?,
                batch_token_hash: r.array()?,
            });
        }
        let input_activation_hash = r.array()?;
        let output_activation_hash = r.array()?;
        let model_hash_before = r.array()?;
        let model_hash_after = r.array()?;
        let pseudo_gradient_hash = r.array()?;
        let loss_micros = r.u64()?;
        let claimed_duration_ms = r.u64()?;
        let n_receipts = r.len(MAX_RECEIPTS)?;
        let mut receipts = Vec::with_capacity(n_receipts);
        for _ in 0..n_receipts {
            receipts.push(Receipt::decode(r)?);
        }
        Ok(Proof {
            network,
            node_id,
            public_key,
            kind,
            round,
            timestamp_ms,
            nonce,
            layers,
            roles,
            hardware,
            tokens,
            batches,
            shards,
            input_activation_hash,
            output_activation_hash,
            model_hash_before,
            model_hash_after,
            pseudo_gradient_hash,
            loss_micros,
            claimed_duration_ms,
            receipts,
        })
    }
}

fn read_public_key(r: &mut Reader<'_>, field: &'static str) -> Result<PublicKey, CodecError> {
    let bytes = r.array::<PUBLIC_KEY_LEN>()?;
    PublicKey::from_wire(bytes).map_err(|e| CodecError::Invalid {
        field,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
