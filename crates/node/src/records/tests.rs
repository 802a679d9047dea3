//! Gossip and DHT validation: what each record kind must be to be accepted.

use super::*;
use neuroshard_proof::Identity;

fn peer_of(id: &Identity) -> NodeId {
    id.node_id()
}

fn heartbeat(id: &Identity) -> Heartbeat {
    Heartbeat {
        node: id.node_id(),
        network: [1; 32],
        stage: 1,
        step: 5,
        queue: 2,
        time_ms: 10,
        every_ms: 2_000,
        leaving: false,
        arch: Default::default(),
    }
}

#[test]
fn heartbeat_from_its_author_is_accepted() {
    let id = Identity::generate();
    let bytes = Signed::sign(&id, &heartbeat(&id)).to_bytes();
    assert!(matches!(
        validate_gossip(&Topic::Heartbeat(1).name(), &peer_of(&id), &bytes),
        Validation::Accept
    ));
}

#[test]
fn forged_or_relayed_heartbeats_are_rejected() {
    let (a, b) = (Identity::generate(), Identity::generate());
    // Signed by a, published by b.
    let bytes = Signed::sign(&a, &heartbeat(&a)).to_bytes();
    assert!(matches!(
        validate_gossip(&Topic::Heartbeat(1).name(), &peer_of(&b), &bytes),
        Validation::Reject
    ));
    // Signed by b but naming a.
    let bytes = Signed::sign(&b, &heartbeat(&a)).to_bytes();
    assert!(matches!(
        validate_gossip(&Topic::Heartbeat(1).name(), &peer_of(&b), &bytes),
        Validation::Reject
    ));
    // Tampered bytes.
    let mut bytes = Signed::sign(&a, &heartbeat(&a)).to_bytes();
    let last = bytes.len() - 70;
    bytes[last] ^= 1;
    assert!(matches!(
        validate_gossip(&Topic::Heartbeat(1).name(), &peer_of(&a), &bytes),
        Validation::Reject
    ));
    assert!(matches!(
        validate_gossip(&Topic::Heartbeat(1).name(), &peer_of(&a), b"garbage"),
        Validation::Reject
    ));
}

#[test]
fn node_records_must_be_fresh_and_under_their_key() {
    let id = Identity::generate();
    let rec = NodeRecord {
        node: id.node_id(),
        network: [2; 32],
        stage: 0,
        expires_ms: 1_000,
        addrs: vec!["/ip4/127.0.0.1/tcp/1".into()],
    };
    let bytes = Signed::sign(&id, &rec).to_bytes();
    let key = node_key(&id.node_id());
    assert!(validate_record(&key, &bytes, Some(&peer_of(&id)), 999));
    assert!(!validate_record(&key, &bytes, Some(&peer_of(&id)), 1_000));
    assert!(!validate_record(b"neuroshard/node/x", &bytes, None, 0));
    let other = Identity::generate();
    assert!(!validate_record(&key, &bytes, Some(&peer_of(&other)), 0));
}

#[test]
fn sync_gossip_must_come_from_its_signer() {
    let (a, b) = (Identity::generate(), Identity::generate());
    let msg = crate::sync::SyncMsg::Offer(crate::sync::SyncOffer {
        network: [1; 32],
        stage: 0,
        round: 1,
        base: [2; 32],
        blob: [3; 32],
        bytes: 10,
        dense_bytes: 40,
        commitment: None,
    });
    let bytes = Signed::sign(&a, &msg).to_bytes();
    let topic = &Topic::Sync(0).name();
    assert_eq!(
        validate_gossip(topic, &peer_of(&a), &bytes),
        Validation::Accept
    );
    assert_eq!(
        validate_gossip(topic, &peer_of(&b), &bytes),
        Validation::Reject
    );
    let mut tampered = bytes.clone();
    let last = tampered.len() - 70;
    tampered[last] ^= 1;
    assert_eq!(
        validate_gossip(topic, &peer_of(&a), &tampered),
        Validation::Reject
    );
    // Garbage is refused before it spreads; an unknown topic is not ours to judge.
    assert_eq!(
        validate_gossip(topic, &peer_of(&a), b"junk"),
        Validation::Reject
    );
    assert_eq!(
        validate_gossip(&Topic::Proof(0).name(), &peer_of(&a), b"junk"),
        Validation::Reject
    );
    assert_eq!(
        validate_gossip("other/topic", &peer_of(&a), &bytes),
        Validation::Ignore
    );
}

#[test]
fn gossip_on_another_stages_topic_is_rejected() {
    // A heartbeat or an offer of stage 1 pushed into stage 0's topic would land in the
    // peer tables and rounds of nodes that never subscribed to stage 1.
    let a = Identity::generate();
    let hb = Signed::sign(&a, &heartbeat(&a)).to_bytes();
    assert_eq!(
        validate_gossip(&Topic::Heartbeat(0).name(), &peer_of(&a), &hb),
        Validation::Reject
    );
    let msg = crate::sync::SyncMsg::Offer(crate::sync::SyncOffer {
        network: [1; 32],
        stage: 1,
        round: 1,
        base: [2; 32],
        blob: [3; 32],
        bytes: 10,
        dense_bytes: 40,
        commitment: None,
    });
    let offer = Signed::sign(&a, &msg).to_bytes();
    assert_eq!(
        validate_gossip(&Topic::Sync(0).name(), &peer_of(&a), &offer),
        Validation::Reject
    );
    assert_eq!(
        validate_gossip(&Topic::Sync(1).name(), &peer_of(&a), &offer),
        Validation::Accept
    );
}

#[test]
fn topics_parse_only_their_canonical_names() {
    for t in [Topic::Heartbeat(0), Topic::Heartbeat(65535), Topic::Sync(7)] {
        assert_eq!(Topic::parse(&t.name()), Some(t));
    }
    for bad in [
        "neuroshard/heartbeat/2/01",
        "neuroshard/heartbeat/2/+1",
        "neuroshard/heartbeat/2/65536",
        "neuroshard/sync/2/",
        "neuroshard/sync/1",
        "neuroshard/proof/1",
    ] {
        assert_eq!(Topic::parse(bad), None, "{bad}");
    }
}

#[test]
fn a_node_hears_its_stage_and_its_neighbours() {
    use Topic::Proof as P;
    use Topic::{Heartbeat as H, Sync as S};
    let (o, f) = (Topic::Ops, Topic::Finality);
    let near = |stage: usize, stages: usize| {
        let layouts =
            crate::layout::Layouts::fixed(&neuroshard_model::ModelConfig::tiny(64), stages)
                .expect("layout");
        Topic::subscriptions(stage, &layouts.near(stage))
    };
    assert_eq!(near(0, 1), vec![H(0), P(0), S(0), o, f]);
    assert_eq!(near(0, 4), vec![H(0), H(1), P(0), P(1), S(0), o, f]);
    assert_eq!(
        near(2, 4),
        vec![H(1), H(2), H(3), P(1), P(2), P(3), S(2), o, f]
    );
    assert_eq!(near(3, 4), vec![H(2), H(3), P(2), P(3), S(3), o, f]);
}

#[test]
fn records_naming_another_node_or_living_forever_are_refused() {
    let (victim, mallory) = (Identity::generate(), Identity::generate());
    let hijack = NodeRecord {
        node: victim.node_id(),
        network: [2; 32],
        stage: 0,
        expires_ms: 1_000,
        addrs: vec!["/ip4/6.6.6.6/tcp/1".into()],
    };
    let bytes = Signed::sign(&mallory, &hijack).to_bytes();
    let key = node_key(&victim.node_id());
    // Published by Mallory under the victim's key: her addresses for the victim's id.
    assert!(!validate_record(&key, &bytes, Some(&peer_of(&mallory)), 0));
    assert!(!validate_record(&key, &bytes, None, 0));
    let forever = NodeRecord {
        node: mallory.node_id(),
        expires_ms: u64::MAX,
        ..hijack.clone()
    };
    let bytes = Signed::sign(&mallory, &forever).to_bytes();
    let key = node_key(&mallory.node_id());
    assert!(!validate_record(&key, &bytes, Some(&peer_of(&mallory)), 0));
    let theta = crate::sync::ThetaRecord {
        node: victim.node_id(),
        network: [2; 32],
        stage: 0,
        round: u64::MAX,
        theta: [6; 32],
        optimizer: [6; 32],
        expires_ms: 1_000,
    };
    let bytes = Signed::sign(&mallory, &theta).to_bytes();
    let key = crate::sync::theta_key(&[2; 32], 0);
    assert!(!validate_record(&key, &bytes, Some(&peer_of(&mallory)), 0));
    let own = crate::sync::ThetaRecord {
        node: mallory.node_id(),
        ..theta
    };
    let bytes = Signed::sign(&mallory, &own).to_bytes();
    assert!(validate_record(&key, &bytes, Some(&peer_of(&mallory)), 0));
}

#[test]
fn ops_spread_from_their_account_and_settlements_from_the_entry_node_named() {
    use neuroshard_ledger::{AccountOp, Action, ServeReceipt, Settlement};
    let (payer, entry, server, other) = (
        Identity::generate(),
        Identity::generate(),
        Identity::generate(),
        Identity::generate(),
    );
    let op = |action| AccountOp {
        network: [1; 32],
        account: payer.node_id(),
        nonce: 0,
        timestamp_ms: 5,
        action,
    };
    let burn = op(Action::Burn { amount: 3 }).sign(&payer).to_bytes();
    let payment = op(Action::PayInference {
        entry: entry.node_id(),
        request: [7; 32],
        per_stage: 10,
        stages: 1,
    })
    .sign(&payer)
    .to_bytes();
    let receipt = ServeReceipt {
        network: [1; 32],
        request: [7; 32],
        entry: entry.node_id(),
        stage: 0,
        server: server.node_id(),
        positions: 4,
    };
    let settlement = Settlement {
        payment: payment.clone(),
        receipts: vec![Signed::sign(&server, &receipt).to_bytes()],
    };
    let settled = Signed::sign(&entry, &settlement).to_bytes();
    let topic = &Topic::Ops.name();
    let judge = |by: &Identity, bytes: &[u8]| validate_gossip(topic, &peer_of(by), bytes);
    assert_eq!(judge(&payer, &burn), Validation::Accept);
    assert_eq!(judge(&other, &burn), Validation::Reject, "a relay");
    assert_eq!(judge(&entry, &settled), Validation::Accept);
    // Only the entry node spreads its settlement: not the payer, a server or anyone else.
    for by in [&payer, &server, &other] {
        assert_eq!(judge(by, &settled), Validation::Reject);
    }
    // A bare payment is refused by every ledger; it is not spread either.
    assert_eq!(judge(&entry, &payment), Validation::Reject);
    assert_eq!(judge(&payer, &payment), Validation::Reject);
}

#[test]
fn a_proof_with_a_bad_signature_is_not_forwarded_even_from_its_signer() {
    use neuroshard_proof::fixtures::{test_identity, training_proof};
    let (me, neighbour) = (test_identity(1), test_identity(2));
    let signed = training_proof(&me, &neighbour, 1, 1_000).sign(&me);
    let topic = Topic::Proof(0).name();
    assert_eq!(
        validate_gossip(&topic, &me.node_id(), &signed.to_bytes()),
        Validation::Accept
    );
    let mut sig = signed.signature();
    sig.0[5] ^= 1;
    let forged = neuroshard_proof::SignedProof::from_parts(
        signed.payload_bytes().to_vec(),
        signed.signer(),
        sig,
    );
    assert_eq!(
        validate_gossip(&topic, &me.node_id(), &forged.to_bytes()),
        Validation::Reject
    );
}

#[test]
fn only_our_networks_stage_keys_are_valid_provider_keys() {
    let net = [7u8; 32];
    let other = [8u8; 32];
    assert!(validate_provider_key(&stage_key(&net, 0), Some(&net), 2));
    assert!(validate_provider_key(&stage_key(&net, 1), Some(&net), 2));
    // Before the network is known, any network's stage key passes.
    assert!(validate_provider_key(&stage_key(&other, 1), None, 2));
    assert!(!validate_provider_key(&stage_key(&other, 1), Some(&net), 2));
    assert!(!validate_provider_key(&stage_key(&net, 2), Some(&net), 2));
    let hexed = hex::encode(net);
    for junk in [
        format!("neuroshard/stage/{hexed}/01"),
        format!("neuroshard/stage/{hexed}/+1"),
        format!("neuroshard/stage/{hexed}/"),
        format!("neuroshard/stage/{hexed}"),
        "neuroshard/stage/zz/0".to_string(),
        format!("neuroshard/theta/{hexed}/0"),
        "junk".to_string(),
    ] {
        assert!(!validate_provider_key(junk.as_bytes(), None, 2), "{junk}");
    }
    assert!(!validate_provider_key(&[0xff, 0xfe], None, 2));
}

/// An audit demand spreads only from its auditor; account ops (signed envelopes too) still
/// pass as ops.
#[test]
fn an_audit_demand_is_forwarded_only_from_its_signer() {
    use neuroshard_proof::fixtures::test_identity;
    let (auditor, worker, relay) = (test_identity(1), test_identity(2), test_identity(3));
    let demand = crate::wire::AuditDemand {
        network: [1; 32],
        jobs: vec![crate::core::fraud_tests::forward_job([1; 32], &worker, 0).sign(&worker)],
        timestamp_ms: 5,
    };
    let bytes = Signed::sign(&auditor, &demand).to_bytes();
    let topic = Topic::Ops.name();
    assert_eq!(
        validate_gossip(&topic, &auditor.node_id(), &bytes),
        Validation::Accept
    );
    assert_eq!(
        validate_gossip(&topic, &relay.node_id(), &bytes),
        Validation::Reject
    );
    let op = neuroshard_ledger::AccountOp {
        network: [1; 32],
        account: relay.node_id(),
        nonce: 0,
        timestamp_ms: 5,
        action: neuroshard_ledger::Action::Register { stage: 0 },
    };
    assert_eq!(
        validate_gossip(&topic, &relay.node_id(), &op.sign(&relay).to_bytes()),
        Validation::Accept
    );
}

/// Fee claims spread only from the auditor they pay: a relay cannot publish them, and an
/// auditor cannot slip in a claim that pays someone else.
#[test]
fn fee_claims_are_forwarded_only_from_the_auditor_they_pay() {
    use neuroshard_audit::{AuditFeeClaim, Served};
    use neuroshard_proof::fixtures::test_identity;
    let (auditor, worker, relay) = (test_identity(1), test_identity(2), test_identity(3));
    let c = crate::core::fraud_tests::forward_job([1; 32], &worker, 0);
    let claim = |to: &neuroshard_proof::Identity| AuditFeeClaim {
        job: c.sign(&worker),
        served: Signed::sign(
            &worker,
            &Served {
                network: c.network,
                job: c.key(),
                worker: worker.node_id(),
                to: to.node_id(),
                input_hash: c.input_hash,
                timestamp_ms: 5,
            },
        ),
    };
    let claims = |cs| crate::wire::FeeClaims {
        network: [1; 32],
        claims: cs,
    };
    let topic = Topic::Ops.name();
    let mine = Signed::sign(&auditor, &claims(vec![claim(&auditor)])).to_bytes();
    assert_eq!(
        validate_gossip(&topic, &auditor.node_id(), &mine),
        Validation::Accept
    );
    assert_eq!(
        validate_gossip(&topic, &relay.node_id(), &mine),
        Validation::Reject
    );
    let mixed = Signed::sign(&auditor, &claims(vec![claim(&auditor), claim(&relay)])).to_bytes();
    assert_eq!(
        validate_gossip(&topic, &auditor.node_id(), &mixed),
        Validation::Reject
    );
}

/// A heartbeat's architecture view travels signed; a view listing more stages than any
/// architecture may have is refused before anything is allocated for it.
#[test]
fn a_heartbeats_architecture_round_trips_and_an_oversized_one_is_refused() {
    let id = Identity::generate();
    let mut hb = heartbeat(&id);
    hb.arch = ArchView {
        version: 2,
        stages: vec![(0, 2), (3, 1), (2, 4), (1, 2)],
    };
    let bytes = hb.to_canonical_bytes();
    assert_eq!(Heartbeat::from_canonical_bytes(&bytes).unwrap(), hb);
    hb.arch.stages = vec![(7, 1); MAX_VIEW_STAGES + 1];
    assert!(Heartbeat::from_canonical_bytes(&hb.to_canonical_bytes()).is_err());
}
