//! Account ops. First byte 0: wire envelope bytes; otherwise an op payload signed by the
//! account owner, applied to a funded ledger (supply must stay conserved).
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::{ALICE, FUNDED, signed_by};
use neuroshard_ledger::{AccountOp, SignedOp, verify_op};
use neuroshard_proof::Canonical;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let signed = if mode == 0 {
        match SignedOp::from_bytes(rest) {
            Ok(s) => s,
            Err(_) => return,
        }
    } else {
        if let Ok(op) = AccountOp::from_canonical_bytes(rest) {
            assert_eq!(op.to_canonical_bytes(), rest);
        }
        signed_by(&ALICE, rest)
    };
    if let Ok(op) = verify_op(&signed) {
        let mut state = FUNDED.clone();
        let _ = state.apply_op(op);
        assert_eq!(state.check_invariants(), Ok(()));
    }
});
