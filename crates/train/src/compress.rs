//! Pseudo-gradient compression with error feedback: per chunk of `chunk` coordinates, a fraction
//! of the entries is selected either by magnitude (`topk`) or by a mask that every replica draws
//! from the same seed (`randk`, no indices on the wire); the values go as fp32, int8, 2-bit or
//! 1-bit (sign) codes with one scale per chunk.
//!
//! Wire format (all integers LEB128 varints unless noted): `version:u8 coding:u8 selection:u8
//! len chunk`, then `seed` for `randk`, then per chunk `count`, and if `count > 0`: `scale:f32le`
//! (quantized codings only), for `topk` the indices unless `count` is the whole chunk (first
//! index, then gap − 1 to each next), then the values (fp32le, i8, or 2-/1-bit codes packed from
//! the low bits of each byte).

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use thiserror::Error;

use crate::dct;
use crate::varint::{self, Reader};

const VERSION: u8 = 2;
/// Set in the selection byte when values are blockwise DCT coefficients.
const DCT_FLAG: u8 = 0x10;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CompressError {
    #[error("pseudo-gradient has {len} values, compressor expects {expected}")]
    LengthMismatch { len: usize, expected: usize },
    #[error("pseudo-gradient has a non-finite value at index {index}")]
    NonFinite { index: usize },
    #[error("error-feedback decay must be in (0, 1], got {0}")]
    Decay(f32),
    #[error("low-rank compression needs the parameters' layout and the round's basis")]
    LowRank,
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
    #[error("value coding {got} is not this network's ({expected})")]
    OtherCoding { got: u8, expected: u8 },
    #[error("the message's {0} is not this network's")]
    OtherFormat(&'static str),
    #[error("unknown selection {0}")]
    Selection(u8),
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
    #[error("low-rank message built on another basis (its sender holds another θ₀ history)")]
    Basis,
    #[error("low-rank message of rank {got}, the network's is {expected}")]
    Rank { got: u8, expected: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueCoding {
    F32,
    /// Symmetric int8, scale = max|v| / 127.
    Int8,
    /// Four uniform levels ±a, ±3a with the step `a` fitted to the chunk by Lloyd iterations
    /// (least squared error), thresholds at 0 and ±2a.
    Int2,
    /// One bit: the sign, times a = mean |v| of the chunk (the least-squares scale for signs).
    Sign,
}

impl ValueCoding {
    pub(crate) fn tag(self) -> u8 {
        match self {
            Self::F32 => 0,
            Self::Int8 => 1,
            Self::Int2 => 2,
            Self::Sign => 3,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Result<Self, DecodeError> {
        match tag {
            0 => Ok(Self::F32),
            1 => Ok(Self::Int8),
            2 => Ok(Self::Int2),
            3 => Ok(Self::Sign),
            other => Err(DecodeError::Coding(other)),
        }
    }

    pub(crate) fn bits(self) -> usize {
        match self {
            Self::F32 => 32,
            Self::Int8 => 8,
            Self::Int2 => 2,
            Self::Sign => 1,
        }
    }

    fn value_bytes(self, count: usize) -> usize {
        (count * self.bits()).div_ceil(8)
    }

    fn name(self) -> &'static str {
        match self {
            Self::F32 => "fp32",
            Self::Int8 => "int8",
            Self::Int2 => "int2",
            Self::Sign => "sign",
        }
    }
}

/// Which entries of a chunk are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The largest magnitudes of the error-compensated vector; indices go on the wire.
    TopK,
    /// A uniformly random subset drawn from the round's seed, the same for every replica, so
    /// no indices are sent and all replicas' values land on the same coordinates (a robust
    /// aggregator then compares like with like instead of mostly zeros).
    Random,
}

impl Selection {
    fn tag(self) -> u8 {
        match self {
            Self::TopK => 0,
            Self::Random => 1,
        }
    }

    fn from_tag(tag: u8) -> Result<Self, DecodeError> {
        match tag {
            0 => Ok(Self::TopK),
            1 => Ok(Self::Random),
            other => Err(DecodeError::Selection(other)),
        }
    }
}

/// How to compress: send `fraction` of every `chunk` coordinates, chosen by `selection`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressSpec {
    pub fraction: f64,
    pub chunk: usize,
    pub values: ValueCoding,
    pub selection: Selection,
    /// Select and code blockwise DCT coefficients instead of raw coordinates (DeMo).
    pub dct: bool,
    /// Send each weight matrix as a rank-r factor on a shared basis instead
    /// ([`crate::lowrank`]; `values` codes the factors, the other fields are unused).
    pub low_rank: Option<usize>,
}

impl CompressSpec {
    fn keep(&self, chunk_len: usize) -> usize {
        ((self.fraction * chunk_len as f64).ceil() as usize).clamp(1, chunk_len)
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
#[error(
    "bad compression spec {0:?} (expected e.g. randk:0.25:sign, topk:0.01:int2, topk:0.05:int8:chunk=2048, int8, lowrank:4:int8)"
)]
pub struct SpecError(pub String);

impl FromStr for CompressSpec {
    type Err = SpecError;

    /// Tokens separated by `:`: `topk` or `randk` followed by a fraction in (0, 1], a coding
    /// (`fp32`, `int8`, `int2`, `sign`), `chunk=N` and `dct`, in any order. Defaults: all
    /// entries, fp32, 4096, no transform.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = || SpecError(spec.to_string());
        let mut out = Self {
            fraction: 1.0,
            chunk: 4096,
            values: ValueCoding::F32,
            selection: Selection::TopK,
            dct: false,
            low_rank: None,
        };
        let mut tokens = spec.split(':').map(str::trim);
        while let Some(token) = tokens.next() {
            match token {
                "topk" | "randk" => {
                    let f: f64 = tokens.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err(bad());
                    }
                    out.fraction = f;
                    out.selection = if token == "topk" {
                        Selection::TopK
                    } else {
                        Selection::Random
                    };
                }
                "lowrank" => {
                    let r: usize = tokens.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                    if r == 0 || r > crate::lowrank::MAX_RANK {
                        return Err(bad());
                    }
                    out.low_rank = Some(r);
                }
                "fp32" => out.values = ValueCoding::F32,
                "int8" => out.values = ValueCoding::Int8,
                "int2" => out.values = ValueCoding::Int2,
                "sign" | "int1" => out.values = ValueCoding::Sign,
                "dct" => out.dct = true,
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
        let sparse = out.fraction < 1.0 || out.dct || out.chunk != 4096;
        if out.low_rank.is_some() && sparse {
            return Err(bad());
        }
        Ok(out)
    }
}

impl fmt::Display for CompressSpec {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(rank) = self.low_rank {
            return write!(out, "lowrank:{rank}:{}", self.values.name());
        }
        let selection = match self.selection {
            Selection::TopK => "topk",
            Selection::Random => "randk",
        };
        write!(
            out,
            "{selection}:{}:{}:chunk={}{}",
            self.fraction,
            self.values.name(),
            self.chunk,
            if self.dct { ":dct" } else { "" }
        )
    }
}

/// The code → value map, shared by encoder and decoder so the sender's residual matches exactly
/// what receivers reconstruct.
pub(crate) fn dequantize(coding: ValueCoding, scale: f32, code: u32) -> f32 {
    match coding {
        ValueCoding::F32 => 0.0,
        ValueCoding::Int8 => f32::from(code as u8 as i8) * scale,
        ValueCoding::Int2 => (2.0 * code as f32 - 3.0) * scale,
        ValueCoding::Sign => {
            if code == 1 {
                scale
            } else {
                -scale
            }
        }
    }
}

pub(crate) fn quantize(coding: ValueCoding, scale: f32, v: f32) -> u32 {
    match coding {
        ValueCoding::F32 => 0,
        ValueCoding::Int8 if scale == 0.0 => 0,
        ValueCoding::Int8 => u32::from((v / scale).round().clamp(-127.0, 127.0) as i8 as u8),
        ValueCoding::Int2 => match (v >= 0.0, v.abs() >= 2.0 * scale) {
            (false, true) => 0,
            (false, false) => 1,
            (true, false) => 2,
            (true, true) => 3,
        },
        ValueCoding::Sign => u32::from(v >= 0.0),
    }
}

/// The chunk's scale for the selected values: chosen to minimise the squared error of what is
/// sent (except int8, which keeps max|v| / 127 so that it clips nothing).
pub(crate) fn scale_of(coding: ValueCoding, values: &[f32]) -> f32 {
    let n = values.len().max(1) as f64;
    let scale = match coding {
        ValueCoding::F32 => 0.0,
        ValueCoding::Int8 => f64::from(values.iter().fold(0.0f32, |m, v| m.max(v.abs()))) / 127.0,
        ValueCoding::Sign => values.iter().map(|v| f64::from(v.abs())).sum::<f64>() / n,
        ValueCoding::Int2 => {
            // Lloyd iterations for levels ±a, ±3a, from a = rms / 2 (near the optimum for a
            // Gaussian). Each step picks the code per value, then the a of least squares.
            let rms = (values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n).sqrt();
            let mut a = rms / 2.0;
            for _ in 0..4 {
                let (mut num, mut den) = (0.0f64, 0.0f64);
                for &v in values {
                    let v = f64::from(v.abs());
                    let c = if v >= 2.0 * a { 3.0 } else { 1.0 };
                    num += v * c;
                    den += c * c;
                }
                if den == 0.0 {
                    break;
                }
                a = num / den;
            }
            a
        }
    };
    // Keep every level finite (3a for int2, 127·scale for int8).
    (scale as f32).min(f32::MAX / 128.0)
}

/// Appends `codes` of `bits` bits each (8, 2 or 1), packed from the low bit of each byte; the
/// last byte is padded with zeros. Both codecs send their quantized values so.
pub(crate) fn pack_codes(out: &mut Vec<u8>, bits: usize, codes: impl IntoIterator<Item = u32>) {
    let (mut packed, mut filled) = (0u8, 0);
    for q in codes {
        packed |= (q as u8) << filled;
        filled += bits;
        if filled == 8 {
            out.push(packed);
            (packed, filled) = (0, 0);
        }
    }
    if filled > 0 {
        out.push(packed);
    }
}

/// Code `n` of `bits` bits from `bytes` packed by [`pack_codes`]; `bytes` holds at least
/// ⌈(n + 1)·bits / 8⌉ bytes.
pub(crate) fn code_at(bytes: &[u8], bits: usize, n: usize) -> u32 {
    (u32::from(bytes[n * bits / 8]) >> (n * bits % 8)) & ((1u32 << bits) - 1)
}

/// The `randk` mask seed of `round` for replicas sharing `seed`.
pub fn mask_seed(seed: u64, round: u64) -> u64 {
    SplitMix(seed ^ round.wrapping_mul(0xA076_1D64_78BD_642F)).next()
}

/// SplitMix64: the mask generator. Small, fast and the same on every platform.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (multiply-shift; the bias is below 2⁻⁴⁴ for chunks up to 2²⁰).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// The `count` coordinates of chunk `chunk` (of `len` entries) that round seed `seed` selects,
/// ascending: a partial Fisher–Yates shuffle seeded per chunk. `scratch` is reused.
fn random_mask(seed: u64, chunk: usize, len: usize, count: usize, scratch: &mut Vec<u32>) {
    scratch.clear();
    scratch.extend(0..len as u32);
    let mut rng = SplitMix(seed ^ (chunk as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    for i in 0..count {
        let j = i + rng.below(len - i);
        scratch.swap(i, j);
    }
    scratch.truncate(count);
    scratch.sort_unstable();
}

/// Encodes one chunk (number `index`) of the error-compensated vector `acc`, subtracting what
/// was sent so that `acc` becomes the new residual.
fn encode_chunk(spec: &CompressSpec, seed: u64, index: usize, acc: &mut [f32], out: &mut Vec<u8>) {
    let keep = spec.keep(acc.len());
    let mut picked: Vec<u32> = Vec::new();
    match spec.selection {
        Selection::Random => random_mask(seed, index, acc.len(), keep, &mut picked),
        Selection::TopK => {
            picked.extend(0..acc.len() as u32);
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
        }
    }
    varint::put(out, keep as u64);
    let selected: Vec<f32> = picked.iter().map(|&i| acc[i as usize]).collect();
    let scale = scale_of(spec.values, &selected);
    if spec.values != ValueCoding::F32 {
        out.extend_from_slice(&scale.to_le_bytes());
    }
    if spec.selection == Selection::TopK && keep < acc.len() {
        let mut prev: Option<u32> = None;
        for &i in &picked {
            varint::put(out, u64::from(prev.map_or(i, |p| i - p - 1)));
            prev = Some(i);
        }
    }
    if spec.values == ValueCoding::F32 {
        for (&i, &v) in picked.iter().zip(&selected) {
            out.extend_from_slice(&v.to_le_bytes());
            acc[i as usize] = 0.0; // sent whole
        }
        return;
    }
    let codes = picked.iter().zip(&selected).map(|(&i, &v)| {
        let q = quantize(spec.values, scale, v);
        acc[i as usize] = v - dequantize(spec.values, scale, q);
        q
    });
    pack_codes(out, spec.values.bits(), codes);
}

/// Compresses successive pseudo-gradients of one replica, carrying the error-feedback residual
/// (what was left unsent) from one round into the next.
#[derive(Debug, Clone)]
pub struct Compressor {
    spec: CompressSpec,
    residual: Vec<f32>,
    seed: u64,
    round: u64,
    /// β: the residual is scaled by β before each new Δ is added (1 keeps all of it).
    decay: f32,
}

impl Compressor {
    pub fn new(spec: CompressSpec, len: usize) -> Self {
        Self::with_seed(spec, len, 0)
    }

    /// `seed` feeds the `randk` masks: replicas whose messages are averaged must share it and
    /// compress the same number of rounds (see [`Self::set_round`]).
    pub fn with_seed(spec: CompressSpec, len: usize, seed: u64) -> Self {
        Self {
            spec,
            residual: vec![0.0; len],
            seed,
            round: 0,
            decay: 1.0,
        }
    }

    /// Error feedback with decay β (SparseLoCo): each round encodes `delta + β·residual`.
    ///
    /// For replicas that restart from the common θ₀ and so re-learn part of what they did not
    /// send: β < 1 forgets old unsent progress geometrically instead of counting it again every
    /// round, and the accumulator then acts as the outer momentum (use the outer step without
    /// momentum). β outside (0, 1] is an error.
    pub fn with_decay(mut self, decay: f32) -> Result<Self, CompressError> {
        if !(decay > 0.0 && decay <= 1.0) {
            return Err(CompressError::Decay(decay));
        }
        self.decay = decay;
        Ok(self)
    }

    /// The error-feedback decay β (1 unless set with [`Self::with_decay`]).
    pub fn decay(&self) -> f32 {
        self.decay
    }

    pub fn spec(&self) -> &CompressSpec {
        &self.spec
    }

    /// What has been computed but not yet sent.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Hands the residual to the caller and starts again from zero: for a replica that keeps
    /// its unsent progress in its own parameters instead (it restarts from θ₀ − residual).
    pub fn take_residual(&mut self) -> Vec<f32> {
        let len = self.residual.len();
        std::mem::replace(&mut self.residual, vec![0.0; len])
    }

    /// The round the next [`Self::compress`] call encodes (it counts up from 0).
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Aligns the round counter, e.g. for a replica that joins late.
    pub fn set_round(&mut self, round: u64) {
        self.round = round;
    }

    /// The `randk` mask seed of the current round: the same for every replica with the same
    /// seed and round.
    pub fn mask_seed(&self) -> u64 {
        mask_seed(self.seed, self.round)
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
        if self.spec.low_rank.is_some() {
            return Err(CompressError::LowRank);
        }
        let (spec, decay) = (self.spec, self.decay);
        let seed = self.mask_seed();
        let transform = if spec.dct { DCT_FLAG } else { 0 };
        let mut out = vec![VERSION, spec.values.tag(), spec.selection.tag() | transform];
        varint::put(&mut out, delta.len() as u64);
        varint::put(&mut out, spec.chunk as u64);
        if spec.selection == Selection::Random {
            varint::put(&mut out, seed);
        }
        let parts: Vec<Vec<u8>> = self
            .residual
            .par_chunks_mut(spec.chunk)
            .zip(delta.par_chunks(spec.chunk))
            .enumerate()
            .map(|(index, (acc, d))| {
                for (a, x) in acc.iter_mut().zip(d) {
                    *a = decay * *a + x;
                }
                let mut part = Vec::new();
                if spec.dct {
                    // Select in the cosine basis; the residual goes back to coordinates.
                    dct::transform(acc, false);
                    encode_chunk(&spec, seed, index, acc, &mut part);
                    dct::transform(acc, true);
                } else {
                    encode_chunk(&spec, seed, index, acc, &mut part);
                }
                part
            })
            .collect();
        for part in parts {
            out.extend_from_slice(&part);
        }
        self.round += 1;
        Ok(out)
    }
}

/// Decodes a message into a dense vector of `expected_len` values. Every field is checked, so
/// malformed or hostile input is an error, never a panic or an oversized allocation.
pub fn decode(bytes: &[u8], expected_len: usize) -> Result<Vec<f32>, DecodeError> {
    decode_checked(bytes, expected_len, None)
}

/// [`decode`] for a network that sends `spec` with the `randk` mask seed `mask_seed` (see
/// [`mask_seed`]): a message in any other coding, selection, chunk, mask or count per chunk is
/// refused. A sender that chose its own mask would put its values where no honest replica
/// puts one, and a coordinate-wise rule would no longer compare like with like.
pub fn decode_for(
    bytes: &[u8],
    spec: &CompressSpec,
    mask_seed: u64,
    expected_len: usize,
) -> Result<Vec<f32>, DecodeError> {
    decode_checked(bytes, expected_len, Some((spec, mask_seed)))
}

fn decode_checked(
    bytes: &[u8],
    expected_len: usize,
    network: Option<(&CompressSpec, u64)>,
) -> Result<Vec<f32>, DecodeError> {
    let mut r = Reader::new(bytes);
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let coding = ValueCoding::from_tag(r.u8()?)?;
    let tag = r.u8()?;
    let dct = tag & DCT_FLAG != 0;
    let selection = Selection::from_tag(tag & !DCT_FLAG)?;
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
    let seed = match selection {
        Selection::Random => r.varint()?,
        Selection::TopK => 0,
    };
    if let Some((spec, mask_seed)) = network {
        if coding != spec.values {
            return Err(DecodeError::OtherCoding {
                got: coding.tag(),
                expected: spec.values.tag(),
            });
        }
        let foreign = [
            (selection != spec.selection, "selection"),
            (dct != spec.dct, "transform"),
            (chunk != spec.chunk, "chunk"),
            (selection == Selection::Random && seed != mask_seed, "mask"),
        ];
        if let Some(&(_, field)) = foreign.iter().find(|(differs, _)| *differs) {
            return Err(DecodeError::OtherFormat(field));
        }
    }
    let mut out = vec![0.0f32; expected_len];
    let mut picked: Vec<u32> = Vec::new();
    for (c, dense) in out.chunks_mut(chunk).enumerate() {
        let count = r.varint()?;
        if count > dense.len() as u64 {
            return Err(DecodeError::Count { chunk: c, count });
        }
        let count = count as usize;
        if network.is_some_and(|(spec, _)| count != spec.keep(dense.len())) {
            return Err(DecodeError::OtherFormat("count"));
        }
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
        match selection {
            Selection::Random => random_mask(seed, c, dense.len(), count, &mut picked),
            Selection::TopK if count == dense.len() => {
                picked.clear();
                picked.extend(0..count as u32);
            }
            Selection::TopK => {
                picked.clear();
                let mut next = 0u64;
                for _ in 0..count {
                    let index = next
                        .checked_add(r.varint()?)
                        .filter(|&i| i < dense.len() as u64);
                    let index = index.ok_or(DecodeError::Index { chunk: c })?;
                    picked.push(index as u32);
                    next = index + 1;
                }
            }
        }
        let values = r.take(coding.value_bytes(count))?;
        let bits = coding.bits();
        for (n, &i) in picked.iter().enumerate() {
            let v = match coding {
                ValueCoding::F32 => {
                    let b = &values[4 * n..4 * n + 4];
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                }
                _ => dequantize(coding, scale, code_at(values, bits, n)),
            };
            if !v.is_finite() {
                return Err(DecodeError::NonFinite { chunk: c });
            }
            dense[i as usize] = v;
        }
        if dct {
            // Finite coefficients can still sum past f32::MAX in the inverse transform.
            dct::transform(dense, true);
            if !dense.iter().all(|v| v.is_finite()) {
                return Err(DecodeError::NonFinite { chunk: c });
            }
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
