//! Model shape: what a NeuroLLM is, checked before any tensor is made.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// Shape of a NeuroLLM decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Number of transformer blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest sequence the rotary tables cover.
    pub max_seq: usize,
    /// Share the LM head with the token embedding.
    pub tie_embeddings: bool,
    /// Rotary base frequency.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
}

/// Most transformer blocks a model may have (the proof plausibility limit is the same), so a
/// hostile config cannot make the per-layer parameter list absurdly long.
pub const MAX_LAYERS: usize = 1_024;
/// Most parameters a model may have (2^40, about 4 TiB of f32): far above anything trained
/// here, and low enough that every size computed from a valid config fits in `usize`.
pub const MAX_PARAMS: usize = 1 << 40;

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_norm_eps() -> f64 {
    1e-6
}

impl ModelConfig {
    /// A small default used by tests, demos and the built-in network.
    pub fn tiny(vocab: usize) -> Self {
        Self {
            layers: 4,
            d_model: 256,
            heads: 4,
            kv_heads: 4,
            ffn: 688,
            vocab,
            max_seq: 256,
            tie_embeddings: false,
            rope_theta: default_rope_theta(),
            norm_eps: default_norm_eps(),
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }

    /// Rejects shapes no transformer can have, with the reason.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::Config(msg));
        if self.layers == 0 {
            return bad("layers must be at least 1".into());
        }
        if self.d_model == 0 || self.heads == 0 || self.kv_heads == 0 || self.ffn == 0 {
            return bad("d_model, heads, kv_heads and ffn must all be positive".into());
        }
        if self.vocab < 2 {
            return bad(format!("vocab must be at least 2, got {}", self.vocab));
        }
        if self.vocab > u32::MAX as usize {
            return bad(format!(
                "vocab {} does not fit token ids of 32 bits",
                self.vocab
            ));
        }
        if self.max_seq == 0 {
            return bad("max_seq must be positive".into());
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return bad(format!(
                "d_model {} is not divisible by heads {}",
                self.d_model, self.heads
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "heads {} is not divisible by kv_heads {}",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "head dimension {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad(format!("rope_theta must be > 1, got {}", self.rope_theta));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(format!("norm_eps must be > 0, got {}", self.norm_eps));
        }
        if self.layers > MAX_LAYERS {
            return bad(format!(
                "{} layers exceed the limit of {MAX_LAYERS}",
                self.layers
            ));
        }
        // Checked here so that the unchecked counts below cannot overflow for a valid config.
        match self.checked_num_params() {
            Some(n) if n <= MAX_PARAMS => Ok(()),
            _ => bad(format!(
                "shape {}x{} (ffn {}, vocab {}) exceeds the limit of {MAX_PARAMS} parameters",
                self.layers, self.d_model, self.ffn, self.vocab
            )),
        }
    }

    /// [`Self::num_params`] with overflow checks; `None` if it does not fit in `usize`.
    fn checked_num_params(&self) -> Option<usize> {
        let d = self.d_model;
        let kv = self.kv_heads.checked_mul(self.head_dim())?;
        let per_layer = [
            d.checked_mul(2)?,
            d.checked_mul(d)?.checked_mul(2)?,
            d.checked_mul(kv)?.checked_mul(2)?,
            d.checked_mul(self.ffn)?.checked_mul(3)?,
        ]
        .into_iter()
        .try_fold(0usize, usize::checked_add)?;
        let embed = self.vocab.checked_mul(d)?;
        let head = if self.tie_embeddings { 0 } else { embed };
        embed
            .checked_add(head)?
            .checked_add(d)?
            .checked_add(self.layers.checked_mul(per_layer)?)
    }

    /// Parameters of one transformer block.
    pub fn params_per_layer(&self) -> usize {
        let d = self.d_model;
        let kv = self.kv_heads * self.head_dim();
        2 * d + d * d + 2 * d * kv + d * d + 3 * d * self.ffn
    }

    /// Total parameter count of the whole model.
    pub fn num_params(&self) -> usize {
        let embed = self.vocab * self.d_model;
        let head = if self.tie_embeddings { 0 } else { embed };
        embed + head + self.d_model + self.layers * self.params_per_layer()
    }

    /// Parameters that take part in matrix products: the embedding table is a lookup unless
    /// it doubles as the LM head.
    pub fn matmul_params(&self) -> usize {
        if self.tie_embeddings {
            self.num_params()
        } else {
            self.num_params() - self.vocab * self.d_model
        }
    }

    /// Training FLOPs per token by the usual 6·N estimate.
    pub fn train_flops_per_token(&self) -> f64 {
        6.0 * self.matmul_params() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_is_valid_and_counts_params() {
        let c = ModelConfig::tiny(4096);
        c.validate().unwrap();
        // 2 × 4096×256 embeddings/head + final norm + 4 blocks.
        let block = 2 * 256 + 4 * 256 * 256 + 3 * 256 * 688;
        assert_eq!(c.num_params(), 2 * 4096 * 256 + 256 + 4 * block);
    }

    #[test]
    fn rejects_shapes_whose_sizes_overflow() {
        let mut c = ModelConfig::tiny(100);
        c.layers = MAX_LAYERS + 1;
        assert!(c.validate().unwrap_err().to_string().contains("layers"));
        let mut c = ModelConfig::tiny(100);
        c.d_model = 1 << 40;
        c.heads = 1;
        c.kv_heads = 1;
        assert!(c.validate().unwrap_err().to_string().contains("parameters"));
        let mut c = ModelConfig::tiny(100);
        c.ffn = usize::MAX / 2;
        assert!(c.validate().is_err());
        let mut c = ModelConfig::tiny(u32::MAX as usize);
        c.d_model = 1 << 16;
        c.heads = 1 << 8;
        c.kv_heads = 1 << 8;
        assert!(c.validate().is_err());
        let c = ModelConfig::tiny(100);
        assert_eq!(c.checked_num_params(), Some(c.num_params()));
    }

    #[test]
    fn rejects_impossible_shapes() {
        let mut c = ModelConfig::tiny(100);
        c.d_model = 250;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("not divisible by heads"), "{err}");
        let mut c = ModelConfig::tiny(100);
        c.kv_heads = 3;
        assert!(c.validate().unwrap_err().to_string().contains("kv_heads"));
        let mut c = ModelConfig::tiny(100);
        c.layers = 0;
        assert!(c.validate().is_err());
        let mut c = ModelConfig::tiny(1);
        c.vocab = 1;
        assert!(c.validate().is_err());
    }
}
