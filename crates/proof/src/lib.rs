//! NeuroShard identity and Proof of Neural Work.
//!
//! - [`identity`]: the node's secp256k1 key (key file, signing, node id, libp2p note);
//! - [`keys`]: public keys, signatures and node ids as plain hex-printable data;
//! - [`envelope`]: [`Signed<T>`], the one signed wrapper for every gossip message.

pub mod codec;
pub mod envelope;
pub mod identity;
pub mod keys;

pub use codec::{Canonical, CodecError, Reader, Writer};
pub use envelope::{EnvelopeError, Signed};
pub use identity::{Identity, IdentityError};
pub use keys::{NodeId, PublicKey, Signature, SignatureError, verify_with_key};
