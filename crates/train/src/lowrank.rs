//! Low-rank pseudo-gradient compression on a basis every replica shares (PowerSGD's two
//! factors, one per round).
//!
//! A weight matrix M (m × n) of the pseudo-gradient is sent as one factor against an
//! orthonormal basis all replicas hold: in odd rounds M·Q (m × r) for a right basis Q (n × r),
//! in even rounds Mᵀ·P (n × r) for a left basis P (m × r). Receivers rebuild F·Qᵀ or P·Fᵀ, the
//! projection of M on the basis, so every replica's message lands in the same r-dimensional
//! subspace and a coordinate-wise robust aggregator compares like with like. The basis of a
//! round comes from the previous round's aggregate U, which every replica in agreement holds
//! (it is part of the outer state): a randomized range finder, orth(Uᵀ·Ω) or orth(U·Ω) with a
//! seeded sign matrix Ω. U of a round that sent M·Q has rows in span(Q) and new columns, so
//! alternating the side is PowerSGD's power iteration spread over rounds: the basis follows
//! the pseudo-gradients' leading subspace. What a projection leaves out stays with the replica
//! (error feedback), so it is sent once the basis turns towards it.
//!
//! Coordinates outside the matrices (norm gains) go whole, in the spec's coding with one scale
//! per [`DENSE_CHUNK`] values.
//!
//! Wire format: `tag:u8 = 'L'`, `rank:u8`, `coding:u8`, `basis id: 8 bytes`, then per matrix its factor
//! column by column (fp32le values, or `scale:f32le` then the codes: int8 a byte each, int2
//! and sign packed from the low bit), then the dense coordinates chunk by chunk (the same). Every length follows from the layout.

use thiserror::Error;

use crate::compress::{
    DecodeError, SplitMix, ValueCoding, code_at, dequantize, pack_codes, quantize, scale_of,
};
use crate::varint::Reader;

/// First byte of a low-rank message (the sparse codec's version byte is never this).
pub(crate) const TAG: u8 = b'L';
/// Values per scale for the coordinates outside the matrices.
pub const DENSE_CHUNK: usize = 4096;
/// Largest rank accepted (the wire carries it in a byte; useful ranks are a few).
pub const MAX_RANK: usize = 64;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum LayoutError {
    #[error("matrix at {offset} ({rows} × {cols}) overlaps the one before or ends past {len}")]
    Matrix {
        offset: usize,
        rows: usize,
        cols: usize,
        len: usize,
    },
    #[error("rank {0} outside 1..={MAX_RANK}")]
    Rank(usize),
    #[error("pseudo-gradient has {len} values, the layout {expected}")]
    Length { len: usize, expected: usize },
    #[error("the basis was built for another layout")]
    Basis,
    #[error("the factors of this pseudo-gradient overflow f32")]
    NonFinite,
}

/// A row-major matrix inside the flat parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matrix {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
}

/// Where the matrices sit in a flat vector of `len` values; the rest is sent whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    len: usize,
    matrices: Vec<Matrix>,
}

impl Layout {
    /// `matrices` in ascending, non-overlapping order inside `len`. Matrices too small for
    /// rank `rank` to save anything are left to the dense part.
    pub fn new(len: usize, matrices: &[Matrix], rank: usize) -> Result<Self, LayoutError> {
        if rank == 0 || rank > MAX_RANK {
            return Err(LayoutError::Rank(rank));
        }
        let mut end = 0usize;
        let mut kept = Vec::new();
        for &m in matrices {
            let size = m.rows.checked_mul(m.cols);
            let stop = size.and_then(|s| m.offset.checked_add(s));
            match stop {
                Some(stop) if m.offset >= end && stop <= len => end = stop,
                _ => {
                    return Err(LayoutError::Matrix {
                        offset: m.offset,
                        rows: m.rows,
                        cols: m.cols,
                        len,
                    });
                }
            }
            // Worth it when the larger factor is under half the matrix.
            if 2 * rank * m.rows.max(m.cols) < m.rows * m.cols {
                kept.push(m);
            }
        }
        Ok(Self {
            len,
            matrices: kept,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn matrices(&self) -> &[Matrix] {
        &self.matrices
    }

    /// The coordinates outside the matrices, as ranges.
    fn dense_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut out = Vec::new();
        let mut at = 0;
        for m in &self.matrices {
            if m.offset > at {
                out.push(at..m.offset);
            }
            at = m.offset + m.rows * m.cols;
        }
        if at < self.len {
            out.push(at..self.len);
        }
        out
    }
}

/// Which side of a matrix the round's basis spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Q (n × r): replicas send M·Q.
    Right,
    /// P (m × r): replicas send Mᵀ·P.
    Left,
}

impl Side {
    pub fn of_round(round: u64) -> Self {
        if round % 2 == 1 {
            Self::Right
        } else {
            Self::Left
        }
    }
}

/// One round's orthonormal bases, one per matrix of the layout: `r` columns of length k
/// (n for a right basis, m for a left one), column-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Basis {
    side: Side,
    rank: usize,
    columns: Vec<Vec<f32>>,
    /// The first bytes of the columns' BLAKE3: messages carry it, so an offer built on
    /// another basis (its sender holds another aggregate history) is refused, not misread.
    id: [u8; ID_BYTES],
}

const ID_BYTES: usize = 8;

/// The seeded ±1 entry (row `i`, column `k`) of matrix `index`'s sketch in `round`.
fn sign(seed: u64, round: u64, index: usize, i: usize, k: usize) -> f64 {
    let mut rng = SplitMix(
        seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (index as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
            ^ ((i as u64) << 8 | k as u64).wrapping_mul(0xA076_1D64_78BD_642F),
    );
    if rng.next() & 1 == 1 { 1.0 } else { -1.0 }
}

impl Basis {
    /// The basis of `round` from the previous round's aggregate (`None` before the first: a
    /// seeded random basis). Deterministic: every replica with the same aggregate, seed and
    /// round computes the same bits.
    pub fn for_round(
        layout: &Layout,
        rank: usize,
        previous: Option<&[f32]>,
        round: u64,
        seed: u64,
    ) -> Result<Self, LayoutError> {
        if rank == 0 || rank > MAX_RANK {
            return Err(LayoutError::Rank(rank));
        }
        if let Some(p) = previous.filter(|p| p.len() != layout.len) {
            return Err(LayoutError::Length {
                len: p.len(),
                expected: layout.len,
            });
        }
        let side = Side::of_round(round);
        let columns: Vec<Vec<f32>> = layout
            .matrices
            .iter()
            .enumerate()
            .map(|(index, m)| {
                let k = match side {
                    Side::Right => m.cols,
                    Side::Left => m.rows,
                };
                let mut cols: Vec<Vec<f64>> = (0..rank)
                    .map(|c| match previous {
                        Some(p) => sketch(&p[m.offset..][..m.rows * m.cols], m, side, |i| {
                            sign(seed, round, index, i, c)
                        }),
                        None => (0..k).map(|i| sign(seed, round, index, i, c)).collect(),
                    })
                    .collect();
                orthonormalize(&mut cols, |c, i| sign(seed ^ 0x5EED, round, index, i, c));
                cols.into_iter()
                    .flat_map(|c| c.into_iter().map(|x| x as f32))
                    .collect()
            })
            .collect();
        let mut hasher = blake3::Hasher::new();
        hasher.update(&[side as u8, rank as u8]);
        for c in &columns {
            for x in c {
                hasher.update(&x.to_le_bytes());
            }
        }
        let mut id = [0u8; ID_BYTES];
        id.copy_from_slice(&hasher.finalize().as_bytes()[..ID_BYTES]);
        Ok(Self {
            side,
            rank,
            columns,
            id,
        })
    }

    pub fn side(&self) -> Side {
        self.side
    }
}

/// Column `c` of Uᵀ·Ω (right basis, length n) or U·Ω (left basis, length m) for U = `u`.
fn sketch(u: &[f32], m: &Matrix, side: Side, omega: impl Fn(usize) -> f64) -> Vec<f64> {
    match side {
        Side::Right => {
            let mut out = vec![0.0f64; m.cols];
            for i in 0..m.rows {
                let w = omega(i);
                for (o, &x) in out.iter_mut().zip(&u[i * m.cols..][..m.cols]) {
                    *o += w * f64::from(x);
                }
            }
            out
        }
        Side::Left => {
            let omega: Vec<f64> = (0..m.cols).map(omega).collect();
            (0..m.rows)
                .map(|i| {
                    u[i * m.cols..][..m.cols]
                        .iter()
                        .zip(&omega)
                        .map(|(&x, w)| f64::from(x) * w)
                        .sum()
                })
                .collect()
        }
    }
}

/// Modified Gram–Schmidt, twice for accuracy, in a fixed order. A column that vanishes (a
/// matrix the aggregate did not move, or a rank below r) is replaced by a seeded random one,
/// so the basis always has r directions and nothing is stuck outside it.
fn orthonormalize(cols: &mut [Vec<f64>], random: impl Fn(usize, usize) -> f64) {
    for c in 0..cols.len() {
        let scale = cols[c].iter().map(|x| x * x).sum::<f64>().sqrt();
        let mut replaced = !(scale > 0.0 && scale.is_finite());
        for attempt in 0..2 {
            if replaced {
                let k = cols[c].len();
                cols[c] = (0..k)
                    .map(|i| random(c + attempt * cols.len(), i))
                    .collect();
            }
            let before = cols[c].iter().map(|x| x * x).sum::<f64>().sqrt();
            for _ in 0..2 {
                for p in 0..c {
                    let dot: f64 = cols[p].iter().zip(&cols[c]).map(|(a, b)| a * b).sum();
                    let (head, tail) = cols.split_at_mut(c);
                    for (x, q) in tail[0].iter_mut().zip(&head[p]) {
                        *x -= dot * q;
                    }
                }
            }
            let after = cols[c].iter().map(|x| x * x).sum::<f64>().sqrt();
            if after > 1e-6 * before && after.is_finite() {
                cols[c].iter_mut().for_each(|x| *x /= after);
                break;
            }
            replaced = true;
            if attempt == 1 {
                // Only when k < r: no direction is left, the column stays zero.
                cols[c].iter_mut().for_each(|x| *x = 0.0);
            }
        }
    }
}

/// `values` in `coding`: fp32, or the sparse codec's scale and codes (int8 one a byte; int2
/// and sign packed from the low bit, as the sparse codec packs them).
fn put_values(out: &mut Vec<u8>, coding: ValueCoding, values: &[f32]) {
    if coding == ValueCoding::F32 {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        return;
    }
    let scale = scale_of(coding, values);
    out.extend_from_slice(&scale.to_le_bytes());
    let codes = values.iter().map(|&v| quantize(coding, scale, v));
    pack_codes(out, coding.bits(), codes);
}

/// `count` values in `coding`; `group` names the column or chunk for errors.
fn read_values(
    r: &mut Reader<'_>,
    coding: ValueCoding,
    count: usize,
    group: usize,
) -> Result<Vec<f32>, DecodeError> {
    let bad = DecodeError::NonFinite { chunk: group };
    if coding == ValueCoding::F32 {
        let bytes = r.take(count.checked_mul(4).ok_or(bad.clone())?)?;
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if v.iter().any(|x| !x.is_finite()) {
            return Err(bad);
        }
        return Ok(v);
    }
    let scale = r.f32()?;
    if !(scale.is_finite() && scale >= 0.0) {
        return Err(bad);
    }
    let bits = coding.bits();
    let codes = r.take(count.checked_mul(bits).ok_or(bad)?.div_ceil(8))?;
    Ok((0..count)
        .map(|n| dequantize(coding, scale, code_at(codes, bits, n)))
        .collect())
}

/// Encodes `delta` on `basis`; returns the message and what receivers will rebuild from it.
pub fn encode(
    layout: &Layout,
    basis: &Basis,
    coding: ValueCoding,
    delta: &[f32],
) -> Result<(Vec<u8>, Vec<f32>), LayoutError> {
    if delta.len() != layout.len {
        return Err(LayoutError::Length {
            len: delta.len(),
            expected: layout.len,
        });
    }
    if basis.columns.len() != layout.matrices.len() {
        return Err(LayoutError::Basis);
    }
    let mut out = vec![TAG, basis.rank as u8, coding.tag()];
    out.extend_from_slice(&basis.id);
    for (m, q) in layout.matrices.iter().zip(&basis.columns) {
        let u = &delta[m.offset..][..m.rows * m.cols];
        for c in 0..basis.rank {
            let factor = match basis.side {
                // (M·Q)[i][c] = Σⱼ M[i][j]·Q[j][c]
                Side::Right => {
                    let q = &q[c * m.cols..][..m.cols];
                    (0..m.rows)
                        .map(|i| dot(&u[i * m.cols..][..m.cols], q))
                        .collect::<Vec<f32>>()
                }
                // (Mᵀ·P)[j][c] = Σᵢ M[i][j]·P[i][c]
                Side::Left => {
                    let p = &q[c * m.rows..][..m.rows];
                    let mut acc = vec![0.0f64; m.cols];
                    for (i, &w) in p.iter().enumerate() {
                        for (a, &x) in acc.iter_mut().zip(&u[i * m.cols..][..m.cols]) {
                            *a += f64::from(w) * f64::from(x);
                        }
                    }
                    acc.into_iter().map(|a| a as f32).collect()
                }
            };
            put_values(&mut out, coding, &factor);
        }
    }
    for range in layout.dense_ranges() {
        for chunk in delta[range].chunks(DENSE_CHUNK) {
            put_values(&mut out, coding, chunk);
        }
    }
    // Finite inputs can still give factors or products past f32's range.
    let decoded = decode(layout, basis, coding, &out).map_err(|_| LayoutError::NonFinite)?;
    Ok((out, decoded))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum::<f64>() as f32
}

/// Rebuilds a message's pseudo-gradient on `basis`: finite values or an error, never a panic.
/// A message in another coding than the network's `coding` is refused: an honest replica never
/// sends one, and auditors re-encode in the network's.
pub fn decode(
    layout: &Layout,
    basis: &Basis,
    coding: ValueCoding,
    bytes: &[u8],
) -> Result<Vec<f32>, DecodeError> {
    if basis.columns.len() != layout.matrices.len() {
        return Err(DecodeError::Basis);
    }
    let mut r = Reader::new(bytes);
    let head = r.take(3)?;
    if head[0] != TAG {
        return Err(DecodeError::Version(head[0]));
    }
    if usize::from(head[1]) != basis.rank {
        return Err(DecodeError::Rank {
            got: head[1],
            expected: basis.rank,
        });
    }
    if ValueCoding::from_tag(head[2])? != coding {
        return Err(DecodeError::OtherCoding {
            got: head[2],
            expected: coding.tag(),
        });
    }
    if r.take(ID_BYTES)? != basis.id {
        return Err(DecodeError::Basis);
    }
    let mut out = vec![0.0f32; layout.len];
    let mut group = 0;
    for (m, q) in layout.matrices.iter().zip(&basis.columns) {
        let target = &mut out[m.offset..][..m.rows * m.cols];
        let k = match basis.side {
            Side::Right => m.rows,
            Side::Left => m.cols,
        };
        for c in 0..basis.rank {
            let f = read_values(&mut r, coding, k, group)?;
            group += 1;
            match basis.side {
                // += F[:, c] · Q[:, c]ᵀ
                Side::Right => {
                    let q = &q[c * m.cols..][..m.cols];
                    for (i, &fi) in f.iter().enumerate() {
                        for (t, &qj) in target[i * m.cols..][..m.cols].iter_mut().zip(q) {
                            *t += fi * qj;
                        }
                    }
                }
                // += P[:, c] · F[:, c]ᵀ
                Side::Left => {
                    let p = &q[c * m.rows..][..m.rows];
                    for (i, &pi) in p.iter().enumerate() {
                        for (t, &fj) in target[i * m.cols..][..m.cols].iter_mut().zip(&f) {
                            *t += pi * fj;
                        }
                    }
                }
            }
        }
    }
    for range in layout.dense_ranges() {
        for chunk in out[range].chunks_mut(DENSE_CHUNK) {
            chunk.copy_from_slice(&read_values(&mut r, coding, chunk.len(), group)?);
            group += 1;
        }
    }
    if !r.at_end() {
        return Err(DecodeError::Trailing(bytes.len() - r.pos()));
    }
    if out.iter().any(|x| !x.is_finite()) {
        return Err(DecodeError::NonFinite { chunk: group });
    }
    Ok(out)
}

#[cfg(test)]
#[path = "lowrank_tests.rs"]
mod tests;
