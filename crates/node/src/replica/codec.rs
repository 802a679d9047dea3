//! How a round's offers are encoded and decoded: the sparse codec needs only the length; the
//! low-rank one needs the stage's matrix shapes and the round's basis, which comes from the
//! aggregate of the round before (part of the outer state every replica in agreement holds).

use neuroshard_aggregate::Attack;
use neuroshard_model::ParamSet;
use neuroshard_train::lowrank::{self, Basis, Layout, Matrix};
use neuroshard_train::{
    CompressSpec, Compressor, DecodeError, DilocoRound, ValueCoding, decode, decode_for, mask_seed,
};

use super::ReplicaError;

pub(super) enum OfferCodec {
    /// Offers in `spec` whose `randk` masks come from `mask_seed`: a message in any other
    /// format is refused.
    Sparse {
        len: usize,
        spec: CompressSpec,
        mask_seed: u64,
    },
    LowRank {
        layout: Layout,
        basis: Basis,
        coding: ValueCoding,
    },
}

/// The stage's weight matrices, where they sit in the flat parameter vector.
pub(super) fn layout_of(params: &ParamSet, rank: usize) -> Result<Layout, ReplicaError> {
    let mut matrices = Vec::new();
    let mut offset = 0usize;
    for spec in params.specs() {
        if let [rows, cols] = spec.shape[..] {
            matrices.push(Matrix { offset, rows, cols });
        }
        offset += spec.numel();
    }
    Ok(Layout::new(offset, &matrices, rank)?)
}

impl OfferCodec {
    /// The codec of `round`, whose outer state before the round is `before`.
    pub(super) fn of_round(
        spec: &CompressSpec,
        seed: u64,
        before: &DilocoRound,
        round: u64,
        params: &ParamSet,
    ) -> Result<Self, ReplicaError> {
        let len = before.theta().len();
        let Some(rank) = spec.low_rank else {
            return Ok(Self::Sparse {
                len,
                spec: *spec,
                mask_seed: mask_seed(seed, round),
            });
        };
        let layout = layout_of(params, rank)?;
        let basis = Basis::for_round(&layout, rank, before.previous(), round, seed)?;
        Ok(Self::LowRank {
            layout,
            basis,
            coding: spec.values,
        })
    }

    pub(super) fn decode(&self, bytes: &[u8]) -> Result<Vec<f32>, DecodeError> {
        match self {
            Self::Sparse {
                len,
                spec,
                mask_seed,
            } => decode_for(bytes, spec, *mask_seed, *len),
            Self::LowRank {
                layout,
                basis,
                coding,
            } => lowrank::decode(layout, basis, *coding, bytes),
        }
    }

    /// Our message for `delta` and what receivers rebuild from it (the residual stays in the
    /// parameters, so the sparse compressor's own residual is dropped).
    pub(super) fn encode(
        &self,
        compressor: &mut Compressor,
        round: u64,
        delta: &[f32],
    ) -> Result<(Vec<u8>, Vec<f32>), ReplicaError> {
        match self {
            Self::Sparse { len, .. } => {
                compressor.set_round(round);
                let blob = compressor.compress(delta)?;
                let _ = compressor.take_residual();
                let decoded = decode(&blob, *len)?;
                Ok((blob, decoded))
            }
            Self::LowRank {
                layout,
                basis,
                coding,
            } => {
                if let Some(index) = delta.iter().position(|x| !x.is_finite()) {
                    return Err(neuroshard_train::CompressError::NonFinite { index }.into());
                }
                Ok(lowrank::encode(layout, basis, *coding, delta)?)
            }
        }
    }

    /// What a Byzantine replica running `attack` sends, in the network's encoding.
    pub(super) fn forge(
        &self,
        spec: CompressSpec,
        seed: u64,
        round: u64,
        attack: &Attack,
        honest: &[f32],
    ) -> Result<Vec<u8>, ReplicaError> {
        let forged = attack
            .forge(&[honest], 1, &mut rand::rng())
            .pop()
            .ok_or(ReplicaError::Attack)?;
        let mut c = Compressor::with_seed(spec, forged.len(), seed);
        Ok(self.encode(&mut c, round, &forged)?.0)
    }
}
