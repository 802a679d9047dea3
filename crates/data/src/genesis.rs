//! Reading a built genesis dataset: memory-mapped shards, windows, batches, assignment.
//!
//! A window is `seq_len + 1` consecutive tokens of one shard starting at
//! `window · seq_len`: inputs are its first `seq_len` tokens, targets its last `seq_len`.
//! Shards are mapped (and hashed against the manifest) the first time they are used, so a
//! node that holds only its assigned shard can train.
//!
//! Batch token hash (what a proof commits to):
//! `BLAKE3("neuroshard/genesis/batch/v1" ‖ rows u64 LE ‖ seq_len u64 LE ‖ for each row its
//! seq_len + 1 window tokens as u32 LE)`; see [`batch_token_hash`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::assign::{Assignment, assign, rotate, rotation_window, windows_in};
use crate::manifest::{Manifest, ManifestError, SignedManifest, Split};
use crate::merkle::MerkleProof;
use crate::shard::ShardView;
use crate::synthetic::EntropyFloor;
use crate::tokenizer::GenesisTokenizer;
use crate::verify::{ShardInclusion, VerifyError, check_shard_bytes, load_tokenizer};

/// Domain prefix of [`batch_token_hash`].
pub const BATCH_HASH_DOMAIN: &[u8] = b"neuroshard/genesis/batch/v1";
const DRAW_DOMAIN: &[u8] = b"neuroshard/genesis/batch-draw/v1";

/// A problem opening or reading a genesis dataset.
#[derive(Debug, Error)]
pub enum DataError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error("no {split} shard {index} (the split has {count})")]
    NoSuchShard {
        split: Split,
        index: usize,
        count: usize,
    },
    #[error("cannot map shard {path}: {source}")]
    Map {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{split} shard {shard} has {windows} windows of {seq_len}+1 tokens, asked for {window}"
    )]
    NoSuchWindow {
        split: Split,
        shard: usize,
        window: u64,
        windows: u64,
        seq_len: usize,
    },
    #[error("the {split} split has no window of {seq_len}+1 tokens")]
    NoWindows { split: Split, seq_len: usize },
    #[error("batch shape must be positive (rows {rows}, seq_len {seq_len})")]
    BadShape { rows: usize, seq_len: usize },
    #[error(
        "node {} is not among the round's {count} drivers",
        hex::encode(node_id)
    )]
    NotADriver { node_id: [u8; 32], count: usize },
}

/// Where a batch row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WindowRef {
    pub split: Split,
    /// Shard index within the split.
    pub shard: usize,
    pub window: u64,
}

/// `rows` windows as model inputs and next-token targets, row-major `rows × seq_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub rows: usize,
    pub seq_len: usize,
    pub windows: Vec<WindowRef>,
    pub token_hash: [u8; 32],
}

impl Batch {
    fn from_windows(seq_len: usize, rows: Vec<(WindowRef, Vec<u32>)>) -> Batch {
        let n = rows.len();
        let mut inputs = Vec::with_capacity(n * seq_len);
        let mut targets = Vec::with_capacity(n * seq_len);
        let mut windows = Vec::with_capacity(n);
        for (r, w) in &rows {
            inputs.extend_from_slice(&w[..seq_len]);
            targets.extend_from_slice(&w[1..]);
            windows.push(*r);
        }
        let token_hash = batch_token_hash(seq_len, rows.iter().map(|(_, w)| w.as_slice()));
        Batch {
            inputs,
            targets,
            rows: n,
            seq_len,
            windows,
            token_hash,
        }
    }
}

/// The batch commitment (see the module docs); `windows` yields each row's `seq_len + 1` tokens.
pub fn batch_token_hash<'a>(
    seq_len: usize,
    windows: impl ExactSizeIterator<Item = &'a [u32]>,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(BATCH_HASH_DOMAIN);
    h.update(&(windows.len() as u64).to_le_bytes());
    h.update(&(seq_len as u64).to_le_bytes());
    for w in windows {
        for t in w {
            h.update(&t.to_le_bytes());
        }
    }
    *h.finalize().as_bytes()
}

/// An opened genesis dataset.
#[derive(Debug)]
pub struct Genesis {
    dir: PathBuf,
    signed: SignedManifest,
    tokenizer: GenesisTokenizer,
    /// Global shard indices of each split, in order.
    train: Vec<usize>,
    val: Vec<usize>,
    maps: Vec<OnceLock<Mmap>>,
}

impl Genesis {
    /// Loads and checks the manifest (canonical form, consistency, signature) and the
    /// tokenizer (hash). Shards are checked when first used.
    pub fn open(dir: &Path) -> Result<Genesis, DataError> {
        let signed = SignedManifest::load(dir)?;
        let tokenizer = load_tokenizer(dir, &signed.manifest)?;
        let of = |split| {
            signed
                .manifest
                .shards
                .iter()
                .enumerate()
                .filter(|(_, s)| s.split == split)
                .map(|(i, _)| i)
                .collect()
        };
        let (train, val) = (of(Split::Train), of(Split::Val));
        let maps = signed
            .manifest
            .shards
            .iter()
            .map(|_| OnceLock::new())
            .collect();
        Ok(Genesis {
            dir: dir.to_path_buf(),
            signed,
            tokenizer,
            train,
            val,
            maps,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.signed.manifest
    }

    pub fn signed_manifest(&self) -> &SignedManifest {
        &self.signed
    }

    /// The dataset identity: the Merkle root over shard hashes.
    pub fn root(&self) -> [u8; 32] {
        self.signed.manifest.merkle_root.0
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    /// The loss floor in nats per token (synthetic datasets only).
    pub fn entropy_floor(&self) -> Option<f64> {
        self.signed.manifest.entropy_floor.map(|f| f.nats_per_token)
    }

    pub fn entropy_floor_info(&self) -> Option<EntropyFloor> {
        self.signed.manifest.entropy_floor
    }

    pub fn tokenizer(&self) -> &GenesisTokenizer {
        &self.tokenizer
    }

    /// `tokenizer.json` of this dataset, to copy beside model checkpoints.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join(&self.signed.manifest.tokenizer.file)
    }

    fn split_indices(&self, split: Split) -> &[usize] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// Number of shards in `split`.
    pub fn shard_count(&self, split: Split) -> usize {
        self.split_indices(split).len()
    }

    fn global(&self, split: Split, shard: usize) -> Result<usize, DataError> {
        let idx = self.split_indices(split);
        idx.get(shard).copied().ok_or(DataError::NoSuchShard {
            split,
            index: shard,
            count: idx.len(),
        })
    }

    /// Windows of `seq_len + 1` tokens in each shard of `split`.
    pub fn windows_per_shard(&self, split: Split, seq_len: usize) -> Vec<u64> {
        self.split_indices(split)
            .iter()
            .map(|&g| windows_in(self.signed.manifest.shards[g].tokens, seq_len))
            .collect()
    }

    /// The mapped, verified shard (global index).
    fn view(&self, global: usize) -> Result<ShardView<'_>, DataError> {
        let cell = &self.maps[global];
        let map = match cell.get() {
            Some(map) => map,
            None => {
                let entry = &self.signed.manifest.shards[global];
                let path = self.dir.join(&entry.file);
                let file = File::open(&path).map_err(|source| VerifyError::ShardMissing {
                    index: entry.index,
                    file: entry.file.clone(),
                    source,
                })?;
                // SAFETY: the map is read-only; shards are immutable once built, and every
                // byte is hashed against the manifest right below, before any token is used.
                let map = unsafe { Mmap::map(&file) }.map_err(|source| DataError::Map {
                    path: path.clone(),
                    source,
                })?;
                check_shard_bytes(&self.signed.manifest, global, &map)?;
                // A concurrent caller may have won the race; both maps were verified.
                cell.get_or_init(|| map)
            }
        };
        Ok(
            ShardView::parse(map).map_err(|reason| VerifyError::ShardFormat {
                index: global as u64,
                file: self.signed.manifest.shards[global].file.clone(),
                reason,
            })?,
        )
    }

    /// Window `window` of shard `shard` of `split`: `seq_len + 1` tokens.
    pub fn window(
        &self,
        split: Split,
        shard: usize,
        window: u64,
        seq_len: usize,
    ) -> Result<Vec<u32>, DataError> {
        let g = self.global(split, shard)?;
        let windows = windows_in(self.signed.manifest.shards[g].tokens, seq_len);
        if window >= windows {
            return Err(DataError::NoSuchWindow {
                split,
                shard,
                window,
                windows,
                seq_len,
            });
        }
        let view = self.view(g)?;
        let mut out = Vec::with_capacity(seq_len + 1);
        let start = window as usize * seq_len;
        if !view.copy_range(start, seq_len + 1, &mut out) {
            return Err(DataError::NoSuchWindow {
                split,
                shard,
                window,
                windows,
                seq_len,
            });
        }
        Ok(out)
    }

    fn check_shape(rows: usize, seq_len: usize) -> Result<(), DataError> {
        if rows == 0 || seq_len == 0 {
            return Err(DataError::BadShape { rows, seq_len });
        }
        Ok(())
    }

    fn rows(&self, seq_len: usize, refs: &[WindowRef]) -> Result<Batch, DataError> {
        let rows = refs
            .iter()
            .map(|r| Ok((*r, self.window(r.split, r.shard, r.window, seq_len)?)))
            .collect::<Result<Vec<_>, DataError>>()?;
        Ok(Batch::from_windows(seq_len, rows))
    }

    /// The assignment of `node_id` in round `round` (see [`assign`]).
    pub fn assign(
        &self,
        node_id: &[u8; 32],
        round: u64,
        seq_len: usize,
    ) -> Result<Assignment, DataError> {
        let layout = self.windows_per_shard(Split::Train, seq_len);
        assign(&self.root(), node_id, round, &layout).ok_or(DataError::NoWindows {
            split: Split::Train,
            seq_len,
        })
    }

    /// The batch `node_id` trains on at `step` of `round`. All rows come from the node's
    /// assigned shard: row `r` uses window `(a.window + step + r·⌊W/rows⌋) mod W`, where `a`
    /// is the assignment and `W` the shard's window count, so rows are spread over the shard
    /// and successive steps move on. Any peer can recompute it.
    pub fn train_batch(
        &self,
        node_id: &[u8; 32],
        round: u64,
        step: u64,
        rows: usize,
        seq_len: usize,
    ) -> Result<Batch, DataError> {
        Self::check_shape(rows, seq_len)?;
        let a = self.assign(node_id, round, seq_len)?;
        let w = self.windows_per_shard(Split::Train, seq_len)[a.shard];
        let stride = (w / rows as u64).max(1);
        let refs: Vec<WindowRef> = (0..rows as u64)
            .map(|r| WindowRef {
                split: Split::Train,
                shard: a.shard,
                window: (a.window % w + step % w + (r * stride) % w) % w,
            })
            .collect();
        self.rows(seq_len, &refs)
    }

    /// The batch driver `node_id` trains on at `step` of `round` when drivers rotate over the
    /// shards (see [`rotate`]): `drivers` is the round's driver set, which every peer that
    /// recomputes the batch must know too. Row `r` reads [`rotation_window`]`(rot, W, step, r,
    /// rows)` of the rotated shard, so with a step counter shared by all drivers each shard is
    /// read onwards from where the previous round's driver left it.
    pub fn rotated_train_batch(
        &self,
        drivers: &[[u8; 32]],
        node_id: &[u8; 32],
        round: u64,
        step: u64,
        rows: usize,
        seq_len: usize,
    ) -> Result<Batch, DataError> {
        Self::check_shape(rows, seq_len)?;
        let layout = self.windows_per_shard(Split::Train, seq_len);
        if layout.iter().all(|&w| w == 0) {
            return Err(DataError::NoWindows {
                split: Split::Train,
                seq_len,
            });
        }
        let rot = rotate(&self.root(), drivers, node_id, round, &layout).ok_or(
            DataError::NotADriver {
                node_id: *node_id,
                count: drivers.len(),
            },
        )?;
        let w = layout[rot.shard];
        let refs = (0..rows as u64)
            .map(|r| {
                let window =
                    rotation_window(&rot, w, step, r, rows as u64).ok_or(DataError::NoWindows {
                        split: Split::Train,
                        seq_len,
                    })?;
                Ok(WindowRef {
                    split: Split::Train,
                    shard: rot.shard,
                    window,
                })
            })
            .collect::<Result<Vec<_>, DataError>>()?;
        self.rows(seq_len, &refs)
    }

    /// A batch of `rows` windows drawn uniformly over all windows of `split`, a pure function
    /// of (dataset root, split, seed, step): row `r` draws with node id
    /// `BLAKE3(draw domain ‖ split ‖ seed ‖ step ‖ r)` and round 0 through [`assign`].
    pub fn batch(
        &self,
        split: Split,
        seed: u64,
        step: u64,
        rows: usize,
        seq_len: usize,
    ) -> Result<Batch, DataError> {
        Self::check_shape(rows, seq_len)?;
        let layout = self.windows_per_shard(split, seq_len);
        let refs = (0..rows as u64)
            .map(|r| {
                let mut h = blake3::Hasher::new();
                h.update(DRAW_DOMAIN);
                h.update(&[split as u8]);
                h.update(&seed.to_le_bytes());
                h.update(&step.to_le_bytes());
                h.update(&r.to_le_bytes());
                let a = assign(&self.root(), h.finalize().as_bytes(), 0, &layout)
                    .ok_or(DataError::NoWindows { split, seq_len })?;
                Ok(WindowRef {
                    split,
                    shard: a.shard,
                    window: a.window,
                })
            })
            .collect::<Result<Vec<_>, DataError>>()?;
        self.rows(seq_len, &refs)
    }

    /// Validation batches: every window of the validation split in order (shard by shard),
    /// `rows` per batch, at most `max` batches; the last batch may have fewer rows. Empty
    /// when the split is empty or too short for one window.
    pub fn val_batches(
        &self,
        rows: usize,
        seq_len: usize,
        max: usize,
    ) -> Result<Vec<Batch>, DataError> {
        Self::check_shape(rows, seq_len)?;
        let mut refs = Vec::new();
        'outer: for (shard, &w) in self
            .windows_per_shard(Split::Val, seq_len)
            .iter()
            .enumerate()
        {
            for window in 0..w {
                if refs.len() >= rows.saturating_mul(max) {
                    break 'outer;
                }
                refs.push(WindowRef {
                    split: Split::Val,
                    shard,
                    window,
                });
            }
        }
        refs.chunks(rows).map(|c| self.rows(seq_len, c)).collect()
    }

    /// Inclusion proof for one shard, to hand to a peer that holds only that shard.
    pub fn shard_inclusion(&self, split: Split, shard: usize) -> Result<ShardInclusion, DataError> {
        let g = self.global(split, shard)?;
        let proof: MerkleProof = self.signed.manifest.inclusion_proof(g as u64)?;
        Ok(ShardInclusion {
            split,
            file: self.signed.manifest.shards[g].file.clone(),
            proof,
        })
    }

    /// Path of a shard file.
    pub fn shard_path(&self, split: Split, shard: usize) -> Result<PathBuf, DataError> {
        let g = self.global(split, shard)?;
        Ok(self.dir.join(&self.signed.manifest.shards[g].file))
    }

    /// All tokens of a shard (verified), widened to u32.
    pub fn shard_tokens(&self, split: Split, shard: usize) -> Result<Vec<u32>, DataError> {
        let g = self.global(split, shard)?;
        Ok(self.view(g)?.to_vec())
    }
}
