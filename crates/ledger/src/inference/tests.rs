use proptest::prelude::*;

use super::*;
use crate::ops::AccountOp;
use crate::state::{LedgerError, LedgerState, Outcome};
use crate::{LedgerGenesis, Rules};
use neuroshard_proof::fixtures::{test_identity, uptime_proof};
use neuroshard_proof::{Identity, ProofVerifier};

const T0: u64 = 1_800_000_000_000;
const REQUEST: Hash32 = [7; 32];
const PER_STAGE: u64 = 1_000_000;

struct World {
    caller: Identity,
    entry: Identity,
    servers: [Identity; 2],
    sybil: Identity,
    state: LedgerState,
}

/// Two registered stage servers (the entry node is server 0), a staked but unregistered
/// Sybil, and a caller with a balance earned by uptime proofs.
fn world() -> World {
    let servers = [test_identity(10), test_identity(11)];
    let sybil = test_identity(12);
    let caller = test_identity(13);
    let rules = Rules::default();
    let mut stakes: Vec<_> = servers
        .iter()
        .chain([&sybil])
        .map(|s| (s.public_key(), rules.min_stake))
        .collect();
    stakes.sort();
    let genesis = LedgerGenesis::new(rules, stakes).unwrap();
    let (mut state, _) = LedgerState::from_genesis(&genesis).unwrap();
    for (stage, s) in servers.iter().enumerate() {
        let stage = u16::try_from(stage).unwrap();
        let register = plain(s, 0, Action::Register { stage });
        assert!(matches!(state.apply_op(register), Ok(Outcome::Applied(_))));
    }
    let neighbour = test_identity(14);
    let mut verifier = ProofVerifier::new();
    verifier.add_known_node(neighbour.public_key());
    for nonce in 0..5 {
        let proof = uptime_proof(&caller, nonce, T0);
        let p = verifier.verify(&proof.sign(&caller), T0).unwrap();
        assert!(matches!(state.apply_proof(&p), Ok(Outcome::Applied(_))));
    }
    World {
        caller,
        entry: test_identity(10),
        servers,
        sybil,
        state,
    }
}

fn plain(id: &Identity, nonce: u64, action: Action) -> VerifiedOp {
    let signed = AccountOp {
        network: [0; 32],
        account: id.node_id(),
        nonce,
        timestamp_ms: T0,
        action,
    }
    .sign(id);
    verify_op(&signed).unwrap()
}

fn payment(w: &World, stages: u16) -> Vec<u8> {
    payment_of(w, PER_STAGE, stages)
}

fn payment_of(w: &World, per_stage: u64, stages: u16) -> Vec<u8> {
    AccountOp {
        network: [0; 32],
        account: w.caller.node_id(),
        nonce: 0,
        timestamp_ms: T0,
        action: Action::PayInference {
            entry: w.entry.node_id(),
            request: REQUEST,
            per_stage,
            stages,
        },
    }
    .sign(&w.caller)
    .to_bytes()
}

fn receipt(signer: &Identity, server: &Identity, stage: u16, request: Hash32) -> Vec<u8> {
    let r = ServeReceipt {
        network: [0; 32],
        request,
        entry: test_identity(10).node_id(),
        stage,
        server: server.node_id(),
        positions: 9,
    };
    Signed::sign(signer, &r).to_bytes()
}

fn settle(by: &Identity, payment: Vec<u8>, receipts: Vec<Vec<u8>>) -> Vec<u8> {
    Signed::sign(by, &Settlement { payment, receipts }).to_bytes()
}

fn honest(w: &World) -> Vec<u8> {
    let receipts = (0..2)
        .map(|i| receipt(&w.servers[i], &w.servers[i], i as u16, REQUEST))
        .collect();
    settle(&w.entry, payment(w, 2), receipts)
}

#[test]
fn a_settlement_pays_each_receipted_stage_burns_a_tenth_and_applies_once() {
    let mut w = world();
    let before: Vec<u64> = [&w.caller, &w.servers[0], &w.servers[1]]
        .map(|i| w.state.account(&i.node_id()).balance)
        .to_vec();
    let burned = w.state.burned();
    let op = decode_op(&honest(&w)).unwrap();
    assert_eq!(op.payees().len(), 2);
    assert!(matches!(
        w.state.apply_op(op.clone()),
        Ok(Outcome::Applied(_))
    ));
    let bal = |s: &LedgerState, i: &Identity| s.account(&i.node_id()).balance;
    assert_eq!(bal(&w.state, &w.caller), before[0] - 2 * PER_STAGE);
    assert_eq!(bal(&w.state, &w.servers[0]), before[1] + PER_STAGE * 9 / 10);
    assert_eq!(bal(&w.state, &w.servers[1]), before[2] + PER_STAGE * 9 / 10);
    assert_eq!(w.state.burned(), burned + 2 * PER_STAGE / 10);
    w.state.check_invariants().unwrap();
    // The same settlement again (gossip, anti-entropy) pays nobody twice.
    assert_eq!(w.state.apply_op(op), Ok(Outcome::Duplicate));
    assert_eq!(bal(&w.state, &w.caller), before[0] - 2 * PER_STAGE);
}

#[test]
fn a_stage_without_a_receipt_is_not_charged() {
    let mut w = world();
    let before = w.state.account(&w.caller.node_id()).balance;
    let one = receipt(&w.servers[1], &w.servers[1], 1, REQUEST);
    let op = decode_op(&settle(&w.entry, payment(&w, 2), vec![one])).unwrap();
    assert!(w.state.apply_op(op).is_ok());
    assert_eq!(
        w.state.account(&w.caller.node_id()).balance,
        before - PER_STAGE
    );
}

#[test]
fn a_bare_payment_op_is_refused() {
    let mut w = world();
    let bare = decode_op(&payment(&w, 2)).unwrap();
    assert_eq!(w.state.apply_op(bare), Err(LedgerError::Unsettled));
}

#[test]
fn only_the_named_entry_node_can_settle() {
    // Another node that saw the payment header cannot claim the fee for its own servers.
    let w = world();
    let receipts = vec![receipt(&w.sybil, &w.sybil, 0, REQUEST)];
    let stolen = settle(&w.sybil, payment(&w, 2), receipts);
    assert!(matches!(
        decode_op(&stolen),
        Err(OpError::Settlement(m)) if m.contains("entry node")
    ));
}

#[test]
fn the_entry_node_cannot_forge_receipts_or_reuse_them() {
    let w = world();
    let check = |receipts: Vec<Vec<u8>>| decode_op(&settle(&w.entry, payment(&w, 2), receipts));
    // A receipt naming server 1 but signed by the entry node: server 1 never served.
    let forged = receipt(&w.entry, &w.servers[1], 1, REQUEST);
    assert!(matches!(check(vec![forged]), Err(OpError::Settlement(_))));
    // A genuine receipt of another request.
    let other = receipt(&w.servers[1], &w.servers[1], 1, [8; 32]);
    assert!(matches!(check(vec![other]), Err(OpError::Settlement(_))));
    // Two receipts for one stage (the entry paying itself twice).
    let twice = vec![
        receipt(&w.servers[0], &w.servers[0], 0, REQUEST),
        receipt(&w.servers[0], &w.servers[0], 0, REQUEST),
    ];
    assert!(matches!(check(twice), Err(OpError::Settlement(_))));
    // A stage beyond what the caller paid for.
    let beyond = receipt(&w.servers[0], &w.servers[0], 2, REQUEST);
    assert!(matches!(check(vec![beyond]), Err(OpError::Settlement(_))));
    assert!(matches!(check(Vec::new()), Err(OpError::Settlement(_))));
}

#[test]
fn a_sybil_that_is_not_registered_for_the_stage_is_not_paid_and_nothing_changes() {
    let mut w = world();
    let hash = w.state.state_hash();
    let receipts = vec![
        receipt(&w.servers[0], &w.servers[0], 0, REQUEST),
        receipt(&w.sybil, &w.sybil, 1, REQUEST),
    ];
    let op = decode_op(&settle(&w.entry, payment(&w, 2), receipts)).unwrap();
    assert!(matches!(
        w.state.apply_op(op),
        Err(LedgerError::NotRegistered { .. })
    ));
    assert_eq!(w.state.state_hash(), hash);
}

#[test]
fn a_caller_cannot_pay_more_than_it_has() {
    let mut w = world();
    let balance = w.state.account(&w.caller.node_id()).balance;
    let op = payment_of(&w, balance, 2);
    let receipts = (0..2)
        .map(|i| receipt(&w.servers[i], &w.servers[i], i as u16, REQUEST))
        .collect();
    let op = decode_op(&settle(&w.entry, op, receipts)).unwrap();
    assert!(matches!(
        w.state.apply_op(op),
        Err(LedgerError::InsufficientBalance { .. })
    ));
}

proptest! {
    #[test]
    fn decode_op_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_op(&bytes);
    }

    #[test]
    fn a_flipped_byte_in_a_settlement_never_pays_anyone_else(at in 0usize..2_000, bit in 0u8..8) {
        let w = world();
        let mut wire = honest(&w);
        let at = at % wire.len();
        wire[at] ^= 1 << bit;
        if let Ok(op) = decode_op(&wire) {
            // Only an unsigned part can change: payees stay the servers.
            for p in op.payees() {
                prop_assert!(w.servers.iter().any(|s| s.node_id() == p.server));
            }
        }
    }
}
