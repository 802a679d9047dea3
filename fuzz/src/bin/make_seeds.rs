//! Writes a seed corpus of valid messages for every fuzz target into the directory named by
//! the first argument (default `corpus`), then exits: `make-seeds fuzz/corpus`.
//!
//! It is built like the targets, by `cargo fuzz build`, because a plain binary cannot link
//! against crates built with coverage instrumentation; so it is a libFuzzer binary whose
//! initialisation does the work and exits before any fuzzing. The `model_meta` seeds are plain
//! JSON written here, so this needs no model crate.
#![no_main]

use std::fs;
use std::path::Path;

use neuroshard_data::{Dtype, encode_shard};
use neuroshard_fuzz::{ALICE, sample_ops, sample_proofs};
use neuroshard_proof::{Canonical, Signed};
use neuroshard_train::lowrank::{self, Basis, Layout, Matrix};
use neuroshard_train::{CompressSpec, Compressor, ValueCoding};

fn write(root: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = root.join(target);
    fs::create_dir_all(&dir)?;
    fs::write(dir.join(name), bytes)
}

libfuzzer_sys::fuzz_target!(
    init: {
        let root = std::env::args().nth(1).unwrap_or_else(|| "corpus".into());
        let code = match write_all(Path::new(&root)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("make-seeds: {e}");
                1
            }
        };
        exit(code);
    },
    |_data: &[u8]| {}
);

/// Ends the process before libFuzzer starts (a `()` function, so the macro's fuzzing code
/// after the init block does not read as unreachable).
fn exit(code: i32) {
    std::process::exit(code)
}

fn write_all(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
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

    // Low-rank offers on the fuzz target's fixed layout: a 16 × 16 matrix, the rest dense.
    for (rank, coding) in [
        (2usize, ValueCoding::Int8),
        (3, ValueCoding::F32),
        (4, ValueCoding::Int2),
        (1, ValueCoding::Sign),
    ] {
        let matrix = Matrix {
            offset: 0,
            rows: 16,
            cols: 16,
        };
        let layout = Layout::new(delta.len(), &[matrix], rank)?;
        let basis = Basis::for_round(&layout, rank, None, 1, 0)?;
        let (msg, _) = lowrank::encode(&layout, &basis, coding, &delta)?;
        let mut seed = (delta.len() as u16).to_le_bytes().to_vec();
        seed.extend(msg);
        write(root, "train_compressed", &format!("lowrank_{rank}"), &seed)?;
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
    for (i, seed) in neuroshard_fuzz::sample_audit().iter().enumerate() {
        write(root, "audit_evidence", &format!("mode{i}"), seed)?;
    }
    for (i, seed) in neuroshard_fuzz::sample_finality().iter().enumerate() {
        write(root, "finality_wire", &format!("msg{i}"), seed)?;
    }
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
    #[cfg(feature = "net")]
    net_seeds(root)?;
    #[cfg(feature = "node")]
    node_seeds(root)?;
    Ok(())
}

/// `mode || payload`: the first byte selects what a target does with the rest.
fn moded(mode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend_from_slice(payload);
    out
}

#[cfg(feature = "net")]
fn net_seeds(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use neuroshard_fuzz::net::BLOB;
    use neuroshard_net::fuzzing::{blob_request, peer_bytes_of, write_frame};

    let mut stream = vec![0, 16];
    for frame in [&b"hello"[..], &[], &[7; 200]] {
        stream.extend(write_frame(frame, 256)?);
    }
    write(root, "net_frame", "frames", &stream)?;
    let hash = *blake3::hash(BLOB).as_bytes();
    for index in [0, 1] {
        write(
            root,
            "net_frame",
            &format!("request{index}"),
            &moded(1, &blob_request(&hash, index)),
        )?;
    }
    let mut response = vec![0];
    response.extend((BLOB.len() as u64).to_be_bytes());
    response.extend(BLOB);
    write(
        root,
        "net_frame",
        "fetch",
        &moded(2, &write_frame(&response, usize::MAX)?),
    )?;
    let peer = peer_bytes_of(&ALICE.public_key().to_bytes())?;
    write(root, "net_frame", "peer", &moded(3, &peer))?;
    Ok(())
}

#[cfg(feature = "node")]
fn node_seeds(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use neuroshard_fuzz::node::*;

    for (i, m) in sample_msgs().iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("msg{i}"),
            &m.to_canonical_bytes(),
        )?;
    }
    let (requests, answers) = sample_pipe();
    for (i, r) in requests.iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("pipe{i}"),
            &r.to_canonical_bytes(),
        )?;
    }
    for (i, a) in answers.iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("answer{i}"),
            &a.to_canonical_bytes(),
        )?;
    }
    for (i, a) in sample_acks().iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("ack{i}"),
            &a.to_canonical_bytes(),
        )?;
    }
    let (infer, replies) = sample_infer();
    for (i, m) in infer.iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("infer{i}"),
            &m.to_canonical_bytes(),
        )?;
    }
    for (i, r) in replies.iter().enumerate() {
        write(
            root,
            "node_wire",
            &format!("reply{i}"),
            &r.to_canonical_bytes(),
        )?;
    }
    for (i, m) in sample_sync().iter().enumerate() {
        let wire = Signed::sign(&ALICE, m).to_bytes();
        write(root, "node_sync", &format!("wire{i}"), &moded(0, &wire))?;
        let payload = m.to_canonical_bytes();
        write(
            root,
            "node_sync",
            &format!("payload{i}"),
            &moded(1, &payload),
        )?;
    }
    let theta = sample_theta_record();
    let wire = Signed::sign(&ALICE, &theta).to_bytes();
    write(root, "node_sync", "theta_wire", &moded(0, &wire))?;
    let payload = theta.to_canonical_bytes();
    write(root, "node_sync", "theta_payload", &moded(1, &payload))?;

    let hb = sample_heartbeat();
    let node = sample_node_record();
    let net = sample_network_genesis();
    write(
        root,
        "node_records",
        "hb_wire",
        &moded(0, &Signed::sign(&ALICE, &hb).to_bytes()),
    )?;
    write(
        root,
        "node_records",
        "node_wire",
        &moded(0, &Signed::sign(&ALICE, &node).to_bytes()),
    )?;
    write(
        root,
        "node_records",
        "net_wire",
        &moded(0, &Signed::sign(&ALICE, &net).to_bytes()),
    )?;
    write(
        root,
        "node_records",
        "hb",
        &moded(1, &hb.to_canonical_bytes()),
    )?;
    write(
        root,
        "node_records",
        "node",
        &moded(2, &node.to_canonical_bytes()),
    )?;
    write(
        root,
        "node_records",
        "net",
        &moded(3, &net.to_canonical_bytes()),
    )?;

    let request = sample_sync_request().to_canonical_bytes();
    write(root, "ledger_sync", "request", &moded(0, &request))?;
    let response = sample_sync_response().to_canonical_bytes();
    write(root, "ledger_sync", "response", &moded(1, &response))?;

    if let Some(outer) = sample_outer() {
        write(root, "replica_state", "outer_mean", &moded(0, &outer))?;
        write(root, "replica_state", "outer_median", &moded(2, &outer))?;
    }
    if let Some(adamw) = sample_adamw() {
        write(root, "replica_state", "adamw", &moded(1, &adamw))?;
    }
    Ok(())
}
