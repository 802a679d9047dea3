//! Catching up under an adversary: which later states a replica behind its stage takes.

use super::tests::{BASE, cfg, done, live, offer, replicas};
use super::*;

fn adopted(acts: &[SyncAction]) -> Option<(u64, Hash32)> {
    acts.iter().find_map(|a| match a {
        SyncAction::Adopt { round, hash, .. } => Some((*round, *hash)),
        _ => None,
    })
}

/// Two Sybil replicas of a stage of seven (f = 2) announce a made-up outer state of a later
/// round, with outcomes and offers against it. A replica that fell behind does not take it,
/// stalled or not, while four honest co-replicas vouch for the real state; it used to adopt
/// any later state that two live co-replicas vouched for.
#[test]
fn two_sybil_replicas_cannot_move_a_lagging_replica_of_a_stage_of_seven() {
    let mut all = replicas(7);
    let t0 = Instant::now();
    let l0 = live(&all, 0);
    for i in [5, 6] {
        let (p, n) = (all[i].peer, all[i].node);
        all[0].s.on_done(p, n, done(9, [66; 32], vec![n]), t0);
        all[0].s.on_offer(p, n, offer(10, [66; 32]), t0);
    }
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
    // Stalled, with the four honest co-replicas offering round 1 against its own θ₀.
    for i in 1..5 {
        let (p, n) = (all[i].peer, all[i].node);
        all[0].s.on_offer(p, n, offer(1, BASE), t0);
    }
    let later = t0 + cfg().timeout * STALLED_TIMEOUTS;
    assert_eq!(adopted(&all[0].s.poll(later, 0, &l0)), None);
    // The honest majority moves on to round 2: that is the state it takes.
    for i in 1..5 {
        let (p, n) = (all[i].peer, all[i].node);
        all[0].s.on_offer(p, n, offer(3, [7; 32]), t0);
    }
    assert_eq!(adopted(&all[0].s.poll(later, 0, &l0)), Some((2, [7; 32])));
}

/// Two Sybils among five: a lagging replica does not follow them while it is not stalled
/// (two of four live co-replicas are no majority), and follows the honest pair's state once
/// three of four vouch for it.
#[test]
fn a_later_round_needs_more_than_half_of_the_live_co_replicas() {
    let mut all = replicas(5);
    let t0 = Instant::now();
    let l0 = live(&all, 0);
    for i in [3, 4] {
        let (p, n) = (all[i].peer, all[i].node);
        all[0].s.on_done(p, n, done(9, [66; 32], vec![n]), t0);
    }
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
    for i in [1, 2] {
        let (p, n) = (all[i].peer, all[i].node);
        all[0].s.on_done(p, n, done(2, [7; 32], vec![n]), t0);
    }
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
    let (p, n) = (all[3].peer, all[3].node);
    all[0].s.on_offer(p, n, offer(3, [7; 32]), t0);
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), Some((2, [7; 32])));
}

/// A replica that finished no round for several round timeouts (no work reached it, its
/// co-replicas split) follows a single live co-replica's later state where no active
/// co-replica vouches for its own; before the stall it does not, a co-replica that vouches
/// for its state outweighs one voucher, and a key that is no live co-replica never counts.
#[test]
fn a_stalled_replica_follows_one_live_voucher_only_where_no_co_replica_holds_its_state() {
    let t0 = Instant::now();
    let later = t0 + cfg().timeout * STALLED_TIMEOUTS;
    let mallory = NodeId([66; 32]);
    let run = |third_offers: bool| {
        let mut all = replicas(3);
        let l0 = live(&all, 0);
        let (p1, n1) = (all[1].peer, all[1].node);
        all[0]
            .s
            .on_done(mallory, mallory, done(4, [66; 32], vec![]), t0);
        all[0].s.on_done(p1, n1, done(3, [7; 32], vec![]), t0);
        if third_offers {
            let (p2, n2) = (all[2].peer, all[2].node);
            all[0].s.on_offer(p2, n2, offer(1, BASE), t0);
        }
        assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
        adopted(&all[0].s.poll(later, 0, &l0))
    };
    assert_eq!(run(false), Some((3, [7; 32])));
    assert_eq!(run(true), None);
}

/// Where the replica has three or more live co-replicas, one voucher never moves it, stalled
/// or not, even when the others send nothing.
#[test]
fn one_key_never_moves_a_replica_with_three_live_co_replicas() {
    let mut all = replicas(4);
    let t0 = Instant::now();
    let l0 = live(&all, 0);
    let (p, n) = (all[3].peer, all[3].node);
    all[0].s.on_done(p, n, done(5, [66; 32], vec![n]), t0);
    all[0].s.on_offer(p, n, offer(6, [66; 32]), t0);
    all[0].s.on_hint(n, 7, [66; 32]);
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
    let later = t0 + cfg().timeout * STALLED_TIMEOUTS;
    assert_eq!(adopted(&all[0].s.poll(later, 0, &l0)), None);
}

/// A replica that keeps taking inner steps is not stalled however long its round lasts (a
/// deep pipeline's rounds outlast four round timeouts): one key in a stage of three moves it
/// only once its steps stop too. Counting time alone left every replica of a slow stage open
/// to one voucher between its rounds.
#[test]
fn a_replica_that_keeps_stepping_is_not_stalled_by_a_long_round() {
    let mut all = replicas(3);
    let t0 = Instant::now();
    let l0 = live(&all, 0);
    let (p, n) = (all[2].peer, all[2].node);
    all[0].s.on_done(p, n, done(4, [66; 32], vec![n]), t0);
    let stall = cfg().timeout * STALLED_TIMEOUTS;
    assert_eq!(adopted(&all[0].s.poll(t0, 0, &l0)), None);
    assert_eq!(adopted(&all[0].s.poll(t0 + stall, 1, &l0)), None);
    assert_eq!(
        adopted(&all[0].s.poll(t0 + stall * 2 - cfg().timeout, 1, &l0)),
        None
    );
    assert_eq!(
        adopted(&all[0].s.poll(t0 + stall * 2, 1, &l0)),
        Some((4, [66; 32]))
    );
}

/// A stalled replica of a stage of three whose honest co-replica holds one later state and
/// whose other co-replica, a Sybil, claims another of a later round: a tie, and it follows
/// neither. The tie used to go to the later round, so one key out-bid the honest
/// co-replica by claiming a round further on.
#[test]
fn a_stalled_replica_does_not_follow_a_sybil_that_ties_its_honest_co_replica() {
    let t0 = Instant::now();
    let later = t0 + cfg().timeout * STALLED_TIMEOUTS;
    let mut all = replicas(3);
    let l0 = live(&all, 0);
    let (p1, n1) = (all[1].peer, all[1].node);
    let (p2, n2) = (all[2].peer, all[2].node);
    all[0].s.on_done(p1, n1, done(3, [7; 32], vec![n1]), t0);
    all[0].s.on_done(p2, n2, done(9, [66; 32], vec![n2]), t0);
    assert_eq!(adopted(&all[0].s.poll(later, 0, &l0)), None);
    // Once the Sybil's vote is gone (it left the live set), the honest state is taken.
    let only_honest: BTreeSet<NodeId> = l0.iter().copied().filter(|n| *n != n2).collect();
    assert_eq!(
        adopted(&all[0].s.poll(later, 0, &only_honest)),
        Some((3, [7; 32]))
    );
}

/// A replica of a stage of six hears only the stage's two Sybils (it just restarted, or
/// they are all the peers it reached): they vouch for a made-up later state. It does not take
/// it, stalled or not, because the finalized ledger names its three unheard honest
/// co-replicas as active provers of the stage; without them it would (the control), as two of
/// two live co-replicas used to be a majority. Once the honest trio's votes reach it (relayed:
/// it still hears none of them directly), it takes the real state.
#[test]
fn sybils_that_are_all_a_replica_hears_cannot_move_it_past_the_stages_active_provers() {
    let t0 = Instant::now();
    let later = t0 + cfg().timeout * STALLED_TIMEOUTS;
    let run = |knows_active: bool| {
        let mut all = replicas(6);
        let sybils: BTreeSet<NodeId> = [all[4].node, all[5].node].into();
        if knows_active {
            let active = live(&all, 0);
            all[0].s.set_active(active);
        }
        for i in [4, 5] {
            let (p, n) = (all[i].peer, all[i].node);
            all[0].s.on_done(p, n, done(9, [66; 32], vec![n]), t0);
            all[0].s.on_offer(p, n, offer(10, [66; 32]), t0);
        }
        let now = adopted(&all[0].s.poll(t0, 0, &sybils));
        let stalled = adopted(&all[0].s.poll(later, 0, &sybils));
        (now, stalled, all, sybils)
    };
    let (now, stalled, ..) = run(false);
    assert_eq!(
        now,
        Some((9, [66; 32])),
        "the control: no active provers known"
    );
    assert_eq!(stalled, None, "already adopting");
    let (now, stalled, mut all, sybils) = run(true);
    assert_eq!((now, stalled), (None, None));
    let relay = all[4].peer;
    for i in 1..4 {
        let n = all[i].node;
        all[0].s.on_offer(relay, n, offer(3, [7; 32]), t0);
    }
    assert_eq!(
        adopted(&all[0].s.poll(later, 0, &sybils)),
        Some((2, [7; 32]))
    );
}
