use super::*;

pub(super) const NET: [u8; 32] = [1; 32];
pub(super) const BASE: [u8; 32] = [0; 32];

pub(super) fn cfg() -> SyncConfig {
    SyncConfig {
        every: 4,
        timeout: Duration::from_secs(2),
        retry_after: Duration::from_secs(1),
        network: NET,
        stage: 0,
        clock: crate::events::Clock::new(Instant::now(), 0),
    }
}

pub(super) struct Replica {
    pub(super) node: NodeId,
    pub(super) peer: NodeId,
    pub(super) s: Syncer,
}

pub(super) fn replicas(n: u8) -> Vec<Replica> {
    (1..=n)
        .map(|i| Replica {
            node: NodeId([i; 32]),
            peer: NodeId(rand::random()),
            s: Syncer::new(cfg(), NodeId([i; 32]), 0, BASE, 0),
        })
        .collect()
}

pub(super) fn live(all: &[Replica], me: usize) -> BTreeSet<NodeId> {
    all.iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .map(|(_, r)| r.node)
        .collect()
}

/// An offer of `round` made against θ₀ `base`.
pub(super) fn offer(round: u64, base: [u8; 32]) -> SyncOffer {
    SyncOffer {
        network: NET,
        stage: 0,
        round,
        base,
        blob: [1; 32],
        bytes: 1,
        dense_bytes: 4,
        commitment: None,
    }
}

pub(super) fn offer_of(actions: &[SyncAction]) -> SyncOffer {
    match actions.iter().find_map(|a| match a {
        SyncAction::Publish(SyncMsg::Offer(o)) => Some(o.clone()),
        _ => None,
    }) {
        Some(o) => o,
        None => panic!("no offer in {actions:?}"),
    }
}

/// Replica `i` prepares round 1 and its offer reaches every other replica.
pub(super) fn prepare_and_offer(all: &mut [Replica], i: usize, now: Instant) {
    let blob = [10 + i as u8; 32];
    let acts = all[i].s.on_prepared(1, blob, 100, 12_800, None, now);
    let offer = offer_of(&acts);
    assert_eq!(offer.base, BASE);
    let (node, peer) = (all[i].node, all[i].peer);
    for (j, r) in all.iter_mut().enumerate() {
        if j != i {
            r.s.on_offer(peer, node, offer.clone(), Instant::now());
        }
    }
}

/// `n` replicas that all offered round 1; replica 0 has started aggregating it.
pub(super) fn replica_zero_aggregating(n: u8) -> (Vec<Replica>, Instant) {
    let mut all = replicas(n);
    let now = Instant::now();
    for i in 0..usize::from(n) {
        let l = live(&all, i);
        all[i].s.poll(now, 4, &l);
        prepare_and_offer(&mut all, i, now);
    }
    let l0 = live(&all, 0);
    aggregate_of(&all[0].s.poll(now, 4, &l0));
    (all, now)
}

pub(super) fn aggregate_of(actions: &[SyncAction]) -> Vec<NodeId> {
    match actions {
        [SyncAction::Aggregate { from, .. }] => from.iter().map(|(n, _, _)| *n).collect(),
        other => panic!("expected one Aggregate, got {other:?}"),
    }
}

/// The pseudo-gradient replica `n` offers in round 1 (see [`prepare_and_offer`]).
pub(super) fn blob_of(n: &NodeId) -> Hash32 {
    [n.0[0].wrapping_add(9); 32]
}

/// Each node with its round-1 offer.
pub(super) fn named(nodes: &[NodeId]) -> Vec<(NodeId, Hash32)> {
    nodes.iter().map(|n| (*n, blob_of(n))).collect()
}

/// An outcome naming `offer()`'s blob for every contributor.
pub(super) fn done_of_offers(round: u64, theta: [u8; 32], contributors: Vec<NodeId>) -> SyncDone {
    SyncDone {
        blobs: vec![[1; 32]; contributors.len()],
        ..done(round, theta, contributors)
    }
}

pub(super) fn done(round: u64, theta: [u8; 32], contributors: Vec<NodeId>) -> SyncDone {
    SyncDone {
        network: NET,
        stage: 0,
        round,
        theta,
        blobs: contributors.iter().map(blob_of).collect(),
        contributors,
        receipts: Vec::new(),
    }
}

#[test]
fn the_first_replica_at_h_leads_and_the_others_follow_into_one_round() {
    let mut all = replicas(3);
    let now = Instant::now();
    let l0 = live(&all, 0);
    assert!(
        all[0].s.poll(now, 3, &l0).is_empty(),
        "H = 4 not reached yet"
    );
    assert_eq!(
        all[0].s.poll(now, 4, &l0),
        vec![SyncAction::Prepare { round: 1 }]
    );
    prepare_and_offer(&mut all, 0, now);
    // The others have done fewer than H steps but follow the leader's offer.
    for i in 1..3 {
        let l = live(&all, i);
        assert_eq!(
            all[i].s.poll(now, 2, &l),
            vec![SyncAction::Prepare { round: 1 }]
        );
        prepare_and_offer(&mut all, i, now);
    }
    let theta = [42; 32];
    for i in 0..3 {
        let l = live(&all, i);
        let mut got = aggregate_of(&all[i].s.poll(now, 4, &l));
        got.sort();
        assert_eq!(got, vec![all[0].node, all[1].node, all[2].node]);
        let contributors = got.clone();
        let (acts, used) = all[i].s.on_applied(1, theta, contributors.clone(), 4, now);
        assert_eq!(used, named(&contributors), "each input named by its offer");
        assert!(matches!(
            &acts[0],
            SyncAction::Event(NodeEvent::Sync {
                contributors: 3,
                expected: 3,
                ..
            })
        ));
        assert_eq!(all[i].s.round(), 1);
    }
    // Same outcome everywhere: a peer's Done only produces an agreement event.
    let (peer, node) = (all[1].peer, all[1].node);
    let everyone = vec![all[0].node, all[1].node, all[2].node];
    let acts = all[0]
        .s
        .on_done(peer, node, done(1, theta, everyone), Instant::now());
    assert!(matches!(
        acts.as_slice(),
        [SyncAction::Event(NodeEvent::Agreed { round: 1, .. })]
    ));
}

#[test]
fn a_silent_replica_is_left_out_after_the_deadline() {
    let mut all = replicas(3);
    let now = Instant::now();
    for i in 0..2 {
        let l = live(&all, i);
        assert_eq!(
            all[i].s.poll(now, 4, &l),
            vec![SyncAction::Prepare { round: 1 }]
        );
        prepare_and_offer(&mut all, i, now);
    }
    let l0 = live(&all, 0);
    assert!(
        all[0].s.poll(now, 5, &l0).is_empty(),
        "waits for the third replica"
    );
    let later = now + Duration::from_secs(3);
    let got = aggregate_of(&all[0].s.poll(later, 6, &l0));
    assert_eq!(got, vec![all[0].node, all[1].node]);
}

#[test]
fn the_larger_outcome_wins_and_the_smaller_one_recomputes_it() {
    let (mut all, now) = replica_zero_aggregating(3);
    // Replica 0 ended up using only two inputs (say a fetch failed); replica 1 used three.
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let (peer, node) = (all[1].peer, all[1].node);
    let acts = all[0]
        .s
        .on_done(peer, node, done(1, [9; 32], vec![a, b, c]), Instant::now());
    // It does not take replica 1's bytes: it fetches the one offer it lacks and recomputes.
    assert_eq!(
        acts,
        vec![SyncAction::Verify {
            round: 1,
            fetch: vec![(c, all[2].peer, [12; 32])],
            set: named(&[a, b, c]),
            theta: [9; 32],
            announcer: peer,
        }]
    );
    assert!(all[0].s.busy());
    let acts = all[0]
        .s
        .on_recomputed(1, [9; 32], [9; 32], named(&[a, b, c]), 5, Instant::now());
    assert!(
        matches!(
            acts.as_slice(),
            [
                SyncAction::Event(NodeEvent::Adopted { round: 1, .. }),
                SyncAction::Event(NodeEvent::Agreed { .. })
            ]
        ),
        "{acts:?}"
    );
    assert_eq!(all[0].s.theta(), [9; 32]);
    assert!(!all[0].s.busy());
}

#[test]
fn a_false_announcement_is_caught_by_recomputing_and_never_followed_again() {
    let (mut all, now) = replica_zero_aggregating(3);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let (peer, node) = (all[1].peer, all[1].node);
    let acts = all[0]
        .s
        .on_done(peer, node, done(1, [1; 32], vec![a, b, c]), Instant::now());
    assert!(matches!(acts.as_slice(), [SyncAction::Verify { .. }]));
    // Our recomputation over {a, b, c} hashes to [6; 32], not the announced [1; 32].
    let acts = all[0]
        .s
        .on_recomputed(1, [6; 32], [1; 32], named(&[a, b, c]), 5, Instant::now());
    assert_eq!(all[0].s.theta(), [6; 32]);
    assert!(!acts.iter().any(|a| matches!(a, SyncAction::Verify { .. })));
    let acts = all[0]
        .s
        .on_done(peer, node, done(1, [1; 32], vec![a, b, c]), Instant::now());
    assert!(acts.is_empty(), "{acts:?}");
}

#[test]
fn invented_contributors_cannot_outrank_an_outcome() {
    let (mut all, now) = replica_zero_aggregating(2);
    let (a, b) = (all[0].node, all[1].node);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, now);
    let sybil = NodeId([99; 32]);
    let (peer, node) = (all[1].peer, all[1].node);
    let acts = all[0].s.on_done(
        peer,
        node,
        done(1, [1; 32], vec![a, b, sybil]),
        Instant::now(),
    );
    // The announcer is asked for the offer it names; without one signed by the Sybil (an
    // unregistered key's offer never reaches the syncer) nothing moves, and a second outcome
    // of the same announcer asks nothing again.
    assert_eq!(
        acts,
        vec![SyncAction::FetchOffers {
            round: 1,
            from: peer,
            nodes: vec![sybil]
        }]
    );
    let acts = all[0].s.on_done(
        peer,
        node,
        done(1, [2; 32], vec![a, b, sybil]),
        Instant::now(),
    );
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(all[0].s.theta(), [5; 32]);
}

#[test]
fn a_replica_behind_fetches_the_latest_outer_state() {
    let mut all = replicas(3);
    let now = Instant::now();
    let (peer, node) = (all[1].peer, all[1].node);
    let others = vec![all[1].node, all[2].node];
    all[0]
        .s
        .on_done(peer, node, done(3, [7; 32], others.clone()), Instant::now());
    let l0 = live(&all, 0);
    // One of two live co-replicas is not enough to move to a later round.
    assert!(all[0].s.poll(now, 0, &l0).is_empty());
    let (peer2, node2) = (all[2].peer, all[2].node);
    all[0]
        .s
        .on_done(peer2, node2, done(3, [7; 32], others), Instant::now());
    let acts = all[0].s.poll(now, 0, &l0);
    assert_eq!(
        acts,
        vec![SyncAction::Adopt {
            round: 3,
            peer,
            hash: [7; 32],
            included: false
        }]
    );
    all[0].s.on_adopted(3, [7; 32], 0, "behind", Instant::now());
    assert_eq!(all[0].s.round(), 3);
    // Offers of round 5 mean round 4 exists: its base is fetched from an offerer.
    all[0]
        .s
        .on_offer(peer2, node2, offer(5, [8; 32]), Instant::now());
    all[0]
        .s
        .on_offer(peer, node, offer(5, [8; 32]), Instant::now());
    let acts = all[0].s.poll(now, 1, &l0);
    assert!(matches!(
        acts.as_slice(),
        [SyncAction::Adopt {
            round: 4,
            hash: [8, ..],
            ..
        }]
    ));
}

#[test]
fn one_dissenting_offer_does_not_move_a_replica_but_a_majority_does() {
    let mut all = replicas(3);
    let now = Instant::now();
    let odd = |base| offer(1, base);
    let l0 = live(&all, 0);
    let (p1, n1, p2, n2) = (all[1].peer, all[1].node, all[2].peer, all[2].node);
    all[0].s.on_offer(p1, n1, odd([3; 32]), Instant::now());
    // One of two co-replicas disagrees: no adoption; the replica follows the offer instead
    // only if it shares the base, which it does not.
    assert!(all[0].s.poll(now, 0, &l0).is_empty());
    all[0].s.on_offer(p2, n2, odd([3; 32]), Instant::now());
    let acts = all[0].s.poll(now, 0, &l0);
    assert!(matches!(
        acts.as_slice(),
        [SyncAction::Adopt {
            round: 0,
            hash: [3, ..],
            ..
        }]
    ));
}

#[test]
fn disabled_sync_does_nothing() {
    let mut s = Syncer::new(
        SyncConfig { every: 0, ..cfg() },
        NodeId([1; 32]),
        0,
        BASE,
        0,
    );
    assert!(s.poll(Instant::now(), 1_000, &BTreeSet::new()).is_empty());
}

#[test]
fn a_replica_that_took_its_state_from_a_peer_fetches_a_better_outcome_a_majority_announces() {
    let mut all = replicas(3);
    let now = Instant::now();
    let (b, c) = (all[1].node, all[2].node);
    let (p1, n1, p2, n2) = (all[1].peer, all[1].node, all[2].peer, all[2].node);
    // Both co-replicas offered in round 2 (against θ₀ [3; 32] of round 1) while we were away.
    for (peer, node) in [(p1, n1), (p2, n2)] {
        all[0]
            .s
            .on_offer(peer, node, offer(2, [3; 32]), Instant::now());
    }
    for (peer, node) in [(p1, n1), (p2, n2)] {
        all[0].s.on_done(
            peer,
            node,
            done_of_offers(2, [7; 32], vec![b]),
            Instant::now(),
        );
    }
    let l0 = live(&all, 0);
    let acts = all[0].s.poll(now, 0, &l0);
    assert!(
        matches!(
            acts.as_slice(),
            [SyncAction::Adopt {
                round: 2,
                hash: [7, ..],
                ..
            }]
        ),
        "{acts:?}"
    );
    all[0].s.on_adopted(2, [7; 32], 0, "behind", Instant::now());
    // Nor is an outcome naming offers we lack worth asking about: we would not recompute it.
    let mut lacking = done_of_offers(2, [6; 32], vec![b, c]);
    lacking.blobs[1] = [77; 32];
    let acts = all[0].s.on_done(p1, n1, lacking, Instant::now());
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, SyncAction::FetchOffers { .. })),
        "{acts:?}"
    );
    // One announcer of a better outcome is not enough: it could name real offers beside a θ₀
    // of its own making, and we cannot recompute (we aggregated nothing this round).
    let acts: Vec<SyncAction> = all[0]
        .s
        .on_done(
            p2,
            n2,
            done_of_offers(2, [8; 32], vec![b, c]),
            Instant::now(),
        )
        .into_iter()
        .filter(|a| !matches!(a, SyncAction::Event(_)))
        .collect();
    assert!(acts.is_empty(), "{acts:?}");
    assert!(
        all[0].s.poll(now, 0, &l0).is_empty(),
        "one announcer moved it"
    );
    all[0].s.on_done(
        p1,
        n1,
        done_of_offers(2, [8; 32], vec![b, c]),
        Instant::now(),
    );
    let acts = all[0].s.poll(now, 0, &l0);
    assert!(
        matches!(
            acts.as_slice(),
            [SyncAction::Adopt {
                round: 2,
                hash: [8, ..],
                included: false,
                ..
            }]
        ),
        "{acts:?}"
    );
}

/// Replica 1 is on another θ₀ lineage (its round-1 offer and that of a fourth replica were
/// made against base [7; 32]): its larger outcome cannot be recomputed from our base, so we
/// neither verify nor refuse it. Recomputing it would brand an honest replica a liar.
#[test]
fn an_outcome_built_on_another_base_is_not_recomputed() {
    let (mut all, now) = replica_zero_aggregating(3);
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    let d = NodeId([44; 32]);
    let other = [7; 32];
    let bpeer = all[1].peer;
    // b and d offered again against another base (replayed into our view).
    all[0].s.on_offer(bpeer, b, offer(1, other), Instant::now());
    all[0]
        .s
        .on_offer(NodeId([45; 32]), d, offer(1, other), Instant::now());
    all[0].s.on_applied(1, [5; 32], vec![a, c], 4, now);
    let mut outcome = done(1, [9; 32], vec![a, b, c, d]);
    outcome.blobs[1] = [1; 32];
    outcome.blobs[3] = [1; 32];
    let acts = all[0].s.on_done(bpeer, b, outcome, Instant::now());
    // We hold b's and d's named offers only against the other base: we ask b for them (it
    // might hold them against ours), and what it relays is against the other base too.
    assert_eq!(
        acts,
        vec![SyncAction::FetchOffers {
            round: 1,
            from: bpeer,
            nodes: vec![b, d]
        }]
    );
    let acts = all[0].s.on_offer(bpeer, d, offer(1, other), Instant::now());
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(all[0].s.theta(), [5; 32]);
}

/// A round-0 offer (rounds start at 1) used to make `round - 1` wrap to u64::MAX, and the
/// replica then fetched and adopted the sender's θ₀ as round u64::MAX.
#[test]
fn a_round_zero_offer_is_ignored() {
    let mut all = replicas(2);
    let now = Instant::now();
    let (peer, node) = (all[1].peer, all[1].node);
    all[0]
        .s
        .on_offer(peer, node, offer(0, [66; 32]), Instant::now());
    let l = live(&all, 0);
    let acts = all[0].s.poll(now, 1, &l);
    assert!(
        !acts.iter().any(|a| matches!(a, SyncAction::Adopt { .. })),
        "{acts:?}"
    );
    assert_eq!(all[0].s.round(), 0);
}

/// One signed `SyncDone` of a later round, from a co-replica or from a key that is no
/// co-replica at all, and a DHT record of round u64::MAX: none moves a replica whose stage
/// has two other live replicas (it used to adopt whatever any single key announced).
#[test]
fn a_single_key_cannot_move_a_stage_to_a_later_round() {
    let mut all = replicas(3);
    let now = Instant::now();
    let l0 = live(&all, 0);
    let (b, c) = (all[1].node, all[2].node);
    let mallory = NodeId([66; 32]);
    let (p1, n1) = (all[1].peer, all[1].node);
    all[0]
        .s
        .on_done(p1, n1, done(1, [66; 32], vec![b, c]), Instant::now());
    for r in 1..4 {
        all[0].s.on_done(
            mallory,
            mallory,
            done(r, [66; 32], vec![b, c]),
            Instant::now(),
        );
        all[0]
            .s
            .on_offer(mallory, mallory, offer(r + 1, [66; 32]), Instant::now());
    }
    all[0].s.on_hint(mallory, u64::MAX, [66; 32]);
    all[0].s.on_hint(n1, u64::MAX - 1, [66; 32]);
    let acts = all[0].s.poll(now, 0, &l0);
    assert!(
        !acts.iter().any(|a| matches!(a, SyncAction::Adopt { .. })),
        "{acts:?}"
    );
    assert_eq!(all[0].s.round(), 0);
}

/// An offer that arrives after a larger outcome naming it (it was late, or held until its
/// sender's registration arrived) lets the replica recompute that outcome; before, the
/// outcome was skipped once and the stage stayed split for the round.
#[test]
fn an_offer_arriving_after_a_larger_outcome_lets_the_replica_recompute_it() {
    let mut all = replicas(3);
    let now = Instant::now();
    for i in 0..3 {
        let l = live(&all, i);
        all[i].s.poll(now, 4, &l);
    }
    prepare_and_offer(&mut all, 0, now);
    prepare_and_offer(&mut all, 1, now);
    // Replica 2's offer reaches replica 1 only.
    let late = offer_of(&all[2].s.on_prepared(1, [12; 32], 100, 12_800, None, now));
    let (a, b, c) = (all[0].node, all[1].node, all[2].node);
    let (peer1, peer2) = (all[1].peer, all[2].peer);
    all[1].s.on_offer(peer2, c, late.clone(), now);
    // Replica 0's deadline passes: it aggregates {0, 1}.
    let after = now + cfg().timeout + Duration::from_millis(1);
    let l0 = live(&all, 0);
    assert_eq!(aggregate_of(&all[0].s.poll(after, 4, &l0)), vec![a, b]);
    all[0].s.on_applied(1, [5; 32], vec![a, b], 4, after);
    // Replica 1 announces {0, 1, 2}: replica 0 lacks 2's offer, so it cannot check it yet;
    // it asks replica 1 for it.
    let acts = all[0]
        .s
        .on_done(peer1, b, done(1, [9; 32], vec![a, b, c]), after);
    assert_eq!(
        acts,
        vec![SyncAction::FetchOffers {
            round: 1,
            from: peer1,
            nodes: vec![c]
        }]
    );
    let acts = all[0].s.on_offer(peer2, c, late, after);
    assert_eq!(
        acts,
        vec![SyncAction::Verify {
            round: 1,
            fetch: vec![(c, peer2, [12; 32])],
            set: named(&[a, b, c]),
            theta: [9; 32],
            announcer: peer1,
        }]
    );
}

/// A sender that announces offers and outcomes for thousands of future rounds is held to its
/// latest few; before, every one was kept until the replica reached that round (never).
#[test]
fn a_flood_of_future_rounds_from_one_sender_holds_a_few_entries() {
    let mut all = replicas(3);
    let (p1, n1) = (all[1].peer, all[1].node);
    let mallory = NodeId([66; 32]);
    for r in 1..10_000u64 {
        all[0]
            .s
            .on_offer(mallory, mallory, offer(r, [66; 32]), Instant::now());
        all[0].s.on_done(
            mallory,
            mallory,
            done(r, [66; 32], vec![mallory]),
            Instant::now(),
        );
    }
    // An honest co-replica's entries are its own: the flood does not push them out.
    all[0].s.on_offer(p1, n1, offer(1, BASE), Instant::now());
    assert_eq!(all[0].s.held(), 2 * ROUNDS_PER_SENDER + 1);
}

#[test]
fn a_replica_whose_training_ended_starts_no_round_and_follows_none_but_still_adopts() {
    let mut all = replicas(3);
    let now = Instant::now();
    all[0].s.end_training();
    let l0 = live(&all, 0);
    // H steps done: it would lead a round, but no inner progress will come after it.
    assert!(all[0].s.poll(now, 4, &l0).is_empty());
    // Another replica leads: it does not follow into a round it cannot train through.
    let l1 = live(&all, 1);
    assert_eq!(
        all[1].s.poll(now, 4, &l1),
        vec![SyncAction::Prepare { round: 1 }]
    );
    prepare_and_offer(&mut all, 1, now);
    assert!(all[0].s.poll(now, 4, &l0).is_empty());
    // Outcomes its co-replicas agree on still move it, so it ends on their state.
    let others = vec![all[1].node, all[2].node];
    for i in 1..3 {
        let (peer, node) = (all[i].peer, all[i].node);
        all[0]
            .s
            .on_done(peer, node, done(1, [7; 32], others.clone()), Instant::now());
    }
    assert!(matches!(
        all[0].s.poll(now, 4, &l0).as_slice(),
        [SyncAction::Adopt {
            round: 1,
            hash: [7, ..],
            ..
        }]
    ));
}

/// Gossip lost a live co-replica's offer: a quarter into the wait the replica asks that
/// co-replica (and only it) once for its messages, wakes for it, and aggregates everyone's
/// offer when the pulled one arrives, as its co-replicas do.
#[test]
fn a_missing_offer_is_pulled_from_its_replica_at_each_quarter_of_the_wait() {
    let mut all = replicas(3);
    let now = Instant::now();
    for i in 0..3 {
        let l = live(&all, i);
        all[i].s.poll(now, 4, &l);
    }
    for i in 0..2 {
        prepare_and_offer(&mut all, i, now);
    }
    let l0 = live(&all, 0);
    assert!(all[0].s.poll(now, 5, &l0).is_empty(), "waits for replica 2");
    let pull_at = now + cfg().timeout / 4;
    assert_eq!(all[0].s.next_deadline(), Some(pull_at));
    let early = pull_at - Duration::from_millis(1);
    assert!(all[0].s.poll(early, 5, &l0).is_empty(), "pulled too early");
    let asked = all[0].s.poll(pull_at, 5, &l0);
    assert_eq!(
        asked,
        vec![SyncAction::Pull {
            round: 1,
            from: vec![all[2].node],
        }]
    );
    assert!(all[0].s.poll(pull_at, 5, &l0).is_empty(), "pulled twice");
    // Replica 2 is slower and had no offer yet: it is asked again a quarter later.
    let again = pull_at + cfg().timeout / 4;
    assert_eq!(all[0].s.next_deadline(), Some(again));
    assert_eq!(all[0].s.poll(again, 5, &l0), asked);
    // Replica 2's offer, as its answer to the second pull brings it.
    let acts = all[2].s.on_prepared(1, [12; 32], 100, 12_800, None, now);
    let (node, peer) = (all[2].node, all[2].peer);
    all[0].s.on_offer(peer, node, offer_of(&acts), again);
    let got = aggregate_of(&all[0].s.poll(again, 5, &l0));
    assert_eq!(got, vec![all[0].node, all[1].node, all[2].node]);
}

/// A replica of a large stage pulls a few of the many missing offers (most are replicas that
/// have not started the round yet, not lost ones), starting after its own id so that the
/// stage's pulls spread over its replicas.
#[test]
fn a_replica_of_a_large_stage_pulls_a_few_offers_starting_after_its_own_id() {
    let mut all = replicas(9);
    let now = Instant::now();
    for i in 0..9 {
        let l = live(&all, i);
        all[i].s.poll(now, 4, &l);
    }
    let (node, peer) = (all[1].node, all[1].peer);
    all[4].s.on_offer(peer, node, offer(1, BASE), now);
    // Replica 4 (id [5; 32]) offers; of the 8 others only replica 1 offered.
    offer_of(&all[4].s.on_prepared(1, [14; 32], 100, 12_800, None, now));
    let l4 = live(&all, 4);
    let asked = all[4].s.poll(now + cfg().timeout / 4, 5, &l4);
    let ids = |idx: &[usize]| idx.iter().map(|&i| all[i].node).collect::<Vec<_>>();
    assert_eq!(
        asked,
        vec![SyncAction::Pull {
            round: 1,
            from: ids(&[5, 6, 7, 8]),
        }]
    );
}
