//! The shard file format: a 32-byte header followed by little-endian token ids.
//!
//! ```text
//! offset size field
//!      0    8 magic        b"NSGSHARD"
//!      8    4 version      u32 LE, currently 1
//!     12    4 dtype        u32 LE, bytes per token: 2 (u16) or 4 (u32)
//!     16    8 token count  u64 LE
//!     24    8 reserved     must be zero
//!     32    … tokens       token count × dtype bytes, little-endian
//! ```
//!
//! Nothing follows the tokens; a file longer or shorter than the header says is rejected.
//! The shard's BLAKE3 hash in the manifest covers the whole file, header included.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// First eight bytes of every shard file.
pub const SHARD_MAGIC: [u8; 8] = *b"NSGSHARD";
/// The only shard format version this code reads and writes.
pub const SHARD_VERSION: u32 = 1;
/// Header length in bytes; tokens start here (a multiple of 4, so mapped tokens stay aligned).
pub const HEADER_LEN: usize = 32;

/// Width of one stored token id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    U16,
    U32,
}

impl Dtype {
    /// The narrowest type that holds every id of a vocabulary of `vocab_size` tokens.
    pub fn for_vocab(vocab_size: usize) -> Dtype {
        if vocab_size <= 1 << 16 {
            Dtype::U16
        } else {
            Dtype::U32
        }
    }

    /// Bytes per token.
    pub fn width(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 => 4,
        }
    }

    fn from_code(code: u32) -> Option<Dtype> {
        match code {
            2 => Some(Dtype::U16),
            4 => Some(Dtype::U32),
            _ => None,
        }
    }
}

/// Why a byte string is not a valid shard.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("file is {len} bytes, shorter than the {HEADER_LEN}-byte shard header")]
    ShortHeader { len: usize },
    #[error("wrong magic {found:02x?} (expected {SHARD_MAGIC:02x?}): not a genesis shard")]
    BadMagic { found: [u8; 8] },
    #[error("unsupported shard format version {found} (this build reads version {SHARD_VERSION})")]
    UnsupportedVersion { found: u32 },
    #[error("unknown dtype code {found} (expected 2 for u16 or 4 for u32)")]
    BadDtype { found: u32 },
    #[error("reserved header bytes are not zero")]
    BadReserved,
    #[error("truncated: header promises {expected} bytes but the file has {actual}")]
    Truncated { expected: u64, actual: u64 },
    #[error("{extra} unexpected bytes after the last token")]
    TrailingBytes { extra: u64 },
    #[error("token id {id} at position {position} does not fit dtype {dtype:?}")]
    IdTooLarge {
        id: u32,
        position: usize,
        dtype: Dtype,
    },
}

/// A validated, borrowed view of a shard's tokens.
#[derive(Debug, Clone, Copy)]
pub struct ShardView<'a> {
    dtype: Dtype,
    payload: &'a [u8],
}

impl<'a> ShardView<'a> {
    /// Checks the header and the length against it.
    pub fn parse(bytes: &'a [u8]) -> Result<ShardView<'a>, ShardError> {
        if bytes.len() < HEADER_LEN {
            return Err(ShardError::ShortHeader { len: bytes.len() });
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&bytes[0..8]);
        if magic != SHARD_MAGIC {
            return Err(ShardError::BadMagic { found: magic });
        }
        let version = read_u32(&bytes[8..12]);
        if version != SHARD_VERSION {
            return Err(ShardError::UnsupportedVersion { found: version });
        }
        let code = read_u32(&bytes[12..16]);
        let dtype = Dtype::from_code(code).ok_or(ShardError::BadDtype { found: code })?;
        let count = read_u64(&bytes[16..24]);
        if bytes[24..32].iter().any(|&b| b != 0) {
            return Err(ShardError::BadReserved);
        }
        let expected = count
            .checked_mul(dtype.width() as u64)
            .and_then(|n| n.checked_add(HEADER_LEN as u64))
            .unwrap_or(u64::MAX);
        let actual = bytes.len() as u64;
        if actual < expected {
            return Err(ShardError::Truncated { expected, actual });
        }
        if actual > expected {
            return Err(ShardError::TrailingBytes {
                extra: actual - expected,
            });
        }
        Ok(ShardView {
            dtype,
            payload: &bytes[HEADER_LEN..],
        })
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Number of tokens in the shard.
    pub fn len(&self) -> usize {
        self.payload.len() / self.dtype.width()
    }

    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }

    /// Token at `i`, or `None` past the end. Decoded explicitly as little-endian so
    /// big-endian hosts read the same ids.
    pub fn get(&self, i: usize) -> Option<u32> {
        let w = self.dtype.width();
        let at = i.checked_mul(w)?;
        let b = self.payload.get(at..at + w)?;
        Some(match self.dtype {
            Dtype::U16 => u32::from(u16::from_le_bytes([b[0], b[1]])),
            Dtype::U32 => read_u32(b),
        })
    }

    /// Copies tokens `[start, start + len)` into `out`; `false` if the range runs past the end.
    pub fn copy_range(&self, start: usize, len: usize, out: &mut Vec<u32>) -> bool {
        let w = self.dtype.width();
        let (Some(lo), Some(hi)) = (start.checked_mul(w), (start + len).checked_mul(w)) else {
            return false;
        };
        let Some(bytes) = self.payload.get(lo..hi) else {
            return false;
        };
        match self.dtype {
            Dtype::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
            ),
            Dtype::U32 => out.extend(bytes.chunks_exact(4).map(read_u32)),
        }
        true
    }

    /// All tokens, widened to u32.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        self.copy_range(0, self.len(), &mut out);
        out
    }
}

/// Serializes `tokens` as a complete shard file.
pub fn encode_shard(tokens: &[u32], dtype: Dtype) -> Result<Vec<u8>, ShardError> {
    let mut out = Vec::with_capacity(HEADER_LEN + tokens.len() * dtype.width());
    out.extend_from_slice(&SHARD_MAGIC);
    out.extend_from_slice(&SHARD_VERSION.to_le_bytes());
    out.extend_from_slice(&(dtype.width() as u32).to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    for (position, &id) in tokens.iter().enumerate() {
        match dtype {
            Dtype::U16 => {
                let narrow = u16::try_from(id).map_err(|_| ShardError::IdTooLarge {
                    id,
                    position,
                    dtype,
                })?;
                out.extend_from_slice(&narrow.to_le_bytes());
            }
            Dtype::U32 => out.extend_from_slice(&id.to_le_bytes()),
        }
    }
    Ok(out)
}

fn read_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn read_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(tokens in proptest::collection::vec(0u32..70_000, 0..300), wide in any::<bool>()) {
            let dtype = if wide { Dtype::U32 } else { Dtype::U16 };
            let tokens: Vec<u32> = if wide { tokens } else { tokens.into_iter().map(|t| t % 65_536).collect() };
            let bytes = encode_shard(&tokens, dtype).unwrap();
            prop_assert_eq!(bytes.len(), HEADER_LEN + tokens.len() * dtype.width());
            let view = ShardView::parse(&bytes).unwrap();
            prop_assert_eq!(view.dtype(), dtype);
            prop_assert_eq!(view.to_vec(), tokens.clone());
            for (i, &t) in tokens.iter().enumerate() {
                prop_assert_eq!(view.get(i), Some(t));
            }
            prop_assert_eq!(view.get(tokens.len()), None);
        }

        #[test]
        fn any_truncation_is_rejected(n in 1usize..50, cut in 1usize..100) {
            let tokens: Vec<u32> = (0..n as u32).collect();
            let bytes = encode_shard(&tokens, Dtype::U16).unwrap();
            let keep = bytes.len().saturating_sub(cut);
            prop_assert!(ShardView::parse(&bytes[..keep]).is_err());
        }
    }

    #[test]
    fn little_endian_layout_is_fixed() {
        let bytes = encode_shard(&[0x0102, 0xA0B0], Dtype::U16).unwrap();
        assert_eq!(&bytes[..8], b"NSGSHARD");
        assert_eq!(&bytes[8..12], &[1, 0, 0, 0]);
        assert_eq!(&bytes[12..16], &[2, 0, 0, 0]);
        assert_eq!(&bytes[16..24], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[32..], &[0x02, 0x01, 0xB0, 0xA0]);
    }

    #[test]
    fn header_errors_are_specific() {
        let good = encode_shard(&[1, 2, 3], Dtype::U16).unwrap();
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(matches!(
            ShardView::parse(&magic),
            Err(ShardError::BadMagic { .. })
        ));
        let mut version = good.clone();
        version[8] = 2;
        assert_eq!(
            ShardView::parse(&version).unwrap_err(),
            ShardError::UnsupportedVersion { found: 2 }
        );
        let mut dtype = good.clone();
        dtype[12] = 3;
        assert_eq!(
            ShardView::parse(&dtype).unwrap_err(),
            ShardError::BadDtype { found: 3 }
        );
        let mut reserved = good.clone();
        reserved[30] = 1;
        assert_eq!(
            ShardView::parse(&reserved).unwrap_err(),
            ShardError::BadReserved
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            ShardView::parse(&long).unwrap_err(),
            ShardError::TrailingBytes { extra: 1 }
        );
        assert_eq!(
            ShardView::parse(&good[..10]).unwrap_err(),
            ShardError::ShortHeader { len: 10 }
        );
        assert_eq!(
            ShardView::parse(&good[..37]).unwrap_err(),
            ShardError::Truncated {
                expected: 38,
                actual: 37
            }
        );
    }

    #[test]
    fn ids_too_wide_for_u16_are_refused() {
        assert_eq!(
            encode_shard(&[5, 65_536], Dtype::U16).unwrap_err(),
            ShardError::IdTooLarge {
                id: 65_536,
                position: 1,
                dtype: Dtype::U16
            }
        );
        assert_eq!(Dtype::for_vocab(65_536), Dtype::U16);
        assert_eq!(Dtype::for_vocab(65_537), Dtype::U32);
    }
}
