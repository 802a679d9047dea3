//! A signed proof from the network: envelope framing, then every verification step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::{T0, verifier};
use neuroshard_proof::SignedProof;

fuzz_target!(|data: &[u8]| {
    let mut v = verifier();
    let _ = v.verify_bytes(data, T0);
    if let Ok(signed) = SignedProof::from_bytes(data) {
        // Framing is exact: a parsed envelope re-encodes to the input.
        assert_eq!(signed.to_bytes(), data);
        let _ = v.check_content(&signed, T0);
    }
});
