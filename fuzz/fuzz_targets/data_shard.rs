//! A shard file: header parsing, widening every id, and the check against a manifest entry.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use neuroshard_data::{Manifest, ShardView, check_shard_bytes};

static MANIFEST: LazyLock<Option<Manifest>> = LazyLock::new(|| {
    let tokens: Vec<u32> = (0..64).map(|i| i * 7 % 300).collect();
    neuroshard_fuzz::manifest_for(&tokens).ok()
});

fuzz_target!(|data: &[u8]| {
    if let Ok(view) = ShardView::parse(data) {
        let ids = view.to_vec();
        assert_eq!(ids.len(), view.len());
        assert_eq!(view.get(ids.len()), None);
    }
    if let Some(manifest) = MANIFEST.as_ref() {
        let _ = check_shard_bytes(manifest, 0, data);
    }
});
