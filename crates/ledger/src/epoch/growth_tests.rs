//! The architecture in the finalized state: announcements, joins and the growth rule at the
//! end of an epoch.

use proptest::prelude::*;

use super::*;
use crate::ops::Action;
use crate::rules::{LedgerGenesis, Rules};
use neuroshard_growth::{Architecture, Evaluated, GrowthPolicy, NetworkGrowth, Shape};
use neuroshard_proof::fixtures::test_identity;

use super::tests::op;

const GIB: u64 = 1 << 30;

/// A growing network (2 stages of a 4-layer model, K = 10, a one-day horizon) whose
/// genesis stakes identities 1..=`staked`.
fn network(staked: u64) -> LedgerState {
    let rules = Rules::default();
    let stakes = (1..=staked)
        .map(|i| (test_identity(i).public_key(), rules.min_stake))
        .collect();
    let mut policy = GrowthPolicy::depth(64);
    policy.rule.every_joins = 10;
    policy.scaler.horizon_s = 86_400;
    let arch = Architecture::genesis(Shape::ladder(256, 4, 4096), &[2, 2]).unwrap();
    let growth = NetworkGrowth::new(policy, arch).unwrap();
    let genesis = LedgerGenesis::new(rules, stakes)
        .unwrap()
        .with_growth(growth);
    LedgerState::from_genesis(&genesis).unwrap().0
}

/// Node `i` registers for a stage and announces `gib` GiB and 1 TFLOP/s.
fn joins(i: u64, gib: u64) -> Vec<EpochItem> {
    let id = test_identity(i);
    vec![
        op(
            &id,
            0,
            Action::Register {
                stage: (i % 2) as u16,
            },
        ),
        op(
            &id,
            1,
            Action::Announce {
                memory_bytes: gib * GIB,
                flops_per_s: 1_000_000_000_000,
            },
        ),
    ]
}

#[test]
fn the_tenth_join_upgrades_the_finalized_architecture_and_its_hash_names_it() {
    let mut s = network(12);
    let genesis_hash = s.state_hash();
    let first: Vec<EpochItem> = (1..=9).flat_map(|i| joins(i, 2)).collect();
    let e = apply_epoch(&mut s, first);
    assert!(e.refused.is_empty(), "{:?}", e.refused);
    assert_eq!(e.growth, Some(Evaluated::NotDue));
    assert_eq!(s.joins(), 9);
    assert_eq!(s.architecture().unwrap().version, 0);
    let before = s.state_hash();
    let e = apply_epoch(&mut s, joins(10, 2));
    assert_eq!(e.growth, Some(Evaluated::Pending { joins: 10 }));
    assert_ne!(
        e.state, before,
        "the pending evaluation is part of the state"
    );
    let e = apply_epoch(&mut s, Vec::new());
    let Some(Evaluated::Upgraded(up)) = e.growth else {
        panic!("ten joins of 2 GiB deepen the model: {:?}", e.growth);
    };
    assert_eq!((up.joins, up.counted, up.epoch), (10, 10, 3));
    let arch = s.architecture().unwrap();
    assert_eq!(arch.version, 1);
    assert!(arch.shape.layers > 4);
    // The old stages keep their ids and layers; the new layers sit between them.
    assert_eq!(
        arch.stages.first().map(|st| (st.id, st.layers)),
        Some((0, 2))
    );
    assert_eq!(
        arch.stages.last().map(|st| (st.id, st.layers)),
        Some((1, 2))
    );
    assert_ne!(e.state, before);
    assert_ne!(genesis_hash, before);
    // An empty epoch after it evaluates nothing and changes nothing.
    let e = apply_epoch(&mut s, Vec::new());
    assert_eq!(e.growth, Some(Evaluated::NotDue));
    assert_eq!(e.state, s.state_hash());
}

#[test]
fn an_announcement_needs_stake_and_the_latest_one_counts() {
    let mut s = network(2);
    let stranger = test_identity(50);
    let e = apply_epoch(
        &mut s,
        vec![op(
            &stranger,
            0,
            Action::Announce {
                memory_bytes: 1 << 50,
                flops_per_s: u64::MAX,
            },
        )],
    );
    assert!(
        matches!(e.refused.as_slice(), [(_, LedgerError::StakeTooLow { .. })]),
        "{:?}",
        e.refused
    );
    assert_eq!(s.claim(&stranger.node_id()), None);
    let mut items = joins(1, 2);
    items.push(op(
        &test_identity(1),
        2,
        Action::Announce {
            memory_bytes: 3 * GIB,
            flops_per_s: 5,
        },
    ));
    apply_epoch(&mut s, items);
    assert_eq!(s.claim(&test_identity(1).node_id()), Some((3 * GIB, 5)));
    // Staked but not registered: its announcement is kept but not counted.
    apply_epoch(
        &mut s,
        vec![op(
            &test_identity(2),
            0,
            Action::Announce {
                memory_bytes: GIB,
                flops_per_s: 1,
            },
        )],
    );
    let counted: Vec<[u8; 32]> = s.registered_claims().iter().map(|c| c.node).collect();
    assert_eq!(counted, vec![test_identity(1).node_id().0]);
    // A registered account that unstakes below the minimum stays a join, but its claim no
    // longer counts: only stake-backed capacity does.
    let mut u = network(2);
    let mut items = joins(2, 2);
    items.push(op(
        &test_identity(2),
        2,
        Action::Unstake {
            amount: Rules::default().min_stake,
        },
    ));
    let e = apply_epoch(&mut u, items);
    assert!(e.refused.is_empty(), "{:?}", e.refused);
    assert_eq!(u.joins(), 1);
    assert!(u.registered_claims().is_empty());
    // A join is a registration with an announcement: neither alone counts.
    assert_eq!(s.joins(), 1);
    let mut t = network(3);
    apply_epoch(
        &mut t,
        vec![op(&test_identity(3), 0, Action::Register { stage: 0 })],
    );
    assert_eq!(t.joins(), 0);
}

#[test]
fn live_ledgers_never_evaluate_so_their_hash_is_unchanged_by_growth() {
    let plain = {
        let rules = Rules::default();
        let stakes = (1..=3u64)
            .map(|i| (test_identity(i).public_key(), rules.min_stake))
            .collect();
        LedgerState::from_genesis(&LedgerGenesis::new(rules, stakes).unwrap())
            .unwrap()
            .0
    };
    let mut grows = network(3);
    let mut fixed = plain;
    for item in (1..=3).flat_map(|i| joins(i, 2)) {
        let EpochItem::Op(o) = item else { continue };
        grows.apply_op(o.clone()).unwrap();
        fixed.apply_op(o).unwrap();
    }
    assert_eq!(grows.state_hash(), fixed.state_hash());
}

proptest! {
    /// Nodes that finalize the same epochs reach the same architecture and state whatever
    /// order each epoch's items came in, and however the joins fall into epochs only the
    /// evaluation points reached matter.
    #[test]
    fn the_same_epochs_in_any_item_order_give_one_architecture(
        order in Just((0..30usize).collect::<Vec<_>>()).prop_shuffle(),
        cut in 1..29usize,
    ) {
        let items: Vec<EpochItem> = (1..=15).flat_map(|i| joins(i, 1 + i % 3)).collect();
        let mut a = network(16);
        apply_epoch(&mut a, items[..cut].to_vec());
        let ea = apply_epoch(&mut a, items[cut..].to_vec());
        let shuffled: Vec<EpochItem> = order.iter().map(|&i| items[i].clone()).collect();
        let mut b = network(16);
        // The same two epochs, each in another order.
        let first: Vec<EpochItem> = shuffled.iter().filter(|i| items[..cut].iter().any(|j| j.id() == i.id())).cloned().collect();
        let second: Vec<EpochItem> = shuffled.iter().filter(|i| items[cut..].iter().any(|j| j.id() == i.id())).cloned().collect();
        apply_epoch(&mut b, first);
        let eb = apply_epoch(&mut b, second);
        prop_assert_eq!(ea.state, eb.state);
        prop_assert_eq!(a.architecture(), b.architecture());
    }
}
