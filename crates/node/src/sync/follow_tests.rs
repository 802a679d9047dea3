//! A slow replica follows its stage's round; one that had nothing to offer joins the
//! round's outcome by recomputing it, never from one key's word.

use super::tests::*;
use super::*;

/// Replica 0 leads round 1 (its offer reaches every other replica at `now`).
fn led(n: u8) -> (Vec<Replica>, Instant) {
    let mut all = replicas(n);
    let now = Instant::now();
    let l0 = live(&all, 0);
    assert_eq!(
        all[0].s.poll(now, 4, &l0),
        vec![SyncAction::Prepare { round: 1 }]
    );
    prepare_and_offer(&mut all, 0, now);
    (all, now)
}

/// When an honest lead whose co-replicas offered nothing closes round 1 alone: its deadline
/// and [`LONE_EXTRA_TIMEOUTS`] more.
fn lone_close(now: Instant) -> Instant {
    now + cfg().timeout * (1 + LONE_EXTRA_TIMEOUTS)
}

/// Replica 0's outcome of round 1 over its own offer reaches replica `i`.
fn announce_alone(all: &mut [Replica], i: usize, theta: Hash32, at: Instant) {
    let (peer, node) = (all[0].peer, all[0].node);
    all[i].s.on_done(peer, node, done(1, theta, vec![node]), at);
}

#[test]
fn a_slow_replica_follows_with_a_quarter_round_once_the_lead_has_waited() {
    let (mut all, now) = led(3);
    let l1 = live(&all, 1);
    // One step of H = 4: too few to follow at once.
    assert!(all[1].s.poll(now, 1, &l1).is_empty());
    let wait = cfg().timeout / 2;
    assert_eq!(
        all[1].s.next_deadline(),
        Some(now + wait),
        "the runtime wakes it when the wait runs out"
    );
    assert!(all[1].s.poll(now + wait / 2, 1, &l1).is_empty());
    // Before: it waited for H/2 steps, which a replica a third as fast as the lead reaches
    // after the lead's round has closed.
    assert_eq!(
        all[1].s.poll(now + wait, 1, &l1),
        vec![SyncAction::Prepare { round: 1 }]
    );
}

#[test]
fn a_replica_without_steps_offers_nothing_and_is_not_woken_again_and_again() {
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    let wait = cfg().timeout / 2;
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    assert!(
        all[2].s.poll(now + wait, 0, &l2).is_empty(),
        "no Δ to offer"
    );
    // A deadline already past would make the runtime poll in a loop.
    assert_eq!(all[2].s.next_deadline(), None);
}

#[test]
fn a_replica_the_round_closed_without_recomputes_its_outcome_and_stays_on_the_stages_line() {
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    let wait = cfg().timeout / 2;
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    assert!(all[2].s.poll(now + wait, 0, &l2).is_empty());
    let theta = [42; 32];
    let closed = lone_close(now);
    announce_alone(&mut all, 2, theta, closed);
    // Before: one announcer of two live co-replicas is no majority, so it waited, then ran
    // round 1 itself from the old θ₀: a second line of states the stage never merged.
    let acts = all[2].s.poll(closed, 0, &l2);
    assert_eq!(
        acts,
        vec![SyncAction::Aggregate {
            round: 1,
            from: vec![(all[0].node, Some(all[0].peer), blob_of(&all[0].node))],
        }],
        "the lead's signed offer, fetched from whoever brought it; nothing of ours"
    );
    let lead = all[0].node;
    let (acts, _) = all[2].s.on_applied(1, theta, vec![lead], 0, closed);
    assert!(matches!(
        &acts[0],
        SyncAction::Event(NodeEvent::Sync {
            round: 1,
            included_self: false,
            ..
        })
    ));
    assert_eq!((all[2].s.round(), all[2].s.theta()), (1, theta));
}

#[test]
fn a_replica_that_could_offer_joins_a_round_that_closed_at_its_deadline_instead() {
    let (mut all, now) = led(3);
    let l1 = live(&all, 1);
    all[1].s.poll(now, 2, &l1);
    prepare_and_offer(&mut all, 1, now);
    let l2 = live(&all, 2);
    // Replica 2 was busy (say, still finishing round 0) until the lead's round closed a
    // full deadline after its offer reached it; it has H/2 steps by then.
    let closed = now + cfg().timeout + Duration::from_millis(100);
    let both = vec![all[0].node, all[1].node];
    let (peer, node) = (all[0].peer, all[0].node);
    all[2]
        .s
        .on_done(peer, node, done(1, [42; 32], both.clone()), closed);
    // Before: it offered late into a round the others had left, and its larger outcome
    // started a line of its own.
    assert_eq!(aggregate_of(&all[2].s.poll(closed, 2, &l2)), both);
}

#[test]
fn an_outcome_one_key_announces_at_once_is_joined_by_no_one_who_could_still_offer() {
    // The lead announces its outcome over its own offer the moment it offers.
    let (mut all, now) = led(3);
    let wait = cfg().timeout / 2;
    for i in 1..3 {
        announce_alone(&mut all, i, [42; 32], now);
    }
    let l1 = live(&all, 1);
    let l2 = live(&all, 2);
    // Before the wait runs out no one joins it, steps or not.
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    assert!(all[1].s.poll(now, 1, &l1).is_empty());
    // After it, a replica with a quarter round offers into the round (its larger outcome
    // wins over the announced one) rather than taking the lone offer's outcome.
    assert_eq!(
        all[1].s.poll(now + wait, 1, &l1),
        vec![SyncAction::Prepare { round: 1 }]
    );
}

#[test]
fn a_lone_outcome_is_joined_only_once_its_lead_waited_as_an_honest_lone_lead_does() {
    // A key leads round 1 the moment round 0 closed and announces its outcome over its own
    // offer a deadline later, when replica 2 has no step yet.
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    let wait = cfg().timeout / 2;
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    let early = now + cfg().timeout + Duration::from_millis(100);
    announce_alone(&mut all, 2, [42; 32], early);
    // Before: it closed on time and replica 2 could not offer, so it joined, and the key
    // alone moved θ₀ of every other round.
    assert!(all[2].s.poll(early, 0, &l2).is_empty(), "not joined");
    // With a quarter round of steps it offers into round 1 itself, the key's offer beside
    // its own: the larger outcome the stage follows.
    assert_eq!(
        all[2].s.poll(early + wait, 1, &l2),
        vec![SyncAction::Prepare { round: 1 }]
    );
}

#[test]
fn a_lead_alone_waits_longer_for_its_live_co_replicas_before_it_closes_the_round() {
    let (mut all, now) = led(3);
    let l0 = live(&all, 0);
    let deadline = now + cfg().timeout;
    // Before: it closed the round alone at its deadline, and since no replica joins a lone
    // outcome that early, the stage would split.
    assert!(all[0].s.poll(deadline, 5, &l0).is_empty());
    let closed = lone_close(now);
    let wake = all[0].s.next_deadline().expect("woken while it waits");
    assert!(
        deadline < wake && wake <= closed,
        "not a deadline already past"
    );
    // Replica 1 offers meanwhile; replica 2 never does.
    let l1 = live(&all, 1);
    all[1].s.poll(deadline, 2, &l1);
    prepare_and_offer(&mut all, 1, deadline);
    let acts = all[0].s.poll(closed - Duration::from_millis(1), 5, &l0);
    assert_eq!(
        acts,
        vec![SyncAction::Pull {
            round: 1,
            from: vec![all[2].node]
        }],
        "replica 2's offer is still pulled; the round is not closed"
    );
    assert_eq!(
        aggregate_of(&all[0].s.poll(closed, 5, &l0)),
        vec![all[0].node, all[1].node]
    );
    // Once: a lead that waited the extra time and still holds no other offer closes alone.
    let (mut all, now) = led(3);
    let l0 = live(&all, 0);
    assert!(all[0].s.poll(now + cfg().timeout, 5, &l0).is_empty());
    assert_eq!(
        aggregate_of(&all[0].s.poll(lone_close(now), 5, &l0)),
        vec![all[0].node]
    );
    // With no live co-replica it closes at its deadline, as before.
    let (mut all, now) = led(3);
    assert_eq!(
        aggregate_of(&all[0].s.poll(now + cfg().timeout, 5, &BTreeSet::new())),
        vec![all[0].node]
    );
}

#[test]
fn an_outcome_naming_offers_not_held_against_our_theta_is_not_joined() {
    let (mut all, now) = led(3);
    let wait = cfg().timeout / 2;
    let l2 = live(&all, 2);
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    let (peer, node) = (all[0].peer, all[0].node);
    let me = all[2].node;
    // Naming us (we offered nothing), naming a blob of the lead's we never saw, and naming
    // a co-replica that offered nothing: none can be recomputed here.
    let claims = [
        done(1, [50; 32], vec![node, me]),
        SyncDone {
            blobs: vec![[77; 32]],
            ..done(1, [51; 32], vec![node])
        },
        done(1, [52; 32], vec![node, all[1].node]),
    ];
    for d in claims {
        all[2].s.on_done(peer, node, d, now);
    }
    assert!(all[2].s.poll(now + wait, 0, &l2).is_empty());
    // The lead's offer made against another θ₀ leads no one here.
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    let (peer, node) = (all[0].peer, all[0].node);
    all[2].s.on_offer(
        peer,
        node,
        SyncOffer {
            blob: blob_of(&node),
            ..offer(1, [9; 32])
        },
        now,
    );
    announce_alone(&mut all, 2, [42; 32], now);
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    assert!(
        all[2].s.poll(now + wait, 0, &l2).is_empty(),
        "its only offer of round 1 is no longer against our θ₀"
    );
}

#[test]
fn a_replica_that_joined_a_lone_outcome_moves_to_the_larger_one() {
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    // Replica 1 offers too; the lead announced over its own offer only.
    let l1 = live(&all, 1);
    assert_eq!(
        all[1].s.poll(now, 2, &l1),
        vec![SyncAction::Prepare { round: 1 }]
    );
    prepare_and_offer(&mut all, 1, now);
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    let closed = lone_close(now);
    announce_alone(&mut all, 2, [42; 32], closed);
    // The best outcome it can recompute when it joins is the lone one.
    aggregate_of(&all[2].s.poll(closed, 0, &l2));
    let lead = all[0].node;
    all[2].s.on_applied(1, [42; 32], vec![lead], 0, closed);
    // Replica 1's outcome over both offers outranks it: recomputed, not taken on trust.
    let both = vec![all[0].node, all[1].node];
    let (peer, node) = (all[1].peer, all[1].node);
    let acts = all[2]
        .s
        .on_done(peer, node, done(1, [43; 32], both.clone()), closed);
    assert!(
        acts.iter().any(|a| matches!(
            a,
            SyncAction::Verify { round: 1, set, .. } if set.len() == 2
        )),
        "{acts:?}"
    );
}

#[test]
fn a_replica_that_joined_a_round_offers_its_steps_into_the_next_one() {
    // A key leads round 1 the moment round 0 closed: replica 2 has no step yet and joins
    // its lone outcome once it closed as late as an honest lone lead's.
    let (mut all, now) = led(3);
    let l2 = live(&all, 2);
    let wait = cfg().timeout / 2;
    assert!(all[2].s.poll(now, 0, &l2).is_empty());
    let closed = lone_close(now);
    announce_alone(&mut all, 2, [42; 32], closed);
    aggregate_of(&all[2].s.poll(closed, 0, &l2));
    let lead = all[0].node;
    // It took 3 inner steps (of H = 4) while the round closed and it recomputed.
    all[2]
        .s
        .on_applied(1, [42; 32], vec![lead], 3, closed + wait);
    // The key leads round 2 at once again. Before: joining restarted the step count, so
    // replica 2 had 0 steps of round 2, joined again, and the key decided every round.
    let (peer, node) = (all[0].peer, all[0].node);
    let lead2 = SyncOffer {
        blob: [77; 32],
        ..offer(2, [42; 32])
    };
    all[2].s.on_offer(peer, node, lead2, closed + wait);
    assert_eq!(
        all[2].s.poll(closed + wait, 3, &l2),
        vec![SyncAction::Prepare { round: 2 }],
        "its 3 steps are more than H/2"
    );
}

#[test]
fn arrival_times_are_kept_only_for_the_offers_and_outcomes_held() {
    let (mut all, now) = led(3);
    let (peer, node) = (all[1].peer, all[1].node);
    // One key floods offers and outcomes of a thousand future rounds.
    for round in 1..=1000u64 {
        all[2].s.on_offer(peer, node, offer(round, [9; 32]), now);
        all[2]
            .s
            .on_done(peer, node, done(round, [9; 32], vec![node]), now);
    }
    let of_flooder = all[2].s.seen.keys().filter(|(n, _, _)| *n == node).count();
    assert_eq!(of_flooder, 2 * ROUNDS_PER_SENDER);
}
