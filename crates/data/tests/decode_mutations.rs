//! Valid shard files and signed manifests, mutated, through the decoders that read them from
//! disk or from peers: each returns Ok or Err, never panics or allocates out of proportion.
//! Manifests are also mutated structurally (a count or size field set to an edge value and the
//! file re-serialized canonically), because byte edits of JSON rarely survive the canonical-
//! form check that runs before the consistency checks.

use neuroshard_data::{
    BuildParams, Dtype, HexHash, MANIFEST_FORMAT, Manifest, ShardEntry, ShardView, SignedManifest,
    Split, SplitCounts, Stats, TOKENIZER_FILE, TokenizerInfo, check_shard_bytes, encode_shard,
    merkle_root, shard_file_name,
};
use neuroshard_mutate::{TrackingAlloc, apply, largest_allocation, mutations};
use neuroshard_proof::Identity;
use neuroshard_proof::fixtures::test_identity;
use proptest::prelude::*;

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

fn shards(tokens: &[u32], dtype: Dtype) -> Vec<Vec<u8>> {
    let half = tokens.len() / 2;
    vec![
        encode_shard(&tokens[..half], dtype).unwrap(),
        encode_shard(&tokens[half..], dtype).unwrap(),
    ]
}

/// A consistent manifest over `files` (a train and a validation shard).
fn manifest(builder: &Identity, files: &[Vec<u8>], dtype: Dtype) -> Manifest {
    let splits = [Split::Train, Split::Val];
    let entries: Vec<ShardEntry> = files
        .iter()
        .zip(splits)
        .enumerate()
        .map(|(i, (bytes, split))| ShardEntry {
            index: i as u64,
            split,
            file: shard_file_name(split, 0),
            tokens: ShardView::parse(bytes).unwrap().len() as u64,
            bytes: bytes.len() as u64,
            blake3: HexHash(*blake3::hash(bytes).as_bytes()),
        })
        .collect();
    let hashes: Vec<_> = entries.iter().map(|e| e.blake3.0).collect();
    let vocab_size = if dtype == Dtype::U16 {
        1 << 16
    } else {
        1 << 20
    };
    Manifest {
        format: MANIFEST_FORMAT.into(),
        name: "mutations".into(),
        params: BuildParams {
            inputs: vec!["in".into()],
            vocab: vocab_size,
            shard_tokens: 64,
            val_fraction: 0.5,
            skip_bad: false,
            synthetic: None,
        },
        tokenizer: TokenizerInfo {
            file: TOKENIZER_FILE.into(),
            blake3: HexHash([7; 32]),
            vocab_size,
            pad_id: 0,
            bos_id: 1,
            eos_id: 2,
        },
        dtype,
        stats: Stats {
            tokens: SplitCounts {
                train: entries[0].tokens,
                val: entries[1].tokens,
            },
            ..Stats::default()
        },
        entropy_floor: None,
        shards: entries,
        merkle_root: HexHash(merkle_root(&hashes).unwrap()),
        builder: builder.public_key(),
    }
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::U16), Just(Dtype::U32)]
}

fn edge() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(u64::MAX / 4 + 1),
        Just(u64::MAX - 31),
        any::<u64>(),
        0u64..100,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_shards(tokens in prop::collection::vec(0u32..65_536, 2..200), dtype in dtype(), m in mutations()) {
        let builder = test_identity(5);
        let files = shards(&tokens, dtype);
        let manifest = manifest(&builder, &files, dtype);
        let bad = apply(&files[0], &m);
        let (result, largest) = largest_allocation(|| {
            let view = ShardView::parse(&bad).map(|v| v.to_vec());
            (view, check_shard_bytes(&manifest, 0, &bad).is_ok())
        });
        // `to_vec` widens u16 ids to u32: at most twice the file.
        prop_assert!(largest <= 2 * bad.len() + 4096, "{largest} bytes");
        if let Ok(ids) = result.0 {
            prop_assert_eq!(ids.len() * dtype_width(&bad), bad.len() - 32);
        }
        if result.1 {
            prop_assert_eq!(bad, files[0].clone());
        }
    }

    /// Mutated manifest files: whatever parses is the original (the signature covers all).
    #[test]
    fn mutated_manifest_files(tokens in prop::collection::vec(0u32..65_536, 2..50), m in mutations()) {
        let builder = test_identity(5);
        let files = shards(&tokens, Dtype::U16);
        let signed = manifest(&builder, &files, Dtype::U16).sign(&builder).unwrap();
        let bytes = signed.to_file_bytes().unwrap();
        let bad = apply(&bytes, &m);
        let (result, largest) = largest_allocation(|| SignedManifest::from_file_bytes(&bad));
        prop_assert!(largest <= 8 * bad.len() + 4096, "{largest} bytes");
        if let Ok(parsed) = result {
            prop_assert_eq!(parsed, signed);
        }
    }

    /// Count and size fields at their edges, re-serialized canonically: the consistency
    /// checks (which run before the signature check) refuse them without overflowing.
    #[test]
    fn manifest_counts_at_the_edges(field in 0u8..7, shard in 0usize..2, value in edge()) {
        let builder = test_identity(5);
        let files = shards(&[1, 2, 3, 4, 5, 6], Dtype::U16);
        let mut m = manifest(&builder, &files, Dtype::U16);
        let original = m.clone();
        match field {
            0 => m.shards[shard].tokens = value,
            1 => m.shards[shard].bytes = value,
            2 => m.shards[shard].index = value,
            3 => m.stats.tokens.train = value,
            4 => m.stats.tokens.val = value,
            5 => m.tokenizer.vocab_size = value as usize,
            _ => {
                m.shards[0].tokens = value;
                m.shards[1].tokens = value;
                m.stats.tokens.train = value;
                m.stats.tokens.val = value;
            }
        }
        let signed = SignedManifest { manifest: m.clone(), signature: original.clone().sign(&builder).unwrap().signature };
        let bytes = signed.to_file_bytes().unwrap();
        let result = SignedManifest::from_file_bytes(&bytes);
        if m != original {
            prop_assert!(result.is_err());
        }
        // Signed by the builder, consistency is the only guard left.
        let resigned = m.clone().sign(&builder).unwrap().to_file_bytes().unwrap();
        if let Ok(parsed) = SignedManifest::from_file_bytes(&resigned) {
            prop_assert!(parsed.manifest.check_consistency().is_ok());
        }
    }
}

fn dtype_width(shard: &[u8]) -> usize {
    usize::from(shard[12])
}

/// The overflow the edge test found, pinned: a shard whose token count times the dtype width
/// wraps past u64::MAX is an inconsistency, not a panic.
#[test]
fn token_count_overflow_is_an_error() {
    let builder = test_identity(5);
    let files = shards(&[1, 2, 3, 4], Dtype::U16);
    let mut m = manifest(&builder, &files, Dtype::U16);
    m.shards[0].tokens = u64::MAX / 2 + 1;
    assert!(m.check_consistency().is_err());
    let err = m.check_consistency().unwrap_err().to_string();
    assert!(err.contains("overflow"), "{err}");
    // Three train shards whose sizes each fit but whose token sum does not.
    let mut m = manifest(&builder, &files, Dtype::U16);
    let tokens = (u64::MAX - 32) / 2;
    m.shards = (0..3)
        .map(|i| ShardEntry {
            index: i,
            split: Split::Train,
            file: shard_file_name(Split::Train, i as usize),
            tokens,
            bytes: tokens * 2 + 32,
            blake3: HexHash([i as u8; 32]),
        })
        .collect();
    let err = m.check_consistency().unwrap_err().to_string();
    assert!(err.contains("overflow"), "{err}");
}
