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

/// Checkpoints of the replica of each stage with the most steps, from clean `stopped` events.
fn best_replicas(
    members: &[Member],
    stages: usize,
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
        let entry = best.entry(*stage).or_insert((0, PathBuf::new()));
        if entry.1.as_os_str().is_empty() || *step > entry.0 {
            *entry = (*step, PathBuf::from(checkpoint));
        }
    }
    if best.len() != stages {
        return Err(SwarmError::MissingStages {
            have: best.keys().copied().collect(),
            stages,
        });
    }
    Ok(best.into_iter().map(|(s, (_, p))| (s, p)).collect())
}

fn checkpoint_error(dir: &Path, message: impl ToString) -> SwarmError {
    SwarmError::Checkpoint {
        dir: dir.to_path_buf(),
        message: message.to_string(),
    }
}

/// Merges the best replica of every stage into one checkpoint in `out`, with the tokenizer.
pub fn assemble(
    members: &[Member],
    config: &ModelConfig,
    out: &Path,
    genesis: &Genesis,
    stages: usize,
) -> Result<Assembly, SwarmError> {
    let best = best_replicas(members, stages)?;
    let mut values: HashMap<String, Vec<f32>> = HashMap::new();
    let mut step = 0;
    for dir in best.values() {
        let ck = checkpoint::load(dir).map_err(|e| checkpoint_error(dir, e))?;
        if ck.meta.model != *config {
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
            values.insert(spec.name.clone(), v.clone());
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
    });
    let meta = checkpoint::save(out, &stage, None, step, extra)?;
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
