//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use neuroshard_data::{BuildOptions, NoProgress, SignedManifest, SyntheticConfig, build};
use neuroshard_proof::Identity;

pub fn synthetic_opts(out: &Path, tokens: u64, shard_tokens: u64) -> BuildOptions {
    BuildOptions {
        synthetic: Some(SyntheticConfig {
            seed: 3,
            tokens,
            ..SyntheticConfig::default()
        }),
        shard_tokens,
        val_fraction: 0.05,
        ..BuildOptions::new(out.to_path_buf())
    }
}

pub fn build_ok(opts: &BuildOptions) -> SignedManifest {
    let id = Identity::generate();
    match build(opts, &id, &NoProgress) {
        Ok(r) => r.manifest,
        Err(e) => panic!("build failed: {e}"),
    }
}

/// A small synthetic dataset with several shards per split.
pub fn small_synthetic(root: &Path) -> PathBuf {
    let out = root.join("gen");
    build_ok(&synthetic_opts(&out, 60_000, 4096));
    out
}

pub fn flip_byte(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x01;
    std::fs::write(path, b).unwrap();
}
