//! Pseudo-gradient compression: top-k per chunk with error feedback, values as fp32, int8 or
//! 2-bit codes with one scale per chunk, indices delta-encoded as varints.
//!
//! Wire format (all integers LEB128 varints unless noted):
//! `version:u8 coding:u8 len chunk` then per chunk `count`, and if `count > 0`: `scale:f32le`
//! (quantized codings only), the indices unless `count` is the whole chunk (first index, then
//! gap − 1 to each next), then the values (fp32le, i8, or 2-bit codes packed four per byte).

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use thiserror::Error;

use crate::varint::{self, Reader};

const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CompressError {
    #[error("pseudo-gradient has {len} values, compressor expects {expected}")]
    LengthMismatch { len: usize, expected: usize },
    #[error("pseudo-gradient has a non-finite value at index {index}")]
    NonFinite { index: usize },
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum DecodeError {
    #[error("truncated at byte {at}")]
    Truncated { at: usize },
    #[error("varint at byte {at} overflows 64 bits")]
    VarintOverflow { at: usize },
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown value coding {0}")]
    Coding(u8),
    #[error("vector length {len} differs from the expected {expected}")]
    Length { len: u64, expected: usize },
    #[error("chunk size {0} is invalid")]
    Chunk(u64),
    #[error("chunk {chunk}: {count} values exceed the chunk size")]
    Count { chunk: usize, count: u64 },
    #[error("chunk {chunk}: index out of range or not increasing")]
    Index { chunk: usize },
    #[error("chunk {chunk}: non-finite scale or value")]
    NonFinite { chunk: usize },
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueCoding {
    F32,
    /// Symmetric int8, scale = max|v| / 127.
    Int8,
    /// Four uniform levels over [−m, m] (m = max|v| of the chunk): −m, −m/3, m/3, m.
    Int2,
}

impl ValueCoding {
    fn tag(self) -> u8 {
        match self {
            Self::F32 => 0,
            Self::Int8 => 1,
            Self::Int2 => 2,
        }
    }

    fn from_tag(tag: u8) -> Result<Self, DecodeError> {
        match tag {
            0 => Ok(Self::F32),
            1 => Ok(Self::Int8),
            2 => Ok(Self::Int2),
            other => Err(DecodeError::Coding(other)),
        }
    }

    fn value_bytes(self, count: usize) -> usize {
        match self {
            Self::F32 => 4 * count,
            Self::Int8 => count,
            Self::Int2 => count.div_ceil(4),
        }
    }
}

/// How to compress: keep the `fraction` largest-magnitude entries of every `chunk` coordinates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressSpec {
    pub fraction: f64,
    pub chunk: usize,
    pub values: ValueCoding,
}

impl CompressSpec {
    fn keep(&self, chunk_len: usize) -> usize {
        ((self.fraction * chunk_len as f64).ceil() as usize).clamp(1, chunk_len)
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
#[error(
    "bad compression spec {0:?} (expected e.g. topk:0.01:int2, topk:0.05:int8:chunk=2048, int8)"
)]
pub struct SpecError(pub String);

impl FromStr for CompressSpec {
    type Err = SpecError;

    /// Tokens separated by `:`: `topk` followed by a fraction in (0, 1], a coding
    /// (`fp32`, `int8`, `int2`) and `chunk=N`, in any order. Defaults: all entries, fp32, 4096.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = || SpecError(spec.to_string());
        let mut out = Self {
            fraction: 1.0,
            chunk: 4096,
            values: ValueCoding::F32,
        };
        let mut tokens = spec.split(':').map(str::trim);
        while let Some(token) = tokens.next() {
            match token {
                "topk" => {
                    let f: f64 = tokens.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err(bad());
                    }
                    out.fraction = f;
                }
                "fp32" => out.values = ValueCoding::F32,
                "int8" => out.values = ValueCoding::Int8,
                "int2" => out.values = ValueCoding::Int2,
                t => {
                    let n = t
                        .strip_prefix("chunk=")
                        .and_then(|n| n.parse().ok())
                        .ok_or_else(bad)?;
                    if n == 0 || n > 1 << 20 {
                        return Err(bad());
                    }
                    out.chunk = n;
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for CompressSpec {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let coding = match self.values {
            ValueCoding::F32 => "fp32",
            ValueCoding::Int8 => "int8",
            ValueCoding::Int2 => "int2",
        };
        write!(out, "topk:{}:{coding}:chunk={}", self.fraction, self.chunk)
    }
}

/// Chunk scale and the code → value map, shared by encoder and decoder so the sender's residual
/// matches exactly what receivers reconstruct.
fn dequantize(coding: ValueCoding, scale: f32, code: i32) -> f32 {
    match coding {
        ValueCoding::F32 => 0.0,
        ValueCoding::Int8 => code as f32 * scale,
        ValueCoding::Int2 => -scale + code as f32 * (2.0 * scale / 3.0),
    }
}

fn quantize(coding: ValueCoding, scale: f32, v: f32) -> i32 {
    if scale == 0.0 {
        // All-zero chunk: int2 code 2 decodes to −0 + 2·0 = 0, int8 code 0 to 0.
        return if coding == ValueCoding::Int2 { 2 } else { 0 };
    }
    match coding {
        ValueCoding::F32 => 0,
        ValueCoding::Int8 => (v / scale).round().clamp(-127.0, 127.0) as i32,
        ValueCoding::Int2 => ((v + scale) / (2.0 * scale / 3.0)).round().clamp(0.0, 3.0) as i32,
    }
}

fn scale_of(coding: ValueCoding, max_abs: f32) -> f32 {
    match coding {
        ValueCoding::F32 => 0.0,
        ValueCoding::Int8 => max_abs / 127.0,
        ValueCoding::Int2 => max_abs,
    }
}

/// Encodes one chunk of the error-compensated vector `acc`, subtracting what was sent so that
/// `acc` becomes the new residual.
fn encode_chunk(spec: &CompressSpec, acc: &mut [f32], out: &mut Vec<u8>) {
    let keep = spec.keep(acc.len());
    let mut picked: Vec<u32> = (0..acc.len() as u32).collect();
    if keep < acc.len() {
        // Largest magnitude first; ties to the lower index so the choice is deterministic.
        picked.select_nth_unstable_by(keep - 1, |&i, &j| {
            acc[j as usize]
                .abs()
                .total_cmp(&acc[i as usize].abs())
                .then(i.cmp(&j))
        });
        picked.truncate(keep);
        picked.sort_unstable();
    }
    varint::put(out, keep as u64);
    let max_abs = picked
        .iter()
        .map(|&i| acc[i as usize].abs())
        .fold(0.0f32, f32::max);
    let scale = scale_of(spec.values, max_abs);
    if spec.values != ValueCoding::F32 {
        out.extend_from_slice(&scale.to_le_bytes());
    }
    if keep < acc.len() {
        let mut prev: Option<u32> = None;
        for &i in &picked {
            varint::put(out, u64::from(prev.map_or(i, |p| i - p - 1)));
            prev = Some(i);
        }
    }
    let mut packed = 0u8;
    for (n, &i) in picked.iter().enumerate() {
        let v = acc[i as usize];
        let sent = match spec.values {
            ValueCoding::F32 => {
                out.extend_from_slice(&v.to_le_bytes());
                v
            }
            ValueCoding::Int8 => {
                let q = quantize(spec.values, scale, v);
                out.push(q as i8 as u8);
                dequantize(spec.values, scale, q)
            }
            ValueCoding::Int2 => {
                let q = quantize(spec.values, scale, v);
                packed |= (q as u8) << (2 * (n % 4));
                if n % 4 == 3 || n + 1 == picked.len() {
                    out.push(packed);
                    packed = 0;
                }
                dequantize(spec.values, scale, q)
            }
        };
        acc[i as usize] = v - sent;
    }
}

/// Compresses successive pseudo-gradients of one replica, carrying the error-feedback residual
/// (what was left unsent) from one round into the next.
#[derive(Debug, Clone)]
pub struct Compressor {
    spec: CompressSpec,
    residual: Vec<f32>,
}

impl Compressor {
    pub fn new(spec: CompressSpec, len: usize) -> Self {
        Self {
            spec,
            residual: vec![0.0; len],
        }
    }

    pub fn spec(&self) -> &CompressSpec {
        &self.spec
    }

    /// What has been computed but not yet sent.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Encodes `delta + residual`; the part not representable in the message becomes the new
    /// residual. The input is checked first, so a rejected call leaves the residual untouched.
    pub fn compress(&mut self, delta: &[f32]) -> Result<Vec<u8>, CompressError> {
        if delta.len() != self.residual.len() {
            return Err(CompressError::LengthMismatch {
                len: delta.len(),
                expected: self.residual.len(),
            });
        }
        if let Some(index) = delta.iter().position(|x| !x.is_finite()) {
            return Err(CompressError::NonFinite { index });
        }
        let spec = self.spec;
        let mut out = vec![VERSION, spec.values.tag()];
        varint::put(&mut out, delta.len() as u64);
        varint::put(&mut out, spec.chunk as u64);
        let parts: Vec<Vec<u8>> = self
            .residual
            .par_chunks_mut(spec.chunk)
            .zip(delta.par_chunks(spec.chunk))
            .map(|(acc, d)| {
                for (a, x) in acc.iter_mut().zip(d) {
                    *a += x;
                }
                let mut part = Vec::new();
                encode_chunk(&spec, acc, &mut part);
                part
            })
            .collect();
        for part in parts {
            out.extend_from_slice(&part);
        }
        Ok(out)
    }
}

/// Decodes a message into a dense vector of `expected_len` values. Every field is checked, so
/// malformed or hostile input is an error, never a panic or an oversized allocation.
pub fn decode(bytes: &[u8], expected_len: usize) -> Result<Vec<f32>, DecodeError> {
    let mut r = Reader::new(bytes);
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let coding = ValueCoding::from_tag(r.u8()?)?;
    let len = r.varint()?;
    if len != expected_len as u64 {
        return Err(DecodeError::Length {
            len,
            expected: expected_len,
        });
    }
    let chunk = r.varint()?;
    if chunk == 0 || chunk > 1 << 20 {
        return Err(DecodeError::Chunk(chunk));
    }
    let chunk = chunk as usize;
    let mut out = vec![0.0f32; expected_len];
    let mut picked = Vec::new();
    for (c, dense) in out.chunks_mut(chunk).enumerate() {
        let count = r.varint()?;
        if count > dense.len() as u64 {
            return Err(DecodeError::Count { chunk: c, count });
        }
        let count = count as usize;
        if count == 0 {
            continue;
        }
        let scale = if coding == ValueCoding::F32 {
            0.0
        } else {
            r.f32()?
        };
        if !scale.is_finite() {
            return Err(DecodeError::NonFinite { chunk: c });
        }
        picked.clear();
        if count == dense.len() {
            picked.extend(0..count as u64);
        } else {
            let mut next = 0u64;
            for _ in 0..count {
                let index = next
                    .checked_add(r.varint()?)
                    .filter(|&i| i < dense.len() as u64);
                let index = index.ok_or(DecodeError::Index { chunk: c })?;
                picked.push(index);
                next = index + 1;
            }
        }
        let values = r.take(coding.value_bytes(count))?;
        for (n, &i) in picked.iter().enumerate() {
            let v = match coding {
                ValueCoding::F32 => {
                    let b = &values[4 * n..4 * n + 4];
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                }
                ValueCoding::Int8 => dequantize(coding, scale, i32::from(values[n] as i8)),
                ValueCoding::Int2 => dequantize(
                    coding,
                    scale,
                    i32::from((values[n / 4] >> (2 * (n % 4))) & 3),
                ),
            };
            if !v.is_finite() {
                return Err(DecodeError::NonFinite { chunk: c });
            }
            dense[i as usize] = v;
        }
    }
    if !r.at_end() {
        return Err(DecodeError::Trailing(bytes.len() - r.pos()));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "compress_tests.rs"]
mod tests;
