//! Valid signed ops, mutated, through the ledger's decoders and rules: each
//! step returns Ok or Err, never panics or allocates out of proportion, and supply stays
//! conserved in memory and in SQLite. Mutated payloads are signed again by the account owner so
//! that they get past the signature into the op decoder and the ledger rules.

#[allow(dead_code)] // shared helpers; this binary uses only some
mod common;
use common::*;

use neuroshard_ledger::{AccountOp, Action, Ledger, LedgerState, SignedOp, verify_op};
use neuroshard_mutate::{TrackingAlloc, apply, largest_allocation, mutations};
use neuroshard_proof::fixtures::{test_identity, uptime_proof};
use neuroshard_proof::{Canonical, Identity, Signed};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

const FIXED_BUDGET: usize = 64 * 1024;

fn action(kind: u8, to: &Identity) -> Action {
    match kind % 4 {
        0 => Action::Transfer {
            to: to.node_id(),
            amount: 1_000,
        },
        1 => Action::Stake {
            amount: 500,
            unlock_at_ms: T0 + 2 * 86_400_000,
        },
        2 => Action::Unstake { amount: 100 },
        _ => Action::Burn { amount: 7 },
    }
}

/// A state in which `alice` holds rewards for a few uptime proofs.
fn funded(alice: &Identity) -> LedgerState {
    let mut state = LedgerState::new();
    let neighbour = test_identity(99);
    for nonce in 0..3 {
        let p = verified(&uptime_proof(alice, nonce, T0 + nonce), alice, &neighbour);
        assert!(state.apply_proof(&p).is_ok());
    }
    state
}

fn signed_again(owner: &Identity, payload: Vec<u8>) -> SignedOp {
    let signature = owner.sign(&payload);
    Signed::from_parts(payload, owner.public_key(), signature)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Mutated op wire bytes: an accepted mutant is the original op.
    #[test]
    fn mutated_op_wire(kind in any::<u8>(), m in mutations()) {
        let (alice, bob) = (test_identity(1), test_identity(2));
        let op = AccountOp { network: [0; 32], account: alice.node_id(), nonce: 0, timestamp_ms: T0, action: action(kind, &bob) };
        let bad = apply(&op.sign(&alice).to_bytes(), &m);
        let (result, largest) = largest_allocation(|| SignedOp::from_bytes(&bad).ok().map(|s| verify_op(&s)));
        prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Some(Ok(v)) = result {
            prop_assert_eq!(*v.op(), op);
        }
    }

    /// Mutated op payloads signed again, applied to a funded account in memory and in SQLite:
    /// canonical round trip, no panic, supply conserved, both stores agree.
    #[test]
    fn mutated_op_payloads_applied(kinds in prop::collection::vec(any::<u8>(), 1..4), m in mutations()) {
        let (alice, bob) = (test_identity(1), test_identity(2));
        let mut state = funded(&alice);
        let mut ledger = Ledger::open_in_memory().unwrap();
        for p in 0..3 {
            let proof = verified(&uptime_proof(&alice, p, T0 + p), &alice, &test_identity(99));
            prop_assert!(ledger.apply_proof(&proof).is_ok());
        }
        for (nonce, kind) in kinds.iter().enumerate() {
            let op = AccountOp { network: [0; 32], account: alice.node_id(), nonce: nonce as u64, timestamp_ms: T0, action: action(*kind, &bob) };
            let payload = apply(&op.to_canonical_bytes(), &m);
            if let Ok(decoded) = AccountOp::from_canonical_bytes(&payload) {
                prop_assert_eq!(decoded.to_canonical_bytes(), payload.clone());
            }
            let signed = signed_again(&alice, payload);
            if let Ok(v) = verify_op(&signed) {
                let memory = state.apply_op(v.clone()).is_ok();
                let stored = ledger.apply_op(v).is_ok();
                prop_assert_eq!(memory, stored);
            }
            prop_assert_eq!(state.check_invariants(), Ok(()));
            prop_assert_eq!(ledger.state_hash(), state.state_hash());
        }
    }
}
