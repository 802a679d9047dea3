//! The model commands end to end on a tiny synthetic dataset: genesis → train → eval →
//! generate → export, and their errors on bad input.

mod common;
use common::*;

#[test]
fn train_eval_generate_export() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let (model, hf) = (dir.path().join("m"), dir.path().join("hf"));

    let log = dir.path().join("log.jsonl");
    let tiny = [
        "--layers",
        "2",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--seq",
        "32",
        "--batch",
        "4",
    ];
    let mut train = vec![
        "train",
        "--data",
        s(&data),
        "--steps",
        "12",
        "--out",
        s(&model),
        "--eval-every",
        "6",
        "--json-log",
        s(&log),
        "--lr",
        "3e-3",
        "--warmup",
        "2",
    ];
    train.extend(tiny);
    ok(&train);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    let first = lines[0]["loss"].as_f64().unwrap();
    let last = lines[11]["loss"].as_f64().unwrap();
    assert!(last < first, "training loss went from {first} to {last}");
    assert!(lines[11]["val_loss"].as_f64().is_some());

    let report: serde_json::Value = serde_json::from_str(&ok(&[
        "eval",
        "--checkpoint",
        s(&model),
        "--data",
        s(&data),
        "--json",
        "--seq",
        "32",
    ]))
    .unwrap();
    let loss = report["loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0);
    assert!((report["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-6 * loss.exp());
    assert!(report["bits_per_byte"].as_f64().unwrap() > 0.0);

    let text = dir.path().join("unseen.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    let report: serde_json::Value = serde_json::from_str(&ok(&[
        "eval",
        "--checkpoint",
        s(&model),
        "--text",
        s(&text),
        "--json",
        "--seq",
        "32",
    ]))
    .unwrap();
    assert!(report["tokens"].as_u64().unwrap() > 0);
    // Every token but the first is scored once, so the bytes are the file's less the first
    // token's, and the end-of-text target is left out of bits per byte.
    let tokenizer = neuroshard_data::GenesisTokenizer::load(&model.join("tokenizer.json")).unwrap();
    let unseen = std::fs::read_to_string(&text).unwrap();
    let ids = tokenizer.encode(&unseen).unwrap();
    let first = tokenizer.token_byte_lengths()[ids[0] as usize] as usize;
    assert_eq!(
        report["bytes"].as_u64().unwrap() as usize,
        unseen.len() - first
    );
    assert_eq!(report["tokens"].as_u64().unwrap() as usize, ids.len());
    assert_eq!(report["special_tokens"].as_u64(), Some(1));
    let bpb = report["bits_per_byte"].as_f64().unwrap();
    assert!(bpb.is_finite() && bpb > 0.0, "{report}");

    let out = ok(&[
        "generate",
        "--checkpoint",
        s(&model),
        "--prompt",
        "the",
        "--max-tokens",
        "5",
        "--seed",
        "1",
    ]);
    assert!(out.starts_with("the"), "{out}");
    let again = ok(&[
        "generate",
        "--checkpoint",
        s(&model),
        "--prompt",
        "the",
        "--max-tokens",
        "5",
        "--seed",
        "1",
    ]);
    assert_eq!(out, again, "seeded generation is reproducible");

    ok(&["export", "--checkpoint", s(&model), "--out", s(&hf)]);
    for f in [
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
    ] {
        assert!(hf.join(f).is_file(), "export lacks {f}");
    }

    // Bad input: a prompt longer than max_seq, a missing checkpoint, invalid UTF-8 text.
    let long = "word ".repeat(200);
    let err = fails(&["generate", "--checkpoint", s(&model), "--prompt", &long]);
    assert!(err.contains("longer than max_seq"), "{err}");
    let err = fails(&[
        "eval",
        "--checkpoint",
        s(&dir.path().join("nope")),
        "--text",
        s(&text),
    ]);
    assert!(err.contains("meta.json"), "{err}");
    std::fs::write(&text, [b'o', b'k', 0xff, 0xfe]).unwrap();
    let err = fails(&["eval", "--checkpoint", s(&model), "--text", s(&text)]);
    assert!(err.contains("not valid UTF-8 at byte 2"), "{err}");
}

#[test]
fn impossible_model_shapes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());

    let err = fails(&[
        "train",
        "--data",
        s(&data),
        "--steps",
        "1",
        "--out",
        s(&dir.path().join("m")),
        "--d-model",
        "30",
        "--heads",
        "4",
    ]);
    assert!(err.contains("not divisible by heads"), "{err}");
}

#[test]
fn constant_schedule_holds_the_peak_after_the_warmup() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let log = dir.path().join("log.jsonl");
    ok(&[
        "train",
        "--data",
        s(&data),
        "--steps",
        "5",
        "--out",
        s(&dir.path().join("m")),
        "--json-log",
        s(&log),
        "--schedule",
        "constant",
        "--lr",
        "4e-3",
        "--warmup",
        "2",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq",
        "16",
        "--batch",
        "2",
        "--eval-windows",
        "2",
    ]);
    let lrs: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["lr"]
                .as_f64()
                .unwrap()
        })
        .collect();
    let want = [2e-3, 4e-3, 4e-3, 4e-3, 4e-3];
    assert_eq!(lrs.len(), want.len());
    assert!(
        lrs.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
        "{lrs:?}"
    );
}

#[test]
fn train_grows_mid_run_without_moving_the_validation_loss() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let (model, log) = (dir.path().join("m"), dir.path().join("log.jsonl"));
    let args = vec![
        "train",
        "--data",
        s(&data),
        "--steps",
        "6",
        "--out",
        s(&model),
        "--json-log",
        s(&log),
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq",
        "16",
        "--batch",
        "2",
        "--eval-windows",
        "2",
    ];
    let out = ok(&[args.as_slice(), &["--grow-at", "3:3"]].concat());
    assert!(out.contains("grew 1 → 3 layers"), "{out}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 7, "6 steps and the growth");
    let grow = &lines[3];
    assert_eq!(grow["grow"]["inserted"], serde_json::json!([1, 2]));
    assert_eq!(grow["val_loss_before"], grow["val_loss_after"]);
    assert!(grow["val_loss_before"].as_f64().is_some());
    assert_eq!(lines[2]["layers"], 1);
    assert_eq!(lines[6]["layers"], 3);
    assert_eq!(lines[6]["architecture_version"], 1);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["architecture"]["version"], 1);
    assert_eq!(meta["model"]["layers"], 3);
    ok(&[
        "eval",
        "--checkpoint",
        s(&model),
        "--data",
        s(&data),
        "--seq",
        "16",
    ]);

    for bad in ["6:3", "0:3", "3:1", "3"] {
        let err = fails(&[args.as_slice(), &["--grow-at", bad]].concat());
        assert!(err.contains("grow-at"), "{bad}: {err}");
    }
}

#[test]
fn scale_prints_the_size_table_and_a_join_trace() {
    let table = ok(&["scale", "--table", "--vocab", "50000"]);
    assert!(
        table.contains("| 64 × 7168 | 56 | 19120 | 40.2B |"),
        "{table}"
    );
    let trace = ok(&[
        "scale",
        "--joins",
        "40",
        "--every",
        "10",
        "--memory-gib",
        "2",
        "--tflops",
        "1",
        "--horizon-days",
        "1",
    ]);
    assert_eq!(trace.lines().count(), 4, "{trace}");
    assert!(trace.lines().next().unwrap().contains("UPGRADE"), "{trace}");
}
