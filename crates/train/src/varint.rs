//! LEB128 unsigned varints and a bounds-checked reader for untrusted bytes.

use crate::compress::DecodeError;

pub(crate) fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Encoded size of `value`, for exact byte accounting without encoding.
#[cfg(test)]
pub(crate) fn len(value: u64) -> usize {
    let bits = 64 - value.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(DecodeError::Truncated { at: self.pos })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn f32(&mut self) -> Result<f32, DecodeError> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn varint(&mut self) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(DecodeError::VarintOverflow { at: start });
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow { at: start })
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(values in prop::collection::vec(any::<u64>(), 0..50)) {
            let mut out = Vec::new();
            for &v in &values {
                put(&mut out, v);
            }
            prop_assert_eq!(out.len(), values.iter().map(|&v| len(v)).sum::<usize>());
            let mut r = Reader::new(&out);
            for &v in &values {
                prop_assert_eq!(r.varint().unwrap(), v);
            }
            prop_assert!(r.at_end());
        }
    }

    #[test]
    fn rejects_overlong_and_truncated() {
        assert!(matches!(
            Reader::new(&[0xff; 11]).varint(),
            Err(DecodeError::VarintOverflow { .. })
        ));
        assert!(matches!(
            Reader::new(&[0x80, 0x80]).varint(),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(len(0), 1);
        assert_eq!(len(127), 1);
        assert_eq!(len(128), 2);
    }
}
