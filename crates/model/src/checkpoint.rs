//! Checkpoints: safetensors for weights and optimizer moments, JSON metadata beside them.
//!
//! Layout of a checkpoint directory:
//! - `model.safetensors`: the stage's parameters under their canonical names (f32);
//! - `optimizer.safetensors` (optional): AdamW moments as `m.<name>` and `v.<name>`;
//! - `meta.json`: format version, model config, architecture version and growth history, stage
//!   spec, step counters, optimizer config and the model hash, written last so its presence marks a complete checkpoint.
//!
//! Every file is written to a temporary name, fsynced and renamed, so a crash leaves either the
//! old checkpoint or the new one. Loading checks names, shapes, dtypes and the model hash.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::grow::Architecture;
use crate::optim::{AdamW, AdamWConfig};
use crate::params::{ParamSet, ParamSpec, StageSpec};
use crate::stage::Stage;

pub const FORMAT: &str = "neuroshard-checkpoint";
pub const VERSION: u32 = 1;
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const META_FILE: &str = "meta.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Metadata stored in `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub format: String,
    pub version: u32,
    pub model: ModelConfig,
    /// Version of the model's shape and how it grew; absent (version 0) in checkpoints
    /// written before growth existed.
    #[serde(default)]
    pub architecture: Architecture,
    pub stage: StageSpec,
    /// Training steps taken by the run that wrote it.
    pub step: u64,
    /// Hex BLAKE3 of the parameters ([`ParamSet::hash`]).
    pub model_hash: String,
    #[serde(default)]
    pub optimizer: Option<OptimizerMeta>,
    /// Free-form state of higher layers (DiLoCo round, data position, …).
    #[serde(default)]
    pub extra: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerMeta {
    pub config: AdamWConfig,
    pub step: u64,
}

/// A loaded checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub stage: Stage,
    pub optimizer: Option<AdamW>,
}

/// Writes `stage` (and the optimizer, if given) to `dir`, creating it if needed, as
/// architecture version 0 (a model that never grew).
pub fn save(
    dir: &Path,
    stage: &Stage,
    optimizer: Option<&AdamW>,
    step: u64,
    extra: serde_json::Value,
) -> Result<CheckpointMeta, ModelError> {
    save_with_architecture(dir, stage, optimizer, step, &Architecture::default(), extra)
}

/// [`save`] for a model with a growth history.
pub fn save_with_architecture(
    dir: &Path,
    stage: &Stage,
    optimizer: Option<&AdamW>,
    step: u64,
    architecture: &Architecture,
    extra: serde_json::Value,
) -> Result<CheckpointMeta, ModelError> {
    architecture.validate(stage.config().layers, stage.config().ffn)?;
    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let params = stage.params();
    let names: Vec<&str> = params.specs().iter().map(|s| s.name.as_str()).collect();
    let bytes: Vec<Vec<u8>> = params.values().iter().map(|v| le_bytes(v)).collect();
    write_tensors(&dir.join(MODEL_FILE), params.specs(), &names, &bytes)?;
    let optimizer_meta = match optimizer {
        Some(opt) => {
            let (m, v) = opt.moments();
            let mut specs = Vec::new();
            let mut names = Vec::new();
            let mut bytes = Vec::new();
            for (prefix, state) in [("m", m), ("v", v)] {
                for (spec, values) in params.specs().iter().zip(state) {
                    specs.push(spec.clone());
                    names.push(format!("{prefix}.{}", spec.name));
                    bytes.push(le_bytes(values));
                }
            }
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            write_tensors(&dir.join(OPTIMIZER_FILE), &specs, &names, &bytes)?;
            Some(OptimizerMeta {
                config: opt.config.clone(),
                step: opt.step_count(),
            })
        }
        None => None,
    };
    let meta = CheckpointMeta {
        format: FORMAT.into(),
        version: VERSION,
        model: stage.config().clone(),
        architecture: architecture.clone(),
        stage: *stage.spec(),
        step,
        model_hash: hex::encode(stage.model_hash()),
        optimizer: optimizer_meta,
        extra,
    };
    let json = serde_json::to_vec_pretty(&meta)
        .map_err(|e| ModelError::Checkpoint(format!("encoding metadata: {e}")))?;
    write_atomic(&dir.join(META_FILE), &json)?;
    Ok(meta)
}

/// Reads only the metadata of a checkpoint.
pub fn read_meta(dir: &Path) -> Result<CheckpointMeta, ModelError> {
    let path = dir.join(META_FILE);
    let bytes = fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
    parse_meta(&bytes).map_err(|e| match e {
        ModelError::Checkpoint(msg) => ModelError::Checkpoint(format!("{}: {msg}", path.display())),
        other => other,
    })
}

/// Parses and validates `meta.json` bytes (format, version, model shape, stage).
pub fn parse_meta(bytes: &[u8]) -> Result<CheckpointMeta, ModelError> {
    let meta: CheckpointMeta =
        serde_json::from_slice(bytes).map_err(|e| ModelError::Checkpoint(e.to_string()))?;
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(ModelError::Checkpoint(format!(
            "format {} v{} is not {FORMAT} v{VERSION}",
            meta.format, meta.version
        )));
    }
    meta.model.validate()?;
    meta.architecture
        .validate(meta.model.layers, meta.model.ffn)?;
    meta.stage.validate(&meta.model)?;
    Ok(meta)
}

/// Loads and fully validates a checkpoint.
pub fn load(dir: &Path) -> Result<Checkpoint, ModelError> {
    let meta = read_meta(dir)?;
    let specs = meta.stage.param_specs(&meta.model);
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let values = read_tensors(&dir.join(MODEL_FILE), &specs, &names)?;
    let params = ParamSet::from_values(specs.clone(), values)?;
    let hash = hex::encode(params.hash());
    if hash != meta.model_hash {
        return Err(ModelError::Checkpoint(format!(
            "{}: parameters hash to {hash}, metadata says {}",
            dir.join(MODEL_FILE).display(),
            meta.model_hash
        )));
    }
    let optimizer = match &meta.optimizer {
        Some(om) => {
            let mut all_specs = specs.clone();
            all_specs.extend(specs.iter().cloned());
            let names: Vec<String> = ["m", "v"]
                .iter()
                .flat_map(|p| specs.iter().map(move |s| format!("{p}.{}", s.name)))
                .collect();
            let mut state = read_tensors(&dir.join(OPTIMIZER_FILE), &all_specs, &names)?;
            let v = state.split_off(specs.len());
            Some(AdamW::from_state(
                om.config.clone(),
                &params,
                om.step,
                state,
                v,
            )?)
        }
        None => None,
    };
    let stage = Stage::from_params(meta.model.clone(), meta.stage, params)?;
    Ok(Checkpoint {
        meta,
        stage,
        optimizer,
    })
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write_tensors(
    path: &Path,
    specs: &[ParamSpec],
    names: &[&str],
    bytes: &[Vec<u8>],
) -> Result<(), ModelError> {
    let views = specs
        .iter()
        .zip(names)
        .zip(bytes)
        .map(|((spec, name), b)| {
            TensorView::new(Dtype::F32, spec.shape.clone(), b)
                .map(|view| (name.to_string(), view))
                .map_err(|e| ModelError::Checkpoint(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut info = HashMap::new();
    info.insert("format".to_string(), "pt".to_string());
    let data = safetensors::serialize(views, Some(info))
        .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", path.display())))?;
    write_atomic(path, &data)
}

/// Reads exactly the named tensors with the given shapes; anything else is an error.
pub(crate) fn read_tensors(
    path: &Path,
    specs: &[ParamSpec],
    names: &[String],
) -> Result<Vec<Vec<f32>>, ModelError> {
    let bytes = fs::read(path).map_err(|e| ModelError::io(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        ModelError::Checkpoint(format!("{}: not a safetensors file: {e}", path.display()))
    })?;
    let expected: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    if let Some(extra) = file.names().into_iter().find(|n| !expected.contains(n)) {
        return Err(ModelError::Checkpoint(format!(
            "{}: unexpected tensor {extra}",
            path.display()
        )));
    }
    specs
        .iter()
        .zip(names)
        .map(|(spec, name)| {
            let view = file.tensor(name).map_err(|_| {
                ModelError::Checkpoint(format!("{}: missing tensor {name}", path.display()))
            })?;
            if view.dtype() != Dtype::F32 {
                return Err(ModelError::Checkpoint(format!(
                    "{}: tensor {name} has dtype {:?}, expected F32",
                    path.display(),
                    view.dtype()
                )));
            }
            if view.shape() != spec.shape.as_slice() {
                return Err(ModelError::Checkpoint(format!(
                    "{}: tensor {name} has shape {:?}, expected {:?}",
                    path.display(),
                    view.shape(),
                    spec.shape
                )));
            }
            Ok(view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
        .collect()
}

/// Write to a temporary file, fsync, rename over the target, fsync the directory.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), ModelError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut f = fs::File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    f.write_all(data).map_err(|e| ModelError::io(&tmp, e))?;
    f.sync_all().map_err(|e| ModelError::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))?;
    if let Ok(d) = fs::File::open(dir) {
        // Directory fsync makes the rename durable; not every filesystem supports it.
        let _ = d.sync_all();
    }
    Ok(())
}
