//! Public key, signature and node id types: fixed-size byte arrays with hex text forms.
//!
//! Everything here is plain data (`Copy`, hashable) so it can sit in maps and canonical
//! encodings; parsing into curve points happens only when a signature is checked.
//!
//! Verification runs on libsecp256k1 (the `secp256k1` crate), several times faster than k256
//! (`cargo run --release -p neuroshard-proof --example ecdsa_verify`); signing stays on k256.
//! Both implement the same ECDSA over SHA-256 prehashes with RFC 6979 nonces, so signatures are
//! byte-identical; the low-S rule is enforced here before either library sees a signature.

use std::fmt;
use std::str::FromStr;

use k256::ecdsa::VerifyingKey;
use sha2::{Digest, Sha256};

/// Length of a compressed SEC1 secp256k1 public key.
pub const PUBLIC_KEY_LEN: usize = 33;
/// Length of a fixed-size `r || s` ECDSA signature.
pub const SIGNATURE_LEN: usize = 64;

/// The secp256k1 group order n, big-endian.
const ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
    0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c, 0xd0, 0x36, 0x41, 0x41,
];

/// Half the secp256k1 group order, big-endian: `s` above this is "high-S".
/// A signature `(r, s)` and its mirror `(r, n - s)` both verify; accepting only the low one
/// makes each signed message have exactly one valid signature (no malleated double credit).
const HALF_ORDER: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x5d, 0x57, 0x6e, 0x73, 0x57, 0xa4, 0x50, 0x1d, 0xdf, 0xe9, 0x2f, 0x46, 0x68, 0x1b, 0x20, 0xa0,
];

/// Why a key, signature or id could not be parsed or checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("expected {expected} bytes, got {got}")]
    Length { expected: usize, got: usize },
    #[error("invalid hex: {0}")]
    Hex(String),
    #[error("public key is not a compressed SEC1 point on secp256k1")]
    InvalidPublicKey,
    #[error("signature r or s is zero or not below the group order")]
    Malformed,
    #[error("signature has a high S value (not low-S normalized)")]
    HighS,
    #[error("signature does not match message and public key")]
    Mismatch,
}

/// SHA-256 of a message: the ECDSA prehash used for every signature in the system.
pub(crate) fn sha256(msg: &[u8]) -> [u8; 32] {
    Sha256::digest(msg).into()
}

/// A node's identity on the network and its ledger account: BLAKE3 of the compressed public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub [u8; 32]);

impl NodeId {
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A secp256k1 public key in compressed SEC1 form (33 bytes). `from_bytes` and text/serde
/// parsing check the point is on the curve; keys decoded from signed messages are checked
/// when their first signature is verified (see `from_wire`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; PUBLIC_KEY_LEN]);

impl PublicKey {
    /// Parses a compressed SEC1 key; uncompressed (65-byte) keys are refused so that each key
    /// has exactly one byte form (and therefore one node id).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SignatureError> {
        let arr: [u8; PUBLIC_KEY_LEN] = bytes.try_into().map_err(|_| SignatureError::Length {
            expected: PUBLIC_KEY_LEN,
            got: bytes.len(),
        })?;
        let key = Self::from_wire(arr)?;
        key.prepare()?;
        Ok(key)
    }

    /// Framing-level parse for decoders on the verification path: length and SEC1 prefix
    /// only. Curve membership is checked when the key is first used to verify (and the
    /// verifier caches that), which saves a point decompression per decoded key.
    pub(crate) fn from_wire(bytes: [u8; PUBLIC_KEY_LEN]) -> Result<Self, SignatureError> {
        if bytes[0] != 0x02 && bytes[0] != 0x03 {
            return Err(SignatureError::InvalidPublicKey);
        }
        Ok(Self(bytes))
    }

    pub(crate) fn from_verifying_key(key: &VerifyingKey) -> Self {
        let point = key.to_sec1_point(true);
        let mut arr = [0u8; PUBLIC_KEY_LEN];
        arr.copy_from_slice(point.as_bytes());
        Self(arr)
    }

    pub fn to_bytes(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.0
    }

    pub fn as_bytes(&self) -> &[u8; PUBLIC_KEY_LEN] {
        &self.0
    }

    pub fn node_id(&self) -> NodeId {
        NodeId(*blake3::hash(&self.0).as_bytes())
    }

    /// The point as k256 sees it (for code that works with k256 types; verification here
    /// uses [`Self::prepare`]).
    pub fn verifying_key(&self) -> Result<VerifyingKey, SignatureError> {
        VerifyingKey::from_sec1_bytes(&self.0).map_err(|_| SignatureError::InvalidPublicKey)
    }

    /// Decompresses the point for verification. Callers that verify many signatures from one
    /// key (the proof verifier) keep the result to skip the square root on every check.
    pub fn prepare(&self) -> Result<PreparedKey, SignatureError> {
        secp256k1::PublicKey::from_byte_array_compressed(self.0)
            .map(PreparedKey)
            .map_err(|_| SignatureError::InvalidPublicKey)
    }

    /// Verifies an ECDSA signature over SHA-256(`msg`); high-S signatures are rejected.
    pub fn verify(&self, msg: &[u8], sig: &Signature) -> Result<(), SignatureError> {
        // A signature found valid before needs no point decompression either: these exact
        // key bytes were a valid point then.
        verify_memoised(&self.0, || self.prepare(), &sha256(msg), sig)
    }
}

/// A public key decompressed once for repeated verification ([`PublicKey::prepare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedKey(secp256k1::PublicKey);

/// Verification against an already decompressed key; see [`PublicKey::verify`].
pub fn verify_with_key(
    key: &PreparedKey,
    msg: &[u8],
    sig: &Signature,
) -> Result<(), SignatureError> {
    verify_prehash_with_key(key, &sha256(msg), sig)
}

pub(crate) fn verify_prehash_with_key(
    key: &PreparedKey,
    prehash: &[u8; 32],
    sig: &Signature,
) -> Result<(), SignatureError> {
    verify_memoised(&key.0.serialize(), || Ok(*key), prehash, sig)
}

/// One check per distinct (key, digest, signature) in the process: a remembered success is
/// returned before the key is even decompressed.
fn verify_memoised(
    public: &[u8; PUBLIC_KEY_LEN],
    key: impl FnOnce() -> Result<PreparedKey, SignatureError>,
    prehash: &[u8; 32],
    sig: &Signature,
) -> Result<(), SignatureError> {
    let seen = crate::memo::key(public, prehash, &sig.0);
    if crate::memo::contains(&seen) {
        return Ok(());
    }
    let key = key()?;
    // Low-S first so a malleated signature gets its own error instead of a generic mismatch.
    if sig.is_high_s() {
        return Err(SignatureError::HighS);
    }
    // libsecp256k1 refuses r or s >= n when parsing but leaves zero to the verification;
    // k256 refused both at parse time, and the error stays the same.
    if sig.0[..32] == [0; 32] || sig.0[32..] == [0; 32] {
        return Err(SignatureError::Malformed);
    }
    let parsed =
        secp256k1::ecdsa::Signature::from_compact(&sig.0).map_err(|_| SignatureError::Malformed)?;
    secp256k1::ecdsa::verify(&parsed, secp256k1::Message::from_digest(*prehash), &key.0)
        .map_err(|_| SignatureError::Mismatch)?;
    crate::memo::insert(seen);
    Ok(())
}

/// An ECDSA secp256k1 signature as `r || s` (32 bytes each, big-endian).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature(pub [u8; SIGNATURE_LEN]);

impl Signature {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SignatureError> {
        let arr: [u8; SIGNATURE_LEN] = bytes.try_into().map_err(|_| SignatureError::Length {
            expected: SIGNATURE_LEN,
            got: bytes.len(),
        })?;
        Ok(Self(arr))
    }

    pub fn to_bytes(&self) -> [u8; SIGNATURE_LEN] {
        self.0
    }

    /// True when `s` is above half the group order (the malleated twin of a valid signature).
    pub fn is_high_s(&self) -> bool {
        self.0[32..] > HALF_ORDER[..]
    }

    /// The mirror signature `(r, n - s)`; verifies mathematically but must be rejected.
    /// Exposed for tests and tooling that check malleability handling.
    pub fn malleate(&self) -> Self {
        let mut out = self.0;
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let v = i16::from(ORDER[i]) - i16::from(self.0[32 + i]) - borrow;
            borrow = i16::from(v < 0);
            out[32 + i] = v.rem_euclid(256) as u8;
        }
        Self(out)
    }
}

macro_rules! hex_text {
    ($ty:ident, $len:expr, $parse:expr) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($ty), hex::encode(self.0))
            }
        }

        impl FromStr for $ty {
            type Err = SignatureError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let bytes = hex::decode(s).map_err(|e| SignatureError::Hex(e.to_string()))?;
                if bytes.len() != $len {
                    return Err(SignatureError::Length {
                        expected: $len,
                        got: bytes.len(),
                    });
                }
                $parse(&bytes)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&hex::encode(self.0))
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

fn node_id_from_slice(bytes: &[u8]) -> Result<NodeId, SignatureError> {
    let arr: [u8; 32] = bytes.try_into().map_err(|_| SignatureError::Length {
        expected: 32,
        got: bytes.len(),
    })?;
    Ok(NodeId(arr))
}

hex_text!(NodeId, 32, node_id_from_slice);
hex_text!(PublicKey, PUBLIC_KEY_LEN, PublicKey::from_bytes);
hex_text!(Signature, SIGNATURE_LEN, Signature::from_bytes);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_order_is_n_over_two() {
        let n = ORDER;
        let mut half = [0u8; 32];
        let mut carry = 0u16;
        for (i, byte) in n.iter().enumerate() {
            let v = (carry << 8) | u16::from(*byte);
            half[i] = (v / 2) as u8;
            carry = v % 2;
        }
        assert_eq!(half, HALF_ORDER);
    }

    use k256::ecdsa::signature::hazmat::{PrehashSigner, PrehashVerifier};
    use proptest::prelude::*;

    use crate::fixtures::test_identity;

    fn k256_verdict(key: &PublicKey, msg: &[u8], sig: &Signature) -> bool {
        let parsed = k256::ecdsa::Signature::from_slice(&sig.0);
        !sig.is_high_s()
            && parsed.is_ok_and(|p| {
                key.verifying_key()
                    .is_ok_and(|k| k.verify_prehash(&sha256(msg), &p).is_ok())
            })
    }

    #[test]
    fn k256_and_libsecp256k1_signatures_are_the_same_bytes() {
        for seed in 0..20 {
            let id = test_identity(seed);
            let msg = format!("message {seed}").into_bytes();
            // libsecp256k1 signs (Identity) and verifies.
            let sig = id.sign(&msg);
            assert_eq!(id.public_key().verify(&msg, &sig), Ok(()));
            // k256 signs the same prehash with the same RFC 6979 nonce: same bytes once
            // normalised to low S, and k256 verifies ours.
            let key = k256::ecdsa::SigningKey::from_slice(&id.secret_bytes()).unwrap();
            let theirs: k256::ecdsa::Signature = key.sign_prehash(&sha256(&msg)).unwrap();
            let theirs = theirs.normalize_s();
            assert_eq!(theirs.to_bytes().as_slice(), sig.0.as_slice());
            assert!(k256_verdict(&id.public_key(), &msg, &sig));
        }
    }

    #[test]
    fn high_s_zero_and_out_of_range_signatures_are_refused() {
        let id = test_identity(1);
        let sig = id.sign(b"m");
        let high = sig.malleate();
        assert!(high.is_high_s());
        assert_eq!(
            id.public_key().verify(b"m", &high),
            Err(SignatureError::HighS)
        );
        // libsecp256k1 alone refuses it too (it requires normalized signatures).
        let parsed = secp256k1::ecdsa::Signature::from_compact(&high.0).unwrap();
        let key = id.public_key().prepare().unwrap();
        assert!(
            secp256k1::ecdsa::verify(
                &parsed,
                secp256k1::Message::from_digest(sha256(b"m")),
                &key.0
            )
            .is_err()
        );
        let mut zero_r = sig;
        zero_r.0[..32].fill(0);
        let mut zero_s = sig;
        zero_s.0[32..].fill(0);
        let mut r_is_n = sig;
        r_is_n.0[..32].copy_from_slice(&ORDER);
        for bad in [zero_r, zero_s, r_is_n] {
            assert_eq!(
                id.public_key().verify(b"m", &bad),
                Err(SignatureError::Malformed)
            );
        }
    }

    proptest! {
        /// Whatever the key and message, our signature is the bytes k256 makes (normalised to
        /// low S): signing moved from k256 to libsecp256k1 without changing one signature.
        #[test]
        fn signatures_match_k256(secret in any::<[u8; 32]>(), msg in proptest::collection::vec(any::<u8>(), 0..200)) {
            let Ok(id) = crate::Identity::from_secret_bytes(&secret) else {
                return Ok(());
            };
            let key = k256::ecdsa::SigningKey::from_slice(&secret).unwrap();
            let theirs: k256::ecdsa::Signature = key.sign_prehash(&sha256(&msg)).unwrap();
            let theirs: Vec<u8> = theirs.normalize_s().to_bytes().to_vec();
            prop_assert_eq!(theirs, id.sign(&msg).0.to_vec());
        }

        /// Random edits of a valid signature or message: libsecp256k1 and k256 (with the
        /// low-S rule) give the same verdict.
        #[test]
        fn verdicts_match_k256(seed in 0u64..8, at in 0usize..64, mask in 1u8..=255, on_msg in any::<bool>()) {
            let id = test_identity(seed);
            let mut msg = b"verdicts".to_vec();
            let mut sig = id.sign(&msg);
            if on_msg {
                msg[at % 8] ^= mask;
            } else {
                sig.0[at] ^= mask;
            }
            let ours = id.public_key().verify(&msg, &sig).is_ok();
            prop_assert_eq!(ours, k256_verdict(&id.public_key(), &msg, &sig));
        }
    }

    #[test]
    fn rejects_uncompressed_and_garbage_keys() {
        assert!(PublicKey::from_bytes(&[2u8; 32]).is_err());
        assert_eq!(
            PublicKey::from_bytes(&[5u8; 33]),
            Err(SignatureError::InvalidPublicKey)
        );
        assert!("zz".parse::<NodeId>().is_err());
        assert!("00".parse::<Signature>().is_err());
    }
}
