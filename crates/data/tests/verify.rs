//! `verify` catches tampering, and every bad input is a clear error.

mod common;

use common::{build_ok, flip_byte, small_synthetic};
use neuroshard_data::{
    BuildError, BuildOptions, DataError, Genesis, HEADER_LEN, MANIFEST_FILE, ManifestError,
    NoProgress, ShardError, SignedManifest, Split, TOKENIZER_FILE, VerifyError, build, verify_dir,
};
use neuroshard_proof::Identity;

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn clean_build_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let report = verify_dir(&dir).unwrap();
    let m = SignedManifest::load(&dir).unwrap().manifest;
    assert!(
        m.shards.len() >= 4,
        "want several shards, got {}",
        m.shards.len()
    );
    assert_eq!(report.shards, m.shards.len());
    assert_eq!(report.tokens, m.stats.tokens.train + m.stats.tokens.val);
}

#[test]
fn a_flipped_byte_in_any_shard_is_caught_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let m = SignedManifest::load(&dir).unwrap().manifest;
    for entry in &m.shards {
        // One flip in the header, one in the middle of the tokens, one in the last byte.
        for at in [
            3usize,
            HEADER_LEN + entry.bytes as usize / 2,
            entry.bytes as usize - 1,
        ] {
            let case = tmp.path().join(format!("case-{}-{at}", entry.index));
            copy_dir(&dir, &case);
            flip_byte(&case.join(&entry.file), at.min(entry.bytes as usize - 1));
            let err = verify_dir(&case).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("shard {} ({})", entry.index, entry.file)),
                "flip at {at} in {}: {msg}",
                entry.file
            );
            std::fs::remove_dir_all(&case).unwrap();
        }
    }
}

#[test]
fn a_flipped_byte_in_the_tokenizer_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let len = std::fs::metadata(dir.join(TOKENIZER_FILE)).unwrap().len() as usize;
    for at in [0, len / 2, len - 1] {
        let case = tmp.path().join(format!("tok-{at}"));
        copy_dir(&dir, &case);
        flip_byte(&case.join(TOKENIZER_FILE), at);
        assert!(
            matches!(verify_dir(&case), Err(VerifyError::TokenizerHash { .. })),
            "flip at {at}"
        );
        // Opening for training refuses it too.
        assert!(matches!(
            Genesis::open(&case),
            Err(DataError::Verify(VerifyError::TokenizerHash { .. }))
        ));
    }
}

#[test]
fn a_flipped_byte_anywhere_in_the_manifest_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let bytes = std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    let case = tmp.path().join("manifest-case");
    copy_dir(&dir, &case);
    // Every byte position (verify stops at the manifest, so this stays fast).
    for at in 0..bytes.len() {
        let mut b = bytes.clone();
        b[at] ^= 0x01;
        std::fs::write(case.join(MANIFEST_FILE), &b).unwrap();
        assert!(
            matches!(verify_dir(&case), Err(VerifyError::Manifest(_))),
            "flip at byte {at} ({:?}) accepted",
            bytes[at] as char
        );
    }
}

#[test]
fn missing_truncated_and_foreign_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let m = SignedManifest::load(&dir).unwrap().manifest;
    let e = &m.shards[1];
    let path = |case: &std::path::Path| case.join(&e.file);

    let case = tmp.path().join("missing");
    copy_dir(&dir, &case);
    std::fs::remove_file(path(&case)).unwrap();
    let err = verify_dir(&case).unwrap_err();
    assert!(
        matches!(err, VerifyError::ShardMissing { index: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&e.file));
    // The loader opens (a node may hold only some shards) but refuses the missing one.
    let g = Genesis::open(&case).unwrap();
    assert!(matches!(
        g.window(Split::Train, 1, 0, 16),
        Err(DataError::Verify(VerifyError::ShardMissing { .. }))
    ));
    assert!(g.window(Split::Train, 0, 0, 16).is_ok());

    let case = tmp.path().join("truncated");
    copy_dir(&dir, &case);
    let b = std::fs::read(path(&case)).unwrap();
    std::fs::write(path(&case), &b[..b.len() - 3]).unwrap();
    let err = verify_dir(&case).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::ShardFormat {
                reason: ShardError::Truncated { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");

    let case = tmp.path().join("magic");
    copy_dir(&dir, &case);
    let mut b = std::fs::read(path(&case)).unwrap();
    b[..8].copy_from_slice(b"NOTSHARD");
    std::fs::write(path(&case), &b).unwrap();
    let err = verify_dir(&case).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::ShardFormat {
                reason: ShardError::BadMagic { .. },
                ..
            }
        ),
        "{err}"
    );

    let case = tmp.path().join("version");
    copy_dir(&dir, &case);
    let mut b = std::fs::read(path(&case)).unwrap();
    b[8] = 9;
    std::fs::write(path(&case), &b).unwrap();
    let err = verify_dir(&case).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::ShardFormat {
                reason: ShardError::UnsupportedVersion { found: 9 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_tokenizer_from_another_build_does_not_match() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let other = tmp.path().join("other");
    let mut opts = common::synthetic_opts(&other, 20_000, 4096);
    if let Some(cfg) = opts.synthetic.as_mut() {
        cfg.seed = 4;
    }
    build_ok(&opts);
    std::fs::copy(other.join(TOKENIZER_FILE), dir.join(TOKENIZER_FILE)).unwrap();
    let err = verify_dir(&dir).unwrap_err();
    assert!(matches!(err, VerifyError::TokenizerHash { .. }), "{err}");
    assert!(err.to_string().contains("manifest says"), "{err}");
}

#[test]
fn missing_manifest_and_empty_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        verify_dir(tmp.path()),
        Err(VerifyError::Manifest(ManifestError::Io { .. }))
    ));
    let id = Identity::generate();

    // A folder with no usable files.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let opts = BuildOptions {
        inputs: vec![empty.clone()],
        ..BuildOptions::new(tmp.path().join("o1"))
    };
    let err = build(&opts, &id, &NoProgress).unwrap_err();
    assert!(
        err.to_string().contains("no .txt, .jsonl or .parquet"),
        "{err}"
    );

    // Files that hold no text.
    std::fs::write(empty.join("a.txt"), "").unwrap();
    std::fs::write(empty.join("b.jsonl"), "\n\n").unwrap();
    let err = build(&opts, &id, &NoProgress).unwrap_err();
    assert!(
        matches!(err, BuildError::EmptyInput { empty: 1, .. }),
        "{err}"
    );

    // No input at all, and a nonexistent one.
    let none = BuildOptions::new(tmp.path().join("o2"));
    assert!(matches!(
        build(&none, &id, &NoProgress),
        Err(BuildError::Options(_))
    ));
    let missing = BuildOptions {
        inputs: vec![tmp.path().join("does-not-exist")],
        ..BuildOptions::new(tmp.path().join("o3"))
    };
    let err = build(&missing, &id, &NoProgress).unwrap_err();
    assert!(err.to_string().contains("does-not-exist"), "{err}");
}

#[test]
fn build_refuses_a_non_empty_output_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let err = build(
        &common::synthetic_opts(&dir, 1000, 4096),
        &Identity::generate(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, BuildError::OutNotEmpty(_)), "{err}");
}

#[test]
fn a_vocabulary_too_small_for_one_token_per_word_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = common::synthetic_opts(&tmp.path().join("small"), 20_000, 4096);
    opts.vocab = 300;
    let err = build(&opts, &Identity::generate(), &NoProgress).unwrap_err();
    assert!(
        matches!(err, BuildError::SyntheticTokenization { vocab: 300, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("raise --vocab"), "{err}");
}
