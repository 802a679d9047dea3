use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn id(i: u64) -> Hash32 {
    *blake3::hash(&i.to_le_bytes()).as_bytes()
}

/// Runs a whole session of `ours` against `theirs`; returns what we were found to lack, the
/// round trips and the bytes both ways.
fn reconcile(ours: &BTreeSet<Hash32>, theirs: &BTreeSet<Hash32>) -> (BTreeSet<Hash32>, u32, usize) {
    let responder = SyncSet::new(theirs.iter().copied());
    let (mut session, mut msg) = Session::start(SyncSet::new(ours.iter().copied())).unwrap();
    let mut bytes = msg.len();
    let mut lacking = BTreeSet::new();
    loop {
        let reply = answer(&responder, &msg).unwrap();
        bytes += reply.len();
        let next = session.on_answer(&reply).unwrap();
        loop {
            let wants = session.take_wants(|_| false);
            if wants.is_empty() {
                break;
            }
            lacking.extend(wants);
        }
        match next {
            Some(next) => {
                bytes += next.len();
                msg = next;
            }
            None => break,
        }
    }
    assert!(session.finished());
    (lacking, session.rounds(), bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever the two sets, the session finds exactly what the responder holds and we lack.
    #[test]
    fn a_session_finds_exactly_what_we_lack(
        shared in 0u64..3_000,
        only_ours in 0u64..400,
        only_theirs in 0u64..400,
    ) {
        let common: BTreeSet<Hash32> = (0..shared).map(id).collect();
        let mut ours = common.clone();
        ours.extend((0..only_ours).map(|i| id(1_000_000 + i)));
        let mut theirs = common;
        theirs.extend((0..only_theirs).map(|i| id(2_000_000 + i)));
        let (lacking, _, _) = reconcile(&ours, &theirs);
        let expected: BTreeSet<Hash32> = theirs.difference(&ours).copied().collect();
        prop_assert_eq!(lacking, expected);
    }

    /// Random bytes, and valid messages with bytes changed, never panic the responder or the
    /// initiator: an error, or an answer within the frame.
    #[test]
    fn malformed_messages_never_panic(
        junk in proptest::collection::vec(any::<u8>(), 0..600),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let set = SyncSet::new((0..500).map(id));
        if let Ok(reply) = answer(&set, &junk) {
            prop_assert!(reply.len() <= MAX_NEG_FRAME);
        }
        let (mut session, mut first) = Session::start(SyncSet::new((250..700).map(id))).unwrap();
        for (at, byte) in &flips {
            let i = at.index(first.len());
            first[i] = *byte;
        }
        if let Ok(reply) = answer(&set, &first) {
            prop_assert!(reply.len() <= MAX_NEG_FRAME);
        }
        let _ = session.on_answer(&junk);
        let _ = session.take_wants(|_| false);
    }
}

/// Past the old design's cliffs (131,072 proofs; 65,536 provers in one request): 200,000 ids
/// on each side, 300 different on each, reconcile in 8 round trips and 537 kB (about 0.9 kB per
/// difference: each sits in a leaf range whose ids are listed),
/// where listing the set would take 6.4 MB.
#[test]
fn a_large_set_with_few_differences_reconciles_in_little_traffic() {
    let common: BTreeSet<Hash32> = (0..200_000).map(id).collect();
    let mut ours = common.clone();
    ours.extend((0..300).map(|i| id(10_000_000 + i)));
    let mut theirs = common;
    theirs.extend((0..300).map(|i| id(20_000_000 + i)));
    let (lacking, rounds, bytes) = reconcile(&ours, &theirs);
    assert_eq!(lacking.len(), 300);
    assert!(rounds <= 12, "{rounds} round trips");
    assert!(bytes < 1_000_000, "{bytes} bytes");
    eprintln!("200,000 ids, 300 missing each side: {rounds} round trips, {bytes} bytes");
}

/// A difference bigger than one frame takes several round trips, never a truncated list.
#[test]
fn a_difference_larger_than_a_frame_spreads_over_round_trips() {
    let ours: BTreeSet<Hash32> = BTreeSet::new();
    let theirs: BTreeSet<Hash32> = (0..20_000).map(id).collect();
    let (lacking, rounds, _) = reconcile(&ours, &theirs);
    assert_eq!(lacking, theirs);
    assert!(rounds > 1);
}

/// A responder that keeps answering with ranges to split cannot hold a session forever.
#[test]
fn a_session_ends_after_its_round_budget() {
    let (mut session, first) = Session::start(SyncSet::new((0..5_000).map(id))).unwrap();
    // An honest answer from a very different set keeps the session splitting; replaying the
    // same answer forever is what a stalling responder does.
    let stall = answer(&SyncSet::new((10_000..60_000).map(id)), &first).unwrap();
    let mut steps = 0;
    while !session.finished() {
        let _ = session.on_answer(&stall);
        steps += 1;
        assert!(steps <= MAX_SESSION_ROUNDS, "the session did not end");
    }
    assert!(session.rounds() <= MAX_SESSION_ROUNDS);
}

#[test]
fn oversized_messages_are_refused_on_both_sides() {
    let set = SyncSet::new((0..10).map(id));
    let huge = vec![0x61; MAX_NEG_BYTES + 1];
    assert!(matches!(
        answer(&set, &huge),
        Err(ReconcileError::TooLarge(_))
    ));
    let (mut session, _) = Session::start(set).unwrap();
    assert!(session.on_answer(&huge).is_err());
    assert!(session.finished());
}

#[test]
fn wants_are_handed_out_once_and_skip_what_arrived() {
    let ours: BTreeSet<Hash32> = BTreeSet::new();
    let theirs: BTreeSet<Hash32> = (0..3_000).map(id).collect();
    let responder = SyncSet::new(theirs.iter().copied());
    let (mut session, first) = Session::start(SyncSet::new(ours)).unwrap();
    let reply = answer(&responder, &first).unwrap();
    session.on_answer(&reply).unwrap();
    let arrived = id(5);
    let first_batch = session.take_wants(|h| *h == arrived);
    assert!(first_batch.len() <= MAX_WANT);
    assert!(!first_batch.contains(&arrived));
    let second = session.take_wants(|_| false);
    assert!(first_batch.iter().all(|h| !second.contains(h)));
}
