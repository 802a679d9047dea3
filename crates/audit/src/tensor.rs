//! The data a job consumed, as evidence carries it, and the hashes commitments name.
//!
//! Hashes are BLAKE3 over little-endian bytes. A tensor's hash is the model crate's
//! `Activations::hash` (shape as three `u64`, then the `f32` values), so what proofs already
//! commit to and what audits compare are one function.

use neuroshard_proof::{CodecError, Hash32, Reader, Writer};

use crate::provenance::GenesisTokens;

/// The hash a commitment names where a job has no such data (a forward job's upstream, the
/// first stage's input gradient, a forward job's parameter gradients).
pub const NO_HASH: Hash32 = [0; 32];

/// Most values one tensor in evidence may hold (64 MiB of `f32`), checked before anything is
/// allocated; the context's [`EvidenceLimits`] then bound it to one micro-batch.
pub const MAX_TENSOR_VALUES: usize = 1 << 24;

/// Bytes a [`StreamHasher`] hands BLAKE3 at a time.
const BLOCK: usize = 16 << 10;

/// BLAKE3 fed through a 16 KiB staging block: the hasher only ever sees whole blocks at
/// block-aligned offsets of the stream, so it hashes 16 chunks side by side whatever framing
/// bytes sit between tensors (unaligned updates ran at half that speed, one update per value
/// at a thirteenth). The hash is that of the same bytes fed to BLAKE3 directly.
pub struct StreamHasher {
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    len: usize,
}

impl Default for StreamHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamHasher {
    pub fn new() -> Self {
        Self {
            hasher: blake3::Hasher::new(),
            buf: vec![0; BLOCK],
            len: 0,
        }
    }

    fn flush_full(&mut self) {
        if self.len == BLOCK {
            self.hasher.update(&self.buf);
            self.len = 0;
        }
    }

    pub fn update(&mut self, mut bytes: &[u8]) -> &mut Self {
        while !bytes.is_empty() {
            let n = (BLOCK - self.len).min(bytes.len());
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            self.flush_full();
        }
        self
    }

    /// The values as little-endian bytes.
    pub fn update_f32s(&mut self, mut xs: &[f32]) -> &mut Self {
        while let Some(first) = xs.first() {
            if cfg!(target_endian = "little") && self.len == 0 && xs.len() >= BLOCK / 4 {
                // At a block boundary, whole blocks go to BLAKE3 straight from the values,
                // whose bytes in memory are the stream's: no staging copy (it was a third of
                // the cost of hashing each backward pass's gradients).
                let whole = xs.len() - xs.len() % (BLOCK / 4);
                self.hasher.update(bytemuck::cast_slice(&xs[..whole]));
                xs = &xs[whole..];
                continue;
            }
            let room = (BLOCK - self.len) / 4;
            if room == 0 {
                // The value straddles the block's end.
                self.update(&first.to_le_bytes());
                xs = &xs[1..];
                continue;
            }
            let k = room.min(xs.len());
            let dst = &mut self.buf[self.len..self.len + 4 * k];
            for (b, x) in dst.chunks_exact_mut(4).zip(&xs[..k]) {
                b.copy_from_slice(&x.to_le_bytes());
            }
            self.len += 4 * k;
            xs = &xs[k..];
            self.flush_full();
        }
        self
    }

    pub fn finalize(mut self) -> Hash32 {
        self.hasher.update(&self.buf[..self.len]);
        *self.hasher.finalize().as_bytes()
    }
}

/// Hash of a `[batch, seq, dim]` tensor, identical to `Activations::hash`.
pub fn tensor_hash(batch: usize, seq: usize, dim: usize, data: &[f32]) -> Hash32 {
    let mut h = StreamHasher::new();
    for d in [batch, seq, dim] {
        h.update(&(d as u64).to_le_bytes());
    }
    h.update_f32s(data);
    h.finalize()
}

/// Hash of token ids `[batch, seq]` under a domain (`tokens` as input, `targets` as upstream),
/// so ids can never be mistaken for a tensor or for the other role.
pub fn tokens_hash(domain: &str, batch: usize, seq: usize, ids: &[u32]) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/audit/");
    h.update(domain.as_bytes());
    for d in [batch, seq] {
        h.update(&(d as u64).to_le_bytes());
    }
    for id in ids {
        h.update(&id.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// Hash of a backward job's parameter gradients (canonical order) and its loss, if it
/// computed one: what the job adds to the replica's step.
pub fn grads_hash(loss: Option<f32>, params: &[Vec<f32>]) -> Hash32 {
    let mut h = StreamHasher::new();
    h.update(b"neuroshard/audit/grads");
    match loss {
        Some(l) => {
            h.update(&[1]);
            h.update(&l.to_le_bytes());
        }
        None => {
            h.update(&[0]);
        }
    }
    h.update(&(params.len() as u64).to_le_bytes());
    for p in params {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update_f32s(p);
    }
    h.finalize()
}

/// Hidden states or gradients `[batch, seq, dim]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub batch: u32,
    pub seq: u32,
    pub dim: u32,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn hash(&self) -> Hash32 {
        tensor_hash(
            self.batch as usize,
            self.seq as usize,
            self.dim as usize,
            &self.data,
        )
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.batch);
        w.u32(self.seq);
        w.u32(self.dim);
        let mut bytes = Vec::with_capacity(self.data.len() * 4);
        for x in &self.data {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        w.bytes(&bytes);
    }

    /// Reads a tensor whose declared shape matches its values and whose values are finite:
    /// an honest engine refuses non-finite inputs, so such evidence describes no real job.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let (batch, seq, dim) = (r.u32()?, r.u32()?, r.u32()?);
        let bytes = r.bytes(MAX_TENSOR_VALUES * 4)?;
        let want = (batch as usize)
            .checked_mul(seq as usize)
            .and_then(|n| n.checked_mul(dim as usize))
            .and_then(|n| n.checked_mul(4));
        if want != Some(bytes.len()) {
            return Err(CodecError::Invalid {
                field: "tensor",
                reason: format!(
                    "shape [{batch}, {seq}, {dim}] does not match {} bytes",
                    bytes.len()
                ),
            });
        }
        let data: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(CodecError::Invalid {
                field: "tensor",
                reason: format!("value at index {i} is not finite"),
            });
        }
        Ok(Self {
            batch,
            seq,
            dim,
            data,
        })
    }
}

/// Token ids `[batch, seq]`, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds {
    pub batch: u32,
    pub seq: u32,
    pub ids: Vec<u32>,
}

impl TokenIds {
    pub fn hash(&self, domain: &str) -> Hash32 {
        tokens_hash(domain, self.batch as usize, self.seq as usize, &self.ids)
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.batch);
        w.u32(self.seq);
        w.len(self.ids.len());
        for id in &self.ids {
            w.u32(*id);
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let (batch, seq) = (r.u32()?, r.u32()?);
        let n = r.len(MAX_TENSOR_VALUES)?;
        if (batch as usize).checked_mul(seq as usize) != Some(n) {
            return Err(CodecError::Invalid {
                field: "token ids",
                reason: format!("shape [{batch}, {seq}] does not match {n} ids"),
            });
        }
        let ids = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(Self { batch, seq, ids })
    }
}

/// What a stage consumed: token ids (the embedding stage) or the previous stage's output.
#[derive(Debug, Clone, PartialEq)]
pub enum StageData {
    Tokens(TokenIds),
    /// The embedding stage's tokens with the genesis window of each row.
    Genesis(GenesisTokens),
    Hidden(Tensor),
    /// An offer's input: the encoded outer state (θ₀) it was taken against, by its hash and
    /// length. Too large for a message, its bytes travel in the evidence blob after the
    /// weights (see [`crate::JobKind::Offer`]).
    Outer {
        hash: Hash32,
        len: u64,
    },
}

impl StageData {
    pub fn hash(&self) -> Hash32 {
        match self {
            Self::Tokens(t) => t.hash("tokens"),
            Self::Genesis(g) => g.hash(),
            Self::Hidden(t) => t.hash(),
            // The outer state's hash is BLAKE3 of its bytes: what replicas compare after a
            // round, and what an offer names as its base.
            Self::Outer { hash, .. } => *hash,
        }
    }

    /// `(batch, seq)` rows of the micro-batch (an offer's outer state counts as one).
    pub fn rows(&self) -> (u32, u32) {
        match self {
            Self::Tokens(t) | Self::Genesis(GenesisTokens { tokens: t, .. }) => (t.batch, t.seq),
            Self::Hidden(t) => (t.batch, t.seq),
            Self::Outer { .. } => (1, 1),
        }
    }
}

/// What flowed into a backward job from downstream.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamData {
    /// A forward job has none.
    None,
    /// The gradient of the loss with respect to the stage's output.
    Grad(Tensor),
    /// The last stage's next-token targets.
    Targets(TokenIds),
}

impl UpstreamData {
    pub fn hash(&self) -> Hash32 {
        match self {
            Self::None => NO_HASH,
            Self::Grad(t) => t.hash(),
            Self::Targets(t) => t.hash("targets"),
        }
    }
}

/// Everything a replay needs besides the weights, which it finds by the commitment's hash.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInputs {
    pub input: StageData,
    pub upstream: UpstreamData,
}

/// How large one job's data may be: one micro-batch of the network's shape. Bounds both the
/// evidence a node accepts and what replaying it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvidenceLimits {
    /// Most `batch × seq` rows in one micro-batch.
    pub max_rows: u32,
    /// The stage's hidden width (`d_model`).
    pub dim: u32,
}

impl JobInputs {
    pub fn encode(&self, w: &mut Writer) {
        match &self.input {
            StageData::Tokens(t) => {
                w.u8(0);
                t.encode(w);
            }
            StageData::Hidden(t) => {
                w.u8(1);
                t.encode(w);
            }
            StageData::Genesis(g) => {
                w.u8(2);
                g.encode(w);
            }
            StageData::Outer { hash, len } => {
                w.u8(3);
                w.fixed(hash);
                w.u64(*len);
            }
        }
        match &self.upstream {
            UpstreamData::None => w.u8(0),
            UpstreamData::Grad(t) => {
                w.u8(1);
                t.encode(w);
            }
            UpstreamData::Targets(t) => {
                w.u8(2);
                t.encode(w);
            }
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let input = match r.u8()? {
            0 => StageData::Tokens(TokenIds::decode(r)?),
            1 => StageData::Hidden(Tensor::decode(r)?),
            2 => StageData::Genesis(GenesisTokens::decode(r)?),
            3 => StageData::Outer {
                hash: r.array()?,
                len: r.u64()?,
            },
            v => return Err(invalid("input kind", v)),
        };
        let upstream = match r.u8()? {
            0 => UpstreamData::None,
            1 => UpstreamData::Grad(Tensor::decode(r)?),
            2 => UpstreamData::Targets(TokenIds::decode(r)?),
            v => return Err(invalid("upstream kind", v)),
        };
        Ok(Self { input, upstream })
    }

    /// Checks every part against one micro-batch of the network's shape: rows within the
    /// limit, hidden width `dim`, and the upstream data shaped like the input.
    pub fn check_limits(&self, limits: &EvidenceLimits) -> Result<(), LimitError> {
        let (batch, seq) = self.input.rows();
        let rows = (batch as u64) * (seq as u64);
        if rows == 0 || rows > limits.max_rows as u64 {
            return Err(LimitError::Rows {
                rows,
                max: limits.max_rows,
            });
        }
        let want = [batch, seq, limits.dim];
        let check_tensor = |t: &Tensor, what: &'static str| {
            let got = [t.batch, t.seq, t.dim];
            if got != want {
                return Err(LimitError::Shape { what, got, want });
            }
            Ok(())
        };
        if let StageData::Hidden(t) = &self.input {
            check_tensor(t, "input")?;
        }
        match &self.upstream {
            UpstreamData::None => Ok(()),
            UpstreamData::Grad(g) => check_tensor(g, "output gradient"),
            UpstreamData::Targets(t) if (t.batch, t.seq) == (batch, seq) => Ok(()),
            UpstreamData::Targets(t) => Err(LimitError::Shape {
                what: "targets",
                got: [t.batch, t.seq, 1],
                want: [batch, seq, 1],
            }),
        }
    }
}

/// Why a job's data is not one micro-batch of the network's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{rows} rows where one micro-batch holds 1 to {max}")]
    Rows { rows: u64, max: u32 },
    #[error("{what} has shape {got:?}, expected {want:?}")]
    Shape {
        what: &'static str,
        got: [u32; 3],
        want: [u32; 3],
    },
}

fn invalid(field: &'static str, v: u8) -> CodecError {
    CodecError::Invalid {
        field,
        reason: format!("unknown tag {v}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub fn hidden(batch: u32, seq: u32, dim: u32, seed: f32) -> Tensor {
        let n = (batch * seq * dim) as usize;
        Tensor {
            batch,
            seq,
            dim,
            data: (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect(),
        }
    }

    fn round_trip(inputs: &JobInputs) -> Result<JobInputs, CodecError> {
        let mut w = Writer::new();
        inputs.encode(&mut w);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        let back = JobInputs::decode(&mut r)?;
        r.finish()?;
        Ok(back)
    }

    proptest! {
        /// Whatever the framing between tensors, staging changes nothing but the speed.
        #[test]
        fn staged_hashing_equals_hashing_the_same_bytes(
            parts in prop::collection::vec(
                (prop::collection::vec(any::<u8>(), 0..40), 0usize..20_000),
                1..6,
            )
        ) {
            let mut direct = blake3::Hasher::new();
            let mut staged = StreamHasher::new();
            for (i, (frame, n)) in parts.iter().enumerate() {
                let xs: Vec<f32> = (0..*n).map(|k| (k + i) as f32 * -0.37).collect();
                direct.update(frame);
                for x in &xs {
                    direct.update(&x.to_le_bytes());
                }
                staged.update(frame).update_f32s(&xs);
            }
            prop_assert_eq!(*direct.finalize().as_bytes(), staged.finalize());
        }
    }

    #[test]
    fn tokens_as_input_and_as_targets_hash_apart() {
        let t = TokenIds {
            batch: 1,
            seq: 2,
            ids: vec![3, 4],
        };
        assert_ne!(t.hash("tokens"), t.hash("targets"));
        assert_ne!(
            StageData::Tokens(t.clone()).hash(),
            UpstreamData::Targets(t).hash()
        );
    }

    #[test]
    fn nan_infinite_or_misshaped_tensors_are_refused_when_decoded() {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut t = hidden(1, 2, 2, 0.0);
            t.data[3] = bad;
            let inputs = JobInputs {
                input: StageData::Hidden(t),
                upstream: UpstreamData::None,
            };
            assert!(matches!(
                round_trip(&inputs),
                Err(CodecError::Invalid {
                    field: "tensor",
                    ..
                })
            ));
        }
        let mut t = hidden(1, 2, 2, 0.0);
        t.seq = 3;
        let inputs = JobInputs {
            input: StageData::Hidden(t),
            upstream: UpstreamData::None,
        };
        assert!(round_trip(&inputs).is_err());
        // A shape whose product overflows is refused, not wrapped.
        let mut w = Writer::new();
        w.u8(1);
        for d in [u32::MAX, u32::MAX, u32::MAX] {
            w.u32(d);
        }
        w.bytes(&[0; 8]);
        w.u8(0);
        let bytes = w.into_bytes();
        assert!(JobInputs::decode(&mut Reader::new(&bytes)).is_err());
    }

    #[test]
    fn a_huge_declared_length_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.u8(0);
        w.u32(1);
        w.u32(1);
        w.u32(u32::MAX);
        let bytes = w.into_bytes();
        assert!(matches!(
            JobInputs::decode(&mut Reader::new(&bytes)),
            Err(CodecError::TooLong { .. })
        ));
    }

    #[test]
    fn limits_bound_rows_width_and_upstream_shape() {
        let limits = EvidenceLimits {
            max_rows: 8,
            dim: 4,
        };
        let ok = JobInputs {
            input: StageData::Hidden(hidden(2, 4, 4, 0.0)),
            upstream: UpstreamData::Grad(hidden(2, 4, 4, 1.0)),
        };
        assert_eq!(ok.check_limits(&limits), Ok(()));
        let too_many = JobInputs {
            input: StageData::Hidden(hidden(3, 4, 4, 0.0)),
            upstream: UpstreamData::None,
        };
        assert!(too_many.check_limits(&limits).is_err());
        let wide = JobInputs {
            input: StageData::Hidden(hidden(2, 4, 5, 0.0)),
            upstream: UpstreamData::None,
        };
        assert!(wide.check_limits(&limits).is_err());
        let skewed = JobInputs {
            input: StageData::Hidden(hidden(2, 4, 4, 0.0)),
            upstream: UpstreamData::Grad(hidden(1, 8, 4, 1.0)),
        };
        assert!(skewed.check_limits(&limits).is_err());
    }

    fn arb_tensor() -> impl Strategy<Value = Tensor> {
        (1u32..3, 1u32..4, 1u32..5).prop_flat_map(|(b, s, d)| {
            prop::collection::vec(-1e6f32..1e6, (b * s * d) as usize).prop_map(move |data| Tensor {
                batch: b,
                seq: s,
                dim: d,
                data,
            })
        })
    }

    fn arb_ids() -> impl Strategy<Value = TokenIds> {
        (1u32..3, 1u32..5).prop_flat_map(|(b, s)| {
            prop::collection::vec(any::<u32>(), (b * s) as usize).prop_map(move |ids| TokenIds {
                batch: b,
                seq: s,
                ids,
            })
        })
    }

    pub fn arb_inputs() -> impl Strategy<Value = JobInputs> {
        let input = prop_oneof![
            arb_ids().prop_map(StageData::Tokens),
            arb_tensor().prop_map(StageData::Hidden),
            (arb_ids(), any::<u64>()).prop_map(|(tokens, seed)| {
                let windows = (0..u64::from(tokens.batch))
                    .map(|i| crate::provenance::WindowRef {
                        shard: (seed >> 40) as u32 ^ i as u32,
                        window: seed.wrapping_add(i),
                    })
                    .collect();
                StageData::Genesis(GenesisTokens { tokens, windows })
            })
        ];
        let upstream = prop_oneof![
            Just(UpstreamData::None),
            arb_tensor().prop_map(UpstreamData::Grad),
            arb_ids().prop_map(UpstreamData::Targets)
        ];
        (input, upstream).prop_map(|(input, upstream)| JobInputs { input, upstream })
    }

    proptest! {
        #[test]
        fn job_inputs_round_trip(inputs in arb_inputs()) {
            prop_assert_eq!(round_trip(&inputs), Ok(inputs));
        }

        #[test]
        fn truncated_job_inputs_are_an_error(inputs in arb_inputs(), cut in any::<prop::sample::Index>()) {
            let mut w = Writer::new();
            inputs.encode(&mut w);
            let bytes = w.into_bytes();
            let cut = cut.index(bytes.len());
            let mut r = Reader::new(&bytes[..cut]);
            let decoded = JobInputs::decode(&mut r).and_then(|v| r.finish().map(|_| v));
            prop_assert!(decoded.is_err());
        }
    }
}
