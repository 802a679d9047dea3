//! Running the `neuroshard` binary from the integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The tiny model the multi-process tests train (a few seconds a run on 2 cores).
pub const TINY: [&str; 10] = [
    "--layers",
    "3",
    "--d-model",
    "64",
    "--heads",
    "4",
    "--seq",
    "32",
    "--batch",
    "4",
];

pub fn neuroshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neuroshard"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the neuroshard binary runs")
}

/// Runs a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = neuroshard(args);
    assert!(
        out.status.success(),
        "neuroshard {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that must fail; returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = neuroshard(args);
    assert!(!out.status.success(), "neuroshard {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// Builds a tiny synthetic genesis dataset in `dir/g` and returns its path.
pub fn tiny_genesis(dir: &Path) -> PathBuf {
    let data = dir.join("g");
    ok(&[
        "genesis",
        "build",
        "--synthetic",
        "--synthetic-tokens",
        "60000",
        "--out",
        s(&data),
    ]);
    data
}
