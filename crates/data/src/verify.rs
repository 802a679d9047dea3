//! `genesis verify`: recompute every hash, the Merkle root and the signature, and name the
//! first shard (or file) that fails and why.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::manifest::{HexHash, ManifestError, SignedManifest, Split};
use crate::merkle::MerkleProof;
use crate::shard::{ShardError, ShardView};
use crate::tokenizer::{GenesisTokenizer, TokenizerError};

/// Why a genesis directory or shard failed verification.
#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("tokenizer {path}: cannot read: {source}")]
    TokenizerIo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tokenizer {path}: BLAKE3 is {found}, manifest says {expected}")]
    TokenizerHash {
        path: PathBuf,
        expected: HexHash,
        found: HexHash,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("tokenizer does not match the manifest: {0}")]
    TokenizerMismatch(String),
    #[error("shard {index} ({file}): missing or unreadable: {source}")]
    ShardMissing {
        index: u64,
        file: String,
        source: std::io::Error,
    },
    #[error("shard {index} ({file}): {reason}")]
    ShardFormat {
        index: u64,
        file: String,
        reason: ShardError,
    },
    #[error("shard {index} ({file}): {reason}")]
    ShardMismatch {
        index: u64,
        file: String,
        reason: String,
    },
    #[error("shard {index} ({file}): BLAKE3 is {found}, manifest says {expected}")]
    ShardHash {
        index: u64,
        file: String,
        expected: HexHash,
        found: HexHash,
    },
    #[error("shard {file}: not included under root {root}: {source}")]
    NotIncluded {
        file: String,
        root: HexHash,
        source: crate::merkle::MerkleError,
    },
}

/// Summary of a successful verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub shards: usize,
    pub tokens: u64,
    pub root: HexHash,
}

/// Checks a shard's bytes against its manifest entry: hash, header, size, token ids.
pub fn check_shard_bytes(
    manifest: &crate::Manifest,
    index: usize,
    bytes: &[u8],
) -> Result<(), VerifyError> {
    let entry = &manifest.shards[index];
    let (idx, file) = (entry.index, entry.file.clone());
    let found = HexHash(*blake3::hash(bytes).as_bytes());
    // Structure first so a truncated or foreign file gets a specific reason.
    let view = ShardView::parse(bytes).map_err(|reason| VerifyError::ShardFormat {
        index: idx,
        file: file.clone(),
        reason,
    })?;
    let mismatch = |reason: String| VerifyError::ShardMismatch {
        index: idx,
        file: file.clone(),
        reason,
    };
    if view.dtype() != manifest.dtype {
        return Err(mismatch(format!(
            "dtype {:?}, manifest says {:?}",
            view.dtype(),
            manifest.dtype
        )));
    }
    if view.len() as u64 != entry.tokens {
        return Err(mismatch(format!(
            "{} tokens, manifest says {}",
            view.len(),
            entry.tokens
        )));
    }
    if found != entry.blake3 {
        return Err(VerifyError::ShardHash {
            index: idx,
            file,
            expected: entry.blake3,
            found,
        });
    }
    // A signed manifest could still list ids the model cannot embed: refuse them here.
    let vocab = manifest.tokenizer.vocab_size as u32;
    if let Some(pos) = (0..view.len()).find(|&i| view.get(i).is_none_or(|id| id >= vocab)) {
        return Err(mismatch(format!(
            "token {:?} at position {pos} is outside the vocabulary of {vocab}",
            view.get(pos)
        )));
    }
    Ok(())
}

/// Reads and checks `dir/tokenizer.json` against the manifest; returns it loaded.
pub fn load_tokenizer(
    dir: &Path,
    manifest: &crate::Manifest,
) -> Result<GenesisTokenizer, VerifyError> {
    let path = dir.join(&manifest.tokenizer.file);
    let bytes = std::fs::read(&path).map_err(|source| VerifyError::TokenizerIo {
        path: path.clone(),
        source,
    })?;
    let found = HexHash(*blake3::hash(&bytes).as_bytes());
    if found != manifest.tokenizer.blake3 {
        return Err(VerifyError::TokenizerHash {
            path,
            expected: manifest.tokenizer.blake3,
            found,
        });
    }
    let tok = GenesisTokenizer::from_json_bytes(&bytes, &path)?;
    let info = &manifest.tokenizer;
    let got = (tok.vocab_size(), tok.pad_id(), tok.bos_id(), tok.eos_id());
    let want = (info.vocab_size, info.pad_id, info.bos_id, info.eos_id);
    if got != want {
        return Err(VerifyError::TokenizerMismatch(format!(
            "(vocab, pad, bos, eos) = {got:?}, manifest says {want:?}"
        )));
    }
    Ok(tok)
}

/// Verifies a whole genesis directory.
pub fn verify_dir(dir: &Path) -> Result<VerifyReport, VerifyError> {
    let signed = SignedManifest::load(dir)?;
    let m = &signed.manifest;
    load_tokenizer(dir, m)?;
    for (i, entry) in m.shards.iter().enumerate() {
        let bytes =
            std::fs::read(dir.join(&entry.file)).map_err(|source| VerifyError::ShardMissing {
                index: entry.index,
                file: entry.file.clone(),
                source,
            })?;
        check_shard_bytes(m, i, &bytes)?;
    }
    Ok(VerifyReport {
        shards: m.shards.len(),
        tokens: m.stats.tokens.train + m.stats.tokens.val,
        root: m.merkle_root,
    })
}

/// What a peer holding one shard sends: which shard, and its path to the root.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardInclusion {
    pub split: Split,
    pub file: String,
    pub proof: MerkleProof,
}

/// Checks one shard file against a dataset root using only the shard and its proof (no
/// manifest, no other shard): the header must parse and the file's hash must sit at the
/// proof's index under `root`.
pub fn verify_shard_inclusion(
    shard_bytes: &[u8],
    inclusion: &ShardInclusion,
    root: &HexHash,
) -> Result<(), VerifyError> {
    ShardView::parse(shard_bytes).map_err(|reason| VerifyError::ShardFormat {
        index: inclusion.proof.index,
        file: inclusion.file.clone(),
        reason,
    })?;
    let hash = *blake3::hash(shard_bytes).as_bytes();
    inclusion
        .proof
        .verify(&root.0, &hash)
        .map_err(|source| VerifyError::NotIncluded {
            file: inclusion.file.clone(),
            root: *root,
            source,
        })
}
