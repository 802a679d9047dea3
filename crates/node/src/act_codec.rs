//! Compression of the activations and activation gradients that cross a stage boundary.
//!
//! Pure functions over plain vectors. The sender packs what its engine produced; the receiver
//! unpacks and computes on exactly the unpacked values, so both sides agree on what was
//! computed. Packing is deterministic (the same input gives the same bits on every machine: no
//! clock, no thread-dependent order, no fused multiply-add), which verification by
//! recomputation relies on.
//!
//! Schemes (bytes per value for `d_model` 256):
//! - `f32`: raw little-endian (4).
//! - `bf16`: the upper half of the f32, rounded to nearest even (2).
//! - `int8`: per row (one token's `d_model` values) a f32 scale `absmax / 127` and one signed
//!   byte per value, rounded to nearest (1.016).
//! - `int4`: per group of [`INT4_GROUP`] values of a row a f32 scale `absmax / 7` and one signed
//!   nibble per value, rounded stochastically with a dither derived from the value and its
//!   index, so it is unbiased yet reproducible (0.625). Unbiased rounding matters for gradients:
//!   rounding to nearest at 4 bits zeroes every component under a fourteenth of its group's
//!   largest, a systematic shrinkage that does not average out over a step.
//! - `int2`: ternary: per group of [`INT2_GROUP`] values a f32 scale `absmax` and two bits per
//!   value for −1, 0 or +1, rounded stochastically like `int4` (0.375: 10.7× below f32).
//!   Unbiased but coarse: its error is up to the group's largest value, so it is meant for
//!   gradients, whose errors average out over a step's rows (TernGrad's rounding).
//!
//! A peer's bytes are checked before anything is allocated for them: the scheme must be the
//! network's, the declared shape must fit the stage's micro-batch, the byte count must be what
//! that shape needs, every scale and value must be finite and within [`MAX_MAGNITUDE`], and the
//! encoding must use only what the packer writes (no `-128`/`-8` codes, no padding bits, no
//! negative scales).

use std::fmt;
use std::str::FromStr;

use neuroshard_model::Activations;

/// Values in a int4 group sharing one scale.
pub const INT4_GROUP: usize = 32;
/// Values in a int2 group sharing one scale.
pub const INT2_GROUP: usize = 32;
/// Largest magnitude a packed value may have (2^60): far above any honest activation or
/// gradient, far below where the receiver's arithmetic overflows.
pub const MAX_MAGNITUDE: f32 = 1.152_921_5e18;

/// How one direction's tensors travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    F32,
    Bf16,
    Int8,
    Int4,
    Int2,
}

impl Scheme {
    pub const ALL: [Scheme; 5] = [
        Scheme::F32,
        Scheme::Bf16,
        Scheme::Int8,
        Scheme::Int4,
        Scheme::Int2,
    ];

    /// Its id on the wire.
    pub fn id(self) -> u8 {
        match self {
            Scheme::F32 => 0,
            Scheme::Bf16 => 1,
            Scheme::Int8 => 2,
            Scheme::Int4 => 3,
            Scheme::Int2 => 4,
        }
    }

    pub fn from_id(id: u8) -> Result<Self, ActCodecError> {
        Self::ALL
            .into_iter()
            .find(|s| s.id() == id)
            .ok_or(ActCodecError::UnknownScheme(id))
    }

    pub fn name(self) -> &'static str {
        match self {
            Scheme::F32 => "f32",
            Scheme::Bf16 => "bf16",
            Scheme::Int8 => "int8",
            Scheme::Int4 => "int4",
            Scheme::Int2 => "int2",
        }
    }

    /// Bytes of `rows` rows of `dim` values; None when that does not fit in memory.
    pub fn encoded_len(self, rows: usize, dim: usize) -> Option<usize> {
        let per_row = match self {
            Scheme::F32 => dim.checked_mul(4)?,
            Scheme::Bf16 => dim.checked_mul(2)?,
            Scheme::Int8 => dim.checked_add(4)?,
            Scheme::Int4 => dim.div_ceil(INT4_GROUP) * 4 + dim.div_ceil(2),
            Scheme::Int2 => dim.div_ceil(INT2_GROUP) * 4 + dim.div_ceil(4),
        };
        rows.checked_mul(per_row)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = ActCodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| ActCodecError::UnknownName(s.to_string()))
    }
}

/// The schemes of a network: forward activations and backward gradients. Written `int8/int4`,
/// or one name for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ActSpec {
    pub forward: Scheme,
    pub backward: Scheme,
}

impl ActSpec {
    /// Raw f32 both ways: what networks founded before compression existed ran.
    pub const UNCOMPRESSED: ActSpec = ActSpec {
        forward: Scheme::F32,
        backward: Scheme::F32,
    };

    /// Raw f32 both ways (serde default of geneses written before the field existed).
    pub fn uncompressed() -> Self {
        Self::UNCOMPRESSED
    }
}

/// int8 activations (nearly lossless) and int4 gradients (unbiased): 4.8× fewer bytes than
/// f32 per driver step at `d_model` 256; int8 alone stays under 4× because of its scales.
impl Default for ActSpec {
    fn default() -> Self {
        Self {
            forward: Scheme::Int8,
            backward: Scheme::Int4,
        }
    }
}

impl fmt::Display for ActSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.forward == self.backward {
            write!(f, "{}", self.forward)
        } else {
            write!(f, "{}/{}", self.forward, self.backward)
        }
    }
}

impl FromStr for ActSpec {
    type Err = ActCodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (f, b) = s.split_once('/').unwrap_or((s, s));
        Ok(Self {
            forward: f.trim().parse()?,
            backward: b.trim().parse()?,
        })
    }
}

impl TryFrom<String> for ActSpec {
    type Error = ActCodecError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<ActSpec> for String {
    fn from(s: ActSpec) -> String {
        s.to_string()
    }
}

/// Why a tensor cannot be packed or a peer's packed tensor is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ActCodecError {
    #[error("unknown activation scheme id {0}")]
    UnknownScheme(u8),
    #[error("unknown activation scheme {0:?} (f32, bf16, int8, int4, int2; forward/backward)")]
    UnknownName(String),
    #[error("activations in {got}, this network uses {want}")]
    WrongScheme { got: Scheme, want: Scheme },
    #[error("activation shape [{batch}, {seq}, {dim}]: {reason}")]
    Shape {
        batch: usize,
        seq: usize,
        dim: usize,
        reason: String,
    },
    #[error("{got} bytes of {scheme} activations, shape [{batch}, {seq}, {dim}] needs {want:?}")]
    Length {
        scheme: Scheme,
        batch: usize,
        seq: usize,
        dim: usize,
        got: usize,
        want: Option<usize>,
    },
    #[error("{what} {value} at index {index} is not finite or beyond ±{MAX_MAGNITUDE:e}")]
    Value {
        what: &'static str,
        index: usize,
        value: f32,
    },
    #[error("not the canonical encoding: {0}")]
    NonCanonical(&'static str),
}

/// What a stage accepts from a peer: the network's scheme for this direction and the largest
/// micro-batch it may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub scheme: Scheme,
    pub dim: usize,
    pub max_batch: usize,
    pub max_seq: usize,
}

/// A tensor as it travels: shape, scheme and the scheme's bytes (length already consistent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    scheme: Scheme,
    batch: usize,
    seq: usize,
    dim: usize,
    bytes: Vec<u8>,
}

fn shape_err(batch: usize, seq: usize, dim: usize, reason: impl Into<String>) -> ActCodecError {
    ActCodecError::Shape {
        batch,
        seq,
        dim,
        reason: reason.into(),
    }
}

impl Packed {
    /// A packed tensor read off the wire: the byte count must be what the shape needs.
    pub fn from_parts(
        scheme: Scheme,
        batch: usize,
        seq: usize,
        dim: usize,
        bytes: Vec<u8>,
    ) -> Result<Self, ActCodecError> {
        if batch == 0 || seq == 0 || dim == 0 {
            return Err(shape_err(batch, seq, dim, "empty"));
        }
        let want = batch
            .checked_mul(seq)
            .and_then(|rows| scheme.encoded_len(rows, dim));
        if want != Some(bytes.len()) {
            return Err(ActCodecError::Length {
                scheme,
                batch,
                seq,
                dim,
                got: bytes.len(),
                want,
            });
        }
        Ok(Self {
            scheme,
            batch,
            seq,
            dim,
            bytes,
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `[batch, seq, dim]`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.batch, self.seq, self.dim)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Checks scheme and shape against what the stage accepts, then decodes: nothing of the
    /// declared size is allocated before the checks pass.
    pub fn unpack(&self, expect: &Expect) -> Result<Activations, ActCodecError> {
        let (b, s, d) = self.shape();
        if self.scheme != expect.scheme {
            return Err(ActCodecError::WrongScheme {
                got: self.scheme,
                want: expect.scheme,
            });
        }
        if d != expect.dim {
            return Err(shape_err(b, s, d, format!("width is not {}", expect.dim)));
        }
        if b > expect.max_batch || s > expect.max_seq {
            return Err(shape_err(
                b,
                s,
                d,
                format!(
                    "larger than a micro-batch of [{}, {}]",
                    expect.max_batch, expect.max_seq
                ),
            ));
        }
        let data = decode(self.scheme, &self.bytes, b * s, d)?;
        Ok(Activations {
            batch: b,
            seq: s,
            dim: d,
            data,
        })
    }
}

/// Packs `a` in `scheme`; refuses non-finite values and values beyond [`MAX_MAGNITUDE`].
pub fn pack(a: &Activations, scheme: Scheme) -> Result<Packed, ActCodecError> {
    let (b, s, d) = (a.batch, a.seq, a.dim);
    let rows = b
        .checked_mul(s)
        .ok_or_else(|| shape_err(b, s, d, "too large"))?;
    if rows == 0 || d == 0 || rows.checked_mul(d) != Some(a.data.len()) {
        return Err(shape_err(b, s, d, format!("{} values", a.data.len())));
    }
    if let Some(i) = a.data.iter().position(|x| !in_range(*x)) {
        return Err(ActCodecError::Value {
            what: "value",
            index: i,
            value: a.data[i],
        });
    }
    let bytes = match scheme {
        Scheme::F32 => a.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Scheme::Bf16 => a
            .data
            .iter()
            .flat_map(|x| bf16_bits(*x).to_le_bytes())
            .collect(),
        Scheme::Int8 => encode_int8(&a.data, d),
        Scheme::Int4 => encode_int4(&a.data, d),
        Scheme::Int2 => encode_int2(&a.data, d),
    };
    Packed::from_parts(scheme, b, s, d, bytes)
}

fn in_range(x: f32) -> bool {
    x.is_finite() && x.abs() <= MAX_MAGNITUDE
}

/// Round to nearest even on the upper 16 bits (the caller has checked the value is finite
/// and far from overflowing).
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let bias = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

fn encode_int8(data: &[f32], dim: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / dim * (dim + 4));
    for row in data.chunks_exact(dim) {
        let scale = absmax(row) / 127.0;
        out.extend_from_slice(&scale.to_le_bytes());
        for x in row {
            let q = if scale > 0.0 {
                (x / scale).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            };
            out.push(q as u8);
        }
    }
    out
}

/// Reproducible uniform draw in [0, 1) from a value and its index (SplitMix64).
fn dither(index: usize, x: f32) -> f32 {
    let mut z = (index as u64) ^ (u64::from(x.to_bits()) << 32);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

fn encode_int4(data: &[f32], dim: usize) -> Vec<u8> {
    let groups = dim.div_ceil(INT4_GROUP);
    let mut out = Vec::with_capacity(data.len() / dim * (groups * 4 + dim.div_ceil(2)));
    let mut codes = vec![0u8; dim];
    for (r, row) in data.chunks_exact(dim).enumerate() {
        for (g, group) in row.chunks(INT4_GROUP).enumerate() {
            let scale = absmax(group) / 7.0;
            out.extend_from_slice(&scale.to_le_bytes());
            for (j, x) in group.iter().enumerate() {
                let col = g * INT4_GROUP + j;
                let q = if scale > 0.0 {
                    (x / scale + dither(r * dim + col, *x))
                        .floor()
                        .clamp(-7.0, 7.0) as i8
                } else {
                    0
                };
                codes[col] = (q as u8) & 0x0F;
            }
        }
        out.extend(
            codes
                .chunks(2)
                .map(|p| p[0] | p.get(1).map_or(0, |h| h << 4)),
        );
    }
    out
}

/// Ternary codes, two bits each, four to a byte from the low bits: 0 → 0b00, +1 → 0b01,
/// −1 → 0b11 (0b10 is never written).
fn encode_int2(data: &[f32], dim: usize) -> Vec<u8> {
    let groups = dim.div_ceil(INT2_GROUP);
    let mut out = Vec::with_capacity(data.len() / dim * (groups * 4 + dim.div_ceil(4)));
    let mut codes = vec![0u8; dim];
    for (r, row) in data.chunks_exact(dim).enumerate() {
        for (g, group) in row.chunks(INT2_GROUP).enumerate() {
            let scale = absmax(group);
            out.extend_from_slice(&scale.to_le_bytes());
            for (j, x) in group.iter().enumerate() {
                let col = g * INT2_GROUP + j;
                let q = if scale > 0.0 {
                    (x / scale + dither(r * dim + col, *x))
                        .floor()
                        .clamp(-1.0, 1.0) as i8
                } else {
                    0
                };
                codes[col] = (q as u8) & 0x03;
            }
        }
        out.extend(codes.chunks(4).map(|quad| {
            quad.iter()
                .enumerate()
                .fold(0u8, |byte, (k, c)| byte | c << (2 * k))
        }));
    }
    out
}

fn scale_at(bytes: &[u8], at: usize, index: usize, most: f32) -> Result<f32, ActCodecError> {
    let s = f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    if !s.is_finite() || s.is_sign_negative() && s != 0.0 || s * most > MAX_MAGNITUDE {
        return Err(ActCodecError::Value {
            what: "scale",
            index,
            value: s,
        });
    }
    if s.to_bits() == (-0.0f32).to_bits() {
        return Err(ActCodecError::NonCanonical("negative zero scale"));
    }
    Ok(s)
}

/// Decodes `rows × dim` values; `bytes` has the length [`Scheme::encoded_len`] gives.
fn decode(
    scheme: Scheme,
    bytes: &[u8],
    rows: usize,
    dim: usize,
) -> Result<Vec<f32>, ActCodecError> {
    let mut out = Vec::with_capacity(rows * dim);
    match scheme {
        Scheme::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        Scheme::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)),
        ),
        Scheme::Int8 => {
            for (r, row) in bytes.chunks_exact(dim + 4).enumerate() {
                let scale = scale_at(row, 0, r, 127.0)?;
                for &c in &row[4..] {
                    let q = c as i8;
                    if q == i8::MIN {
                        return Err(ActCodecError::NonCanonical("int8 code -128"));
                    }
                    out.push(f32::from(q) * scale);
                }
            }
        }
        Scheme::Int4 => {
            let groups = dim.div_ceil(INT4_GROUP);
            for (r, row) in bytes.chunks_exact(groups * 4 + dim.div_ceil(2)).enumerate() {
                let (scales, codes) = row.split_at(groups * 4);
                if dim % 2 == 1 && codes[codes.len() - 1] >> 4 != 0 {
                    return Err(ActCodecError::NonCanonical("int4 padding bits set"));
                }
                for g in 0..groups {
                    let scale = scale_at(scales, g * 4, r * groups + g, 7.0)?;
                    for col in g * INT4_GROUP..((g + 1) * INT4_GROUP).min(dim) {
                        let nibble = (codes[col / 2] >> (4 * (col % 2))) & 0x0F;
                        let q = ((nibble << 4) as i8) >> 4;
                        if q == -8 {
                            return Err(ActCodecError::NonCanonical("int4 code -8"));
                        }
                        out.push(f32::from(q) * scale);
                    }
                }
            }
        }
        Scheme::Int2 => {
            let groups = dim.div_ceil(INT2_GROUP);
            for (r, row) in bytes.chunks_exact(groups * 4 + dim.div_ceil(4)).enumerate() {
                let (scales, codes) = row.split_at(groups * 4);
                let used = 2 * (dim % 4);
                if used != 0 && codes[codes.len() - 1] >> used != 0 {
                    return Err(ActCodecError::NonCanonical("int2 padding bits set"));
                }
                for g in 0..groups {
                    let scale = scale_at(scales, g * 4, r * groups + g, 1.0)?;
                    for col in g * INT2_GROUP..((g + 1) * INT2_GROUP).min(dim) {
                        let q = match (codes[col / 4] >> (2 * (col % 4))) & 0x03 {
                            0b00 => 0.0,
                            0b01 => 1.0,
                            0b11 => -1.0,
                            _ => return Err(ActCodecError::NonCanonical("int2 code 0b10")),
                        };
                        out.push(q * scale);
                    }
                }
            }
        }
    }
    // Raw and bf16 values are the peer's own: the same bounds as a packer's input.
    if let Some(i) = out.iter().position(|x| !in_range(*x)) {
        return Err(ActCodecError::Value {
            what: "value",
            index: i,
            value: out[i],
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
