//! Ledger anti-entropy. First byte even: a sync request (range message and wanted ids),
//! answered by an economy that holds proofs (the answer stays within its limits); odd: a sync
//! response, applied by a fresh economy with a session open (every proof it accepts verifies
//! on its own; the range message never panics the session).
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::T0;
use neuroshard_fuzz::node::{SYNC_PEER, economy_with_proofs, fresh_economy};
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
        HOLDER.with_borrow_mut(|holder| {
            if let Some(answer) = holder
                .as_mut()
                .map(|e| e.answer_sync(&request, MAX_BYTES, T0 + 10))
            {
                assert!(answer.proofs.len() <= MAX_SYNC_PROOFS);
                let bytes: usize = answer.proofs.iter().chain(&answer.ops).map(Vec::len).sum();
                assert!(bytes + answer.neg.len() <= MAX_BYTES.max(answer.neg.len()));
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
        let _ = economy.start_sync(SYNC_PEER, T0);
        let (_, next) = economy.on_sync_response(SYNC_PEER, &response, T0 + 10);
        if let Some(next) = next {
            assert!(next.want.len() <= neuroshard_node::economy::MAX_SYNC_WANT);
        }
        assert!(economy.proof_count() <= response.proofs.len());
        assert_eq!(economy.ledger().check_invariants(), Ok(()));
    }
});
