//! A genesis manifest file: the full check (canonical form, consistency, signature), and the
//! consistency checks alone on whatever parses as JSON, since the canonical-form check stops
//! most mutants before them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_data::SignedManifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = SignedManifest::from_file_bytes(data) {
        assert_eq!(m.to_file_bytes().ok().as_deref(), Some(data));
    }
    if let Ok(m) = serde_json::from_slice::<SignedManifest>(data) {
        let _ = m.manifest.check_consistency();
        let _ = m.manifest.inclusion_proof(0);
    }
});
