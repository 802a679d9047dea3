//! Slash reports. First byte 0: wire envelope bytes; otherwise a report payload signed by the
//! reporter (the two embedded proofs are fuzzed too).
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::{BOB, signed_by};
use neuroshard_ledger::{LedgerState, SlashReport, verify_slash};
use neuroshard_proof::{Canonical, Signed};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let signed: Signed<SlashReport> = if mode == 0 {
        match Signed::from_bytes(rest) {
            Ok(s) => s,
            Err(_) => return,
        }
    } else {
        if let Ok(report) = SlashReport::from_canonical_bytes(rest) {
            assert_eq!(report.to_canonical_bytes(), rest);
        }
        signed_by(&BOB, rest)
    };
    if let Ok(slash) = verify_slash(&signed) {
        let mut state = LedgerState::new();
        let _ = state.apply_slash(&slash);
        assert_eq!(state.check_invariants(), Ok(()));
    }
});
