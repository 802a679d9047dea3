//! Canonical binary encoding: one byte string per value, so a signature over the bytes is a
//! signature over the value.
//!
//! Rules: integers little-endian at fixed width; fixed-size arrays (hashes, keys, signatures)
//! raw; variable-length data and lists prefixed with a `u32` length; every message starts with
//! its domain tag (length-prefixed ASCII) so bytes signed for one message kind can never be
//! replayed as another; decoding must consume every byte. There are no optional fields, maps
//! or floats-with-many-encodings, so encoding is a function and decoding its exact inverse.

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("input ended early: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("wrong domain tag: expected {expected:?}")]
    Domain { expected: &'static str },
    #[error("unsupported version {got} (this build understands {supported})")]
    Version { got: u16, supported: u16 },
    #[error("list of {got} items exceeds the limit of {max}")]
    TooLong { got: usize, max: usize },
    #[error("invalid value for {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Append-only canonical writer.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Raw fixed-size bytes (the length is implied by the field's type).
    pub fn fixed(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.buf.extend_from_slice(v);
    }

    /// A list length. Lists longer than `u32::MAX` cannot be built by any caller in this
    /// system (every list has a small declared limit), so saturating is unreachable.
    pub fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
}

/// Bounds-checked canonical reader.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let out = &self.buf[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            None => Err(CodecError::Truncated {
                offset: self.pos,
                needed: n - (self.buf.len() - self.pos).min(n),
            }),
        }
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a list length and checks it against `max` before anything is allocated.
    pub fn len(&mut self, max: usize) -> Result<usize, CodecError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(CodecError::TooLong { got: n, max });
        }
        Ok(n)
    }

    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], CodecError> {
        let n = self.len(max)?;
        self.take(n)
    }

    pub fn finish(self) -> Result<(), CodecError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }
}

/// A message with one canonical byte form, beginning with its domain tag.
pub trait Canonical: Sized {
    /// Distinct per message kind, e.g. `"neuroshard/proof"`.
    const DOMAIN: &'static str;

    fn encode_body(&self, w: &mut Writer);
    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError>;

    fn to_canonical_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(Self::DOMAIN.as_bytes());
        self.encode_body(&mut w);
        w.into_bytes()
    }

    fn from_canonical_bytes(bytes: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new(bytes);
        let domain = r
            .bytes(Self::DOMAIN.len())
            .map_err(|_| CodecError::Domain {
                expected: Self::DOMAIN,
            })?;
        if domain != Self::DOMAIN.as_bytes() {
            return Err(CodecError::Domain {
                expected: Self::DOMAIN,
            });
        }
        let value = Self::decode_body(&mut r)?;
        r.finish()?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_rejects_truncation_and_trailing() {
        let mut w = Writer::new();
        w.u64(7);
        w.bytes(b"abc");
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u64(), Ok(7));
        assert_eq!(r.bytes(8), Ok(&b"abc"[..]));
        assert_eq!(r.finish(), Ok(()));

        let mut r = Reader::new(&bytes[..10]);
        assert_eq!(r.u64(), Ok(7));
        assert!(matches!(r.bytes(8), Err(CodecError::Truncated { .. })));

        let mut r = Reader::new(&bytes);
        assert_eq!(r.u64(), Ok(7));
        assert_eq!(r.bytes(2), Err(CodecError::TooLong { got: 3, max: 2 }));

        let r = Reader::new(&bytes);
        assert_eq!(r.finish(), Err(CodecError::Trailing(15)));
    }
}
