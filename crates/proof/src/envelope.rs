//! `Signed<T>`: the one signed wrapper for gossip messages (heartbeats, DHT records, receipts,
//! sync announcements, transfers).
//!
//! The sender encodes the payload canonically, signs those exact bytes and sends
//! `(payload bytes, signer public key, signature)`. The receiver checks the signature over the
//! bytes *before* decoding them, so a parser never sees unauthenticated input beyond the
//! envelope's own fixed framing.

use std::marker::PhantomData;

use crate::codec::{Canonical, CodecError, Reader, Writer};
use crate::identity::Identity;
use crate::keys::{PUBLIC_KEY_LEN, PublicKey, SIGNATURE_LEN, Signature, SignatureError};

/// Largest payload an envelope accepts (1 MiB); bigger data travels by hash reference.
pub const MAX_PAYLOAD_LEN: usize = 1 << 20;

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("envelope framing: {0}")]
    Framing(CodecError),
    #[error("signer key: {0}")]
    Signer(SignatureError),
    #[error("signature: {0}")]
    Signature(SignatureError),
    #[error("payload: {0}")]
    Payload(CodecError),
}

/// A payload of type `T`, its canonical bytes, the signer's public key and the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<T> {
    payload: Vec<u8>,
    signer: PublicKey,
    signature: Signature,
    _kind: PhantomData<fn() -> T>,
}

impl<T: Canonical> Signed<T> {
    /// Encodes and signs `value` with `identity`.
    pub fn sign(identity: &Identity, value: &T) -> Self {
        let payload = value.to_canonical_bytes();
        let signature = identity.sign(&payload);
        Self {
            payload,
            signer: identity.public_key(),
            signature,
            _kind: PhantomData,
        }
    }

    /// Reassembles an envelope from its parts (nothing is checked until [`Self::verify`]).
    pub fn from_parts(payload: Vec<u8>, signer: PublicKey, signature: Signature) -> Self {
        Self {
            payload,
            signer,
            signature,
            _kind: PhantomData,
        }
    }

    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    pub fn signer(&self) -> PublicKey {
        self.signer
    }

    pub fn signature(&self) -> Signature {
        self.signature
    }

    /// BLAKE3 of the payload bytes: the message's identity for deduplication. It excludes the
    /// signature, so a re-signed or malleated copy of the same payload has the same hash.
    pub fn payload_hash(&self) -> [u8; 32] {
        *blake3::hash(&self.payload).as_bytes()
    }

    /// Checks the signature (low-S included), then decodes the payload.
    pub fn verify(&self) -> Result<T, EnvelopeError> {
        self.signer
            .verify(&self.payload, &self.signature)
            .map_err(EnvelopeError::Signature)?;
        T::from_canonical_bytes(&self.payload).map_err(EnvelopeError::Payload)
    }

    /// Wire form: `u32 len || payload || 33-byte signer || 64-byte signature`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&self.payload);
        w.fixed(self.signer.as_bytes());
        w.fixed(&self.signature.0);
        w.into_bytes()
    }

    /// Parses the wire form; the payload stays undecoded until [`Self::verify`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let mut r = Reader::new(bytes);
        let payload = r
            .bytes(MAX_PAYLOAD_LEN)
            .map_err(EnvelopeError::Framing)?
            .to_vec();
        let signer = r
            .array::<PUBLIC_KEY_LEN>()
            .map_err(EnvelopeError::Framing)?;
        let signer = PublicKey::from_wire(signer).map_err(EnvelopeError::Signer)?;
        let signature = Signature(r.array::<SIGNATURE_LEN>().map_err(EnvelopeError::Framing)?);
        r.finish().map_err(EnvelopeError::Framing)?;
        Ok(Self::from_parts(payload, signer, signature))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[derive(Debug, PartialEq)]
    struct Ping {
        seq: u64,
        note: Vec<u8>,
    }

    impl Canonical for Ping {
        const DOMAIN: &'static str = "neuroshard/test-ping";
        fn encode_body(&self, w: &mut Writer) {
            w.u64(self.seq);
            w.bytes(&self.note);
        }
        fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
            Ok(Ping {
                seq: r.u64()?,
                note: r.bytes(64)?.to_vec(),
            })
        }
    }

    fn identity() -> Identity {
        Identity::generate_with(&mut rand_chacha::ChaCha20Rng::seed_from_u64(9))
    }

    #[test]
    fn sign_wire_roundtrip_verify() {
        let ping = Ping {
            seq: 42,
            note: b"hello".to_vec(),
        };
        let env = Signed::sign(&identity(), &ping);
        let back = Signed::<Ping>::from_bytes(&env.to_bytes());
        assert_eq!(back.as_ref().ok(), Some(&env));
        assert_eq!(back.and_then(|e| e.verify()), Ok(ping));
    }

    #[test]
    fn every_flipped_payload_byte_fails_before_decoding() {
        let env = Signed::sign(
            &identity(),
            &Ping {
                seq: 1,
                note: vec![1, 2, 3],
            },
        );
        for i in 0..env.payload_bytes().len() {
            let mut payload = env.payload_bytes().to_vec();
            payload[i] ^= 0x01;
            let forged = Signed::<Ping>::from_parts(payload, env.signer(), env.signature());
            assert!(matches!(forged.verify(), Err(EnvelopeError::Signature(_))));
        }
    }

    #[test]
    fn malleated_envelope_signature_rejected() {
        let env = Signed::sign(
            &identity(),
            &Ping {
                seq: 5,
                note: vec![],
            },
        );
        let forged = Signed::<Ping>::from_parts(
            env.payload_bytes().to_vec(),
            env.signer(),
            env.signature().malleate(),
        );
        assert_eq!(
            forged.verify(),
            Err(EnvelopeError::Signature(SignatureError::HighS))
        );
        assert_eq!(forged.payload_hash(), env.payload_hash());
    }

    #[test]
    fn truncated_wire_form_is_a_framing_error() {
        let env = Signed::sign(
            &identity(),
            &Ping {
                seq: 5,
                note: vec![],
            },
        );
        let bytes = env.to_bytes();
        for cut in 0..bytes.len() {
            assert!(Signed::<Ping>::from_bytes(&bytes[..cut]).is_err());
        }
    }
}
