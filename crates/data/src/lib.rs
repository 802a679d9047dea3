//! NeuroShard genesis dataset: the verifiable training data every peer can re-check.
//!
//! A genesis directory holds `manifest.json` (signed), `tokenizer.json` (HF byte-level BPE)
//! and shard files `train-NNNNN.bin` / `val-NNNNN.bin`. Building: [`build()`]; checking:
//! [`verify_dir`]; reading for training: [`Genesis`].
//!
//! Public API at a glance:
//! - [`Genesis::open`]`(dir) -> Result<Genesis, DataError>`: checks manifest signature and
//!   tokenizer hash; [`Genesis::manifest`], [`Genesis::vocab_size`],
//!   [`Genesis::entropy_floor`] (nats/token, synthetic only), [`Genesis::tokenizer`],
//!   [`Genesis::tokenizer_path`], [`Genesis::root`].
//! - Loader: [`Genesis::window`]`(split, shard, window, seq_len) -> Vec<u32>` (`seq_len + 1`
//!   tokens), [`Genesis::batch`]`(split, seed, step, rows, seq_len) -> Batch`,
//!   [`Genesis::train_batch`]`(node_id, round, step, rows, seq_len) -> Batch`,
//!   [`Genesis::val_batches`]`(rows, seq_len, max) -> Vec<Batch>`; a [`Batch`] carries
//!   `inputs`/`targets` (`rows × seq_len`, row-major) and `token_hash` ([`batch_token_hash`]).
//! - Assignment: [`assign`]`(root, node_id, round_seed, windows_per_shard) -> Option<Assignment>`
//!   and [`Genesis::assign`]`(node_id, round, seq_len)`; rotation over shards for a known driver
//!   set: [`rotate`]`(root, drivers, me, round, windows_per_shard) -> Option<Rotation>`,
//!   [`rotation_window`] and [`Genesis::rotated_train_batch`]`(drivers, node_id, round, step,
//!   rows, seq_len)`.
//! - Tokenizer: [`GenesisTokenizer`] with `encode`, `decode`, `token_byte_lengths`, `eos_id`,
//!   `bos_id`, `pad_id`, `path`.
//! - Integrity: [`SignedManifest`], [`MerkleProof`], [`verify_shard_inclusion`] for a peer
//!   that holds a single shard.
//! - Synthetic corpus with an exact loss floor: [`MarkovSource`], [`SyntheticConfig`].

mod assign;
mod build;
mod genesis;
mod ingest;
mod manifest;
mod merkle;
mod shard;
mod synthetic;
mod tokenizer;
mod verify;

pub use assign::{
    ASSIGN_DOMAIN, Assignment, ROTATE_DOMAIN, Rotation, assign, rotate, rotation_window, windows_in,
};
pub use build::{BuildError, BuildOptions, BuildReport, NoProgress, Progress, build};
pub use genesis::{BATCH_HASH_DOMAIN, Batch, DataError, Genesis, WindowRef, batch_token_hash};
pub use ingest::{Document, Documents, IngestError, InputFile, discover};
pub use manifest::{
    BuildParams, HexHash, MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_SIGNING_DOMAIN, Manifest,
    ManifestError, ShardEntry, SignedManifest, Split, SplitCounts, Stats, TOKENIZER_FILE,
    TokenizerInfo, shard_file_name,
};
pub use merkle::{Hash32, MerkleError, MerkleProof, merkle_root};
pub use shard::{
    Dtype, HEADER_LEN, SHARD_MAGIC, SHARD_VERSION, ShardError, ShardView, encode_shard,
};
pub use synthetic::{EntropyFloor, MarkovSource, SyntheticConfig, SyntheticError};
pub use tokenizer::{BOS_TOKEN, EOS_TOKEN, GenesisTokenizer, PAD_TOKEN, TokenizerError};
pub use verify::{
    ShardInclusion, VerifyError, VerifyReport, check_shard_bytes, load_tokenizer, verify_dir,
    verify_shard_inclusion,
};
