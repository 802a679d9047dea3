//! `genesis build`: read documents, train the tokenizer, write shards, sign the manifest.
//!
//! Two streaming passes over the input (it is never held in memory whole):
//! 1. read every document, count it, note its split key, and feed it to BPE training;
//! 2. read again, tokenize in parallel batches, append `ids ‖ end-of-text` to the train or
//!    validation stream, cutting each stream into shards of exactly `shard_tokens` tokens
//!    (the last shard of a split holds the remainder).
//!
//! Validation split: a document's key is the first 8 bytes (LE u64) of BLAKE3 of its text;
//! it is a validation document when `key < ⌊val_fraction · 2^64⌋`. If that picks none while
//! `val_fraction > 0` and there are at least two documents, the documents with the smallest
//! key are taken instead; if it would take every document, the validation split is left
//! empty. The choice depends only on the document texts, so it is stable across machines
//! and input order.

use std::path::{Path, PathBuf};

use neuroshard_proof::Identity;
use thiserror::Error;

use crate::ingest::{Document, Documents, IngestError, InputFile, discover};
use crate::manifest::{
    BuildParams, HexHash, MANIFEST_FILE, MANIFEST_FORMAT, Manifest, ManifestError, ShardEntry,
    SignedManifest, Split, SplitCounts, Stats, TOKENIZER_FILE, TokenizerInfo, shard_file_name,
};
use crate::merkle::merkle_root;
use crate::shard::{Dtype, ShardError, encode_shard};
use crate::synthetic::{MarkovSource, SyntheticConfig, SyntheticError};
use crate::tokenizer::{GenesisTokenizer, TokenizerError};

/// What to build.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildOptions {
    /// `.txt` files or folders, `.jsonl`, `.parquet`; ignored when `synthetic` is set.
    pub inputs: Vec<PathBuf>,
    pub synthetic: Option<SyntheticConfig>,
    pub out: PathBuf,
    /// Dataset name; defaults to the output folder's name.
    pub name: Option<String>,
    pub vocab: usize,
    pub shard_tokens: u64,
    pub val_fraction: f64,
    pub skip_bad: bool,
}

impl BuildOptions {
    /// Defaults of the CLI: vocabulary 4096, 1,048,576 tokens per shard, 1% validation.
    pub fn new(out: PathBuf) -> BuildOptions {
        BuildOptions {
            inputs: Vec::new(),
            synthetic: None,
            out,
            name: None,
            vocab: 4096,
            shard_tokens: 1 << 20,
            val_fraction: 0.01,
            skip_bad: false,
        }
    }
}

/// Progress reporting hook (the CLI draws a bar with it). Units are text bytes.
pub trait Progress: Sync {
    fn stage(&self, name: &str, total: u64);
    fn advance(&self, n: u64);
    fn finish(&self);
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn stage(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// A failed build.
#[derive(Debug, Error)]
pub enum BuildError {
    #[error("invalid option: {0}")]
    Options(String),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error("empty input: no non-empty documents ({skipped} skipped as bad, {empty} empty)")]
    EmptyInput { skipped: u64, empty: u64 },
    #[error("input changed between the two read passes ({first} documents, then {second})")]
    InputChanged { first: u64, second: u64 },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("synthetic corpus: {0}")]
    Synthetic(#[from] SyntheticError),
    #[error(
        "synthetic word {word:?} encodes to {tokens} tokens; the loss floor needs one token per \
         word (raise --vocab, currently {vocab})"
    )]
    SyntheticTokenization {
        word: String,
        tokens: usize,
        vocab: usize,
    },
    #[error("shard {file}: {source}")]
    Shard { file: String, source: ShardError },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("output folder {0} exists and is not empty; remove it or choose another --out")]
    OutNotEmpty(PathBuf),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The build's result: the signed manifest plus the first few skipped-document messages.
#[derive(Debug)]
pub struct BuildReport {
    pub manifest: SignedManifest,
    pub skipped: Vec<String>,
}

enum Source {
    Files(Vec<InputFile>),
    Synthetic(MarkovSource, Vec<Vec<u32>>),
}

type DocIter<'a> = Box<dyn Iterator<Item = Result<Document, IngestError>> + Send + 'a>;

impl Source {
    fn documents(&self) -> DocIter<'_> {
        match self {
            Source::Files(files) => Box::new(Documents::new(files)),
            Source::Synthetic(src, docs) => Box::new(docs.iter().map(|d| {
                Ok(Document {
                    text: src.doc_text(d),
                })
            })),
        }
    }
}

fn split_key(text: &str) -> u64 {
    let h = blake3::hash(text.as_bytes());
    let mut k = [0u8; 8];
    k.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(k)
}

/// Pass-one tallies.
#[derive(Default)]
struct Census {
    docs: u64,
    by_rule: u64,
    min_key: Option<u64>,
    skipped: u64,
    skipped_msgs: Vec<String>,
    empty: u64,
    text_bytes: u64,
    fatal: Option<IngestError>,
}

const MAX_SKIP_MESSAGES: usize = 20;

/// Filters a document stream: bad documents are counted (`skip_bad`) or end the stream with
/// the error parked in `census.fatal`; empty documents are counted and dropped.
struct Clean<'a> {
    docs: DocIter<'a>,
    census: &'a mut Census,
    skip_bad: bool,
    threshold: u64,
    progress: &'a dyn Progress,
}

impl Iterator for Clean<'_> {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        loop {
            match self.docs.next()? {
                Err(e) if self.skip_bad => {
                    self.census.skipped += 1;
                    if self.census.skipped_msgs.len() < MAX_SKIP_MESSAGES {
                        self.census.skipped_msgs.push(e.to_string());
                    }
                }
                Err(e) => {
                    self.census.fatal = Some(e);
                    return None;
                }
                Ok(d) if d.text.is_empty() => self.census.empty += 1,
                Ok(d) => {
                    let k = split_key(&d.text);
                    self.census.by_rule += u64::from(k < self.threshold);
                    self.census.min_key = Some(self.census.min_key.map_or(k, |m| m.min(k)));
                    self.census.docs += 1;
                    self.census.text_bytes += d.text.len() as u64;
                    self.progress.advance(d.text.len() as u64);
                    return Some(d.text);
                }
            }
        }
    }
}

/// Accumulates one split's token stream and writes full shards as they fill.
struct SplitWriter<'a> {
    split: Split,
    dir: &'a Path,
    dtype: Dtype,
    shard_tokens: usize,
    buf: Vec<u32>,
    written: Vec<(String, u64, u64, HexHash)>,
    docs: u64,
}

impl SplitWriter<'_> {
    fn push(&mut self, ids: &[u32]) -> Result<(), BuildError> {
        let mut rest = ids;
        while !rest.is_empty() {
            let room = self.shard_tokens - self.buf.len();
            let take = room.min(rest.len());
            self.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.buf.len() == self.shard_tokens {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), BuildError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let file = shard_file_name(self.split, self.written.len());
        let bytes = encode_shard(&self.buf, self.dtype).map_err(|source| BuildError::Shard {
            file: file.clone(),
            source,
        })?;
        let path = self.dir.join(&file);
        std::fs::write(&path, &bytes).map_err(io(&path))?;
        let hash = HexHash(*blake3::hash(&bytes).as_bytes());
        self.written
            .push((file, self.buf.len() as u64, bytes.len() as u64, hash));
        self.buf.clear();
        Ok(())
    }
}

fn check_options(opts: &BuildOptions) -> Result<(), BuildError> {
    let bad = |m: &str| Err(BuildError::Options(m.to_owned()));
    if opts.synthetic.is_none() && opts.inputs.is_empty() {
        return bad("give --input PATH (one or more) or --synthetic");
    }
    if !(259..=(u32::MAX as usize)).contains(&opts.vocab) {
        return bad("--vocab must be at least 259 (3 special tokens + 256 bytes)");
    }
    if opts.shard_tokens < 2 || opts.shard_tokens > (1 << 34) {
        return bad("--shard-tokens must be between 2 and 2^34");
    }
    if !(0.0..=0.5).contains(&opts.val_fraction) {
        return bad("--val-fraction must be between 0 and 0.5");
    }
    Ok(())
}

fn prepare_out(out: &Path) -> Result<(), BuildError> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(io(out))?;
        if entries.next().is_some() {
            return Err(BuildError::OutNotEmpty(out.to_path_buf()));
        }
    }
    std::fs::create_dir_all(out).map_err(io(out))
}

/// Builds a genesis dataset into `opts.out` and signs it with `identity`.
pub fn build(
    opts: &BuildOptions,
    identity: &Identity,
    progress: &dyn Progress,
) -> Result<BuildReport, BuildError> {
    check_options(opts)?;
    let source = match opts.synthetic {
        Some(cfg) => {
            let src = MarkovSource::new(cfg)?;
            let docs = src.generate();
            Source::Synthetic(src, docs)
        }
        None => Source::Files(discover(&opts.inputs)?),
    };
    prepare_out(&opts.out)?;
    let threshold = (opts.val_fraction * 2f64.powi(64)).min(u64::MAX as f64) as u64;

    // Pass 1: census and tokenizer training.
    let total_bytes = match &source {
        Source::Files(files) => files.iter().map(|f| f.bytes).sum(),
        Source::Synthetic(src, docs) => docs
            .iter()
            .map(|d| {
                d.iter()
                    .map(|&w| src.words()[w as usize].len() as u64 + 1)
                    .sum::<u64>()
            })
            .sum(),
    };
    progress.stage("reading, training tokenizer", total_bytes);
    let mut census = Census::default();
    let tokenizer = GenesisTokenizer::train(
        opts.vocab,
        Clean {
            docs: source.documents(),
            census: &mut census,
            skip_bad: opts.skip_bad,
            threshold,
            progress,
        },
    );
    progress.finish();
    if let Some(e) = census.fatal.take() {
        return Err(e.into());
    }
    let tokenizer = tokenizer?;
    if census.docs == 0 {
        return Err(BuildError::EmptyInput {
            skipped: census.skipped,
            empty: census.empty,
        });
    }
    let is_val = {
        let (by_rule, docs, min_key) = (census.by_rule, census.docs, census.min_key);
        let fallback = opts.val_fraction > 0.0 && by_rule == 0 && docs >= 2;
        let none = by_rule == docs;
        move |k: u64| !none && (k < threshold || (fallback && Some(k) == min_key))
    };

    // The synthetic floor is per token only if every word is one token.
    let word_tokens = match &source {
        Source::Synthetic(src, _) => Some(synthetic_token_map(src, &tokenizer, opts.vocab)?),
        Source::Files(_) => None,
    };

    let tok_json = tokenizer.to_json()?;
    let tok_path = opts.out.join(TOKENIZER_FILE);
    std::fs::write(&tok_path, tok_json.as_bytes()).map_err(io(&tok_path))?;
    let dtype = Dtype::for_vocab(tokenizer.vocab_size());
    let eos = tokenizer.eos_id();

    // Pass 2: tokenize and shard.
    progress.stage("tokenizing, writing shards", census.text_bytes);
    let mut writers = [Split::Train, Split::Val].map(|split| SplitWriter {
        split,
        dir: &opts.out,
        dtype,
        shard_tokens: opts.shard_tokens as usize,
        buf: Vec::new(),
        written: Vec::new(),
        docs: 0,
    });
    let mut second = Census::default();
    let mut clean = Clean {
        docs: source.documents(),
        census: &mut second,
        skip_bad: opts.skip_bad,
        threshold,
        progress,
    };
    let mut synthetic_docs = match &source {
        Source::Synthetic(_, docs) => Some(docs.iter()),
        Source::Files(_) => None,
    };
    loop {
        let mut batch = Vec::new();
        let mut batch_bytes = 0usize;
        for text in clean.by_ref() {
            batch_bytes += text.len();
            batch.push(text);
            if batch.len() >= 1024 || batch_bytes >= 8 << 20 {
                break;
            }
        }
        if batch.is_empty() {
            break;
        }
        let encoded = tokenizer.encode_batch(&batch)?;
        for (text, mut ids) in batch.iter().zip(encoded) {
            if let (Some(docs), Some(map)) = (synthetic_docs.as_mut(), word_tokens.as_ref()) {
                check_synthetic_doc(docs.next(), &ids, map)?;
            }
            ids.push(eos);
            let w = &mut writers[usize::from(is_val(split_key(text)))];
            w.docs += 1;
            w.push(&ids)?;
        }
    }
    drop(clean);
    progress.finish();
    if let Some(e) = second.fatal.take() {
        return Err(e.into());
    }
    if second.docs != census.docs {
        return Err(BuildError::InputChanged {
            first: census.docs,
            second: second.docs,
        });
    }
    for w in &mut writers {
        w.flush()?;
    }

    let mut shards = Vec::new();
    for w in &writers {
        for (file, tokens, bytes, blake3) in &w.written {
            shards.push(ShardEntry {
                index: shards.len() as u64,
                split: w.split,
                file: file.clone(),
                tokens: *tokens,
                bytes: *bytes,
                blake3: *blake3,
            });
        }
    }
    let count = |split| {
        shards
            .iter()
            .filter(|s: &&ShardEntry| s.split == split)
            .map(|s| s.tokens)
            .sum::<u64>()
    };
    let stats = Stats {
        documents: SplitCounts {
            train: writers[0].docs,
            val: writers[1].docs,
        },
        tokens: SplitCounts {
            train: count(Split::Train),
            val: count(Split::Val),
        },
        skipped_documents: census.skipped,
        empty_documents: census.empty,
        text_bytes: census.text_bytes,
    };
    let root = merkle_root(&shards.iter().map(|s| s.blake3.0).collect::<Vec<_>>())
        .map_err(ManifestError::from)?;
    let entropy_floor = match &source {
        Source::Synthetic(src, _) => Some(src.entropy_floor()),
        Source::Files(_) => None,
    };
    let name = opts.name.clone().unwrap_or_else(|| {
        opts.out
            .file_name()
            .map_or_else(|| "genesis".into(), |n| n.to_string_lossy().into_owned())
    });
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        name,
        params: BuildParams {
            inputs: match &opts.synthetic {
                Some(_) => Vec::new(),
                None => opts
                    .inputs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            },
            vocab: opts.vocab,
            shard_tokens: opts.shard_tokens,
            val_fraction: opts.val_fraction,
            skip_bad: opts.skip_bad,
            synthetic: opts.synthetic,
        },
        tokenizer: TokenizerInfo {
            file: TOKENIZER_FILE.into(),
            blake3: HexHash(*blake3::hash(tok_json.as_bytes()).as_bytes()),
            vocab_size: tokenizer.vocab_size(),
            pad_id: tokenizer.pad_id(),
            bos_id: tokenizer.bos_id(),
            eos_id: eos,
        },
        dtype,
        stats,
        entropy_floor,
        shards,
        merkle_root: HexHash(root),
        builder: identity.public_key(),
    };
    let signed = manifest.sign(identity)?;
    let bytes = signed.to_file_bytes()?;
    // Write then rename, so a manifest on disk is always complete.
    let tmp = opts.out.join(format!("{MANIFEST_FILE}.tmp"));
    let path = opts.out.join(MANIFEST_FILE);
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(BuildReport {
        manifest: signed,
        skipped: census.skipped_msgs,
    })
}

/// Token id of every synthetic word, checking each `" word"` is exactly one token.
fn synthetic_token_map(
    src: &MarkovSource,
    tokenizer: &GenesisTokenizer,
    vocab: usize,
) -> Result<Vec<u32>, BuildError> {
    src.words()
        .iter()
        .map(|w| {
            let ids = tokenizer.encode(&format!(" {w}"))?;
            match ids.as_slice() {
                [id] => Ok(*id),
                _ => Err(BuildError::SyntheticTokenization {
                    word: w.clone(),
                    tokens: ids.len(),
                    vocab,
                }),
            }
        })
        .collect()
}

fn check_synthetic_doc(doc: Option<&Vec<u32>>, ids: &[u32], map: &[u32]) -> Result<(), BuildError> {
    let ok = doc.is_some_and(|d| {
        d.len() == ids.len() && d.iter().zip(ids).all(|(&w, &id)| map[w as usize] == id)
    });
    if ok {
        Ok(())
    } else {
        Err(BuildError::SyntheticTokenization {
            word: "(a whole document)".into(),
            tokens: ids.len(),
            vocab: map.len(),
        })
    }
}
