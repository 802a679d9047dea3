//! The whole model put together from the best saved replica of every stage.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use neuroshard_data::Genesis;
use neuroshard_model::{ModelConfig, ParamSet, SpecialTokens, Stage, StageSpec, checkpoint};
use neuroshard_node::events::NodeEvent;
use serde_json::json;

use crate::{Member, SwarmError};

/// The assembled model and where it came from.
pub struct Assembly {
    pub stage: Stage,
    pub out: PathBuf,
    pub model_hash: String,
    /// Stage → the checkpoint it was taken from.
    pub sources: BTreeMap<usize, String>,
}

/// Checkpoints of the replica of each of `stages` with the most steps, from clean `stopped`
/// events.
fn best_replicas(
    members: &[Member],
    stages: &[usize],
) -> Result<BTreeMap<usize, PathBuf>, SwarmError> {
    let mut best: BTreeMap<usize, (u64, PathBuf)> = BTreeMap::new();
    for m in members {
        let Some(NodeEvent::Stopped {
            stage,
            step,
            checkpoint,
            error: None,
            ..
        }) = &m.stopped
        else {
            continue;
        };
        if !stages.contains(stage) {
            continue;
        }
        let entry = best.entry(*stage).or_insert((0, PathBuf::new()));
        if entry.1.as_os_str().is_empty() || *step > entry.0 {
            *entry = (*step, PathBuf::from(checkpoint));
        }
    }
    if best.len() != stages.len() {
        return Err(SwarmError::MissingStages {
            have: best.keys().copied().collect(),
            stages: stages.len(),
        });
    }
    Ok(best.into_iter().map(|(s, (_, p))| (s, p)).collect())
}

/// Each block's place in the assembled model: block `block_order[i]` goes to place `i`.
fn places(layout: &neuroshard_node::layout::Layout) -> HashMap<usize, usize> {
    layout
        .block_order()
        .into_iter()
        .enumerate()
        .map(|(pos, block)| (block, pos))
        .collect()
}

/// `model.layers.{block}.…` under the block's place in the pipeline; other names as they are.
fn renamed(name: &str, place: &HashMap<usize, usize>) -> String {
    const PREFIX: &str = "model.layers.";
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return name.to_string();
    };
    let Some((block, tail)) = rest.split_once('.') else {
        return name.to_string();
    };
    match block.parse::<usize>().ok().and_then(|b| place.get(&b)) {
        Some(pos) => format!("{PREFIX}{pos}.{tail}"),
        None => name.to_string(),
    }
}

fn checkpoint_error(dir: &Path, message: impl ToString) -> SwarmError {
    SwarmError::Checkpoint {
        dir: dir.to_path_buf(),
        message: message.to_string(),
    }
}

/// Merges the best replica of every stage into one checkpoint in `out`, with the tokenizer.
/// A network that grew is assembled as the newest version a driver trained (`trained`: its
/// version and stages in pipeline order as (id, blocks)): each stage's blocks keep the names
/// of their stage id's range, so they are renamed to their place in the pipeline.
pub fn assemble(
    members: &[Member],
    config: &ModelConfig,
    out: &Path,
    genesis: &Genesis,
    stages: usize,
    trained: &[crate::architecture::Trained],
) -> Result<Assembly, SwarmError> {
    use neuroshard_node::layout::Layout;
    let base = Layout::fixed(config, stages).map_err(|e| checkpoint_error(out, e))?;
    // The growth history the checkpoint carries: per version trained, the blocks it added
    // (those past the previous version's indices) at their places in its pipeline.
    let mut layout = base;
    let mut history = Vec::new();
    for (version, step, order) in trained {
        let view = neuroshard_node::records::ArchView {
            version: *version,
            stages: order
                .iter()
                .map(|&(id, b)| (id, u32::try_from(b).unwrap_or(u32::MAX)))
                .collect(),
        };
        let next =
            Layout::of(config, &view.architecture(config)).map_err(|e| checkpoint_error(out, e))?;
        let from_layers = layout.model().layers;
        history.push(neuroshard_model::grow::Growth {
            step: *step,
            from_layers,
            to_layers: next.model().layers,
            inserted: next
                .block_order()
                .iter()
                .enumerate()
                .filter(|(_, b)| **b >= from_layers)
                .map(|(pos, _)| pos)
                .collect(),
            ffn: None,
        });
        layout = next;
    }
    let architecture = neuroshard_model::grow::Architecture {
        version: u32::try_from(history.len()).unwrap_or(u32::MAX),
        history,
    };
    let best = best_replicas(members, layout.order())?;
    let place = places(&layout);
    let config = layout.model();
    let mut values: HashMap<String, Vec<f32>> = HashMap::new();
    let mut step = 0;
    for dir in best.values() {
        let ck = checkpoint::load(dir).map_err(|e| checkpoint_error(dir, e))?;
        // A stage's config is the genesis model deep enough for its block indices.
        let same_model = ModelConfig {
            layers: config.layers,
            ..ck.meta.model.clone()
        } == *config;
        if !same_model {
            return Err(checkpoint_error(dir, "holds another model"));
        }
        step = step.max(ck.meta.step);
        let mut params = ck.stage.params().clone();
        // With DiLoCo the stage's model is its θ₀, the point every honest replica agrees on.
        if let Ok(bytes) = std::fs::read(dir.join(neuroshard_node::compute::DILOCO_FILE)) {
            let (round, theta) = neuroshard_node::replica::outer_theta(&bytes, params.numel())
                .map_err(|e| checkpoint_error(dir, e))?;
            if round > 0 {
                params.set_flat(&theta)?;
            }
        }
        for (spec, v) in params.specs().iter().zip(params.values()) {
            values.insert(renamed(&spec.name, &place), v.clone());
        }
    }
    let full = StageSpec::full(config);
    let specs = full.param_specs(config);
    let ordered = specs
        .iter()
        .map(|s| {
            values
                .remove(&s.name)
                .ok_or_else(|| checkpoint_error(out, format!("no replica saved {}", s.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let stage = Stage::from_params(config.clone(), full, ParamSet::from_values(specs, ordered)?)?;
    let tok = genesis.tokenizer();
    let special = SpecialTokens {
        bos: Some(tok.bos_id()),
        eos: Some(tok.eos_id()),
        pad: Some(tok.pad_id()),
    };
    let sources: BTreeMap<usize, String> = best
        .iter()
        .map(|(s, p)| (*s, p.display().to_string()))
        .collect();
    let extra = json!({
        "tokens": special,
        "dataset": { "root": hex::encode(genesis.root()), "name": genesis.manifest().name },
        "assembled_from": sources,
        // The network's version (its growth history above counts only versions trained).
        "network_architecture_version": trained.last().map_or(0, |t| t.0),
    });
    let meta = checkpoint::save_with_architecture(out, &stage, None, step, &architecture, extra)?;
    let tokenizer = out.join(checkpoint::TOKENIZER_FILE);
    std::fs::copy(genesis.tokenizer_path(), &tokenizer)
        .map_err(|e| SwarmError::io(&tokenizer, e))?;
    Ok(Assembly {
        stage,
        out: out.to_path_buf(),
        model_hash: meta.model_hash,
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 1 of a 2-stage, 4-block model with a stage of 4 new blocks between the two:
    /// the head's blocks 2 and 3 sit after the new ones (named 4 to 7) in the pipeline.
    #[test]
    fn blocks_are_renamed_to_their_place_in_the_grown_pipeline() {
        let mut config = ModelConfig::tiny(64);
        config.layers = 4;
        let view = neuroshard_node::records::ArchView {
            version: 1,
            stages: vec![(0, 2), (2, 4), (1, 2)],
        };
        let layout = neuroshard_node::layout::Layout::of(&config, &view.architecture(&config))
            .expect("layout");
        let place = places(&layout);
        let r = |n: &str| renamed(n, &place);
        assert_eq!(
            r("model.layers.1.mlp.down_proj.weight"),
            "model.layers.1.mlp.down_proj.weight"
        );
        assert_eq!(
            r("model.layers.4.self_attn.o_proj.weight"),
            "model.layers.2.self_attn.o_proj.weight"
        );
        assert_eq!(
            r("model.layers.7.input_layernorm.weight"),
            "model.layers.5.input_layernorm.weight"
        );
        assert_eq!(
            r("model.layers.2.mlp.up_proj.weight"),
            "model.layers.6.mlp.up_proj.weight"
        );
        assert_eq!(
            r("model.layers.3.mlp.up_proj.weight"),
            "model.layers.7.mlp.up_proj.weight"
        );
        assert_eq!(r("model.norm.weight"), "model.norm.weight");
        assert_eq!(r("lm_head.weight"), "lm_head.weight");
    }
}
