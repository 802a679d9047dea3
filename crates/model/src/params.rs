//! Named parameter tensors kept as plain `f32` buffers in a fixed order.
//!
//! Everything outside the tensor engine — the optimizer, checkpoints, hashes, DiLoCo
//! pseudo-gradients, the wire — sees parameters through this type. Names follow the Hugging Face
//! LLaMA layout with global layer indices, so stages of one model never clash and assemble back
//! into the whole model by name. Linear weights are stored `[d_in, d_out]` (x · W).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use crate::config::ModelConfig;
use crate::error::ModelError;

/// What role a parameter plays: decides weight decay and export layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// Token embedding table `[vocab, d_model]`.
    Embedding,
    /// RMSNorm gain `[d_model]`: no weight decay.
    Norm,
    /// Projection `[d_in, d_out]`.
    Linear,
}

impl ParamKind {
    /// Weight decay applies to matrices, never to norm gains (we have no biases).
    pub fn decays(self) -> bool {
        !matches!(self, ParamKind::Norm)
    }
}

/// Name, shape and role of one parameter tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: ParamKind,
    /// Standard deviation of the initial values (norms start at 1 instead).
    init_std: f32,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Which part of the model a stage holds: a layer range plus the embedding and/or the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageSpec {
    /// First transformer block (global index).
    pub first_layer: usize,
    /// One past the last block.
    pub end_layer: usize,
    /// Holds the token embedding and takes token ids as input.
    pub embed: bool,
    /// Holds the final norm and LM head and computes the loss.
    pub head: bool,
}

impl StageSpec {
    /// The whole model in one stage.
    pub fn full(config: &ModelConfig) -> Self {
        Self {
            first_layer: 0,
            end_layer: config.layers,
            embed: true,
            head: true,
        }
    }

    /// Splits the layers into `stages` contiguous ranges as evenly as possible; the first
    /// stage holds the embedding, the last the head.
    pub fn split(config: &ModelConfig, stages: usize) -> Result<Vec<StageSpec>, ModelError> {
        if stages == 0 || stages > config.layers {
            return Err(ModelError::Config(format!(
                "cannot split {} layers into {stages} stages",
                config.layers
            )));
        }
        if stages > 1 && config.tie_embeddings {
            return Err(ModelError::Config(
                "a model with tied embeddings cannot be split: the embedding and the LM head \
                 would live on different stages"
                    .into(),
            ));
        }
        let base = config.layers / stages;
        let extra = config.layers % stages;
        let mut first = 0;
        Ok((0..stages)
            .map(|i| {
                let len = base + usize::from(i < extra);
                let spec = StageSpec {
                    first_layer: first,
                    end_layer: first + len,
                    embed: i == 0,
                    head: i + 1 == stages,
                };
                first += len;
                spec
            })
            .collect())
    }

    pub fn validate(&self, config: &ModelConfig) -> Result<(), ModelError> {
        if self.first_layer > self.end_layer || self.end_layer > config.layers {
            return Err(ModelError::Config(format!(
                "stage layers {}..{} outside the model's {} layers",
                self.first_layer, self.end_layer, config.layers
            )));
        }
        if self.head && config.tie_embeddings && !self.embed {
            return Err(ModelError::Config(
                "tied LM head needs the embedding in the same stage".into(),
            ));
        }
        if !self.embed && !self.head && self.first_layer == self.end_layer {
            return Err(ModelError::Config("a stage must hold something".into()));
        }
        Ok(())
    }

    /// The parameters this stage holds, in the canonical order.
    pub fn param_specs(&self, config: &ModelConfig) -> Vec<ParamSpec> {
        let d = config.d_model;
        let kv = config.kv_heads * config.head_dim();
        let std = 0.02f32;
        // GPT-2 style: residual-output projections shrink with depth so the stream stays O(1).
        let out_std = std / (2.0 * config.layers as f32).sqrt();
        let spec = |name: String, shape: Vec<usize>, kind, init_std| ParamSpec {
            name,
            shape,
            kind,
            init_std,
        };
        let mut specs = Vec::new();
        if self.embed {
            specs.push(spec(
                "model.embed_tokens.weight".into(),
                vec![config.vocab, d],
                ParamKind::Embedding,
                std,
            ));
        }
        for l in self.first_layer..self.end_layer {
            let p = |s: &str| format!("model.layers.{l}.{s}.weight");
            specs.push(spec(p("input_layernorm"), vec![d], ParamKind::Norm, 0.0));
            specs.push(spec(
                p("self_attn.q_proj"),
                vec![d, d],
                ParamKind::Linear,
                std,
            ));
            specs.push(spec(
                p("self_attn.k_proj"),
                vec![d, kv],
                ParamKind::Linear,
                std,
            ));
            specs.push(spec(
                p("self_attn.v_proj"),
                vec![d, kv],
                ParamKind::Linear,
                std,
            ));
            specs.push(spec(
                p("self_attn.o_proj"),
                vec![d, d],
                ParamKind::Linear,
                out_std,
            ));
            specs.push(spec(
                p("post_attention_layernorm"),
                vec![d],
                ParamKind::Norm,
                0.0,
            ));
            let f = config.ffn;
            specs.push(spec(p("mlp.gate_proj"), vec![d, f], ParamKind::Linear, std));
            specs.push(spec(p("mlp.up_proj"), vec![d, f], ParamKind::Linear, std));
            specs.push(spec(
                p("mlp.down_proj"),
                vec![f, d],
                ParamKind::Linear,
                out_std,
            ));
        }
        if self.head {
            specs.push(spec(
                "model.norm.weight".into(),
                vec![d],
                ParamKind::Norm,
                0.0,
            ));
            if !config.tie_embeddings {
                specs.push(spec(
                    "lm_head.weight".into(),
                    vec![d, config.vocab],
                    ParamKind::Linear,
                    std,
                ));
            }
        }
        specs
    }
}

/// Parameter values of one stage, in the order of its [`ParamSpec`]s.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSet {
    specs: Vec<ParamSpec>,
    values: Vec<Vec<f32>>,
}

impl ParamSet {
    /// Fresh initial values. Each tensor draws from its own generator seeded by (seed, name),
    /// so a stage gets exactly the values the whole model would have for the same names.
    pub fn init(specs: Vec<ParamSpec>, seed: u64) -> Self {
        let values = specs
            .iter()
            .map(|spec| {
                if spec.kind == ParamKind::Norm {
                    return vec![1.0; spec.numel()];
                }
                let mut key = blake3::Hasher::new();
                key.update(&seed.to_le_bytes());
                key.update(spec.name.as_bytes());
                let mut rng = ChaCha8Rng::from_seed(*key.finalize().as_bytes());
                let normal = Normal::new(0.0f32, spec.init_std)
                    .expect("init std is one of our finite, non-negative constants");
                (0..spec.numel()).map(|_| normal.sample(&mut rng)).collect()
            })
            .collect();
        Self { specs, values }
    }

    /// Wraps given values after checking they match the specs one for one.
    pub fn from_values(specs: Vec<ParamSpec>, values: Vec<Vec<f32>>) -> Result<Self, ModelError> {
        if specs.len() != values.len() {
            return Err(ModelError::Input(format!(
                "expected {} parameter tensors, got {}",
                specs.len(),
                values.len()
            )));
        }
        for (spec, v) in specs.iter().zip(&values) {
            if spec.numel() != v.len() {
                return Err(ModelError::Input(format!(
                    "{}: expected {} values for shape {:?}, got {}",
                    spec.name,
                    spec.numel(),
                    spec.shape,
                    v.len()
                )));
            }
        }
        Ok(Self { specs, values })
    }

    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    pub fn values(&self) -> &[Vec<f32>] {
        &self.values
    }

    pub fn values_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.values
    }

    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .map(|i| self.values[i].as_slice())
    }

    /// Total number of scalars.
    pub fn numel(&self) -> usize {
        self.specs.iter().map(ParamSpec::numel).sum()
    }

    /// All values concatenated in canonical order (for pseudo-gradients and the wire).
    pub fn flatten(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.numel());
        for v in &self.values {
            out.extend_from_slice(v);
        }
        out
    }

    /// Overwrites all values from one flat vector in canonical order.
    pub fn set_flat(&mut self, flat: &[f32]) -> Result<(), ModelError> {
        if flat.len() != self.numel() {
            return Err(ModelError::Input(format!(
                "flat parameter vector has {} values, the stage holds {}",
                flat.len(),
                self.numel()
            )));
        }
        let mut at = 0;
        for v in &mut self.values {
            let n = v.len();
            v.copy_from_slice(&flat[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// BLAKE3 over every (name, shape, little-endian value bytes) in canonical order: the
    /// identity of a set of weights in proofs and sync checks.
    pub fn hash(&self) -> [u8; 32] {
        // Staged in aligned blocks: the same hash as feeding each value, an order of
        // magnitude faster (it runs every step; see `neuroshard_audit::StreamHasher`).
        let mut h = neuroshard_audit::StreamHasher::new();
        h.update(b"neuroshard-params-v1");
        for (spec, v) in self.specs.iter().zip(&self.values) {
            h.update(&(spec.name.len() as u64).to_le_bytes());
            h.update(spec.name.as_bytes());
            h.update(&(spec.shape.len() as u64).to_le_bytes());
            for d in &spec.shape {
                h.update(&(*d as u64).to_le_bytes());
            }
            h.update_f32s(v);
        }
        h.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_all_layers_once() {
        let mut c = ModelConfig::tiny(64);
        c.layers = 5;
        let stages = StageSpec::split(&c, 3).unwrap();
        assert_eq!(stages.len(), 3);
        assert_eq!(stages[0].first_layer, 0);
        assert_eq!(stages[2].end_layer, 5);
        for w in stages.windows(2) {
            assert_eq!(w[0].end_layer, w[1].first_layer);
        }
        assert!(stages[0].embed && !stages[0].head);
        assert!(stages[2].head && !stages[2].embed);
        let names: usize = stages.iter().map(|s| s.param_specs(&c).len()).sum();
        assert_eq!(names, StageSpec::full(&c).param_specs(&c).len());
        assert!(StageSpec::split(&c, 6).is_err());
    }

    #[test]
    fn stage_init_matches_full_model_by_name() {
        let c = ModelConfig::tiny(64);
        let full = ParamSet::init(StageSpec::full(&c).param_specs(&c), 7);
        let last = StageSpec::split(&c, 2).unwrap()[1];
        let part = ParamSet::init(last.param_specs(&c), 7);
        for spec in part.specs() {
            assert_eq!(part.get(&spec.name), full.get(&spec.name), "{}", spec.name);
        }
        assert_eq!(full.numel(), c.num_params());
    }

    #[test]
    fn hash_changes_with_any_value() {
        let c = ModelConfig::tiny(64);
        let mut p = ParamSet::init(StageSpec::full(&c).param_specs(&c), 1);
        let h = p.hash();
        assert_eq!(h, p.clone().hash());
        p.values_mut()[3][17] += 1e-7;
        assert_ne!(h, p.hash());
        let flat = p.flatten();
        let mut q = ParamSet::init(StageSpec::full(&c).param_specs(&c), 2);
        q.set_flat(&flat).unwrap();
        assert_eq!(p.hash(), q.hash());
        assert!(q.set_flat(&flat[1..]).is_err());
    }
}
