//! The signed dataset manifest (`manifest.json`).
//!
//! On disk: `{"manifest": {…}, "signature": "<128 hex>"}`, written as
//! `serde_json::to_string_pretty` plus a newline; a file that is not byte-for-byte in that
//! form is rejected, so every changed byte of the file is detected, not only those that
//! change a parsed value.
//!
//! Signature: ECDSA secp256k1 (the project identity key, `neuroshard_proof`) over
//! `MANIFEST_SIGNING_DOMAIN ‖ serde_json::to_vec(&manifest)`, i.e. the compact JSON of the
//! inner object: fields in the declaration order of the structs below, no whitespace,
//! integers in decimal, floats in shortest round-trip form (serde_json with
//! `float_roundtrip`, so they re-serialize to the same bytes), `null` for absent options.
//! The builder's public key is inside the signed object.

use std::fmt;
use std::path::Path;

use neuroshard_proof::{Identity, PublicKey, Signature, SignatureError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::merkle::{Hash32, MerkleError, MerkleProof, merkle_root};
use crate::shard::{Dtype, HEADER_LEN};
use crate::synthetic::{EntropyFloor, SyntheticConfig};

/// Value of [`Manifest::format`] this code reads and writes.
pub const MANIFEST_FORMAT: &str = "neuroshard-genesis/1";
/// Prefix of the signed bytes, so this signature can never be replayed as another message.
pub const MANIFEST_SIGNING_DOMAIN: &[u8] = b"neuroshard/genesis/manifest/v1\n";
/// File names inside a genesis directory.
pub const MANIFEST_FILE: &str = "manifest.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A manifest problem.
#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("manifest is not valid JSON of the expected shape: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("manifest bytes differ from their canonical form (edited or corrupted)")]
    NotCanonical,
    #[error("unsupported manifest format {found:?} (expected {MANIFEST_FORMAT:?})")]
    Format { found: String },
    #[error("manifest signature is invalid: {0}")]
    Signature(#[from] SignatureError),
    #[error("manifest shard list is inconsistent: {0}")]
    Inconsistent(String),
    #[error("merkle: {0}")]
    Merkle(#[from] MerkleError),
    #[error("manifest merkle root does not match its shard hashes")]
    RootMismatch,
}

/// A 32-byte BLAKE3 hash written as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HexHash(pub Hash32);

impl fmt::Display for HexHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for HexHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HexHash({self})")
    }
}

impl Serialize for HexHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for HexHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // Only lowercase, so each hash has one spelling.
        if s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(serde::de::Error::custom("hash hex must be lowercase"));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(HexHash(out))
    }
}

/// Train or validation split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Val,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Val => "val",
        })
    }
}

/// The file name of the `n`-th shard of `split`.
pub fn shard_file_name(split: Split, n: usize) -> String {
    format!("{split}-{n:05}.bin")
}

/// Build settings, recorded for provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildParams {
    /// Input paths as given to the builder (informational; not part of the data identity).
    pub inputs: Vec<String>,
    /// Requested vocabulary size (the trained one can be smaller).
    pub vocab: usize,
    pub shard_tokens: u64,
    pub val_fraction: f64,
    pub skip_bad: bool,
    pub synthetic: Option<SyntheticConfig>,
}

/// The tokenizer's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerInfo {
    pub file: String,
    /// BLAKE3 of the `tokenizer.json` bytes.
    pub blake3: HexHash,
    pub vocab_size: usize,
    pub pad_id: u32,
    pub bos_id: u32,
    pub eos_id: u32,
}

/// Per-split counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitCounts {
    pub train: u64,
    pub val: u64,
}

/// What the build saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    pub documents: SplitCounts,
    pub tokens: SplitCounts,
    /// Documents dropped by `--skip-bad`.
    pub skipped_documents: u64,
    /// Documents with no text (not tokenized; they would be a bare end-of-text).
    pub empty_documents: u64,
    /// UTF-8 bytes of document text tokenized.
    pub text_bytes: u64,
}

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// Position in the shard list and among the Merkle leaves.
    pub index: u64,
    pub split: Split,
    pub file: String,
    pub tokens: u64,
    pub bytes: u64,
    /// BLAKE3 of the whole file.
    pub blake3: HexHash,
}

/// The signed content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub name: String,
    pub params: BuildParams,
    pub tokenizer: TokenizerInfo,
    pub dtype: Dtype,
    pub stats: Stats,
    /// Loss floor, synthetic builds only.
    pub entropy_floor: Option<EntropyFloor>,
    /// Train shards first, then validation shards.
    pub shards: Vec<ShardEntry>,
    pub merkle_root: HexHash,
    /// Public key of the builder who signed.
    pub builder: PublicKey,
}

/// The manifest file: content plus signature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedManifest {
    pub manifest: Manifest,
    pub signature: Signature,
}

impl Manifest {
    /// The exact bytes the signature covers.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, ManifestError> {
        let mut out = MANIFEST_SIGNING_DOMAIN.to_vec();
        serde_json::to_writer(&mut out, self)?;
        Ok(out)
    }

    /// Signs with `identity` (which must be the key named in `builder`).
    pub fn sign(self, identity: &Identity) -> Result<SignedManifest, ManifestError> {
        if identity.public_key() != self.builder {
            return Err(ManifestError::Inconsistent(
                "builder key is not the signing key".into(),
            ));
        }
        let signature = identity.sign(&self.signing_bytes()?);
        Ok(SignedManifest {
            manifest: self,
            signature,
        })
    }

    /// Shard hashes in leaf order.
    pub fn shard_hashes(&self) -> Vec<Hash32> {
        self.shards.iter().map(|s| s.blake3.0).collect()
    }

    /// Shards of one split, in order.
    pub fn split_shards(&self, split: Split) -> impl Iterator<Item = &ShardEntry> {
        self.shards.iter().filter(move |s| s.split == split)
    }

    /// Inclusion proof for the shard at global `index`, for a peer that holds only that shard.
    pub fn inclusion_proof(&self, index: u64) -> Result<MerkleProof, ManifestError> {
        Ok(MerkleProof::new(&self.shard_hashes(), index)?)
    }

    /// Internal consistency: format, shard order and names, sizes, root.
    pub fn check_consistency(&self) -> Result<(), ManifestError> {
        if self.format != MANIFEST_FORMAT {
            return Err(ManifestError::Format {
                found: self.format.clone(),
            });
        }
        let bad = |m: String| Err(ManifestError::Inconsistent(m));
        if self.shards.is_empty() {
            return bad("no shards".into());
        }
        if Dtype::for_vocab(self.tokenizer.vocab_size) != self.dtype && self.dtype != Dtype::U32 {
            return bad(format!(
                "dtype {:?} cannot hold a vocabulary of {}",
                self.dtype, self.tokenizer.vocab_size
            ));
        }
        let mut seen_val = false;
        let mut per_split = SplitCounts::default();
        let mut tokens = SplitCounts::default();
        for (i, s) in self.shards.iter().enumerate() {
            if s.index != i as u64 {
                return bad(format!("shard at position {i} has index {}", s.index));
            }
            let n = match s.split {
                Split::Train if seen_val => {
                    return bad(format!("train shard {i} follows a validation shard"));
                }
                Split::Train => &mut per_split.train,
                Split::Val => {
                    seen_val = true;
                    &mut per_split.val
                }
            };
            let expected = shard_file_name(s.split, *n as usize);
            if s.file != expected {
                return bad(format!(
                    "shard {i} is named {:?}, expected {expected:?}",
                    s.file
                ));
            }
            *n += 1;
            // Counts come from the file: checked, so a hostile count is an error, not a wrap.
            let Some(bytes) = s
                .tokens
                .checked_mul(self.dtype.width() as u64)
                .and_then(|b| b.checked_add(HEADER_LEN as u64))
            else {
                return bad(format!(
                    "shard {i}: {} tokens overflow a file size",
                    s.tokens
                ));
            };
            if s.bytes != bytes {
                return bad(format!(
                    "shard {i} lists {} bytes but {} tokens need {bytes}",
                    s.bytes, s.tokens
                ));
            }
            let total = match s.split {
                Split::Train => &mut tokens.train,
                Split::Val => &mut tokens.val,
            };
            *total = match total.checked_add(s.tokens) {
                Some(t) => t,
                None => {
                    return bad(format!(
                        "shard {i}: {} split token count overflows",
                        s.split
                    ));
                }
            };
        }
        if tokens != self.stats.tokens {
            return bad(format!(
                "shards hold {tokens:?} tokens, stats say {:?}",
                self.stats.tokens
            ));
        }
        if merkle_root(&self.shard_hashes())? != self.merkle_root.0 {
            return Err(ManifestError::RootMismatch);
        }
        Ok(())
    }
}

impl SignedManifest {
    /// The canonical file bytes.
    pub fn to_file_bytes(&self) -> Result<Vec<u8>, ManifestError> {
        let mut out = serde_json::to_vec_pretty(self)?;
        out.push(b'\n');
        Ok(out)
    }

    /// Parses file bytes and checks canonical form, consistency and the signature.
    pub fn from_file_bytes(bytes: &[u8]) -> Result<SignedManifest, ManifestError> {
        let parsed: SignedManifest = serde_json::from_slice(bytes)?;
        if parsed.to_file_bytes()? != bytes {
            return Err(ManifestError::NotCanonical);
        }
        parsed.manifest.check_consistency()?;
        parsed
            .manifest
            .builder
            .verify(&parsed.manifest.signing_bytes()?, &parsed.signature)?;
        Ok(parsed)
    }

    /// Reads and checks `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<SignedManifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|source| ManifestError::Io {
            path: path.display().to_string(),
            source,
        })?;
        SignedManifest::from_file_bytes(&bytes)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(identity: &Identity) -> Manifest {
        let shards: Vec<ShardEntry> = [
            (Split::Train, 0, 100),
            (Split::Train, 1, 7),
            (Split::Val, 0, 5),
        ]
        .iter()
        .enumerate()
        .map(|(i, &(split, n, tokens))| ShardEntry {
            index: i as u64,
            split,
            file: shard_file_name(split, n),
            tokens,
            bytes: tokens * 2 + HEADER_LEN as u64,
            blake3: HexHash(*blake3::hash(&[i as u8]).as_bytes()),
        })
        .collect();
        let root = merkle_root(&shards.iter().map(|s| s.blake3.0).collect::<Vec<_>>()).unwrap();
        Manifest {
            format: MANIFEST_FORMAT.into(),
            name: "unit".into(),
            params: BuildParams {
                inputs: vec!["a b".into()],
                vocab: 4096,
                shard_tokens: 100,
                val_fraction: 0.01,
                skip_bad: false,
                synthetic: Some(SyntheticConfig::default()),
            },
            tokenizer: TokenizerInfo {
                file: TOKENIZER_FILE.into(),
                blake3: HexHash([7; 32]),
                vocab_size: 300,
                pad_id: 0,
                bos_id: 1,
                eos_id: 2,
            },
            dtype: Dtype::U16,
            stats: Stats {
                tokens: SplitCounts { train: 107, val: 5 },
                ..Stats::default()
            },
            entropy_floor: Some(EntropyFloor {
                nats_per_token: 1.234_567_890_123_456_7,
                bits_per_token: 0.1 + 0.2,
                mean_doc_tokens: 64.000_000_000_001,
            }),
            shards,
            merkle_root: HexHash(root),
            builder: identity.public_key(),
        }
    }

    #[test]
    fn sign_write_read_round_trip() {
        let id = Identity::generate();
        let signed = sample(&id).sign(&id).unwrap();
        let bytes = signed.to_file_bytes().unwrap();
        let back = SignedManifest::from_file_bytes(&bytes).unwrap();
        assert_eq!(back, signed);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let id = Identity::generate();
        let bytes = sample(&id).sign(&id).unwrap().to_file_bytes().unwrap();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x20, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                assert!(
                    SignedManifest::from_file_bytes(&b).is_err(),
                    "flip {bit:#x} at byte {i} ({:?}) accepted",
                    bytes[i] as char
                );
            }
        }
    }

    #[test]
    fn a_resigned_edit_by_another_key_is_still_a_valid_manifest_of_that_key() {
        // The signature binds content to the builder key; trusting a key is the reader's call.
        let (a, b) = (Identity::generate(), Identity::generate());
        let mut m = sample(&a);
        assert!(matches!(
            m.clone().sign(&b),
            Err(ManifestError::Inconsistent(_))
        ));
        m.builder = b.public_key();
        let signed = m.sign(&b).unwrap();
        let back = SignedManifest::from_file_bytes(&signed.to_file_bytes().unwrap()).unwrap();
        assert_eq!(back.manifest.builder, b.public_key());
    }

    #[test]
    fn signature_over_other_content_fails() {
        let id = Identity::generate();
        let mut signed = sample(&id).sign(&id).unwrap();
        signed.manifest.name = "other".into();
        let bytes = signed.to_file_bytes().unwrap();
        assert!(matches!(
            SignedManifest::from_file_bytes(&bytes),
            Err(ManifestError::Signature(_))
        ));
    }

    #[test]
    fn inconsistencies_are_named() {
        let id = Identity::generate();
        let check = |f: &dyn Fn(&mut Manifest)| {
            let mut m = sample(&id);
            f(&mut m);
            m.check_consistency().unwrap_err().to_string()
        };
        assert!(check(&|m| m.format = "x".into()).contains("unsupported manifest format"));
        assert!(check(&|m| m.shards[1].file = "../etc".into()).contains("named"));
        assert!(check(&|m| m.shards.swap(1, 2)).contains("index"));
        assert!(check(&|m| m.shards[0].bytes += 1).contains("bytes"));
        assert!(check(&|m| m.stats.tokens.val = 9).contains("stats"));
        assert!(check(&|m| m.merkle_root = HexHash([0; 32])).contains("merkle root"));
        assert!(check(&|m| m.shards.clear()).contains("no shards"));
    }

    #[test]
    fn proofs_from_the_manifest_check_against_its_root() {
        let id = Identity::generate();
        let m = sample(&id);
        for s in &m.shards {
            let proof = m.inclusion_proof(s.index).unwrap();
            assert_eq!(proof.verify(&m.merkle_root.0, &s.blake3.0), Ok(()));
        }
    }
}
