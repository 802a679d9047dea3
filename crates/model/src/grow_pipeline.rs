//! Depth growth mapped onto the pipeline: a new stage of identity blocks between two existing
//! stages, held by nodes that join for it, while every existing stage keeps its values bit for
//! bit (only the global layer indices in its tensor names move).
//!
//! A joiner has no neighbour's weights, so the new blocks' norms start at one and their
//! q/k/v/gate/up matrices are drawn like a fresh model's (seeded); `W_o` and `W_down` are zero,
//! which is all exactness needs (see [`crate::grow`]).

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::grow::MAX_INSERTED;
use crate::optim::AdamW;
use crate::params::{ParamSet, StageSpec};
use crate::stage::Stage;

/// The layout after inserting a stage of identity blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineGrowth {
    /// The model and stages before growth.
    pub old_config: ModelConfig,
    pub old_stages: Vec<StageSpec>,
    /// The grown model.
    pub config: ModelConfig,
    /// Its stages, in pipeline order.
    pub stages: Vec<StageSpec>,
    /// Index (in `stages`) of the new stage of identity blocks.
    pub new_stage: usize,
    /// For each grown stage, the old stage it continues (`None` for the new one).
    pub from: Vec<Option<usize>>,
}

impl PipelineGrowth {
    /// Global indices of the identity blocks.
    pub fn inserted(&self) -> std::ops::Range<usize> {
        let s = self.stages[self.new_stage];
        s.first_layer..s.end_layer
    }
}

/// Inserts a stage of `blocks` identity blocks before old stage `at` (between the embedding's
/// stage and the head's: `1 ≤ at < stages`). `stages` must cover the model's layers in order.
pub fn insert_identity_stage(
    config: &ModelConfig,
    stages: &[StageSpec],
    at: usize,
    blocks: usize,
) -> Result<PipelineGrowth, ModelError> {
    let bad = |m: String| Err(ModelError::Config(m));
    if stages.len() < 2 || at == 0 || at >= stages.len() {
        return bad(format!(
            "a new stage goes between two of the {} stages, not before stage {at}",
            stages.len()
        ));
    }
    if blocks == 0 || blocks > MAX_INSERTED {
        return bad(format!(
            "a new stage holds 1 to {MAX_INSERTED} blocks, not {blocks}"
        ));
    }
    let contiguous = stages
        .first()
        .is_some_and(|s| s.first_layer == 0 && s.embed)
        && stages
            .last()
            .is_some_and(|s| s.end_layer == config.layers && s.head)
        && stages
            .windows(2)
            .all(|w| w[0].end_layer == w[1].first_layer)
        && stages[1..stages.len() - 1]
            .iter()
            .all(|s| !s.embed && !s.head);
    if !contiguous {
        return bad("the stages do not cover the model in order".into());
    }
    for s in stages {
        s.validate(config)?;
    }
    let grown = ModelConfig {
        layers: config.layers + blocks,
        ..config.clone()
    };
    grown.validate()?;
    let shift = |s: &StageSpec| StageSpec {
        first_layer: s.first_layer + blocks,
        end_layer: s.end_layer + blocks,
        ..*s
    };
    let start = stages[at].first_layer;
    let mut out: Vec<StageSpec> = stages[..at].to_vec();
    out.push(StageSpec {
        first_layer: start,
        end_layer: start + blocks,
        embed: false,
        head: false,
    });
    out.extend(stages[at..].iter().map(shift));
    let from = (0..out.len())
        .map(|i| match i.cmp(&at) {
            std::cmp::Ordering::Less => Some(i),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => Some(i - 1),
        })
        .collect();
    Ok(PipelineGrowth {
        old_config: config.clone(),
        old_stages: stages.to_vec(),
        config: grown,
        stages: out,
        new_stage: at,
        from,
    })
}

/// An existing stage in the grown layout: the same values (and AdamW moments) in the same
/// order, under the renumbered names.
pub fn continue_stage(
    stage: &Stage,
    optimizer: Option<&AdamW>,
    growth: &PipelineGrowth,
    index: usize,
) -> Result<(Stage, Option<AdamW>), ModelError> {
    let spec = *growth
        .stages
        .get(index)
        .ok_or_else(|| ModelError::Input(format!("the grown pipeline has no stage {index}")))?;
    let Some(old) = growth.from[index] else {
        return Err(ModelError::Input(format!(
            "stage {index} is the new one: make it with identity_stage"
        )));
    };
    if *stage.config() != growth.old_config || *stage.spec() != growth.old_stages[old] {
        return Err(ModelError::Input(format!(
            "stage {:?} is not old stage {old} of this growth",
            stage.spec()
        )));
    }
    let params = ParamSet::from_values(
        spec.param_specs(&growth.config),
        stage.params().values().to_vec(),
    )?;
    let optimizer = match optimizer {
        Some(opt) => {
            let (m, v) = opt.moments();
            Some(AdamW::from_state(
                opt.config.clone(),
                &params,
                opt.step_count(),
                m.to_vec(),
                v.to_vec(),
            )?)
        }
        None => None,
    };
    Ok((
        Stage::from_params(growth.config.clone(), spec, params)?,
        optimizer,
    ))
}

/// The new stage of identity blocks, drawn from `seed` as a fresh model would be, with zero
/// `W_o` and `W_down`.
pub fn identity_stage(growth: &PipelineGrowth, seed: u64) -> Result<Stage, ModelError> {
    identity_blocks(growth.config.clone(), growth.stages[growth.new_stage], seed)
}

/// A stage of `spec`'s blocks as identities: drawn from `seed` like a fresh model's, with
/// zero `W_o` and `W_down` (a stage with the embedding or the head is refused: those are no
/// identity).
pub fn identity_blocks(
    config: ModelConfig,
    spec: StageSpec,
    seed: u64,
) -> Result<Stage, ModelError> {
    if spec.embed || spec.head {
        return Err(ModelError::Config(
            "identity blocks hold neither the embedding nor the head".into(),
        ));
    }
    let mut params = ParamSet::init(spec.param_specs(&config), seed);
    let zero: Vec<usize> = params
        .specs()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name.ends_with("o_proj.weight") || s.name.ends_with("down_proj.weight"))
        .map(|(i, _)| i)
        .collect();
    for i in zero {
        params.values_mut()[i].fill(0.0);
    }
    Stage::from_params(config, spec, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_shifts_later_stages_and_keeps_earlier_ones() {
        let mut c = ModelConfig::tiny(64);
        c.layers = 6;
        let stages = StageSpec::split(&c, 3).unwrap();
        let g = insert_identity_stage(&c, &stages, 2, 3).unwrap();
        assert_eq!(g.config.layers, 9);
        assert_eq!(g.stages.len(), 4);
        assert_eq!(g.stages[..2], stages[..2]);
        assert_eq!(g.inserted(), 4..7);
        assert_eq!((g.stages[3].first_layer, g.stages[3].end_layer), (7, 9));
        assert!(g.stages[3].head && !g.stages[2].head && !g.stages[2].embed);
        assert_eq!(g.from, vec![Some(0), Some(1), None, Some(2)]);
        assert!(insert_identity_stage(&c, &stages, 0, 1).is_err());
        assert!(insert_identity_stage(&c, &stages, 3, 1).is_err());
        assert!(insert_identity_stage(&c, &stages, 1, 0).is_err());
        assert!(insert_identity_stage(&c, &stages[..2], 1, 1).is_err());
        assert!(insert_identity_stage(&c, &[StageSpec::full(&c)], 1, 1).is_err());
    }
}
