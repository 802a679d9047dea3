//! Each input format builds, and the tokens decode back to the input documents.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use common::build_ok;
use neuroshard_data::{BuildError, BuildOptions, Genesis, NoProgress, Split, build, verify_dir};
use neuroshard_proof::Identity;
use parquet::arrow::ArrowWriter;

fn docs() -> Vec<String> {
    (0..60)
        .map(|i| {
            format!(
                "Document {i}: the quick brown fox jumps over the lazy dog {} times.\n\
                 Ünïcödé line {i} — ☃ — and some more words to merge.",
                i * 7
            )
        })
        .collect()
}

/// Every document decoded from the built shards (split on end-of-text), sorted.
fn decoded_documents(dir: &Path) -> Vec<String> {
    let g = Genesis::open(dir).unwrap();
    let eos = g.tokenizer().eos_id();
    let mut out = Vec::new();
    for split in [Split::Train, Split::Val] {
        let mut stream = Vec::new();
        for s in 0..g.shard_count(split) {
            stream.extend(g.shard_tokens(split, s).unwrap());
        }
        assert_eq!(stream.last(), Some(&eos), "{split} stream ends a document");
        for doc in stream.split(|&t| t == eos).filter(|d| !d.is_empty()) {
            out.push(g.tokenizer().decode(doc).unwrap());
        }
    }
    out.sort();
    out
}

fn opts(inputs: Vec<PathBuf>, out: PathBuf) -> BuildOptions {
    BuildOptions {
        inputs,
        vocab: 400,
        shard_tokens: 500,
        val_fraction: 0.1,
        ..BuildOptions::new(out)
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn txt_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(input.join("nested/deeper")).unwrap();
    for (i, d) in docs().iter().enumerate() {
        let sub = if i % 3 == 0 { "nested/deeper" } else { "" };
        std::fs::write(input.join(sub).join(format!("{i:03}.txt")), d).unwrap();
    }
    let out = tmp.path().join("out");
    let m = build_ok(&opts(vec![input], out.clone())).manifest;
    assert_eq!(m.stats.documents.train + m.stats.documents.val, 60);
    assert!(m.stats.documents.val >= 1);
    assert!(m.entropy_floor.is_none());
    verify_dir(&out).unwrap();
    assert_eq!(decoded_documents(&out), sorted(docs()));
}

#[test]
fn jsonl_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("d.jsonl");
    let lines: Vec<String> = docs()
        .iter()
        .enumerate()
        .map(|(i, d)| serde_json::json!({"id": i, "text": d, "meta": {"x": 1}}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = tmp.path().join("out");
    build_ok(&opts(vec![path], out.clone()));
    verify_dir(&out).unwrap();
    assert_eq!(decoded_documents(&out), sorted(docs()));
}

#[test]
fn parquet_file_written_by_the_test() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("fineweb-like.parquet");
    let texts = docs();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..texts.len() as i64));
    let text: ArrayRef = Arc::new(StringArray::from_iter_values(texts.iter()));
    let batch = RecordBatch::try_new(schema.clone(), vec![ids, text]).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
    // Two record batches so the reader crosses a batch boundary.
    w.write(&batch.slice(0, 25)).unwrap();
    w.write(&batch.slice(25, 35)).unwrap();
    w.close().unwrap();

    let out = tmp.path().join("out");
    build_ok(&opts(vec![path.clone()], out.clone()));
    verify_dir(&out).unwrap();
    assert_eq!(decoded_documents(&out), sorted(docs()));

    // A Parquet file without a text column is a clear error.
    let bad = tmp.path().join("no-text.parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..3));
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&bad).unwrap(), schema.clone(), None).unwrap();
    w.write(&RecordBatch::try_new(schema, vec![ids]).unwrap())
        .unwrap();
    w.close().unwrap();
    let err = build(
        &opts(vec![bad], tmp.path().join("o2")),
        &Identity::generate(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no \"text\" column"), "{err}");
}

#[test]
fn mixed_inputs_and_skip_bad() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let d = docs();
    for (i, text) in d.iter().take(30).enumerate() {
        std::fs::write(input.join(format!("{i:03}.txt")), text).unwrap();
    }
    std::fs::write(input.join("zz-bad.txt"), b"fine until \xff here").unwrap();
    let jsonl = tmp.path().join("more.jsonl");
    let mut body: Vec<String> = d[30..]
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    body.insert(3, "{\"text\": 5}".into());
    body.insert(7, "{broken".into());
    std::fs::write(&jsonl, body.join("\n")).unwrap();

    // Without --skip-bad the first bad document stops the build, naming file and position.
    let err = build(
        &opts(vec![input.clone(), jsonl.clone()], tmp.path().join("o1")),
        &Identity::generate(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, BuildError::Ingest(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("zz-bad.txt") && msg.contains("byte offset 11"),
        "{msg}"
    );

    let mut o = opts(vec![input, jsonl], tmp.path().join("o2"));
    o.skip_bad = true;
    let m = build_ok(&o).manifest;
    assert_eq!(m.stats.skipped_documents, 3);
    assert_eq!(m.stats.documents.train + m.stats.documents.val, 60);
    assert_eq!(decoded_documents(&tmp.path().join("o2")), sorted(d));
}

#[test]
fn builds_are_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("d.jsonl");
    let lines: Vec<String> = docs()
        .iter()
        .map(|d| serde_json::json!({ "text": d }).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let a = build_ok(&opts(vec![path.clone()], tmp.path().join("a"))).manifest;
    let b = build_ok(&opts(vec![path], tmp.path().join("b"))).manifest;
    // Same data, same tokenizer, same shards: the dataset identity matches across builders.
    assert_eq!(a.merkle_root, b.merkle_root);
    assert_eq!(a.tokenizer, b.tokenizer);
    assert_ne!(a.builder, b.builder);
}

/// Builds from three plays of the real corpus (skipped, loudly, when it is absent).
#[test]
fn shakespeare_subset() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/shakespeare");
    if !corpus.is_dir() {
        eprintln!(
            "SKIPPED shakespeare_subset: corpus not found at {}",
            corpus.display()
        );
        return;
    }
    let plays = ["macbeth.txt", "othello.txt", "julius_caesar.txt"];
    let inputs: Vec<PathBuf> = plays.iter().map(|p| corpus.join(p)).collect();
    if let Some(missing) = inputs.iter().find(|p| !p.is_file()) {
        panic!("corpus folder exists but {} is missing", missing.display());
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = BuildOptions {
        inputs: inputs.clone(),
        vocab: 1024,
        shard_tokens: 50_000,
        ..BuildOptions::new(out.clone())
    };
    let m = build_ok(&o).manifest;
    // Three documents: the fallback puts exactly one play in validation.
    assert_eq!(m.stats.documents.val, 1);
    assert_eq!(m.stats.documents.train, 2);
    verify_dir(&out).unwrap();
    let g = Genesis::open(&out).unwrap();
    assert_eq!(g.vocab_size(), 1024);
    let mut originals: Vec<String> = inputs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    originals.sort();
    assert_eq!(decoded_documents(&out), originals);
    // Bits per byte bookkeeping: token byte lengths add up to the text bytes.
    let lens = g.tokenizer().token_byte_lengths();
    let mut bytes = 0u64;
    for split in [Split::Train, Split::Val] {
        for s in 0..g.shard_count(split) {
            bytes += g
                .shard_tokens(split, s)
                .unwrap()
                .iter()
                .map(|&t| u64::from(lens[t as usize]))
                .sum::<u64>();
        }
    }
    assert_eq!(bytes, m.stats.text_bytes);
}
