//! A pipeline stage: a contiguous slice of the model with forward and vector–Jacobian product.
//!
//! Inputs and outputs are plain vectors so the network and the trainer never touch the engine.
//! The whole model is simply the stage that holds everything.

use burn::prelude::*;

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::params::{ParamSet, StageSpec};
use crate::transformer::{Ctx, Weights, ids_tensor};

/// Hidden states crossing a stage boundary, `[batch, seq, d_model]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    pub batch: usize,
    pub seq: usize,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Activations {
    /// Checks shape against the model and that every value is finite.
    pub fn validate(&self, config: &ModelConfig) -> Result<(), ModelError> {
        if self.dim != config.d_model {
            return Err(ModelError::Input(format!(
                "activation width {} does not match d_model {}",
                self.dim, config.d_model
            )));
        }
        check_batch_shape(config, self.batch, self.seq)?;
        if self.data.len() != self.batch * self.seq * self.dim {
            return Err(ModelError::Input(format!(
                "activation tensor has {} values, shape [{}, {}, {}] needs {}",
                self.data.len(),
                self.batch,
                self.seq,
                self.dim,
                self.batch * self.seq * self.dim
            )));
        }
        if let Some(i) = self.data.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::Input(format!(
                "activation value at index {i} is not finite ({})",
                self.data[i]
            )));
        }
        Ok(())
    }

    /// BLAKE3 of the shape and little-endian values: what proofs and audits commit to.
    pub fn hash(&self) -> [u8; 32] {
        neuroshard_audit::tensor_hash(self.batch, self.seq, self.dim, &self.data)
    }
}

/// Token ids `[batch, seq]` row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<u32>,
}

impl Tokens {
    pub fn validate(&self, config: &ModelConfig) -> Result<(), ModelError> {
        check_batch_shape(config, self.batch, self.seq)?;
        if self.ids.len() != self.batch * self.seq {
            return Err(ModelError::Input(format!(
                "{} token ids for shape [{}, {}]",
                self.ids.len(),
                self.batch,
                self.seq
            )));
        }
        if let Some(&t) = self.ids.iter().find(|&&t| t as usize >= config.vocab) {
            return Err(ModelError::Input(format!(
                "token id {t} is outside the vocabulary of {}",
                config.vocab
            )));
        }
        Ok(())
    }
}

fn check_batch_shape(config: &ModelConfig, batch: usize, seq: usize) -> Result<(), ModelError> {
    if batch == 0 || seq == 0 {
        return Err(ModelError::Input(format!(
            "empty batch shape [{batch}, {seq}]"
        )));
    }
    if seq > config.max_seq {
        return Err(ModelError::Input(format!(
            "sequence length {seq} exceeds max_seq {}",
            config.max_seq
        )));
    }
    Ok(())
}

/// What a stage consumes: token ids (first stage) or the previous stage's hidden states.
#[derive(Debug, Clone, PartialEq)]
pub enum StageInput {
    Tokens(Tokens),
    Hidden(Activations),
}

/// What flows back into a stage's backward pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Upstream {
    /// Gradient of the loss with respect to this stage's output.
    Grad(Activations),
    /// Next-token targets `[batch, seq]`: the stage computes the loss itself.
    Targets(Vec<u32>),
}

/// Result of a stage's backward pass.
#[derive(Debug, Clone)]
pub struct StageGrads {
    /// Mean cross-entropy, when this stage computed the loss.
    pub loss: Option<f32>,
    /// Gradient with respect to the input hidden states (None for the embedding stage).
    pub input_grad: Option<Activations>,
    /// Parameter gradients in canonical order.
    pub params: Vec<Vec<f32>>,
}

/// A forward pass's autodiff graph, waiting for its backward pass.
struct Graph {
    weights: Weights,
    h: Tensor<3>,
    input_leaf: Option<Tensor<3>>,
    batch: usize,
    seq: usize,
    device: Device,
}

/// A forward pass kept for its backward pass ([`Stage::forward_kept`]): the engine's graph
/// of one micro-batch (its intermediate activations), opaque outside this crate.
pub struct Kept(Graph);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kept([{}, {}])", self.0.batch, self.0.seq)
    }
}

/// One stage of the model with its parameters.
#[derive(Debug, Clone)]
pub struct Stage {
    config: ModelConfig,
    spec: StageSpec,
    params: ParamSet,
}

impl Stage {
    /// A stage with freshly initialised parameters.
    pub fn init(config: ModelConfig, spec: StageSpec, seed: u64) -> Result<Self, ModelError> {
        config.validate()?;
        spec.validate(&config)?;
        let params = ParamSet::init(spec.param_specs(&config), seed);
        Ok(Self {
            config,
            spec,
            params,
        })
    }

    /// A stage over given parameters, which must match the spec tensor for tensor.
    pub fn from_params(
        config: ModelConfig,
        spec: StageSpec,
        params: ParamSet,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        spec.validate(&config)?;
        let expected = spec.param_specs(&config);
        if expected.len() != params.specs().len() {
            return Err(ModelError::Input(format!(
                "stage needs {} parameter tensors, got {}",
                expected.len(),
                params.specs().len()
            )));
        }
        for (e, g) in expected.iter().zip(params.specs()) {
            if e.name != g.name || e.shape != g.shape {
                return Err(ModelError::Input(format!(
                    "expected parameter {} {:?}, got {} {:?}",
                    e.name, e.shape, g.name, g.shape
                )));
            }
        }
        Ok(Self {
            config,
            spec,
            params,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }

    pub fn params(&self) -> &ParamSet {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut ParamSet {
        &mut self.params
    }

    /// BLAKE3 of this stage's parameters (see [`ParamSet::hash`]).
    pub fn model_hash(&self) -> [u8; 32] {
        self.params.hash()
    }

    fn check_input(&self, input: &StageInput) -> Result<(usize, usize), ModelError> {
        match (input, self.spec.embed) {
            (StageInput::Tokens(t), true) => {
                t.validate(&self.config)?;
                Ok((t.batch, t.seq))
            }
            (StageInput::Hidden(a), false) => {
                a.validate(&self.config)?;
                Ok((a.batch, a.seq))
            }
            (StageInput::Tokens(_), false) => Err(ModelError::Input(
                "this stage takes hidden states, not token ids".into(),
            )),
            (StageInput::Hidden(_), true) => Err(ModelError::Input(
                "this stage holds the embedding and takes token ids".into(),
            )),
        }
    }

    fn check_targets(&self, targets: &[u32], batch: usize, seq: usize) -> Result<(), ModelError> {
        Tokens {
            batch,
            seq,
            ids: targets.to_vec(),
        }
        .validate(&self.config)
    }

    /// Hidden states after this stage's blocks (before the head, if it has one).
    fn hidden(
        &self,
        weights: &Weights,
        input: &StageInput,
        device: &Device,
        track_input: bool,
    ) -> Result<(Tensor<3>, Option<Tensor<3>>), ModelError> {
        let (x, leaf) = match input {
            StageInput::Tokens(t) => {
                let ids = ids_tensor(&t.ids, t.batch, t.seq, device);
                (weights.embed(ids), None)
            }
            StageInput::Hidden(a) => {
                let x = Tensor::<3>::from_data(
                    TensorData::new(a.data.clone(), [a.batch, a.seq, a.dim]),
                    device,
                );
                let x = if track_input { x.require_grad() } else { x };
                (x.clone(), Some(x))
            }
        };
        let seq = x.dims()[1];
        let ctx = Ctx::new(&self.config, 0, seq, device);
        Ok((weights.blocks(&self.config, x, &ctx, None)?, leaf))
    }

    /// Forward pass of a stage without the head: the activations sent downstream.
    pub fn forward(&self, input: &StageInput) -> Result<Activations, ModelError> {
        if self.spec.head {
            return Err(ModelError::Input(
                "the last stage ends in the loss: call loss() or logits()".into(),
            ));
        }
        let (batch, seq) = self.check_input(input)?;
        let device = crate::engine::device();
        let weights = Weights::upload(&self.config, &self.spec, &self.params, &device, false);
        let (out, _) = self.hidden(&weights, input, &device, false)?;
        Ok(Activations {
            batch,
            seq,
            dim: self.config.d_model,
            data: crate::engine::to_vec(out.into_data())?,
        })
    }

    /// Mean cross-entropy of the last stage on `targets`, and the per-token losses.
    pub fn token_losses(
        &self,
        input: &StageInput,
        targets: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        if !self.spec.head {
            return Err(ModelError::Input(
                "only the last stage computes the loss".into(),
            ));
        }
        let (batch, seq) = self.check_input(input)?;
        self.check_targets(targets, batch, seq)?;
        let device = crate::engine::device();
        let weights = Weights::upload(&self.config, &self.spec, &self.params, &device, false);
        let (h, _) = self.hidden(&weights, input, &device, false)?;
        let logits = crate::engine::to_vec(weights.logits(&self.config, h).into_data())?;
        Ok(crate::loss::token_losses(
            &logits,
            targets,
            self.config.vocab,
        ))
    }

    /// Backward pass: the vector–Jacobian product of this stage at `input`.
    ///
    /// A middle or first stage takes the gradient of the loss with respect to its output; the
    /// last stage takes the targets and computes the loss itself.
    pub fn backward(
        &self,
        input: &StageInput,
        upstream: &Upstream,
    ) -> Result<StageGrads, ModelError> {
        let graph = self.graph(input)?;
        self.finish(graph, upstream)
    }

    /// A forward pass of a stage without the head whose autodiff graph is kept, so its
    /// backward pass ([`Self::backward_kept`]) need not recompute it. The output has the bits
    /// of [`Self::forward`], and the gradients those of [`Self::backward`] on the same input
    /// at the same weights: the same operations, split at the output.
    pub fn forward_kept(&self, input: &StageInput) -> Result<(Activations, Kept), ModelError> {
        if self.spec.head {
            return Err(ModelError::Input(
                "the last stage ends in the loss: call backward()".into(),
            ));
        }
        let graph = self.graph(input)?;
        let out = Activations {
            batch: graph.batch,
            seq: graph.seq,
            dim: self.config.d_model,
            data: crate::engine::to_vec(graph.h.clone().inner().into_data())?,
        };
        Ok((out, Kept(graph)))
    }

    /// The backward pass of a kept forward pass (made by this stage's weights at the time).
    pub fn backward_kept(&self, kept: Kept, upstream: &Upstream) -> Result<StageGrads, ModelError> {
        self.finish(kept.0, upstream)
    }

    /// The forward pass on the autodiff device, every weight and the input a leaf.
    fn graph(&self, input: &StageInput) -> Result<Graph, ModelError> {
        let (batch, seq) = self.check_input(input)?;
        let device = crate::engine::device().autodiff();
        let weights = Weights::upload(&self.config, &self.spec, &self.params, &device, true);
        let (h, input_leaf) = self.hidden(&weights, input, &device, true)?;
        Ok(Graph {
            weights,
            h,
            input_leaf,
            batch,
            seq,
            device,
        })
    }

    fn finish(&self, graph: Graph, upstream: &Upstream) -> Result<StageGrads, ModelError> {
        let Graph {
            weights,
            h,
            input_leaf,
            batch,
            seq,
            device,
        } = graph;
        let (objective, loss) = match (upstream, self.spec.head) {
            (Upstream::Targets(targets), true) => {
                self.check_targets(targets, batch, seq)?;
                let vocab = self.config.vocab;
                let logits = weights
                    .logits(&self.config, h)
                    .reshape([batch * seq, vocab]);
                // The loss and its gradient come from plain rows (see `loss.rs`); the engine
                // back-propagates Σ logits · ∂loss/∂logits, whose gradient is the same.
                let values = crate::engine::to_vec(logits.clone().inner().into_data())?;
                let (loss, dlogits) = crate::loss::cross_entropy(&values, targets, vocab);
                let dlogits = Tensor::<2>::from_data(
                    TensorData::new(dlogits, [batch * seq, vocab]),
                    &device.clone().inner(),
                );
                (logits.mul(dlogits.autodiff()).sum(), Some(loss))
            }
            (Upstream::Grad(g), false) => {
                g.validate(&self.config)?;
                if (g.batch, g.seq) != (batch, seq) {
                    return Err(ModelError::Input(format!(
                        "output gradient shape [{}, {}] does not match input [{batch}, {seq}]",
                        g.batch, g.seq
                    )));
                }
                let dy = Tensor::<3>::from_data(
                    TensorData::new(g.data.clone(), [batch, seq, g.dim]),
                    &device.clone().inner(),
                );
                // VJP: d/dθ of Σ y·dy with dy constant is exactly dyᵀ·∂y/∂θ.
                (h.mul(dy.autodiff()).sum(), None)
            }
            (Upstream::Grad(_), true) => {
                return Err(ModelError::Input(
                    "the last stage computes its own loss: pass targets".into(),
                ));
            }
            (Upstream::Targets(_), false) => {
                return Err(ModelError::Input(
                    "only the last stage takes targets; pass the output gradient".into(),
                ));
            }
        };
        let mut grads = objective.backward();
        let input_grad = match input_leaf {
            Some(x) => {
                let g = x
                    .grad_remove(&mut grads)
                    .ok_or_else(|| ModelError::Engine("no gradient for the input".into()))?;
                Some(Activations {
                    batch,
                    seq,
                    dim: self.config.d_model,
                    data: crate::engine::to_vec(g.into_data())?,
                })
            }
            None => None,
        };
        let params = weights
            .leaves
            .iter()
            .zip(self.params.specs())
            .map(|(leaf, spec)| {
                // A parameter the loss does not reach (impossible in this model) gets zeros.
                leaf.grad(&mut grads)
                    .unwrap_or_else(|| vec![0.0; spec.numel()])
            })
            .collect();
        Ok(StageGrads {
            loss,
            input_grad,
            params,
        })
    }
}
