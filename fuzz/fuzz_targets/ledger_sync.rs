//! Ledger anti-entropy. First byte even: a sync request, answered by an economy that holds
//! proofs (the answer stays within its limits); odd: a sync response, applied by a fresh
//! economy (every proof it accepts verifies on its own).
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::T0;
use neuroshard_fuzz::node::{economy_with_proofs, fresh_economy};
use neuroshard_node::economy::{Economy, LedgerSyncRequest, LedgerSyncResponse, MAX_SYNC_PROOFS};
use neuroshard_proof::Canonical;

/// The answer budget the node uses is larger; a small one exercises the cut-off.
const MAX_BYTES: usize = 4 * 1024;

thread_local! {
    static HOLDER: RefCell<Option<Economy>> = RefCell::new(economy_with_proofs());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let Ok(request) = LedgerSyncRequest::from_canonical_bytes(rest) else {
            return;
        };
        assert_eq!(request.to_canonical_bytes(), rest);
        HOLDER.with_borrow(|holder| {
            if let Some(Ok(answer)) = holder.as_ref().map(|e| e.answer_sync(&request, MAX_BYTES)) {
                assert!(answer.proofs.len() <= MAX_SYNC_PROOFS);
                let bytes: usize = answer.proofs.iter().map(Vec::len).sum();
                assert!(bytes <= MAX_BYTES);
            }
        });
    } else {
        let Ok(response) = LedgerSyncResponse::from_canonical_bytes(rest) else {
            return;
        };
        assert_eq!(response.to_canonical_bytes(), rest);
        let Some(mut economy) = fresh_economy() else {
            return;
        };
        let summary = economy.on_sync_response(&response, T0 + 10);
        let _ = summary;
        assert!(economy.proof_count() <= response.proofs.len());
        assert_eq!(economy.ledger().check_invariants(), Ok(()));
    }
});
