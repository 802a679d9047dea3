//! `neuroshard experiment diloco` end to end on a tiny synthetic dataset: the JSON report's
//! fields, that training lowers the loss, compression's byte counts, the replicas' moments,
//! the DDP baseline and a rejected configuration.

use std::path::Path;

mod common;
use common::*;

use serde_json::Value;

/// Runs a tiny experiment and returns its JSON report.
fn experiment(data: &Path, json: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "experiment",
        "diloco",
        "--data",
        s(data),
        "--replicas",
        "2",
        "--inner-steps",
        "6",
        "--outer-steps",
        "3",
        "--layers",
        "1",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--seq",
        "32",
        "--batch",
        "4",
        "--lr",
        "3e-3",
        "--warmup",
        "2",
        "--eval-windows",
        "8",
        "--threads",
        "1",
        "--json-out",
        s(json),
    ];
    args.extend_from_slice(extra);
    let stdout = ok(&args);
    assert!(stdout.contains("final validation loss"), "{stdout}");
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

fn steps(report: &Value) -> &Vec<Value> {
    report["steps"].as_array().expect("steps is an array")
}

/// A field that must be a finite number. A NaN or infinite loss is written as `null`, and
/// comparing `Option`s (`None < Some(x)`) would let a diverged run pass as "falling".
fn finite(step: &Value, key: &str) -> f64 {
    match step[key].as_f64() {
        Some(x) if x.is_finite() => x,
        _ => panic!("{key} is not a finite number in {step}"),
    }
}

/// Every step's losses are finite and the last step's are below the first's.
fn assert_loss_falls(st: &[Value], keys: &[&str]) {
    for step in st {
        for key in keys {
            finite(step, key);
        }
    }
    let (first, last) = (&st[0], &st[st.len() - 1]);
    for key in keys {
        assert!(finite(last, key) < finite(first, key), "{key}: {st:?}");
    }
}

#[test]
fn diloco_compressed_and_ddp_report_falling_loss() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());

    let dense = experiment(&data, &dir.path().join("dense.json"), &[]);
    assert_eq!(dense["mode"], "diloco");
    assert_eq!(dense["replicas"], 2);
    assert_eq!(dense["inner_steps"], 6);
    assert_eq!(dense["outer_steps"], 3);
    assert_eq!(dense["aggregator"], "mean");
    assert_eq!(dense["compress"], "none");
    let params = dense["params"].as_u64().unwrap();
    assert!(dense["entropy_floor"].as_f64().unwrap() > 0.0);
    let st = steps(&dense);
    assert_eq!(st.len(), 3);
    for (i, step) in st.iter().enumerate() {
        assert_eq!(step["outer_step"], i as u64 + 1);
        assert_eq!(step["tokens"], (i as u64 + 1) * 6 * 2 * 4 * 32);
        assert_eq!(step["bytes_sent_per_replica"], 4 * params);
        assert_eq!(step["bytes_dense_per_replica"], 4 * params);
        for key in ["wall_s", "delta_norm", "update_norm"] {
            finite(step, key);
        }
        assert!(step.get("compress_rel_error").is_none());
    }
    assert_loss_falls(st, &["train_loss", "val_loss"]);
    finite(&dense, "final_val_loss");
    assert_eq!(dense["final_val_loss"], st[2]["val_loss"]);

    // Compression: a quarter of the coordinates at one bit is > 100x smaller; it reports its
    // error and the loss still falls.
    let packed = experiment(
        &data,
        &dir.path().join("packed.json"),
        &["--compress", "randk:0.25:sign", "--outer-momentum", "0.8"],
    );
    assert_eq!(packed["compress"], "randk:0.25:sign");
    assert_eq!(packed["error_feedback"], "params");
    let st = steps(&packed);
    for step in st {
        let sent = step["bytes_sent_per_replica"].as_u64().unwrap();
        assert!(sent * 100 < 4 * params, "{sent} B vs {params} parameters");
        let err = step["compress_rel_error"].as_f64().unwrap();
        assert!(err > 0.0 && err < 1.0, "{err}");
    }
    assert_loss_falls(st, &["train_loss", "val_loss"]);
    finite(&packed, "final_val_loss");

    // SparseLoCo's decaying accumulator: the residual lives beside the nodes' round code.
    let acc = experiment(
        &data,
        &dir.path().join("acc.json"),
        &[
            "--compress",
            "topk:0.05:int8",
            "--error-feedback",
            "accumulate",
            "--ef-decay",
            "0.9",
            "--outer-momentum",
            "0",
        ],
    );
    assert_eq!(acc["error_feedback"], "accumulate");
    let st = steps(&acc);
    for step in st {
        assert!(step["residual_ratio"].as_f64().unwrap() > 0.0, "{step}");
    }
    // Only the validation loss is compared here; finite() so that a diverged run (NaN
    // written as null, and None < Some(x)) cannot pass as falling.
    assert!(
        finite(&st[2], "val_loss") < finite(&st[0], "val_loss"),
        "{st:?}"
    );

    // Shorter early rounds and sparse evaluation: the first two outer steps take 3 inner
    // steps, the last 6; only steps 2 and 3 are evaluated.
    let early = experiment(
        &data,
        &dir.path().join("early.json"),
        &["--early", "2:3", "--eval-every", "2"],
    );
    let st = steps(&early);
    let tokens: Vec<u64> = st.iter().map(|s| s["tokens"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [3, 6, 12].map(|steps| steps * 2 * 4 * 32));
    assert!(st[0].get("val_loss").is_none(), "{st:?}");
    assert!(
        finite(&st[2], "val_loss") < finite(&st[1], "val_loss"),
        "{st:?}"
    );
    assert_eq!(early["final_val_loss"], st[2]["val_loss"]);

    // What the replicas do with their AdamW moments after a round: averaging them or zeroing
    // the first moment changes the run (so the option is applied), and the report says which.
    assert_eq!(dense["moments"], "keep");
    for how in [
        "average",
        "average-first",
        "average-second",
        "average-second-factored",
        "zero-first",
    ] {
        let json = dir.path().join(format!("{how}.json"));
        let run = experiment(&data, &json, &["--moments", how]);
        assert_eq!(run["moments"], how);
        assert_eq!(run["beta2"], dense["beta2"]);
        let last = finite(&steps(&run)[2], "val_loss");
        assert_ne!(last, finite(&dense["steps"][2], "val_loss"), "{how}");
    }

    // Replicas reading as a network's drivers do (a shard section each round) see other
    // windows than uniform draws, and the report says which.
    assert_eq!(dense["replica_data"], "uniform");
    let assigned = experiment(
        &data,
        &dir.path().join("assigned.json"),
        &["--replica-data", "assigned"],
    );
    assert_eq!(assigned["replica_data"], "assigned");
    assert_ne!(
        finite(&steps(&assigned)[2], "val_loss"),
        finite(&dense["steps"][2], "val_loss")
    );

    let ddp = experiment(&data, &dir.path().join("ddp.json"), &["--baseline", "ddp"]);
    assert_eq!(ddp["mode"], "ddp");
    let st = steps(&ddp);
    assert_eq!(st[2]["tokens"], dense["steps"][2]["tokens"]);
    assert_eq!(st[0]["bytes_sent_per_replica"], 6 * 4 * params);
    assert_loss_falls(st, &["train_loss", "val_loss"]);
    finite(&ddp, "final_val_loss");
    // β₂ by default follows a step's tokens (`AdamWConfig::beta2_for`): 4 rows of 32 tokens a
    // replica, 8 for DDP, are both few enough to take the ceiling; `--beta2` overrides it.
    assert_eq!(finite(&dense, "beta2"), 0.99);
    assert_eq!(finite(&ddp, "beta2"), 0.99);
    let told = experiment(&data, &dir.path().join("b2.json"), &["--beta2", "0.95"]);
    assert_eq!(finite(&told, "beta2"), 0.95);
    let last = finite(&steps(&told)[2], "val_loss");
    assert_ne!(last, finite(&dense["steps"][2], "val_loss"));

    let out = neuroshard(&[
        "experiment",
        "diloco",
        "--data",
        s(&data),
        "--replicas",
        "2",
        "--byzantine",
        "2",
        "--attack",
        "sign-flip",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no honest replica"));

    // β₂ = 1 would never forget a gradient: refused before any training.
    let out = neuroshard(&["experiment", "diloco", "--data", s(&data), "--beta2", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--beta2 must be in [0, 1)"));
}
