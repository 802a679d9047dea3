//! Pulling round messages: a pull is answered with the responder's own messages of the round
//! asked and nothing else, and a pulled message counts only as the asked peer's own gossip.

use std::time::Instant;

use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, NodeId, Signed};

use super::tests::{NETWORK, committed_offer, core, drain};
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
        commitment: None,
    })
}

/// The answer `core` gives to a pull of `(network, stage, round)`.
fn answer(core: &mut NodeCore, network: [u8; 32], stage: u16, round: u64) -> SyncPullAnswer {
    let data = SyncPull {
        network,
        stage,
        round,
        of: Vec::new(),
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
        blobs: vec![[3; 32]],
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
        blobs: vec![[3; 32]],
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
        messages: vec![
            Signed::sign(&third, &SyncMsg::Offer(committed_offer(&third, 1, 1))).to_bytes(),
        ],
    };
    let out = pulled(&mut c, &peer, relayed.to_canonical_bytes());
    assert!(penalised(&out, &peer), "a relayed message was not charged");
    assert_eq!(c.rounds.syncer.held(), 0, "a relayed message was counted");
    // Junk instead of an answer.
    let out = pulled(&mut c, &peer, vec![0xff; 40]);
    assert!(penalised(&out, &peer), "junk was not charged");
    // The peer's own offer: counted as if gossip had brought it.
    let own = SyncPullAnswer {
        messages: vec![
            Signed::sign(&peer, &SyncMsg::Offer(committed_offer(&peer, 1, 1))).to_bytes(),
        ],
    };
    let out = pulled(&mut c, &peer, own.to_canonical_bytes());
    assert!(!penalised(&out, &peer));
    assert_eq!(c.rounds.syncer.held(), 1);
}

/// An offer of round 1 by `who` whose pseudo-gradient is `blob`.
fn offer_with(who: &Identity, blob: u8) -> Vec<u8> {
    Signed::sign(who, &SyncMsg::Offer(committed_offer(who, 1, blob))).to_bytes()
}

/// A co-replica's signed offers that reached us by gossip are relayed to a pull naming
/// their sender (several of one round, since an outcome may name any of them), and no
/// one else's.
#[test]
fn offers_an_outcome_names_are_relayed_to_a_pull_naming_their_senders() {
    let (x, y) = (test_identity(2), test_identity(3));
    let mut c = core(&test_identity(1), Instant::now());
    let now = Instant::now();
    for (who, blob) in [(&x, 21), (&x, 22), (&y, 23)] {
        let inbound = Inbound::Gossip {
            topic: crate::records::Topic::Sync(1).name(),
            data: offer_with(who, blob),
        };
        c.handle_message(who.node_id(), inbound, now);
    }
    drain(&mut c);
    let data = SyncPull {
        network: NETWORK,
        stage: 1,
        round: 1,
        of: vec![x.node_id()],
    }
    .to_canonical_bytes();
    c.handle_message(NodeId([5; 32]), Inbound::Request { token: 78, data }, now);
    let answer = drain(&mut c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Respond { token: 78, data } => Some(data),
            _ => None,
        })
        .expect("an answer");
    let answer = SyncPullAnswer::from_canonical_bytes(&answer).unwrap();
    let blobs: Vec<[u8; 32]> = answer
        .messages
        .iter()
        .map(|m| match io::open_from::<SyncMsg>(m, &x.node_id()) {
            Ok((SyncMsg::Offer(o), _)) => o.blob,
            other => panic!("not x's offer: {other:?}"),
        })
        .collect();
    assert_eq!(blobs, vec![[21; 32], [22; 32]]);
    // The announcer's own offer, when named.
    let me = test_identity(1);
    c.publish_sync(&offer(1));
    drain(&mut c);
    let data = SyncPull {
        network: NETWORK,
        stage: 1,
        round: 1,
        of: vec![me.node_id(), y.node_id()],
    }
    .to_canonical_bytes();
    c.handle_message(NodeId([5; 32]), Inbound::Request { token: 79, data }, now);
    let answer = drain(&mut c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Respond { token: 79, data } => Some(data),
            _ => None,
        })
        .expect("an answer");
    let signers: Vec<NodeId> = SyncPullAnswer::from_canonical_bytes(&answer)
        .unwrap()
        .messages
        .iter()
        .map(|m| Signed::<SyncMsg>::from_bytes(m).unwrap().signer().node_id())
        .collect();
    assert_eq!(signers, vec![me.node_id(), y.node_id()]);
}

/// Sends an offer fetch of round 1 for `nodes` to `peer` and answers it with `data`.
fn fetched(c: &mut NodeCore, peer: &Identity, nodes: Vec<NodeId>, data: Vec<u8>) -> Vec<Transmit> {
    c.send_offer_fetch(1, peer.node_id(), nodes);
    let token = drain(c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Request { to, token, .. } if to == peer.node_id() => Some(token),
            _ => None,
        })
        .expect("an offer fetch");
    let inbound = Inbound::Response {
        token,
        result: Ok(data),
    };
    c.handle_message(peer.node_id(), inbound, Instant::now());
    drain(c)
}

/// A relay may bring only signed offers of the round asked, by the nodes asked about: a
/// forgery, an unasked node's offer, another round or an outcome costs it; a genuine offer
/// of an asked node is taken as that node's (a relay cannot change a signed offer).
#[test]
fn a_relayed_offer_counts_only_if_it_is_an_asked_nodes_signed_offer_of_the_round() {
    let (relay, x, y) = (test_identity(2), test_identity(3), test_identity(4));
    let mut c = core(&test_identity(1), Instant::now());
    drain(&mut c);
    let answer = |messages: Vec<Vec<u8>>| SyncPullAnswer { messages }.to_canonical_bytes();
    let unasked = answer(vec![offer_with(&y, 30)]);
    let out = fetched(&mut c, &relay, vec![x.node_id()], unasked);
    assert!(
        penalised(&out, &relay),
        "an unasked node's offer was not charged"
    );
    let mut forged = offer_with(&x, 31);
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let out = fetched(&mut c, &relay, vec![x.node_id()], answer(vec![forged]));
    assert!(penalised(&out, &relay), "a forged offer was not charged");
    let later = Signed::sign(&x, &SyncMsg::Offer(committed_offer(&x, 2, 2))).to_bytes();
    let out = fetched(&mut c, &relay, vec![x.node_id()], answer(vec![later]));
    assert!(
        penalised(&out, &relay),
        "an offer of another round was not charged"
    );
    assert_eq!(c.rounds.syncer.held(), 0, "a refused offer was counted");
    let out = fetched(
        &mut c,
        &relay,
        vec![x.node_id()],
        answer(vec![offer_with(&x, 32)]),
    );
    assert!(!penalised(&out, &relay));
    assert_eq!(c.rounds.syncer.held(), 1);
    assert!(
        c.rounds
            .heard_offers
            .get(&1)
            .is_some_and(|r| r.contains_key(&x.node_id())),
        "kept to relay on"
    );
}

/// A replica that adopted an outer state announces it only while fewer than
/// `ENOUGH_VOUCHERS` live co-replicas did, or when something it gossiped for that round (its own
/// outcome, an offer of the next round) still votes otherwise.
#[test]
fn an_adopted_state_is_announced_only_where_vouchers_are_short_or_our_old_vote_stands() {
    let mut c = core(&test_identity(1), Instant::now());
    let now = Instant::now();
    let theta = [6; 32];
    let outcome = |theta: [u8; 32]| SyncDone {
        network: NETWORK,
        stage: 1,
        round: 2,
        theta,
        contributors: Vec::new(),
        blobs: Vec::new(),
        receipts: Vec::new(),
    };
    // Announcements of a key that is no live co-replica (no heartbeat) count for nothing.
    let gone = test_identity(20);
    c.rounds
        .syncer
        .on_done(gone.node_id(), gone.node_id(), outcome(theta), now);
    for i in 2..2 + rounds::ENOUGH_VOUCHERS as u64 {
        assert!(c.must_vouch(2, theta), "only {} vouchers", i - 2);
        let who = test_identity(i);
        let beat = Inbound::Gossip {
            topic: crate::records::Topic::Heartbeat(1).name(),
            data: super::tests::heartbeat(&who, 1),
        };
        c.handle_message(who.node_id(), beat, now);
        c.rounds
            .syncer
            .on_done(who.node_id(), who.node_id(), outcome(theta), now);
        // Another state's announcement vouches for nothing here.
        let other = test_identity(i + 10);
        c.rounds
            .syncer
            .on_done(other.node_id(), other.node_id(), outcome([7; 32]), now);
    }
    assert!(!c.must_vouch(2, theta), "enough co-replicas announced it");
    // Our own outcome of round 2 (another θ₀) still stands in their tables: replace it.
    c.publish_sync(&SyncMsg::Done(outcome([8; 32])));
    assert!(c.must_vouch(2, theta));
}

/// A pull naming many nodes gets at most `MAX_RELAYED` offers back, an answer the asker can
/// decode: a flood of names costs the responder a bounded copy.
#[test]
fn a_pull_naming_many_nodes_gets_a_bounded_answer() {
    let mut c = core(&test_identity(1), Instant::now());
    let now = Instant::now();
    let names: Vec<NodeId> = (0..300u16)
        .map(|i| {
            let mut id = [0u8; 32];
            id[..2].copy_from_slice(&i.to_le_bytes());
            NodeId(id)
        })
        .collect();
    let envelope = offer_with(&test_identity(2), 9);
    let round = c.rounds.heard_offers.entry(1).or_default();
    for n in &names {
        round.insert(*n, vec![([9; 32], envelope.clone()); 2]);
    }
    drain(&mut c);
    let data = SyncPull {
        network: NETWORK,
        stage: 1,
        round: 1,
        of: names[..crate::sync::msgs::MAX_CONTRIBUTORS].to_vec(),
    }
    .to_canonical_bytes();
    c.handle_message(NodeId([5; 32]), Inbound::Request { token: 80, data }, now);
    let answer = drain(&mut c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Respond { token: 80, data } => Some(data),
            _ => None,
        })
        .expect("an answer");
    let answer = SyncPullAnswer::from_canonical_bytes(&answer).expect("decodable");
    assert_eq!(answer.messages.len(), crate::sync::pull::MAX_RELAYED);
}

/// A peer asked for its own round messages that answers with more than an offer and an
/// outcome is charged, and only the first two are looked at.
#[test]
fn a_pull_answered_with_more_than_two_messages_is_charged() {
    let peer = test_identity(2);
    let mut c = core(&test_identity(1), Instant::now());
    drain(&mut c);
    let flood = SyncPullAnswer {
        messages: (0..3).map(|b| offer_with(&peer, 40 + b)).collect(),
    };
    let out = pulled(&mut c, &peer, flood.to_canonical_bytes());
    assert!(
        penalised(&out, &peer),
        "an oversized answer was not charged"
    );
    assert_eq!(
        c.rounds.syncer.held(),
        1,
        "one offer of the round, the latest"
    );
}

/// The signed offers kept to relay are bounded per sender: its latest few rounds, a few
/// offers each, whatever it floods.
#[test]
fn envelopes_kept_for_relaying_are_bounded_per_sender() {
    let x = test_identity(2);
    let mut c = core(&test_identity(1), Instant::now());
    let now = Instant::now();
    for round in 1..40u64 {
        for blob in 0..8u8 {
            let o = committed_offer(&x, round, blob);
            let data = Signed::sign(&x, &SyncMsg::Offer(o)).to_bytes();
            let inbound = Inbound::Gossip {
                topic: crate::records::Topic::Sync(1).name(),
                data,
            };
            c.handle_message(x.node_id(), inbound, now);
        }
    }
    let kept = &c.rounds.heard_offers;
    let rounds = kept
        .values()
        .filter(|r| r.contains_key(&x.node_id()))
        .count();
    assert_eq!(rounds, crate::sync::ROUNDS_PER_SENDER);
    for r in kept.values() {
        let held = r.get(&x.node_id()).map_or(0, Vec::len);
        assert!(held <= 1 + crate::sync::DISPLACED_PER_SENDER, "{held}");
    }
}

/// Every offer is a committed job that its auditor can replay: one without its commitment,
/// or whose commitment names another blob, base, round or worker, never reaches the syncer
/// and costs its sender; a committed one is held for its audit.
#[test]
fn an_offer_without_a_commitment_naming_it_is_refused_and_charged() {
    let x = test_identity(2);
    let mut c = core(&test_identity(1), Instant::now());
    drain(&mut c);
    let now = Instant::now();
    let send = |c: &mut NodeCore, o: SyncOffer| {
        let data = Signed::sign(&x, &SyncMsg::Offer(o)).to_bytes();
        let topic = crate::records::Topic::Sync(1).name();
        c.handle_message(x.node_id(), Inbound::Gossip { topic, data }, now);
        drain(c)
    };
    let good = committed_offer(&x, 1, 40);
    let someone_elses = SyncOffer {
        commitment: committed_offer(&test_identity(3), 1, 40).commitment,
        ..good.clone()
    };
    let bad = [
        SyncOffer {
            commitment: None,
            ..good.clone()
        },
        SyncOffer {
            blob: [41; 32],
            ..good.clone()
        },
        SyncOffer {
            base: [1; 32],
            ..good.clone()
        },
        SyncOffer {
            round: 2,
            ..good.clone()
        },
        someone_elses,
    ];
    for (i, o) in bad.into_iter().enumerate() {
        let out = send(&mut c, o);
        assert!(penalised(&out, &x), "case {i} was not charged");
        assert_eq!(c.rounds.syncer.held(), 0, "case {i} was counted");
    }
    let out = send(&mut c, good.clone());
    assert!(!penalised(&out, &x));
    assert_eq!(c.rounds.syncer.held(), 1);
    // Held for its audit until its beacon epoch is final (test cores finalize none).
    let key = good.commitment(x.node_id()).unwrap().0.key();
    assert!(c.audit.awaiting.contains_key(&key));
}

/// An offer committed at an epoch long final here could have been signed knowing its
/// beacon, hence whether it is audited: it is not taken (nor charged: an honest replica may
/// lag), while one within two epochs of ours is.
#[test]
fn an_offer_committed_at_an_epoch_long_final_is_not_taken() {
    let x = test_identity(2);
    let mut c = core(&test_identity(1), Instant::now());
    c.audit.test_beacons.insert(10, [3; 32]);
    drain(&mut c);
    let now = Instant::now();
    let at_epoch = |epoch: u64, blob: u8| {
        let o = committed_offer(&x, 1, blob);
        let signed = o.commitment.as_deref().unwrap();
        let job = neuroshard_audit::JobCommitment {
            epoch,
            ..signed.verify().unwrap()
        };
        SyncOffer {
            commitment: Some(Box::new(job.sign(&x))),
            ..o
        }
    };
    let send = |c: &mut NodeCore, o: SyncOffer| {
        let data = Signed::sign(&x, &SyncMsg::Offer(o)).to_bytes();
        let topic = crate::records::Topic::Sync(1).name();
        c.handle_message(x.node_id(), Inbound::Gossip { topic, data }, now);
        drain(c)
    };
    let out = send(&mut c, at_epoch(7, 50));
    assert!(!penalised(&out, &x), "a lagging replica was charged");
    assert_eq!(c.rounds.syncer.held(), 0, "a stale offer was counted");
    let out = send(&mut c, at_epoch(8, 51));
    assert!(!penalised(&out, &x));
    assert_eq!(c.rounds.syncer.held(), 1);
}
