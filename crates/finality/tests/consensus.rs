//! Finality in the deterministic harness: honest committees finalize, crashes up to f are
//! tolerated, more halt it without loss, a partition heals, a lying proposer and an
//! equivocating validator are handled, and certificates check without trusting their bearer.

mod harness;

use std::time::Duration;

use harness::{Byzantine, Net};
use malachite_types::ThresholdParams;
use neuroshard_finality::{
    ConsensusWire, EvidenceError, decode_certificate, encode_certificate, verify_commit,
    verify_equivocation,
};

const MINUTE: Duration = Duration::from_secs(60);

fn assert_same_chains(net: &Net, epochs: usize) {
    let reference = net.chain(0);
    assert!(
        reference.len() >= epochs,
        "node 0 finalized {}",
        reference.len()
    );
    for (i, n) in net.nodes.iter().enumerate() {
        if n.byzantine != Byzantine::Honest || !n.up {
            continue;
        }
        let chain = net.chain(i);
        let k = chain.len().min(reference.len());
        assert_eq!(chain[..k], reference[..k], "node {i} disagrees");
        for (e, v) in &chain {
            assert!(
                net.is_valid(v),
                "node {i} finalized an invalid value at epoch {e}"
            );
        }
        assert!(n.errors.is_empty(), "node {i}: {:?}", n.errors);
    }
}

#[test]
fn four_and_seven_validators_finalize_the_same_epochs() {
    for n in [4usize, 7] {
        let mut net = Net::new(&vec![10; n], 1);
        net.start();
        assert!(
            net.run_until(MINUTE, |net| net.all_reached(10)),
            "{n} validators"
        );
        assert_same_chains(&net, 10);
    }
}

#[test]
fn one_crashed_validator_of_four_does_not_stop_finality() {
    let mut net = Net::new(&[10; 4], 2);
    net.nodes[3].up = false;
    net.start();
    assert!(net.run_until(5 * MINUTE, |net| net.all_reached(5)));
    assert_same_chains(&net, 5);
}

#[test]
fn two_of_four_down_halt_finality_and_it_resumes_when_they_return() {
    let mut net = Net::new(&[10; 4], 3);
    net.start();
    assert!(net.run_until(MINUTE, |net| net.all_reached(2)));
    net.nodes[2].up = false;
    net.nodes[3].up = false;
    let before = net.nodes[0].finalized.len();
    // Half the power is gone: nothing can finalize, however long we wait.
    assert!(!net.run_until(3 * MINUTE, |net| net.nodes[0].finalized.len() > before + 1));
    let halted = net.nodes[0].finalized.len();
    assert!(
        halted <= before + 1,
        "finalized {} → {halted} with half the power down",
        before
    );
    net.nodes[2].up = true;
    net.nodes[3].up = true;
    assert!(net.run_until(10 * MINUTE, |net| net.all_reached(halted + 3)));
    assert_same_chains(&net, halted + 3);
}

#[test]
fn a_partition_that_heals_loses_nothing_and_splits_nothing() {
    let mut net = Net::new(&[10; 4], 4);
    net.start();
    assert!(net.run_until(MINUTE, |net| net.all_reached(2)));
    net.groups = Some(vec![0, 0, 1, 1]);
    let before: Vec<usize> = net.nodes.iter().map(|n| n.finalized.len()).collect();
    net.run_until(2 * MINUTE, |_| false);
    for (i, n) in net.nodes.iter().enumerate() {
        assert!(
            n.finalized.len() <= before[i] + 1,
            "node {i} finalized across a 2|2 split"
        );
    }
    net.groups = None;
    let target = net.nodes.iter().map(|n| n.finalized.len()).max().unwrap() + 3;
    assert!(net.run_until(10 * MINUTE, |net| net.all_reached(target)));
    assert_same_chains(&net, target);
}

#[test]
fn a_proposer_with_another_state_cannot_finalize_it() {
    let mut net = Net::new(&[10; 4], 5);
    net.nodes[1].byzantine = Byzantine::WrongState;
    net.start();
    assert!(net.run_until(5 * MINUTE, |net| net.all_reached(8)));
    // Every finalized value is the honest one (checked inside), although node 1 proposed
    // its own state whenever it was the proposer.
    assert_same_chains(&net, 8);
}

#[test]
fn votes_signed_in_other_validators_names_count_for_nothing() {
    let mut net = Net::new(&[10; 4], 12);
    net.nodes[1].byzantine = Byzantine::Impersonates;
    net.start();
    assert!(net.run_until(5 * MINUTE, |net| net.all_reached(8)));
    assert_same_chains(&net, 8);
}

#[test]
fn a_validator_that_signs_two_votes_is_reported_by_the_others() {
    let mut net = Net::new(&[10; 4], 6);
    net.nodes[2].byzantine = Byzantine::Equivocates;
    net.start();
    assert!(net.run_until(MINUTE, |net| net.all_reached(3)));
    assert_same_chains(&net, 3);
    let liar = net.nodes[2].identity.node_id();
    for i in [0, 1, 3] {
        let seen = &net.nodes[i].equivocations;
        assert!(!seen.is_empty(), "node {i} saw no equivocation");
        for q in seen {
            assert_eq!(q.validator, liar, "only the liar");
            // The evidence convicts on its own, for any node holding the committee.
            assert_eq!(
                verify_equivocation(&q.first, &q.second, &net.committee),
                Ok(liar)
            );
        }
    }
    // Evidence that does not hold up is refused.
    let q = net.nodes[0].equivocations[0].clone();
    assert_eq!(
        verify_equivocation(&q.first, &q.first, &net.committee),
        Err(EvidenceError::SameValue)
    );
    let ConsensusWire::Vote(mut tampered) = q.second.clone() else {
        panic!("vote evidence")
    };
    tampered.signature.0[10] ^= 1;
    assert_eq!(
        verify_equivocation(
            &q.first,
            &ConsensusWire::Vote(tampered.clone()),
            &net.committee
        ),
        Err(EvidenceError::BadSignature)
    );
    tampered.message.validator =
        neuroshard_finality::context::Address(net.nodes[0].identity.node_id());
    assert_eq!(
        verify_equivocation(&q.first, &ConsensusWire::Vote(tampered), &net.committee),
        Err(EvidenceError::TwoSigners)
    );
    let without = neuroshard_finality::Committee::new(
        net.committee
            .validators()
            .iter()
            .filter(|v| v.address.0 != liar)
            .cloned()
            .collect(),
    );
    assert_eq!(
        verify_equivocation(&q.first, &q.second, &without),
        Err(EvidenceError::NotAMember(liar))
    );
}

#[test]
fn stake_weights_the_vote_a_big_staker_alone_is_needed() {
    // 10 + 1 + 1 + 1: the big staker holds 10/13 of the power; without it nothing finalizes,
    // with only it and one other (11/13 > 2/3) everything does.
    let mut net = Net::new(&[10, 1, 1, 1], 7);
    let big = net
        .nodes
        .iter()
        .position(|n| net.committee.get(&n.identity.node_id()).unwrap().power == 10)
        .unwrap();
    net.nodes[big].up = false;
    net.start();
    assert!(!net.run_until(2 * MINUTE, |net| {
        net.nodes.iter().any(|n| !n.finalized.is_empty())
    }));
    // The big staker and one small one (11/13) finalize; the two others stay down.
    let mut net = Net::new(&[10, 1, 1, 1], 7);
    for (i, n) in net.nodes.iter_mut().enumerate() {
        n.up = i == big || i == (big + 1) % 4;
    }
    net.start();
    assert!(net.run_until(5 * MINUTE, |net| net.all_reached(3)));
}

#[test]
fn certificates_check_against_the_committee_and_forgeries_do_not() {
    let mut net = Net::new(&[10; 4], 8);
    net.start();
    assert!(net.run_until(MINUTE, |net| net.all_reached(3)));
    let quorum = ThresholdParams::default().quorum;
    for f in &net.nodes[0].finalized {
        let bytes = encode_certificate(&f.certificate);
        let cert = decode_certificate(&bytes).unwrap();
        assert_eq!(cert.value_id, malachite_types::Value::id(&f.value));
        verify_commit(&cert, &net.committee, quorum).unwrap();
        // Fewer than 2/3 of the power: refused.
        let mut short = cert.clone();
        short.commit_signatures.truncate(2);
        assert!(verify_commit(&short, &net.committee, quorum).is_err());
        // A signature moved to another value: refused.
        let mut other = cert.clone();
        other.value_id = neuroshard_finality::context::ValueId([7; 32]);
        assert!(verify_commit(&other, &net.committee, quorum).is_err());
        // One signer twice does not count twice.
        let mut twice = cert.clone();
        let first = twice.commit_signatures[0].clone();
        twice.commit_signatures.truncate(2);
        twice.commit_signatures.push(first);
        assert!(verify_commit(&twice, &net.committee, quorum).is_err());
        // Another committee (the same keys with the powers of strangers): refused.
    }
    let foreign = neuroshard_finality::Committee::new(
        (0..4)
            .map(|i| {
                neuroshard_finality::Validator::new(
                    neuroshard_proof::fixtures::test_identity(5000 + i).public_key(),
                    10,
                )
            })
            .collect(),
    );
    let cert = &net.nodes[0].finalized[0].certificate;
    assert!(verify_commit(cert, &foreign, quorum).is_err());
}

#[test]
fn garbage_is_refused_with_a_reason_and_changes_nothing() {
    let mut net = Net::new(&[10; 4], 10);
    net.start();
    let now = net.now;
    let from = net.nodes[1].identity.node_id();
    net.nodes[0].finality.handle_message(from, &[1, 2, 3], now);
    net.nodes[0]
        .finality
        .handle_message(from, &vec![0u8; 200_000], now);
    let mut refused = 0;
    while let Some(e) = net.nodes[0].finality.poll_event() {
        assert!(matches!(
            e,
            neuroshard_finality::FinalityEvent::Refused { .. }
        ));
        refused += 1;
    }
    assert_eq!(refused, 2);
    assert!(net.run_until(MINUTE, |net| net.all_reached(2)));
    assert_same_chains(&net, 2);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = |seed| {
        let mut net = Net::new(&[10; 7], seed);
        net.start();
        assert!(net.run_until(MINUTE, |net| net.all_reached(5)));
        (net.latencies(0), net.nodes[0].sent_bytes)
    };
    assert_eq!(run(11), run(11));
}

#[test]
fn thirty_one_validators_tolerate_ten_faulty_but_not_eleven() {
    // f = 10 of 3f + 1 = 31: nine down and one equivocating (its votes count where its
    // first vote arrived first, for nothing elsewhere): the 21 honest ones finalize.
    let mut net = Net::new(&[10; 31], 13);
    for n in &mut net.nodes[22..] {
        n.up = false;
    }
    net.nodes[20].byzantine = Byzantine::Equivocates;
    net.start();
    assert!(net.run_until(5 * MINUTE, |net| net.all_reached(4)));
    assert_same_chains(&net, 4);
    let liar = net.nodes[20].identity.node_id();
    assert!(
        net.nodes[0]
            .equivocations
            .iter()
            .any(|q| q.validator == liar)
    );
    // Eleven down: 20/31 < 2/3, nothing finalizes.
    let mut net = Net::new(&[10; 31], 14);
    for n in &mut net.nodes[20..] {
        n.up = false;
    }
    net.start();
    assert!(!net.run_until(3 * MINUTE, |net| {
        net.nodes.iter().any(|n| !n.finalized.is_empty())
    }));
}

/// A validator that crashes right after proposing, and comes back with more contents (another
/// value), restarts in the same round: from its write-ahead log it re-sends what it signed
/// and nobody sees a second proposal; without the log it proposes again, differently, and
/// every other validator reports it.
#[test]
fn a_validator_restarted_from_its_log_signs_nothing_twice() {
    let run = |with_log: bool| {
        let mut net = Net::new(&[10; 4], 15);
        net.start();
        // The first epoch from 3 on that node 1 proposes in round 0.
        let proposer = net.nodes[1].identity.node_id();
        let epoch = (3..200)
            .find(|e| {
                let c = net.committee_of(*e);
                malachite_types::Context::select_proposer(
                    &neuroshard_finality::FinalityContext,
                    &c,
                    neuroshard_finality::context::Epoch(*e),
                    malachite_types::Round::new(0),
                )
                .address
                .0 == proposer
            })
            .expect("node 1 proposes some epoch");
        assert!(net.run_until(5 * MINUTE, |n| n.nodes[1].proposed.contains(&epoch)));
        net.restart(1, with_log);
        assert!(net.run_until(5 * MINUTE, |n| n.all_reached(epoch as usize + 2)));
        assert_same_chains(&net, epoch as usize + 2);
        let reported: Vec<_> = [0, 2, 3]
            .iter()
            .flat_map(|i| net.nodes[*i].equivocations.iter().map(|q| q.validator))
            .collect();
        (proposer, reported)
    };
    let (_, with_log) = run(true);
    assert!(
        with_log.is_empty(),
        "restarted from its log, it was reported: {with_log:?}"
    );
    let (proposer, without) = run(false);
    assert!(
        without.contains(&proposer),
        "without its log the restart should have proposed twice"
    );
}

/// A flood of proposals for epochs far ahead (signed by a member) or by a key outside the
/// committee asks the caller to judge nothing and is not kept.
#[test]
fn proposals_far_ahead_or_from_strangers_ask_nothing() {
    use neuroshard_finality::context::{Address, Epoch, Proposal, Sig};
    use neuroshard_proof::Canonical;
    let mut net = Net::new(&[10; 4], 16);
    net.start();
    let now = net.now;
    let member = net.nodes[1].identity.clone();
    let stranger = neuroshard_proof::fixtures::test_identity(7777);
    let base = net.honest_value(1, 1);
    let proposal = |by: &neuroshard_proof::Identity, epoch: u64, salt: u8| {
        let value = neuroshard_finality::EpochValue {
            epoch,
            contents: [salt; 32],
            ..base
        };
        let p = Proposal {
            epoch: Epoch(epoch),
            round: malachite_types::Round::new(0),
            value,
            pol_round: malachite_types::Round::Nil,
            proposer: Address(by.node_id()),
        };
        let sig = Sig(by.sign(&p.to_canonical_bytes()).0);
        ConsensusWire::Proposal(malachite_types::SignedMessage::new(p, sig)).to_canonical_bytes()
    };
    let node = &mut net.nodes[0].finality;
    while node.poll_event().is_some() {}
    for epoch in 3..500 {
        node.handle_message(member.node_id(), &proposal(&member, epoch, 1), now);
    }
    for salt in 0..50 {
        node.handle_message(stranger.node_id(), &proposal(&stranger, 1, salt), now);
    }
    let mut refused = 0;
    while let Some(e) = node.poll_event() {
        match e {
            neuroshard_finality::FinalityEvent::Judge { value } => {
                panic!("asked to judge epoch {}", value.epoch)
            }
            neuroshard_finality::FinalityEvent::Refused { .. } => refused += 1,
            _ => {}
        }
    }
    assert_eq!(
        refused, 50,
        "each stranger's proposal is refused with a reason"
    );
    // And the network goes on.
    assert!(net.run_until(MINUTE, |net| net.all_reached(3)));
    assert_same_chains(&net, 3);
}

/// Certificates a node acts on from a peer (a skip to a later round, a polka that would
/// unlock it) made of votes signed in others' names move no one: every node still
/// finalizes epoch 1 in round 0.
#[test]
fn forged_round_and_polka_certificates_move_no_one() {
    use malachite_types::{
        NilOrVal, PolkaCertificate, PolkaSignature, Round, RoundCertificate, RoundCertificateType,
        RoundSignature, VoteType,
    };
    use neuroshard_finality::context::{Epoch, Sig, ValueId, Vote};
    use neuroshard_proof::Canonical;
    let mut net = Net::new(&[10; 4], 17);
    let forger = net.nodes[3].identity.clone();
    let members: Vec<_> = net.committee.validators().to_vec();
    let sign = |v: &Vote| Sig(forger.sign(&v.to_canonical_bytes()).0);
    let vote = |kind, round, value, v: &neuroshard_finality::Validator| Vote {
        kind,
        epoch: Epoch(1),
        round: Round::new(round),
        value,
        validator: v.address,
        extension: None,
    };
    let skip = RoundCertificate {
        height: Epoch(1),
        round: Round::new(9),
        cert_type: RoundCertificateType::Skip,
        round_signatures: members
            .iter()
            .map(|m| {
                let v = vote(VoteType::Precommit, 9, NilOrVal::Nil, m);
                RoundSignature::new(VoteType::Precommit, NilOrVal::Nil, m.address, sign(&v))
            })
            .collect(),
    };
    let fake = ValueId([0xCD; 32]);
    let polka = PolkaCertificate {
        height: Epoch(1),
        round: Round::new(0),
        value_id: fake,
        polka_signatures: members
            .iter()
            .map(|m| {
                let v = vote(VoteType::Prevote, 0, NilOrVal::Val(fake), m);
                PolkaSignature::new(m.address, sign(&v))
            })
            .collect(),
    };
    net.start();
    let now = net.now;
    for i in 0..3 {
        for msg in [
            ConsensusWire::Round(skip.clone()),
            ConsensusWire::Polka(polka.clone()),
        ] {
            net.nodes[i]
                .finality
                .handle_message(forger.node_id(), &msg.to_canonical_bytes(), now);
        }
    }
    assert!(net.run_until(MINUTE, |net| net.all_reached(2)));
    assert_same_chains(&net, 2);
    for (i, n) in net.nodes.iter().enumerate().take(3) {
        assert_eq!(
            n.finalized[0].certificate.round,
            Round::new(0),
            "node {i} was moved to another round"
        );
    }
}

/// In the node an epoch starts every 10 s, long after the last one finalized (milliseconds
/// on a LAN). Malachite re-broadcasts a validator's last votes every 5 s while it sits at a
/// height; at a height this node has finalized they help no one (a lagging validator
/// catches up from certificates: `LedgerFinality` asks for the chain), and at 100 nodes
/// they were 1,214 of the 2,002 finality messages published (`bench sim --nodes 100
/// --replicas 4 --rounds 5`), each heard by every node.
#[test]
fn a_finalized_epoch_is_not_rebroadcast_while_the_next_one_waits() {
    let mut net = Net::new(&[1, 1, 1, 1], 21);
    net.last_epoch = 1;
    net.start();
    assert!(net.run_until(Duration::from_secs(30), |n| n.all_reached(1)));
    let sent = |net: &Net| net.nodes.iter().map(|n| n.sent_msgs).sum::<u64>();
    let before = sent(&net);
    net.run_until(Duration::from_secs(30), |_| false);
    assert_eq!(sent(&net), before, "messages for an epoch already final");
}
