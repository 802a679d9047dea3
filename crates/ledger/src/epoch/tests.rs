use proptest::prelude::*;

use super::*;
use crate::ops::{AccountOp, Action, verify_op};
use crate::rules::{LedgerGenesis, Rules};
use neuroshard_proof::fixtures::{test_identity, uptime_proof};
use neuroshard_proof::{Identity, ProofVerifier};

const T0: u64 = 1_800_000_000_000;

pub(super) fn op(id: &Identity, nonce: u64, action: Action) -> EpochItem {
    let signed = AccountOp {
        network: Rules::default().network,
        account: id.node_id(),
        nonce,
        timestamp_ms: T0 + nonce,
        action,
    }
    .sign(id);
    EpochItem::Op(verify_op(&signed).expect("fixture op"))
}

fn proof(id: &Identity, nonce: u64, neighbour: &Identity) -> EpochItem {
    let mut v = ProofVerifier::new();
    v.add_known_node(neighbour.public_key());
    let p = uptime_proof(id, nonce, T0 + nonce);
    EpochItem::Proof(v.verify(&p.sign(id), T0 + nonce).expect("fixture proof"))
}

/// A founder with stake and balance to move, two others, and a mix of items, among them a
/// conflicting pair (two ops at one nonce) whose outcome arrival order would decide.
fn world() -> (LedgerState, Vec<EpochItem>) {
    let (a, b, c) = (test_identity(1), test_identity(2), test_identity(3));
    let rules = Rules::default();
    let genesis = LedgerGenesis::new(rules, vec![(a.public_key(), 3 * rules.min_stake)]).unwrap();
    let (state, _) = LedgerState::from_genesis(&genesis).unwrap();
    let items = vec![
        proof(&a, 0, &b),
        proof(&a, 1, &b),
        proof(&b, 0, &a),
        proof(&c, 0, &a),
        op(&a, 0, Action::Register { stage: 1 }),
        op(&a, 1, Action::Register { stage: 2 }),
        // The same nonce again, another action: one of the two wins, the same on every node.
        op(&a, 1, Action::Register { stage: 3 }),
        op(&b, 0, Action::Burn { amount: 1 }),
    ];
    (state, items)
}

proptest! {
    /// The same items in any order, repeated or not, give the same contents and state.
    #[test]
    fn any_order_of_the_same_items_gives_one_epoch(
        order in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle(),
        repeat in 0..8usize,
    ) {
        let (base, items) = world();
        let mut s1 = base.clone();
        let reference = apply_epoch(&mut s1, items.clone());
        let mut shuffled: Vec<EpochItem> = order.iter().map(|&i| items[i].clone()).collect();
        shuffled.push(items[repeat].clone());
        let mut s2 = base.clone();
        let other = apply_epoch(&mut s2, shuffled);
        prop_assert_eq!(other.contents, reference.contents);
        prop_assert_eq!(other.state, reference.state);
        prop_assert_eq!(other.refused.len(), reference.refused.len());
    }
}

#[test]
fn a_conflict_is_settled_by_the_canonical_order_and_listed() {
    let (base, items) = world();
    let mut s = base.clone();
    let e = apply_epoch(&mut s, items);
    // One of the two ops at (a, 1) is refused, whichever arrived first anywhere; and b's
    // burn, ordered before the proof that pays b, finds nothing to burn.
    let conflicts = e
        .refused
        .iter()
        .filter(|(_, why)| matches!(why, LedgerError::OpNonceConflict { .. }))
        .count();
    assert_eq!(conflicts, 1, "{:?}", e.refused);
    assert_eq!(e.refused.len(), 2, "{:?}", e.refused);
    assert_eq!(e.state, s.state_hash());
    // Another epoch's items give other contents.
    let (base, mut items) = world();
    items.pop();
    let mut t = base.clone();
    assert_ne!(apply_epoch(&mut t, items).contents, e.contents);
}

#[test]
fn an_empty_epoch_changes_nothing() {
    let (base, _) = world();
    let mut s = base.clone();
    let e = apply_epoch(&mut s, Vec::new());
    assert_eq!(e.state, base.state_hash());
    assert!(e.refused.is_empty());
}

#[test]
fn the_admission_rule_refuses_an_item_alike_and_the_contents_still_name_it() {
    let (base, items) = world();
    let mut all = base.clone();
    let reference = apply_epoch(&mut all, items.clone());
    assert_eq!(epoch_contents(&items), reference.contents);
    // Admitting no proof of node 3: its proof is listed as refused, the rest apply as before.
    let c = test_identity(3).node_id();
    let mut admitted = base.clone();
    let out = apply_epoch_admitted(&mut admitted, items.clone(), |_, item| match item {
        EpochItem::Proof(p) if p.proof().node_id == c => Err("not admitted here".into()),
        _ => Ok(()),
    });
    assert_eq!(out.contents, reference.contents);
    assert!(
        out.refused
            .iter()
            .any(|(_, e)| matches!(e, LedgerError::NotAdmitted(_)))
    );
    assert_ne!(out.state, reference.state);
    let without: Vec<EpochItem> = items
        .into_iter()
        .filter(|i| !matches!(i, EpochItem::Proof(p) if p.proof().node_id == c))
        .collect();
    let mut plain = base;
    assert_eq!(apply_epoch(&mut plain, without).state, out.state);
}
