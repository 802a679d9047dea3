//! A compressed pseudo-gradient. The first two bytes give the expected vector length (as the
//! receiver knows it); an accepted message decodes to that many finite values.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((len, msg)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len));
    if let Ok(values) = neuroshard_train::decode(msg, len) {
        assert_eq!(values.len(), len);
        assert!(values.iter().all(|v| v.is_finite()));
    }
});
