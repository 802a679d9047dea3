//! Checkpoint metadata (`meta.json`) from mutated bytes: `parse_meta` returns Ok or Err, never
//! panics, and what it accepts can be turned into parameter specs (what `load` does next)
//! without overflow or an absurd allocation. Field values are also set to edge values
//! structurally, since byte edits of JSON mostly break the syntax.

use neuroshard_model::checkpoint::{self, FORMAT, VERSION};
use neuroshard_model::{AdamWConfig, CheckpointMeta, ModelConfig, StageSpec};
use neuroshard_mutate::{TrackingAlloc, apply, largest_allocation, mutations};
use proptest::prelude::*;
use serde_json::{Value, json};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

fn meta(with_optimizer: bool) -> CheckpointMeta {
    let model = ModelConfig::tiny(300);
    CheckpointMeta {
        format: FORMAT.into(),
        version: VERSION,
        stage: StageSpec::full(&model),
        model,
        architecture: Default::default(),
        step: 12,
        model_hash: "ab".repeat(32),
        optimizer: with_optimizer.then(|| checkpoint::OptimizerMeta {
            config: AdamWConfig::default(),
            step: 12,
        }),
        extra: json!({"round": 3, "replicas": [1, 2]}),
    }
}

/// Parses, then does what `load` does with the shape before reading tensors.
fn parse_and_size(bytes: &[u8]) -> Option<usize> {
    let meta = checkpoint::parse_meta(bytes).ok()?;
    let specs = meta.stage.param_specs(&meta.model);
    Some(specs.iter().map(|s| s.numel()).sum())
}

fn edge() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(1025),
        Just(u32::MAX as u64),
        Just(1 << 32),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>(),
        0u64..4096,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_meta_bytes(with_optimizer in any::<bool>(), m in mutations()) {
        let bytes = serde_json::to_vec_pretty(&meta(with_optimizer)).unwrap();
        let bad = apply(&bytes, &m);
        let (_, largest) = largest_allocation(|| parse_and_size(&bad));
        prop_assert!(largest <= 8 * bad.len() + 64 * 1024, "{largest} bytes");
    }

    #[test]
    fn meta_fields_at_the_edges(field in 0usize..10, value in edge()) {
        let mut v = serde_json::to_value(meta(false)).unwrap();
        let path: &[&str] = match field {
            0 => &["model", "layers"],
            1 => &["model", "d_model"],
            2 => &["model", "heads"],
            3 => &["model", "kv_heads"],
            4 => &["model", "ffn"],
            5 => &["model", "vocab"],
            6 => &["model", "max_seq"],
            7 => &["stage", "first_layer"],
            8 => &["stage", "end_layer"],
            _ => &["step"],
        };
        let mut slot = &mut v;
        for key in path {
            slot = &mut slot[*key];
        }
        *slot = Value::from(value);
        let bytes = serde_json::to_vec(&v).unwrap();
        let (size, largest) = largest_allocation(|| parse_and_size(&bytes));
        prop_assert!(largest <= 64 * 1024, "{largest} bytes");
        if let Some(n) = size {
            prop_assert!(n <= 1 << 40);
        }
    }
}

#[test]
fn deep_layer_counts_are_refused() {
    let mut v = serde_json::to_value(meta(false)).unwrap();
    v["model"]["layers"] = Value::from(1u64 << 40);
    v["stage"]["end_layer"] = Value::from(1u64 << 40);
    v["model"]["d_model"] = Value::from(2);
    v["model"]["heads"] = Value::from(1);
    v["model"]["kv_heads"] = Value::from(1);
    v["model"]["ffn"] = Value::from(1);
    let err = checkpoint::parse_meta(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert!(err.to_string().contains("layers"), "{err}");
}
