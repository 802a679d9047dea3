//! Checkpoint metadata (`meta.json`): parse and validate, then size the stage's parameters as
//! `checkpoint::load` does before reading tensors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_model::checkpoint;

fuzz_target!(|data: &[u8]| {
    if let Ok(meta) = checkpoint::parse_meta(data) {
        let specs = meta.stage.param_specs(&meta.model);
        let total: usize = specs.iter().map(|s| s.numel()).sum();
        assert!(total <= meta.model.num_params());
    }
});
