//! NeuroShard identity and Proof of Neural Work.
//!
//! - [`identity`]: the node's secp256k1 key (key file, signing, node id, libp2p note);
//! - [`keys`]: public keys, signatures and node ids as plain hex-printable data;
//! - [`codec`]: the canonical binary encoding every signed message uses;
//! - [`envelope`]: [`Signed<T>`], the one signed wrapper for every gossip message;
//! - [`proof`]: the versioned Proof of Neural Work and neighbour receipts;
//! - [`plausibility`]: named throughput limits per hardware class;
//! - [`verify`]: the sans-IO [`ProofVerifier`] pipeline with one error per step;
//! - [`fixtures`]: deterministic test identities and sample proofs.

pub mod codec;
pub mod envelope;
pub mod fixtures;
pub mod identity;
pub mod keys;
mod memo;
pub mod plausibility;
pub mod proof;
pub mod tally;
pub mod verify;

pub use codec::{Canonical, CodecError, Reader, Writer};
pub use envelope::{EnvelopeError, Signed};
pub use identity::{Identity, IdentityError, KEY_FILE};
pub use keys::{NodeId, PreparedKey, PublicKey, Signature, SignatureError, verify_with_key};
pub use memo::forget_all as forget_verified_signatures;
pub use plausibility::{HardwareLimits, PlausibilityError};
pub use proof::{
    HardwareClass, Hash32, LayerRange, PROOF_VERSION, Proof, ProofKind, Receipt, ReceiptKind,
    Roles, ShardWork, SignedProof,
};
pub use tally::{JobSketch, SKETCH_BYTES, WorkTally, distinct_jobs, tally_jobs};
pub use verify::{ProofVerifier, ReceiptError, ReplayKind, VerifiedProof, VerifyError};
