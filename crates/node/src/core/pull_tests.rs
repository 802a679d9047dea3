//! Pulling round messages: a pull is answered with the responder's own messages of the round
//! asked and nothing else, and a pulled message counts only as the asked peer's own gossip.

use std::time::Instant;

use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, NodeId, Signed};

use super::tests::{NETWORK, core, drain};
use super::*;
use crate::sync::{SyncDone, SyncMsg, SyncOffer, SyncPull, SyncPullAnswer};

fn offer(round: u64) -> SyncMsg {
    SyncMsg::Offer(SyncOffer {
        network: NETWORK,
        stage: 1,
        round,
        base: [0; 32],
        blob: [round as u8; 32],
        bytes: 10,
        dense_bytes: 40,
    })
}

/// The answer `core` gives to a pull of `(network, stage, round)`.
fn answer(core: &mut NodeCore, network: [u8; 32], stage: u16, round: u64) -> SyncPullAnswer {
    let data = SyncPull {
        network,
        stage,
        round,
    }
    .to_canonical_bytes();
    core.handle_message(
        NodeId([5; 32]),
        Inbound::Request { token: 77, data },
        Instant::now(),
    );
    let data = drain(core)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Respond { token: 77, data } => Some(data),
            _ => None,
        })
        .expect("an answer");
    SyncPullAnswer::from_canonical_bytes(&data).unwrap()
}

#[test]
fn a_pull_is_answered_with_our_own_messages_of_that_round_only() {
    let me = test_identity(1);
    let mut c = core(&me, Instant::now());
    c.publish_sync(&offer(3));
    c.publish_sync(&SyncMsg::Done(SyncDone {
        network: NETWORK,
        stage: 1,
        round: 3,
        theta: [3; 32],
        contributors: vec![me.node_id()],
        receipts: Vec::new(),
    }));
    c.publish_sync(&offer(4));
    drain(&mut c);
    let got = answer(&mut c, NETWORK, 1, 3);
    assert_eq!(got.messages.len(), 2);
    for m in &got.messages {
        let (msg, key) = io::open_from::<SyncMsg>(m, &me.node_id()).unwrap();
        assert_eq!(key.node_id(), me.node_id());
        assert_eq!(msg.round(), 3);
    }
    // A second outcome of round 3 (a recomputation) replaces the first: the offer stays.
    c.publish_sync(&SyncMsg::Done(SyncDone {
        network: NETWORK,
        stage: 1,
        round: 3,
        theta: [4; 32],
        contributors: vec![me.node_id()],
        receipts: Vec::new(),
    }));
    drain(&mut c);
    let got = answer(&mut c, NETWORK, 1, 3);
    let offer_first = |m: &Vec<u8>| {
        matches!(
            io::open_from::<SyncMsg>(m, &me.node_id()),
            Ok((SyncMsg::Offer(_), _))
        )
    };
    let kinds: Vec<bool> = got.messages.iter().map(offer_first).collect();
    assert_eq!(kinds, vec![true, false], "the offer and the latest outcome");
    let latest = io::open_from::<SyncMsg>(&got.messages[1], &me.node_id());
    assert!(
        matches!(latest, Ok((SyncMsg::Done(d), _)) if d.theta == [4; 32]),
        "not the latest outcome"
    );
    assert!(
        answer(&mut c, [8; 32], 1, 3).messages.is_empty(),
        "other network"
    );
    assert!(
        answer(&mut c, NETWORK, 0, 3).messages.is_empty(),
        "other stage"
    );
    assert!(
        answer(&mut c, NETWORK, 1, 9).messages.is_empty(),
        "unknown round"
    );
    // Only the last few rounds are kept: a peer cannot make us hold every message we sent.
    for round in 5..40 {
        c.publish_sync(&offer(round));
    }
    assert_eq!(c.rounds.published.len(), pull::PUBLISHED_KEPT);
    assert!(answer(&mut c, NETWORK, 1, 4).messages.is_empty());
}

/// Sends a pull of round 1 to `peer` and answers it with `data`; what the core transmits next.
fn pulled(c: &mut NodeCore, peer: &Identity, data: Vec<u8>) -> Vec<Transmit> {
    c.send_sync_pulls(1, vec![peer.node_id()]);
    let token = drain(c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Request { to, token, .. } if to == peer.node_id() => Some(token),
            _ => None,
        })
        .expect("a pull request");
    let inbound = Inbound::Response {
        token,
        result: Ok(data),
    };
    c.handle_message(peer.node_id(), inbound, Instant::now());
    drain(c)
}

fn penalised(out: &[Transmit], peer: &Identity) -> bool {
    out.iter()
        .any(|t| matches!(t, Transmit::Penalize { peer: p, .. } if *p == peer.node_id()))
}

#[test]
fn a_pulled_message_counts_only_if_the_peer_asked_signed_it() {
    let (peer, third) = (test_identity(2), test_identity(3));
    let mut c = core(&test_identity(1), Instant::now());
    drain(&mut c);
    // A third key's genuine offer, relayed: refused and charged to the relay.
    let relayed = SyncPullAnswer {
        messages: vec![Signed::sign(&third, &offer(1)).to_bytes()],
    };
    let out = pulled(&mut c, &peer, relayed.to_canonical_bytes());
    assert!(penalised(&out, &peer), "a relayed message was not charged");
    assert_eq!(c.rounds.syncer.held(), 0, "a relayed message was counted");
    // Junk instead of an answer.
    let out = pulled(&mut c, &peer, vec![0xff; 40]);
    assert!(penalised(&out, &peer), "junk was not charged");
    // The peer's own offer: counted as if gossip had brought it.
    let own = SyncPullAnswer {
        messages: vec![Signed::sign(&peer, &offer(1)).to_bytes()],
    };
    let out = pulled(&mut c, &peer, own.to_canonical_bytes());
    assert!(!penalised(&out, &peer));
    assert_eq!(c.rounds.syncer.held(), 1);
}
