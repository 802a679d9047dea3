//! Model shapes and their parameter counts, computed from the shape.
//!
//! The count is NeuroLLM's (`neuroshard_model::ModelConfig::num_params`, cross-checked in the
//! tests): per block two RMSNorm gains, q/k/v/o projections (k and v of width
//! `kv_heads · head_dim`) and a SwiGLU MLP of three `d_model × ffn` matrices; plus the token
//! embedding, an untied LM head and the final norm.

use serde::{Deserialize, Serialize};

use crate::error::GrowthError;

/// Most parameters and layers a shape may have: the model crate's limits
/// (`MAX_PARAMS` and `MAX_LAYERS` in its `config.rs`).
pub const MAX_PARAMS: u64 = 1 << 40;
pub const MAX_LAYERS: u64 = 1024;

/// The part of a model's shape the scaler chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub ffn: u64,
    pub vocab: u64,
}

impl Shape {
    /// The ladder's shape of width `d_model` and depth `layers`: heads of width 64 below
    /// 2048 and 128 from there, full multi-head attention (`kv_heads = heads`, as the seed's
    /// table assumed) and a SwiGLU width of 8/3 · `d_model` rounded up to 16 (the project's
    /// default).
    pub fn ladder(d_model: u64, layers: u64, vocab: u64) -> Self {
        let head_dim = if d_model < 2048 { 64 } else { 128 };
        let heads = (d_model / head_dim).max(1);
        Self {
            layers,
            d_model,
            heads,
            kv_heads: heads,
            ffn: (8 * d_model / 3).div_ceil(16) * 16,
            vocab,
        }
    }

    /// Parameters of one block, `None` on overflow or a shape with no head width.
    pub fn params_per_layer(&self) -> Option<u64> {
        let d = self.d_model;
        let head_dim = d.checked_div(self.heads)?;
        let kv = self.kv_heads.checked_mul(head_dim)?;
        [
            d.checked_mul(2)?,                        // two norm gains
            d.checked_mul(d)?.checked_mul(2)?,        // q and o
            d.checked_mul(kv)?.checked_mul(2)?,       // k and v
            d.checked_mul(self.ffn)?.checked_mul(3)?, // gate, up, down
        ]
        .into_iter()
        .try_fold(0u64, u64::checked_add)
    }

    /// Total parameters (untied embedding and LM head), `None` on overflow.
    pub fn params(&self) -> Option<u64> {
        let embed = self.vocab.checked_mul(self.d_model)?;
        embed
            .checked_mul(2)?
            .checked_add(self.d_model)?
            .checked_add(self.layers.checked_mul(self.params_per_layer()?)?)
    }

    /// The same checks `ModelConfig::validate` makes on these fields.
    pub fn validate(&self) -> Result<(), GrowthError> {
        let bad = |m: String| Err(GrowthError::Shape(m));
        if [
            self.layers,
            self.d_model,
            self.heads,
            self.kv_heads,
            self.ffn,
        ]
        .contains(&0)
            || self.vocab < 2
        {
            return bad(format!("{self:?} has an empty dimension"));
        }
        if !self.d_model.is_multiple_of(self.heads)
            || !self.heads.is_multiple_of(self.kv_heads)
            || !(self.d_model / self.heads).is_multiple_of(2)
        {
            return bad(format!("{self:?}: heads do not divide the width evenly"));
        }
        if self.layers > MAX_LAYERS || self.params().is_none_or(|p| p > MAX_PARAMS) {
            return bad(format!(
                "{self:?} exceeds {MAX_LAYERS} layers or {MAX_PARAMS} parameters"
            ));
        }
        Ok(())
    }
}

/// The widths the scaler chooses from, smallest first.
pub const WIDTHS: [u64; 16] = [
    256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192, 12288, 16384,
];

/// Depths allowed at a width: between `d_model / 256` and `d_model / 32` (at least 2), so the
/// ladder never proposes a very wide shallow or a very deep narrow model (LLaMA 7B has
/// 4096 / 32 = 128 width per layer, 70B 8192 / 80 ≈ 102).
pub fn depth_range(d_model: u64) -> std::ops::RangeInclusive<u64> {
    (d_model / 256).max(2)..=(d_model / 32).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_large_rung_is_about_40b_not_123b() {
        // 64 layers × 7168 width with a 50k vocabulary.
        let s = Shape::ladder(7168, 64, 50_000);
        let p = s.params().unwrap();
        assert!((39_000_000_000..41_000_000_000).contains(&p), "{p}");
    }

    #[test]
    fn overflow_is_none_not_a_wrap() {
        let s = Shape {
            layers: u64::MAX,
            ..Shape::ladder(256, 4, 4096)
        };
        assert_eq!(s.params(), None);
        assert!(s.validate().is_err());
        let s = Shape {
            d_model: 1 << 40,
            heads: 1,
            kv_heads: 1,
            ..Shape::ladder(256, 4, 4096)
        };
        assert_eq!(s.params(), None);
        let zero_heads = Shape {
            heads: 0,
            ..Shape::ladder(256, 4, 4096)
        };
        assert_eq!(zero_heads.params_per_layer(), None);
        assert!(zero_heads.validate().is_err());
    }

    #[test]
    fn every_ladder_shape_is_valid_up_to_the_size_limit() {
        let mut valid = 0;
        for d in WIDTHS {
            for l in depth_range(d) {
                let s = Shape::ladder(d, l, 50_000);
                match s.validate() {
                    Ok(()) => valid += 1,
                    Err(_) => assert!(s.params().unwrap() > MAX_PARAMS, "{s:?}"),
                }
            }
        }
        assert!(valid > 1000, "{valid}");
    }
}
