//! The Hugging Face export: names, transposed layouts and configs.

mod common;

use neuroshard_model::{
    AdamWConfig, SpecialTokens, Stage, StageSpec, Trainer, checkpoint, export_hf,
};
use safetensors::SafeTensors;

#[test]
fn export_writes_hf_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("hf"));
    let trainer = Trainer::new(common::small_config(40), AdamWConfig::default(), 2).unwrap();
    checkpoint::save(&ckpt, &trainer.stage, None, 0, serde_json::json!({})).unwrap();
    std::fs::write(ckpt.join(checkpoint::TOKENIZER_FILE), b"{}").unwrap();
    let special = SpecialTokens {
        bos: Some(1),
        eos: Some(2),
        pad: Some(0),
    };
    let report = export_hf(&ckpt, &out, special).unwrap();
    assert!(report.tokenizer);
    assert_eq!(report.tensors, trainer.stage.params().specs().len());

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let q = file
        .tensor("model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    // Ours is [d_in = 64, d_out = 2 kv heads × 16] = [64, 32]; HF wants [out, in].
    assert_eq!(q.shape(), &[32, 64]);
    let ours = trainer
        .stage
        .params()
        .get("model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    let theirs: Vec<f32> = q
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // HF[o][i] == ours[i][o]
    assert_eq!(theirs[5 * 64 + 7], ours[7 * 32 + 5]);
    assert_eq!(file.tensor("lm_head.weight").unwrap().shape(), &[40, 64]);
    assert_eq!(
        file.tensor("model.embed_tokens.weight").unwrap().shape(),
        &[40, 64]
    );

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["num_key_value_heads"], 2);
    assert_eq!(config["eos_token_id"], 2);
    assert!(out.join("generation_config.json").is_file());
    assert!(out.join("tokenizer.json").is_file());
}

#[test]
fn export_refuses_a_single_stage() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::small_config(40);
    let spec = StageSpec::split(&config, 3).unwrap()[1];
    let stage = Stage::init(config, spec, 1).unwrap();
    checkpoint::save(dir.path(), &stage, None, 0, serde_json::json!({})).unwrap();
    let err = export_hf(dir.path(), &dir.path().join("hf"), SpecialTokens::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("whole model"), "{err}");
}
