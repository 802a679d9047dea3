//! Checkpoints round-trip exactly and refuse anything that does not match.

mod common;

use std::collections::HashMap;

use neuroshard_model::{AdamWConfig, Trainer, checkpoint};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

fn trained(dir: &std::path::Path) -> Trainer {
    let mut trainer = Trainer::new(common::small_config(40), AdamWConfig::default(), 3).unwrap();
    let batch = common::random_batch(&mut common::rng(1), 40, 2, 8);
    trainer.step(&batch).unwrap();
    checkpoint::save(
        dir,
        &trainer.stage,
        Some(&trainer.optimizer),
        1,
        serde_json::json!({}),
    )
    .unwrap();
    trainer
}

/// Rewrites model.safetensors through `edit`, which may drop, reshape or retype tensors.
fn rewrite(
    dir: &std::path::Path,
    edit: impl Fn(&str, Vec<usize>, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let path = dir.join(checkpoint::MODEL_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in file.tensors() {
        if let Some(t) = edit(&name, view.shape().to_vec(), view.data().to_vec()) {
            kept.push((name, t));
        }
    }
    let views: Vec<(String, TensorView)> = kept
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let data = safetensors::serialize(views, None::<HashMap<String, String>>).unwrap();
    std::fs::write(&path, data).unwrap();
}

#[test]
fn round_trip_restores_weights_and_optimizer_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = trained(dir.path());
    let loaded = checkpoint::load(dir.path()).unwrap();
    assert_eq!(loaded.stage.model_hash(), trainer.stage.model_hash());
    let mut resumed = Trainer::resume(
        loaded.stage,
        loaded.optimizer.unwrap(),
        loaded.meta.architecture,
    );
    assert_eq!(resumed.optimizer, trainer.optimizer);
    // The next step from the checkpoint equals the next step of the original run, bit for bit.
    let batch = common::random_batch(&mut common::rng(2), 40, 2, 8);
    let a = trainer.step(&batch).unwrap();
    let b = resumed.step(&batch).unwrap();
    assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    assert_eq!(trainer.stage.model_hash(), resumed.stage.model_hash());
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    trained(dir.path());
    rewrite(dir.path(), |name, shape, data| {
        (name != "model.layers.1.mlp.up_proj.weight").then_some((Dtype::F32, shape, data))
    });
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("missing tensor model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
}

#[test]
fn wrong_shape_and_dtype_are_named() {
    let dir = tempfile::tempdir().unwrap();
    trained(dir.path());
    rewrite(dir.path(), |name, shape, data| {
        if name == "model.norm.weight" {
            Some((Dtype::F32, vec![shape[0] / 2, 2], data))
        } else {
            Some((Dtype::F32, shape, data))
        }
    });
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("model.norm.weight has shape [32, 2]"), "{err}");

    trained(dir.path());
    rewrite(dir.path(), |name, shape, data| {
        if name == "model.norm.weight" {
            Some((Dtype::I32, shape, data))
        } else {
            Some((Dtype::F32, shape, data))
        }
    });
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("dtype I32, expected F32"), "{err}");
}

#[test]
fn altered_values_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    trained(dir.path());
    rewrite(dir.path(), |name, shape, mut data| {
        if name == "model.embed_tokens.weight" {
            data[7] ^= 0x40;
        }
        Some((Dtype::F32, shape, data))
    });
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("hash"), "{err}");

    std::fs::write(dir.path().join(checkpoint::MODEL_FILE), b"truncated").unwrap();
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a safetensors file"), "{err}");

    std::fs::write(dir.path().join(checkpoint::META_FILE), b"{").unwrap();
    assert!(checkpoint::load(dir.path()).is_err());
    let empty = tempfile::tempdir().unwrap();
    let err = checkpoint::load(empty.path()).unwrap_err().to_string();
    assert!(err.contains("meta.json"), "{err}");
}
