//! Writes a seed corpus of valid messages for every fuzz target:
//! `cargo run --manifest-path fuzz/Cargo.toml --bin make-seeds -- fuzz/corpus`.
//! The `model_meta` seeds are plain JSON written here, so this needs no model crate.

use std::fs;
use std::path::Path;

use neuroshard_data::{Dtype, encode_shard};
use neuroshard_fuzz::{ALICE, BOB, sample_ops, sample_proofs, sample_slash};
use neuroshard_proof::{Canonical, Signed};
use neuroshard_train::{CompressSpec, Compressor};

fn write(root: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = root.join(target);
    fs::create_dir_all(&dir)?;
    fs::write(dir.join(name), bytes)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).unwrap_or_else(|| "corpus".into());
    let root = Path::new(&root);
    for (i, proof) in sample_proofs().iter().enumerate() {
        write(
            root,
            "proof_wire",
            &format!("proof{i}"),
            &proof.sign(&ALICE).to_bytes(),
        )?;
        write(
            root,
            "proof_payload",
            &format!("proof{i}"),
            &proof.to_canonical_bytes(),
        )?;
    }
    for (i, op) in sample_ops().iter().enumerate() {
        // First byte selects the target's mode: 0 = wire envelope, 1 = payload signed again.
        let mut wire = vec![0];
        wire.extend(op.sign(&ALICE).to_bytes());
        write(root, "ledger_op", &format!("wire{i}"), &wire)?;
        let mut payload = vec![1];
        payload.extend(op.to_canonical_bytes());
        write(root, "ledger_op", &format!("payload{i}"), &payload)?;
    }
    let report = sample_slash();
    let mut wire = vec![0];
    wire.extend(Signed::sign(&BOB, &report).to_bytes());
    write(root, "ledger_slash", "wire", &wire)?;
    let mut payload = vec![1];
    payload.extend(report.to_canonical_bytes());
    write(root, "ledger_slash", "payload", &payload)?;

    let delta: Vec<f32> = (0..300)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.01)
        .collect();
    for spec in [
        "topk:0.1:fp32:chunk=64",
        "topk:0.25:int8:chunk=100",
        "randk:0.25:int2:chunk=50",
        "randk:0.5:sign:chunk=128",
        "topk:0.1:fp32:chunk=128:dct",
        "topk:1:int8:chunk=300",
    ] {
        let spec: CompressSpec = spec.parse()?;
        let msg = Compressor::with_seed(spec, delta.len(), 5).compress(&delta)?;
        // First two bytes: the expected length, little-endian.
        let mut seed = (delta.len() as u16).to_le_bytes().to_vec();
        seed.extend(msg);
        write(
            root,
            "train_compressed",
            &spec.to_string().replace(':', "_"),
            &seed,
        )?;
    }

    let tokens: Vec<u32> = (0..64).map(|i| i * 7 % 300).collect();
    write(
        root,
        "data_shard",
        "u16",
        &encode_shard(&tokens, Dtype::U16)?,
    )?;
    write(
        root,
        "data_shard",
        "u32",
        &encode_shard(&tokens, Dtype::U32)?,
    )?;
    let manifest = neuroshard_fuzz::sample_manifest(&tokens)?;
    write(root, "data_manifest", "manifest.json", &manifest)?;

    let meta = serde_json::json!({
        "format": "neuroshard-checkpoint",
        "version": 1,
        "model": {"layers": 4, "d_model": 256, "heads": 4, "kv_heads": 4, "ffn": 688,
                  "vocab": 300, "max_seq": 256, "tie_embeddings": false,
                  "rope_theta": 10000.0, "norm_eps": 1e-6},
        "stage": {"first_layer": 0, "end_layer": 4, "embed": true, "head": true},
        "step": 12,
        "model_hash": "ab".repeat(32),
        "optimizer": null,
        "extra": {"round": 3}
    });
    write(
        root,
        "model_meta",
        "meta.json",
        &serde_json::to_vec_pretty(&meta)?,
    )?;
    Ok(())
}
