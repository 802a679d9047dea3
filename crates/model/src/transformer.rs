//! The NeuroLLM forward pass in burn tensors, written to read like the equations.
//!
//! x ← x + Attn(RMSNorm(x)),  x ← x + MLP(RMSNorm(x)),  MLP(x) = W_down(silu(W_gate x) ⊙ W_up x),
//! attention with rotary positions (rotate-half form, as in Hugging Face LLaMA), grouped
//! key/value heads and a causal mask. Only this file and `engine.rs` see burn types.

use burn::prelude::*;
use burn::tensor::module::embedding;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::params::{ParamKind, ParamSet, StageSpec};

/// One parameter tensor as the engine holds it, kept in canonical order for gradient lookup.
pub(crate) enum Leaf {
    One(Tensor<1>),
    Two(Tensor<2>),
}

impl Leaf {
    /// Takes this leaf's gradient out of `grads`: the engine hands over its buffer instead of
    /// copying a shared one.
    pub(crate) fn grad(&self, grads: &mut burn::tensor::Gradients) -> Option<Vec<f32>> {
        let data = match self {
            Leaf::One(t) => t.grad_remove(grads)?.into_data(),
            Leaf::Two(t) => t.grad_remove(grads)?.into_data(),
        };
        data.try_into_vec::<f32>().ok()
    }
}

pub(crate) struct Block {
    attn_norm: Tensor<1>,
    q: Tensor<2>,
    k: Tensor<2>,
    v: Tensor<2>,
    o: Tensor<2>,
    mlp_norm: Tensor<1>,
    gate: Tensor<2>,
    up: Tensor<2>,
    down: Tensor<2>,
}

/// A stage's weights on a device, plus the leaves in canonical order.
pub(crate) struct Weights {
    embed: Option<Tensor<2>>,
    blocks: Vec<Block>,
    norm: Option<Tensor<1>>,
    /// `[d_model, vocab]`; the transposed embedding when tied.
    head: Option<Tensor<2>>,
    pub(crate) leaves: Vec<Leaf>,
    /// Whether the leaves track gradients (a training pass).
    track: bool,
}

impl Weights {
    /// Uploads `params` (which must follow `spec`'s canonical order) to `device`. With `track`,
    /// every tensor is a gradient-retaining leaf of a new autodiff graph.
    pub(crate) fn upload(
        config: &ModelConfig,
        spec: &StageSpec,
        params: &ParamSet,
        device: &Device,
        track: bool,
    ) -> Self {
        let leaves: Vec<Leaf> = params
            .specs()
            .iter()
            .zip(params.values())
            .map(|(s, v)| {
                let data = TensorData::new(v.clone(), s.shape.clone());
                if s.kind == ParamKind::Norm {
                    let t = Tensor::<1>::from_data(data, device);
                    Leaf::One(if track { t.require_grad() } else { t })
                } else {
                    let t = Tensor::<2>::from_data(data, device);
                    Leaf::Two(if track { t.require_grad() } else { t })
                }
            })
            .collect();
        // Walk the canonical order (see `StageSpec::param_specs`).
        let mut blocks = Vec::new();
        let mut at = usize::from(spec.embed);
        let one = |i: usize| -> Tensor<1> {
            let Leaf::One(t) = &leaves[i] else {
                unreachable!("ParamSet order was checked against the stage spec")
            };
            t.clone()
        };
        let two = |i: usize| -> Tensor<2> {
            let Leaf::Two(t) = &leaves[i] else {
                unreachable!("ParamSet order was checked against the stage spec")
            };
            t.clone()
        };
        let embed = spec.embed.then(|| two(0));
        for _ in spec.first_layer..spec.end_layer {
            blocks.push(Block {
                attn_norm: one(at),
                q: two(at + 1),
                k: two(at + 2),
                v: two(at + 3),
                o: two(at + 4),
                mlp_norm: one(at + 5),
                gate: two(at + 6),
                up: two(at + 7),
                down: two(at + 8),
            });
            at += 9;
        }
        let (norm, head) = if spec.head {
            let head = if config.tie_embeddings {
                embed.clone().map(|e| e.transpose())
            } else {
                Some(two(at + 1))
            };
            (Some(one(at)), head)
        } else {
            (None, None)
        };
        Self {
            embed,
            blocks,
            norm,
            head,
            leaves,
            track,
        }
    }
}

/// Per-call tables: rotary cos/sin for the positions in play, and where they start (the causal
/// mask is applied on plain rows, see `fastmath::causal_softmax`).
pub(crate) struct Ctx {
    cos: Tensor<4>,
    sin: Tensor<4>,
    offset: usize,
}

impl Ctx {
    /// Tables for `len` new positions starting at `offset`, attending to `offset + len` keys.
    pub(crate) fn new(config: &ModelConfig, offset: usize, len: usize, device: &Device) -> Self {
        let hd = config.head_dim();
        let half = hd / 2;
        // Computed in f32 exactly as Hugging Face LLaMA does, so exported models agree.
        let theta = config.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / hd as f32))
            .collect();
        let mut cos = Vec::with_capacity(len * hd);
        let mut sin = Vec::with_capacity(len * hd);
        for p in offset..offset + len {
            for _ in 0..2 {
                for f in &inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let cos = Tensor::<4>::from_data(TensorData::new(cos, [1, 1, len, hd]), device);
        let sin = Tensor::<4>::from_data(TensorData::new(sin, [1, 1, len, hd]), device);
        Self { cos, sin, offset }
    }
}

/// Keys and values of earlier positions, per block, before grouped heads are repeated.
pub(crate) struct KvCache {
    layers: Vec<Option<(Tensor<4>, Tensor<4>)>>,
}

impl KvCache {
    pub(crate) fn new(blocks: usize) -> Self {
        Self {
            layers: (0..blocks).map(|_| None).collect(),
        }
    }

    /// Number of cached positions.
    pub(crate) fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.dims()[2],
            _ => 0,
        }
    }
}

/// RMSNorm over the rows of `[tokens, d]`.
fn rms_norm(x: Tensor<2>, weight: &Tensor<1>, eps: f64) -> Tensor<2> {
    let inv_rms = x
        .clone()
        .square()
        .mean_dim(1)
        .add_scalar(eps)
        .sqrt()
        .recip();
    x.mul(inv_rms).mul(weight.clone().unsqueeze::<2>())
}

fn rotate_half(x: Tensor<4>) -> Tensor<4> {
    let half = x.dims()[3] / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(vec![x2.neg(), x1], 3)
}

fn rope(x: Tensor<4>, ctx: &Ctx) -> Tensor<4> {
    x.clone().mul(ctx.cos.clone()) + rotate_half(x).mul(ctx.sin.clone())
}

/// `[b, kv_heads, s, hd]` → `[b, heads, s, hd]`, query head i reading kv head i / rep.
fn repeat_kv(x: Tensor<4>, rep: usize) -> Tensor<4> {
    if rep == 1 {
        return x;
    }
    let [b, kvh, s, hd] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .repeat_dim(2, rep)
        .reshape([b, kvh * rep, s, hd])
}

impl Weights {
    /// Token ids `[b, s]` → hidden states `[b, s, d]`.
    pub(crate) fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        match &self.embed {
            Some(e) => embedding(e.clone(), tokens),
            None => unreachable!("callers check that the stage holds the embedding"),
        }
    }

    /// Runs every block of the stage. With a cache, keys/values of earlier positions are
    /// reused and the new ones appended.
    ///
    /// Inside, the hidden states are one `[b·s, d]` matrix: every projection is then a single
    /// matrix product whose weight is packed once, instead of one small product per sequence.
    pub(crate) fn blocks(
        &self,
        config: &ModelConfig,
        x: Tensor<3>,
        ctx: &Ctx,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor<3>, ModelError> {
        let [b, s, d] = x.dims();
        let mut x = x.reshape([b * s, d]);
        for (i, block) in self.blocks.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            let h = rms_norm(x.clone(), &block.attn_norm, config.norm_eps);
            x = x + attention(config, block, h, [b, s], ctx, slot, self.track)?;
            let h = rms_norm(x.clone(), &block.mlp_norm, config.norm_eps);
            let mlp = self.swiglu(
                h.clone().matmul(block.gate.clone()),
                h.matmul(block.up.clone()),
            )?;
            x = x + mlp.matmul(block.down.clone());
        }
        Ok(x.reshape([b, s, d]))
    }

    /// `silu(g) ⊙ u`, computed on plain rows (see `fastmath.rs`) instead of the engine's
    /// scalar sigmoid, which it would also recompute in the backward pass.
    ///
    /// When training, the result is `u ⊙ silu(g) + (g − ḡ) ⊙ (silu'(g) ⊙ u)` with ḡ = g
    /// detached and both factors constants: `g − ḡ` is exactly zero, so the value is
    /// `u ⊙ silu(g)` bit for bit, while the engine's backward pass sends `silu(g)` to `u` and
    /// `silu'(g) ⊙ u` to `g`, SwiGLU's exact gradient.
    fn swiglu(&self, g: Tensor<2>, u: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let dims = g.dims();
        let device = g.device();
        let plain = |t: &Tensor<2>| crate::engine::to_vec(t.clone().into_data());
        let (gv, uv) = (plain(&g)?, plain(&u)?);
        let constant = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, dims), &device);
        if !self.track {
            return Ok(constant(crate::fastmath::swiglu(&gv, &uv)));
        }
        let (act, slope) = crate::fastmath::swiglu_factors(&gv, &uv);
        let zero = g.clone() - g.detach();
        Ok(u.mul(constant(act)) + zero.mul(constant(slope)))
    }

    /// Final norm and LM head: hidden `[b, s, d]` → logits `[b, s, vocab]`.
    pub(crate) fn logits(&self, config: &ModelConfig, x: Tensor<3>) -> Tensor<3> {
        let [b, s, d] = x.dims();
        match (&self.norm, &self.head) {
            (Some(norm), Some(head)) => {
                let h = rms_norm(x.reshape([b * s, d]), norm, config.norm_eps);
                let logits = h.matmul(head.clone());
                let v = logits.dims()[1];
                logits.reshape([b, s, v])
            }
            _ => unreachable!("callers check that the stage holds the head"),
        }
    }
}

/// Causal self-attention of `[b·s, d]` hidden states (`shape` = `[b, s]`).
fn attention(
    config: &ModelConfig,
    block: &Block,
    x: Tensor<2>,
    [b, s]: [usize; 2],
    ctx: &Ctx,
    cache: Option<&mut Option<(Tensor<4>, Tensor<4>)>>,
    track: bool,
) -> Result<Tensor<2>, ModelError> {
    let d = x.dims()[1];
    let (h, kvh, hd) = (config.heads, config.kv_heads, config.head_dim());
    let heads = |t: Tensor<2>, n: usize| t.reshape([b, s, n, hd]).swap_dims(1, 2);
    let q = rope(heads(x.clone().matmul(block.q.clone()), h), ctx);
    let mut k = rope(heads(x.clone().matmul(block.k.clone()), kvh), ctx);
    let mut v = heads(x.matmul(block.v.clone()), kvh);
    if let Some(slot) = cache {
        if let Some((pk, pv)) = slot.take() {
            k = Tensor::cat(vec![pk, k], 2);
            v = Tensor::cat(vec![pv, v], 2);
        }
        *slot = Some((k.clone(), v.clone()));
    }
    let k = repeat_kv(k, h / kvh);
    let v = repeat_kv(v, h / kvh);
    let scores = q.matmul(k.swap_dims(2, 3));
    let out = causal_softmax(scores, 1.0 / (hd as f32).sqrt(), ctx.offset, track)?
        .matmul(v)
        .swap_dims(1, 2)
        .reshape([b * s, d]);
    Ok(out.matmul(block.o.clone()))
}

/// Attention weights from raw scores `[b, heads, queries, keys]`: softmax of `scale · scores`
/// under the causal mask, computed on plain rows with a vectorised exp.
///
/// When training, the engine sees `P + (z − Σ_k z⊙P)⊙P` with `z = scale·(x − x̄)`, x̄ the scores
/// detached and P constant: z is exactly zero, so the value is P bit for bit, and the backward
/// pass yields softmax's gradient `scale·(P⊙dy − P·Σ P⊙dy)` without the engine's scalar exp,
/// its recomputation, or a mask tensor.
fn causal_softmax(
    scores: Tensor<4>,
    scale: f32,
    offset: usize,
    track: bool,
) -> Result<Tensor<4>, ModelError> {
    let dims = scores.dims();
    let plain = crate::engine::to_vec(scores.clone().into_data())?;
    let probs = crate::fastmath::causal_softmax(&plain, dims[3], dims[2], offset, scale);
    let probs = Tensor::<4>::from_data(TensorData::new(probs, dims), &scores.device());
    if !track {
        return Ok(probs);
    }
    let z = (scores.clone() - scores.detach()).mul_scalar(scale);
    let row = z.clone().mul(probs.clone()).sum_dim(3);
    Ok(probs.clone() + (z - row).mul(probs))
}

/// Token ids as an engine tensor `[b, s]`.
pub(crate) fn ids_tensor(ids: &[u32], batch: usize, seq: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    Tensor::<2, Int>::from_data(TensorData::new(data, [batch, seq]), device)
}
