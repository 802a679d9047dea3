//! The dataset's byte-level BPE tokenizer: training with the HF `tokenizers` crate, a
//! standard `tokenizer.json`, and the few queries training and evaluation need.
//!
//! Layout: special tokens `<|pad|>` = 0, `<|bos|>` = 1, `<|endoftext|>` = 2, then the 256
//! byte symbols, then merges. No normalizer, GPT-2 byte-level pre-tokenizer without a prefix
//! space, byte-level decoder, no post-processor, so `encode` adds nothing on its own and
//! decoding is lossless. Special-token strings inside document text are encoded as plain
//! text (never as control tokens), so a document cannot forge an end-of-text.

use std::path::{Path, PathBuf};

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use thiserror::Error;

pub const PAD_TOKEN: &str = "<|pad|>";
pub const BOS_TOKEN: &str = "<|bos|>";
pub const EOS_TOKEN: &str = "<|endoftext|>";

type HfError = tokenizers::Error;

/// A tokenizer problem.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer {path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: HfError,
    },
    #[error("tokenizer training failed: {0}")]
    Train(#[source] HfError),
    #[error("cannot serialize tokenizer: {0}")]
    Save(#[source] HfError),
    #[error("tokenizer lacks the special token {0}")]
    MissingSpecial(&'static str),
    #[error("vocabulary size {0} is too small (need at least 259: 3 special tokens and 256 bytes)")]
    VocabTooSmall(usize),
    #[error("encoding failed: {0}")]
    Encode(#[source] HfError),
    #[error("decoding failed: {0}")]
    Decode(#[source] HfError),
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    UnknownId { id: u32, vocab_size: usize },
}

/// The genesis tokenizer.
#[derive(Debug, Clone)]
pub struct GenesisTokenizer {
    inner: Tokenizer,
    path: Option<PathBuf>,
    pad: u32,
    bos: u32,
    eos: u32,
    vocab_size: usize,
}

impl GenesisTokenizer {
    /// Trains byte-level BPE with at most `vocab_size` tokens (specials included) on `texts`.
    pub fn train<I, S>(vocab_size: usize, texts: I) -> Result<GenesisTokenizer, TokenizerError>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        if vocab_size < 259 {
            return Err(TokenizerError::VocabTooSmall(vocab_size));
        }
        let specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]
            .iter()
            .map(|s| AddedToken::from(*s, true))
            .collect();
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .special_tokens(specials)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::BpeTrainer(trainer);
        let mut tok = Tokenizer::new(BPE::default());
        tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        tok.with_decoder(Some(ByteLevel::default()));
        tok.train(&mut trainer, texts)
            .map_err(TokenizerError::Train)?;
        GenesisTokenizer::from_hf(tok, None)
    }

    /// Loads a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<GenesisTokenizer, TokenizerError> {
        let tok = Tokenizer::from_file(path).map_err(|source| TokenizerError::Load {
            path: path.to_path_buf(),
            source,
        })?;
        GenesisTokenizer::from_hf(tok, Some(path.to_path_buf()))
    }

    /// Parses `tokenizer.json` bytes already in memory (the hash was checked on these bytes).
    pub fn from_json_bytes(bytes: &[u8], path: &Path) -> Result<GenesisTokenizer, TokenizerError> {
        let tok = Tokenizer::from_bytes(bytes).map_err(|source| TokenizerError::Load {
            path: path.to_path_buf(),
            source,
        })?;
        GenesisTokenizer::from_hf(tok, Some(path.to_path_buf()))
    }

    fn from_hf(
        mut inner: Tokenizer,
        path: Option<PathBuf>,
    ) -> Result<GenesisTokenizer, TokenizerError> {
        inner.set_encode_special_tokens(true);
        let id = |s: &'static str| {
            inner
                .token_to_id(s)
                .ok_or(TokenizerError::MissingSpecial(s))
        };
        let (pad, bos, eos) = (id(PAD_TOKEN)?, id(BOS_TOKEN)?, id(EOS_TOKEN)?);
        let vocab_size = inner.get_vocab_size(true);
        Ok(GenesisTokenizer {
            inner,
            path,
            pad,
            bos,
            eos,
            vocab_size,
        })
    }

    /// The canonical `tokenizer.json` text (the bytes whose hash the manifest records).
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner.to_string(true).map_err(TokenizerError::Save)
    }

    /// Where this tokenizer was loaded from, to copy beside model checkpoints.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn pad_id(&self) -> u32 {
        self.pad
    }

    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// Token ids of `text`; no special tokens are added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes many texts in parallel.
    pub fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let encs = self
            .inner
            .encode_batch_fast(inputs, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Text of `ids`, special tokens included verbatim.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(TokenizerError::Decode)
    }

    /// Number of text bytes each token id stands for (0 for special tokens), so evaluation
    /// can convert nats per token into bits per byte.
    pub fn token_byte_lengths(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.vocab_size];
        let specials = self.inner.get_added_tokens_decoder();
        for (token, id) in self.inner.get_vocab(true) {
            let Some(slot) = out.get_mut(id as usize) else {
                continue;
            };
            let special = specials.get(&id).is_some_and(|t| t.special);
            // Byte-level BPE spells every byte as exactly one char.
            *slot = if special {
                0
            } else {
                token.chars().count() as u32
            };
        }
        out
    }

    /// The HF tokenizer, for anything this wrapper does not cover.
    pub fn hf(&self) -> &Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "To be, or not to be, that is the question:\n\
        Whether 'tis nobler in the mind to suffer\n\
        The slings and arrows of outrageous fortune, or to take arms. Café — ünïcode ☃ 🎭\n";

    fn trained() -> GenesisTokenizer {
        GenesisTokenizer::train(300, std::iter::repeat_n(TEXT, 5)).unwrap()
    }

    #[test]
    fn layout_and_round_trip() {
        let tok = trained();
        assert_eq!((tok.pad_id(), tok.bos_id(), tok.eos_id()), (0, 1, 2));
        assert!(tok.vocab_size() <= 300 && tok.vocab_size() > 259);
        let ids = tok.encode(TEXT).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), TEXT);
        // Unseen bytes still encode: all 256 byte symbols are in the vocabulary.
        let odd = "\u{1F600} ÿ \t\r\n xyzzy";
        assert_eq!(tok.decode(&tok.encode(odd).unwrap()).unwrap(), odd);
    }

    #[test]
    fn byte_lengths_sum_to_text_bytes() {
        let tok = trained();
        let lens = tok.token_byte_lengths();
        assert_eq!(lens.len(), tok.vocab_size());
        assert_eq!(&lens[..3], &[0, 0, 0]);
        for text in [TEXT, "plain ascii", "日本語のテキスト"] {
            let ids = tok.encode(text).unwrap();
            let total: u32 = ids.iter().map(|&i| lens[i as usize]).sum();
            assert_eq!(total as usize, text.len(), "{text}");
        }
    }

    #[test]
    fn special_strings_in_text_are_plain_text() {
        let tok = trained();
        let ids = tok.encode("a <|endoftext|> b").unwrap();
        assert!(!ids.contains(&tok.eos_id()));
        assert_eq!(tok.decode(&ids).unwrap(), "a <|endoftext|> b");
    }

    #[test]
    fn training_is_deterministic_and_json_round_trips() {
        let a = trained().to_json().unwrap();
        assert_eq!(a, trained().to_json().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, &a).unwrap();
        let loaded = GenesisTokenizer::load(&path).unwrap();
        assert_eq!(loaded.to_json().unwrap(), a);
        assert_eq!(loaded.path(), Some(path.as_path()));
        assert_eq!(
            loaded.encode(TEXT).unwrap(),
            trained().encode(TEXT).unwrap()
        );
    }

    #[test]
    fn errors() {
        assert!(matches!(
            GenesisTokenizer::train(100, std::iter::once("x")),
            Err(TokenizerError::VocabTooSmall(100))
        ));
        let tok = trained();
        assert!(matches!(
            tok.decode(&[1_000_000]),
            Err(TokenizerError::UnknownId { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(
            GenesisTokenizer::load(&path),
            Err(TokenizerError::Load { .. })
        ));
    }
}
