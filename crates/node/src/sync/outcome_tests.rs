//! Outcomes that name their offers: equivocation, replicas that moved on, majorities for
//! outcomes that cannot be recomputed, and bounded offer fetches.

use std::time::Instant;

use super::tests::*;
use super::*;

/// A replica that signs two offers of one round shows each half of the stage another one.
/// Each half aggregates what it saw; the outcomes name the offers they used, so the half
/// whose outcome loses asks the winner's announcer for the offer it lacks, recomputes the
/// winning outcome from exactly the named offers and takes it: the stage ends on one θ₀.
#[test]
fn an_equivocating_contributor_cannot_split_the_stage() {
    let mut all = replicas(3);
    let now = Instant::now();
    let (a, b, m) = (all[0].node, all[1].node, all[2].node);
    let (pa, pb, pm) = (all[0].peer, all[1].peer, all[2].peer);
    for i in 0..2 {
        let l = live(&all, i);
        all[i].s.poll(now, 4, &l);
        prepare_and_offer(&mut all, i, now);
    }
    // m's two offers of round 1, against the same θ₀: one to a, one to b.
    let to_a = SyncOffer {
        blob: [70; 32],
        ..offer(1, BASE)
    };
    let to_b = SyncOffer {
        blob: [71; 32],
        ..offer(1, BASE)
    };
    all[0].s.on_offer(pm, m, to_a.clone(), now);
    all[1].s.on_offer(pm, m, to_b.clone(), now);
    let mut outcomes = Vec::new();
    for (i, theta) in [(0, [40; 32]), (1, [30; 32])] {
        let l = live(&all, i);
        let got = aggregate_of(&all[i].s.poll(now, 4, &l));
        let (_, used) = all[i].s.on_applied(1, theta, got, 4, now);
        outcomes.push(SyncDone {
            blobs: used.iter().map(|(_, h)| *h).collect(),
            ..done(1, theta, used.iter().map(|(n, _)| *n).collect())
        });
    }
    assert!(outcomes[0].blobs.contains(&[70; 32]) && outcomes[1].blobs.contains(&[71; 32]));
    // b's outcome (the smaller hash, same count) wins. b, seeing a's, keeps its own.
    let acts = all[1].s.on_done(pa, a, outcomes[0].clone(), now);
    assert!(
        acts.iter().all(|x| matches!(x, SyncAction::Event(_))),
        "{acts:?}"
    );
    // a lacks the offer of m that b's outcome names: it asks b, the announcer.
    let acts = all[0].s.on_done(pb, b, outcomes[1].clone(), now);
    assert_eq!(
        acts,
        vec![SyncAction::FetchOffers {
            round: 1,
            from: pb,
            nodes: vec![m]
        }]
    );
    // b relays m's signed offer; a recomputes over exactly the named offers, fetching m's
    // other pseudo-gradient from b, who served it.
    let acts = all[0].s.on_offer(pb, m, to_b, now);
    let set: Vec<(NodeId, Hash32)> = outcomes[1].named().collect();
    assert_eq!(
        acts,
        vec![SyncAction::Verify {
            round: 1,
            fetch: vec![(m, pb, [71; 32])],
            set: set.clone(),
            theta: [30; 32],
            announcer: pb,
        }]
    );
    all[0].s.on_recomputed(1, [30; 32], [30; 32], set, 5, now);
    assert_eq!(all[0].s.theta(), all[1].s.theta());
    // m's first offer stays known: an outcome naming it can still be checked.
    let again = all[0].s.on_done(pm, m, outcomes[0].clone(), now);
    assert!(
        !again
            .iter()
            .any(|x| matches!(x, SyncAction::FetchOffers { .. }))
    );
}

/// A replica that aggregated its round from fewer inputs and already started the next one
/// abandons that round for an outcome of its own round with more inputs, which it then
/// recomputes; an outcome that only wins on its hash does not stop it. Before, a replica that
/// had moved on never looked at outcomes of its last round again, and ran a lineage of its
/// own until training ended.
#[test]
fn a_replica_that_moved_on_abandons_its_round_for_a_larger_outcome_of_the_last() {
    let (mut all, now) = replica_zero_aggregating(3);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let l0 = live(&all, 0);
    assert_eq!(
        all[0].s.poll(now, 8, &l0),
        vec![SyncAction::Prepare { round: 2 }]
    );
    all[0].s.on_prepared(2, [50; 32], 100, 12_800, None, now);
    let (pb, pc) = (all[1].peer, all[2].peer);
    let acts = all[0].s.on_done(pb, b, done(1, [1; 32], vec![a, b]), now);
    assert!(
        !acts.iter().any(|x| matches!(x, SyncAction::Verify { .. })),
        "{acts:?}"
    );
    assert!(all[0].s.busy(), "still collecting round 2");
    let acts = all[0]
        .s
        .on_done(pc, c, done(1, [9; 32], vec![a, b, c]), now);
    assert!(
        matches!(acts.as_slice(), [SyncAction::Verify { round: 1, .. }]),
        "{acts:?}"
    );
}

/// An outcome of our round that outranks ours but that we cannot recompute (its inputs are
/// offers we do not hold against our θ₀): a majority of live co-replicas vouching for it moves
/// us to it, one does not.
#[test]
fn a_majority_vouching_for_a_better_outcome_we_cannot_recompute_moves_a_replica() {
    let (mut all, now) = replica_zero_aggregating(3);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a], 4, now);
    let l0 = live(&all, 0);
    let (pb, pc) = (all[1].peer, all[2].peer);
    let theirs = || done_of_offers(1, [9; 32], vec![b, c]);
    all[0].s.on_done(pb, b, theirs(), now);
    let acts = all[0].s.poll(now, 4, &l0);
    assert!(acts.is_empty(), "one voucher moved it: {acts:?}");
    all[0].s.on_done(pc, c, theirs(), now);
    let acts = all[0].s.poll(now, 4, &l0);
    assert!(
        matches!(
            acts.as_slice(),
            [SyncAction::Adopt {
                round: 1,
                hash: [9, ..],
                ..
            }]
        ),
        "{acts:?}"
    );
}

/// Many announcers of one outcome naming an offer we lack: at most `ASKS_PER_OUTCOME` of
/// them are asked for it (a stage of many replicas announcing it would otherwise cost a fetch
/// each), and one announcer is asked once a round whatever it announces.
#[test]
fn an_outcome_is_asked_about_from_a_few_announcers_and_each_announcer_once() {
    let (mut all, now) = replica_zero_aggregating(4);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let lacking = |theta: [u8; 32]| {
        let mut o = done(1, theta, vec![a, b, c]);
        o.blobs[2] = [77; 32];
        o
    };
    let mut asked = Vec::new();
    let mut fetches = |acts: Vec<SyncAction>| {
        asked.extend(acts.into_iter().filter_map(|x| match x {
            SyncAction::FetchOffers { from, .. } => Some(from),
            _ => None,
        }))
    };
    for i in 1..4 {
        let (peer, node) = (all[i].peer, all[i].node);
        fetches(all[0].s.on_done(peer, node, lacking([9; 32]), now));
    }
    // The first announcer again, with another outcome of the round: not asked again.
    let (peer, node) = (all[1].peer, all[1].node);
    fetches(all[0].s.on_done(peer, node, lacking([8; 32]), now));
    assert_eq!(asked, vec![all[1].peer, all[2].peer]);
    assert_eq!(asked.len(), ASKS_PER_OUTCOME);
}

/// Already collecting the next round, a replica still judges outcomes of its last round
/// against the θ₀ its own offer of that round was made against: a larger outcome built on an
/// offer against another θ₀ is another lineage, neither recomputed (which would brand an
/// honest announcer a liar) nor worth abandoning the round for.
#[test]
fn a_replica_in_the_next_round_does_not_recompute_an_outcome_of_another_lineage() {
    let (mut all, now) = replica_zero_aggregating(3);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let l0 = live(&all, 0);
    all[0].s.poll(now, 8, &l0);
    all[0].s.on_prepared(2, [50; 32], 100, 12_800, None, now);
    // c's only offer of round 1 we hold is against another θ₀.
    let pc = all[2].peer;
    all[0].s.on_offer(pc, c, offer(1, [7; 32]), now);
    let mut outcome = done(1, [9; 32], vec![a, b, c]);
    outcome.blobs[2] = [1; 32];
    let acts = all[0].s.on_done(pc, c, outcome, now);
    assert!(
        !acts.iter().any(|x| matches!(x, SyncAction::Verify { .. })),
        "{acts:?}"
    );
    assert!(all[0].s.busy(), "still collecting round 2");
}
