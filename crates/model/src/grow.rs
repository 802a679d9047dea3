//! Function-preserving growth: a deeper model that computes exactly what the old one did.
//!
//! A pre-norm block adds `Attn(RMSNorm(x)) · W_o` and `MLP(RMSNorm(x)) · W_down` to the residual
//! stream. With `W_o = 0` and `W_down = 0` both products are exactly zero for finite inputs, and
//! `x + 0 = x` in floating point, so such a block is an identity bit for bit (LLaMA Pro's
//! identity blocks, arXiv:2401.02415). Inserting it anywhere leaves the logits unchanged.
//!
//! The new block's other tensors are copied from an old neighbour (LLaMA Pro's choice): they do
//! not change the function, and they give the zero projections a useful gradient at once.
//! In the first step after growth, only `W_o` and `W_down` of a new block receive a non-zero
//! gradient (everything else in it sits behind them); its other matrices move only by weight
//! decay and its norm gains not at all. The old tensors get exactly the gradients the old
//! model would have given them.
//!
//! The AdamW moments of every new tensor start at zero; the optimizer's step counter (which
//! drives the learning-rate schedule and the bias correction) continues, so a new tensor's
//! first update is about `(1 − β₁)/√(1 − β₂) ≈ 0.45` of a fresh AdamW's: a built-in warm-up.
//!
//! The MLP widens exactly too: new hidden units with fresh gate/up columns and zero rows of
//! `W_down` add exactly zero (SwiGLU is per unit), and the engine's matrix product gave the
//! same bits with the longer inner dimension in every case tested ([`grow_ffn`];
//! `tests/growth.rs`). The residual width (`d_model`) is not grown: RMSNorm divides by the
//! root mean square over `d_model`, so new dimensions change every norm's value unless the
//! gains and ε are rescaled, and even then the sums have other terms and roundings: exact in
//! real arithmetic at best, never bit for bit (see `README.md`, "Dynamic architecture").

use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::optim::AdamW;
use crate::params::{ParamSet, StageSpec};
use crate::stage::Stage;

/// Most identity blocks one growth step may insert (the model limit applies as well).
pub const MAX_INSERTED: usize = 256;

/// Which architecture a set of weights belongs to: version 0 is the genesis shape, and every
/// growth step adds one version and one entry to `history`. Checkpoints and the HF export
/// carry it; checkpoints written before it existed load as version 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Architecture {
    pub version: u32,
    #[serde(default)]
    pub history: Vec<Growth>,
}

/// One growth step: depth (identity blocks inserted) or MLP width (`ffn` set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Growth {
    /// Training steps taken before the growth.
    pub step: u64,
    pub from_layers: usize,
    pub to_layers: usize,
    /// Indices, in the grown model, of the identity blocks inserted (empty for a widening).
    pub inserted: Vec<usize>,
    /// MLP width before and after, for a widening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn: Option<FfnGrowth>,
}

/// The MLP widths of a widening step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FfnGrowth {
    pub from: usize,
    pub to: usize,
}

impl Architecture {
    /// Checks the history against the model it describes: one entry per version, each step
    /// either adding exactly its inserted blocks or widening the MLP, depths and widths
    /// chaining up to `layers` and `ffn`, steps not decreasing.
    pub fn validate(&self, layers: usize, ffn: usize) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::Checkpoint(format!("architecture: {msg}")));
        if self.history.len() != self.version as usize {
            return bad(format!(
                "version {} with {} growth steps",
                self.version,
                self.history.len()
            ));
        }
        let mut last_step = 0;
        let mut last_ffn: Option<usize> = None;
        for (i, g) in self.history.iter().enumerate() {
            if let Some(w) = g.ffn {
                if w.from >= w.to
                    || last_ffn.is_some_and(|f| f != w.from)
                    || !g.inserted.is_empty()
                    || g.from_layers != g.to_layers
                {
                    return bad(format!("growth {i} is not a widening of the MLP"));
                }
                last_ffn = Some(w.to);
            }
            let added = g.to_layers.checked_sub(g.from_layers);
            if added != Some(g.inserted.len()) || (g.inserted.is_empty() && g.ffn.is_none()) {
                return bad(format!(
                    "growth {i} goes from {} to {} layers inserting {}",
                    g.from_layers,
                    g.to_layers,
                    g.inserted.len()
                ));
            }
            if !g.inserted.windows(2).all(|w| w[0] < w[1])
                || g.inserted.last().is_some_and(|&l| l >= g.to_layers)
            {
                return bad(format!("growth {i} lists invalid inserted layers"));
            }
            if i > 0 && self.history[i - 1].to_layers != g.from_layers {
                return bad(format!(
                    "growth {i} does not start where growth {} ended",
                    i - 1
                ));
            }
            if g.step < last_step {
                return bad(format!("growth {i} happens before the one preceding it"));
            }
            last_step = g.step;
        }
        if last_ffn.is_some_and(|f| f != ffn) {
            return bad(format!("history widens the MLP to other than its {ffn}"));
        }
        match self.history.last() {
            Some(g) if g.to_layers != layers => bad(format!(
                "history ends at {} layers, the model has {layers}",
                g.to_layers
            )),
            _ => Ok(()),
        }
    }
}

/// Where each layer of the grown model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerSource {
    /// Old layer `i`, unchanged.
    Old(usize),
    /// A new identity block whose norms and input projections are copies of old layer `i`.
    Identity { copy_of: usize },
}

/// The layer map of inserting identity blocks before the old layers `positions` (each in
/// `0..=layers`; `layers` appends at the top; a repeated position inserts several blocks
/// there). Positions need not be sorted. Each new block copies the old block below it, or the
/// one above when it sits at the bottom.
pub fn depth_plan(layers: usize, positions: &[usize]) -> Result<Vec<LayerSource>, ModelError> {
    if layers == 0 {
        return Err(ModelError::Config(
            "cannot grow a model without layers".into(),
        ));
    }
    if positions.is_empty() || positions.len() > MAX_INSERTED {
        return Err(ModelError::Config(format!(
            "growth inserts between 1 and {MAX_INSERTED} blocks, asked for {}",
            positions.len()
        )));
    }
    if let Some(&p) = positions.iter().find(|&&p| p > layers) {
        return Err(ModelError::Config(format!(
            "cannot insert a block before layer {p} of a {layers}-layer model"
        )));
    }
    let mut sorted = positions.to_vec();
    sorted.sort_unstable();
    let mut plan = Vec::with_capacity(layers + sorted.len());
    let mut next = sorted.iter().peekable();
    for old in 0..=layers {
        while next.next_if(|&&p| p == old).is_some() {
            plan.push(LayerSource::Identity {
                copy_of: old.saturating_sub(1).min(layers - 1),
            });
        }
        if old < layers {
            plan.push(LayerSource::Old(old));
        }
    }
    Ok(plan)
}

/// Tensor names of one block, as [`StageSpec::param_specs`] writes them, without the layer.
const BLOCK_TENSORS: [&str; 9] = [
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// The residual-output projections an identity block sets to zero.
fn zero_in_identity(tensor: &str) -> bool {
    matches!(tensor, "self_attn.o_proj" | "mlp.down_proj")
}

/// What a tensor of the grown model starts from: a copy of an old tensor, or zeros.
enum Origin {
    Copy(usize),
    Zero,
}

/// For each tensor of the grown full model, its origin in `old` (by index).
fn origins(
    old: &ParamSet,
    new_specs: &[crate::params::ParamSpec],
    plan: &[LayerSource],
) -> Result<Vec<Origin>, ModelError> {
    let index = |name: &str| {
        old.specs()
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| ModelError::Input(format!("the model to grow has no tensor {name}")))
    };
    new_specs
        .iter()
        .map(|spec| {
            let Some(rest) = spec.name.strip_prefix("model.layers.") else {
                return index(&spec.name).map(Origin::Copy);
            };
            let (layer, tensor) = rest
                .split_once('.')
                .and_then(|(l, t)| Some((l.parse::<usize>().ok()?, t.strip_suffix(".weight")?)))
                .filter(|(_, t)| BLOCK_TENSORS.contains(t))
                .ok_or_else(|| ModelError::Input(format!("unexpected tensor {}", spec.name)))?;
            match plan[layer] {
                LayerSource::Old(i) => {
                    index(&format!("model.layers.{i}.{tensor}.weight")).map(Origin::Copy)
                }
                LayerSource::Identity { .. } if zero_in_identity(tensor) => Ok(Origin::Zero),
                LayerSource::Identity { copy_of } => {
                    index(&format!("model.layers.{copy_of}.{tensor}.weight")).map(Origin::Copy)
                }
            }
        })
        .collect()
}

fn assemble(
    origins: &[Origin],
    new_specs: &[crate::params::ParamSpec],
    old: &[Vec<f32>],
) -> Vec<Vec<f32>> {
    origins
        .iter()
        .zip(new_specs)
        .map(|(o, spec)| match o {
            Origin::Copy(i) => old[*i].clone(),
            Origin::Zero => vec![0.0; spec.numel()],
        })
        .collect()
}

/// A whole model grown in depth, with its optimizer and the record of the step.
#[derive(Debug, Clone)]
pub struct Grown {
    pub stage: Stage,
    pub optimizer: AdamW,
    pub growth: Growth,
}

/// Grows a whole-model stage (and its AdamW state) by identity blocks inserted before the old
/// layers `positions` (see [`depth_plan`]). The grown model's logits equal the old model's
/// bit for bit; the moments of every new tensor are zero (identity blocks' copied tensors
/// included: they are new parameters, not continuations of the copied ones).
pub fn grow_depth(
    stage: &Stage,
    optimizer: &AdamW,
    positions: &[usize],
    step: u64,
) -> Result<Grown, ModelError> {
    let config = stage.config();
    if *stage.spec() != StageSpec::full(config) {
        return Err(ModelError::Input(
            "depth growth needs the whole model in one stage".into(),
        ));
    }
    let plan = depth_plan(config.layers, positions)?;
    let new_config = ModelConfig {
        layers: plan.len(),
        ..config.clone()
    };
    new_config.validate()?;
    let new_spec = StageSpec::full(&new_config);
    let new_specs = new_spec.param_specs(&new_config);
    let origins = origins(stage.params(), &new_specs, &plan)?;
    let params = ParamSet::from_values(
        new_specs.clone(),
        assemble(&origins, &new_specs, stage.params().values()),
    )?;
    // Old layers keep their moments under their new names; every new tensor starts at zero.
    let fresh: Vec<bool> = new_specs
        .iter()
        .map(|spec| {
            spec.name
                .strip_prefix("model.layers.")
                .and_then(|r| r.split_once('.'))
                .and_then(|(l, _)| l.parse::<usize>().ok())
                .is_some_and(|l| matches!(plan[l], LayerSource::Identity { .. }))
        })
        .collect();
    let (m, v) = optimizer.moments();
    let moments = |state: &[Vec<f32>]| -> Vec<Vec<f32>> {
        assemble(&origins, &new_specs, state)
            .into_iter()
            .zip(&fresh)
            .map(|(t, &new)| if new { vec![0.0; t.len()] } else { t })
            .collect()
    };
    let optimizer = AdamW::from_state(
        optimizer.config.clone(),
        &params,
        optimizer.step_count(),
        moments(m),
        moments(v),
    )?;
    let inserted = plan
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, LayerSource::Identity { .. }))
        .map(|(i, _)| i)
        .collect();
    Ok(Grown {
        stage: Stage::from_params(new_config, new_spec, params)?,
        optimizer,
        growth: Growth {
            step,
            from_layers: config.layers,
            to_layers: plan.len(),
            inserted,
            ffn: None,
        },
    })
}

/// Widens the MLP of every block of a whole-model stage to `new_ffn` hidden units. The new
/// units' gate and up columns are drawn as a fresh model of the new width would draw them
/// (seed `seed`); their rows of `W_down` are zero, so the function is unchanged bit for bit.
/// Old tensors keep their values and AdamW moments; every new column and row starts with
/// zero moments.
pub fn grow_ffn(
    stage: &Stage,
    optimizer: &AdamW,
    new_ffn: usize,
    seed: u64,
    step: u64,
) -> Result<Grown, ModelError> {
    let config = stage.config();
    if *stage.spec() != StageSpec::full(config) {
        return Err(ModelError::Input(
            "widening needs the whole model in one stage".into(),
        ));
    }
    if new_ffn <= config.ffn {
        return Err(ModelError::Config(format!(
            "cannot widen the MLP from {} to {new_ffn}",
            config.ffn
        )));
    }
    let new_config = ModelConfig {
        ffn: new_ffn,
        ..config.clone()
    };
    new_config.validate()?;
    let spec = StageSpec::full(&new_config);
    let (d, f) = (config.d_model, config.ffn);
    let fresh = ParamSet::init(spec.param_specs(&new_config), seed);
    // Old [d, f] as the first f columns of [d, f']; `new` fills the rest.
    let widen_cols = |old: &[f32], new: &dyn Fn(usize) -> f32| -> Vec<f32> {
        (0..d * new_ffn)
            .map(|i| {
                let (r, c) = (i / new_ffn, i % new_ffn);
                if c < f { old[r * f + c] } else { new(i) }
            })
            .collect()
    };
    let relayout = |values: &[Vec<f32>], fill_fresh: bool| -> Vec<Vec<f32>> {
        spec.param_specs(&new_config)
            .iter()
            .zip(values)
            .enumerate()
            .map(|(i, (s, old))| {
                if s.name.ends_with("mlp.gate_proj.weight")
                    || s.name.ends_with("mlp.up_proj.weight")
                {
                    let src = &fresh.values()[i];
                    widen_cols(old, &|j| if fill_fresh { src[j] } else { 0.0 })
                } else if s.name.ends_with("mlp.down_proj.weight") {
                    // [f, d] → [f', d]: the new rows are zero.
                    let mut v = old.clone();
                    v.resize(new_ffn * d, 0.0);
                    v
                } else {
                    old.clone()
                }
            })
            .collect()
    };
    let params = ParamSet::from_values(
        spec.param_specs(&new_config),
        relayout(stage.params().values(), true),
    )?;
    let (m, v) = optimizer.moments();
    let optimizer = AdamW::from_state(
        optimizer.config.clone(),
        &params,
        optimizer.step_count(),
        relayout(m, false),
        relayout(v, false),
    )?;
    Ok(Grown {
        stage: Stage::from_params(new_config, spec, params)?,
        optimizer,
        growth: Growth {
            step,
            from_layers: config.layers,
            to_layers: config.layers,
            inserted: Vec::new(),
            ffn: Some(FfnGrowth {
                from: f,
                to: new_ffn,
            }),
        },
    })
}

/// Evenly spread insertion points for growing `layers` to `target` layers: one identity block
/// after every old block from the top down when doubling, fewer spread over the depth
/// otherwise (G_stack and LLaMA Pro both interleave new blocks with old ones).
pub fn spread_positions(layers: usize, target: usize) -> Result<Vec<usize>, ModelError> {
    if target <= layers || layers == 0 {
        return Err(ModelError::Config(format!(
            "cannot grow {layers} layers to {target}"
        )));
    }
    let add = target - layers;
    // Block j of `add` goes after old layer ⌈(j + 1)·layers / add⌉ − 1: spread, top included.
    Ok((0..add)
        .map(|j| ((j + 1) * layers).div_ceil(add).min(layers))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_inserts_before_the_named_layers() {
        use LayerSource::*;
        assert_eq!(
            depth_plan(2, &[2, 0, 1]).unwrap(),
            vec![
                Identity { copy_of: 0 },
                Old(0),
                Identity { copy_of: 0 },
                Old(1),
                Identity { copy_of: 1 },
            ]
        );
        assert_eq!(
            depth_plan(1, &[1, 1]).unwrap(),
            vec![Old(0), Identity { copy_of: 0 }, Identity { copy_of: 0 }]
        );
        assert!(depth_plan(2, &[3]).is_err());
        assert!(depth_plan(2, &[]).is_err());
        assert!(depth_plan(0, &[0]).is_err());
        assert!(depth_plan(2, &vec![1; MAX_INSERTED + 1]).is_err());
    }

    #[test]
    fn spread_positions_interleave() {
        assert_eq!(spread_positions(2, 4).unwrap(), vec![1, 2]);
        assert_eq!(spread_positions(4, 6).unwrap(), vec![2, 4]);
        assert_eq!(spread_positions(3, 4).unwrap(), vec![3]);
        assert_eq!(spread_positions(2, 7).unwrap().len(), 5);
        assert!(spread_positions(4, 4).is_err());
        for (l, t) in [(1, 2), (2, 3), (5, 13), (8, 10)] {
            let p = spread_positions(l, t).unwrap();
            assert_eq!(depth_plan(l, &p).unwrap().len(), t);
        }
    }

    #[test]
    fn architecture_history_must_match_the_model() {
        let g = |from, to, inserted: Vec<usize>| Growth {
            step: 5,
            from_layers: from,
            to_layers: to,
            inserted,
            ffn: None,
        };
        let ok = Architecture {
            version: 2,
            history: vec![g(2, 4, vec![1, 3]), g(4, 5, vec![4])],
        };
        ok.validate(5, 10).unwrap();
        assert!(ok.validate(4, 10).is_err());
        Architecture::default().validate(7, 10).unwrap();
        let wrong_version = Architecture {
            version: 1,
            ..ok.clone()
        };
        assert!(wrong_version.validate(5, 10).is_err());
        let gap = Architecture {
            version: 2,
            history: vec![g(2, 4, vec![1, 3]), g(3, 4, vec![0])],
        };
        assert!(gap.validate(4, 10).is_err());
        let unsorted = Architecture {
            version: 1,
            history: vec![g(2, 4, vec![3, 1])],
        };
        assert!(unsorted.validate(4, 10).is_err());
        let out_of_range = Architecture {
            version: 1,
            history: vec![g(2, 3, vec![3])],
        };
        assert!(out_of_range.validate(3, 10).is_err());
        let widen = |from, to| Growth {
            ffn: Some(FfnGrowth { from, to }),
            ..g(5, 5, vec![])
        };
        let wide = Architecture {
            version: 3,
            history: vec![g(4, 5, vec![2]), widen(10, 16), widen(16, 20)],
        };
        wide.validate(5, 20).unwrap();
        assert!(wide.validate(5, 16).is_err());
        let broken = Architecture {
            version: 2,
            history: vec![widen(10, 16), widen(12, 20)],
        };
        assert!(broken.validate(5, 20).is_err());
        let narrowing = Architecture {
            version: 1,
            history: vec![widen(16, 10)],
        };
        assert!(narrowing.validate(5, 10).is_err());
    }
}
