//! A joiner verifies the finalized history from certificates alone, across committee
//! changes, and refuses every forgery a serving peer could make.

mod harness;

use std::time::Duration;

use harness::{Byzantine, Net};
use neuroshard_finality::{
    CertifiedEpoch, ChainError, ChainHead, Committee, Validator, verify_chain,
};
use neuroshard_proof::fixtures::test_identity;

/// A network whose committee's powers change every 5 epochs, run for `epochs`; returns it and
/// node 0's finalized history as a joiner receives it.
fn history(epochs: usize) -> (Net, Vec<CertifiedEpoch>) {
    let mut net = Net::new(&[10; 4], 21);
    net.rotate = true;
    net.last_epoch = epochs as u64;
    net.start();
    assert!(net.run_until(Duration::from_secs(600), |n| n.all_reached(epochs)));
    let chain = net.nodes[0]
        .finalized
        .iter()
        .map(|f| CertifiedEpoch {
            value: f.value,
            certificate: f.certificate.clone(),
            next_committee: net.committee_of(f.epoch + 1),
        })
        .collect();
    (net, chain)
}

fn genesis(net: &Net) -> ChainHead {
    ChainHead {
        epoch: 0,
        state: [0; 32],
        committee: net.committee_of(1),
    }
}

#[test]
fn a_joiner_follows_the_committee_through_rotations_from_certificates_alone() {
    let (net, chain) = history(30);
    assert!(
        net.nodes
            .iter()
            .all(|n| n.byzantine == Byzantine::Honest && n.errors.is_empty())
    );
    // The committee really changed along the way.
    assert_ne!(net.committee_of(1).hash(), net.committee_of(6).hash());
    let head = verify_chain(&genesis(&net), &chain).unwrap();
    assert_eq!(head.epoch, 30);
    assert_eq!(head.state, chain[29].value.state);
    assert_eq!(head.committee, net.committee_of(31));
    // In two parts, from the head of the first.
    let mid = verify_chain(&genesis(&net), &chain[..12]).unwrap();
    assert_eq!(verify_chain(&mid, &chain[12..]).unwrap(), head);
}

#[test]
fn forged_histories_are_refused() {
    let (net, chain) = history(12);
    let g = genesis(&net);
    // Another state for an epoch, under the real certificate.
    let mut c = chain.clone();
    c[4].value.state = [9; 32];
    assert_eq!(
        verify_chain(&g, &c),
        Err(ChainError::OtherValue { epoch: 5 })
    );
    // A gap.
    let mut c = chain.clone();
    c.remove(3);
    assert!(matches!(
        verify_chain(&g, &c),
        Err(ChainError::Gap { after: 3, got: 5 })
    ));
    // A committee other than the one the value names (e.g. the server's own keys, which
    // could then certify anything).
    let mut c = chain.clone();
    let theirs = Committee::new(
        (0..4)
            .map(|i| Validator::new(test_identity(9000 + i).public_key(), 10))
            .collect(),
    );
    c[6].next_committee = theirs.clone();
    assert_eq!(
        verify_chain(&g, &c),
        Err(ChainError::OtherCommittee { epoch: 7 })
    );
    // A certificate with less than 2/3 of the power.
    let mut c = chain.clone();
    c[2].certificate.commit_signatures.truncate(2);
    assert!(matches!(
        verify_chain(&g, &c),
        Err(ChainError::Certificate { epoch: 3, .. })
    ));
    // A history certified by strangers (keys that never sat) from epoch 3 on: a server
    // splicing its own committee's certificates into the real history.
    let mut strangers = Net::with_keys(&[10; 4], 22, 9000);
    strangers.rotate = true;
    strangers.last_epoch = 3;
    strangers.start();
    assert!(strangers.run_until(Duration::from_secs(60), |n| n.all_reached(3)));
    let theirs = &strangers.nodes[0].finalized[2];
    let mut spliced = chain[..2].to_vec();
    spliced.push(CertifiedEpoch {
        value: theirs.value,
        certificate: theirs.certificate.clone(),
        next_committee: strangers.committee_of(4),
    });
    assert!(matches!(
        verify_chain(&g, &spliced),
        Err(ChainError::Certificate { epoch: 3, .. })
    ));
    // The real history still verifies.
    verify_chain(&g, &chain).unwrap();
}

/// Whatever a server changes in the bytes of a finalized history — any byte, anywhere — the
/// joiner either refuses it or ends on the very head the true history gives: a tampered
/// history never verifies to another state or committee.
#[test]
fn no_single_byte_change_to_a_served_history_yields_another_head() {
    use neuroshard_proof::{Reader, Writer};
    let (net, chain) = history(6);
    let g = genesis(&net);
    let truth = verify_chain(&g, &chain).unwrap();
    let mut w = Writer::new();
    for c in &chain {
        c.encode(&mut w);
    }
    let bytes = w.into_bytes();
    let decode = |b: &[u8]| -> Option<Vec<CertifiedEpoch>> {
        let mut r = Reader::new(b);
        let mut out = Vec::new();
        while out.len() < chain.len() {
            out.push(CertifiedEpoch::decode(&mut r).ok()?);
        }
        r.finish().ok()?;
        Some(out)
    };
    assert_eq!(decode(&bytes).as_deref(), Some(&chain[..]));
    let mut accepted_changes = 0;
    // Every byte position, two different flips each (a few thousand verifications).
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            let Some(c) = decode(&b) else { continue };
            if let Ok(head) = verify_chain(&g, &c) {
                // Only a change that does not matter may pass (e.g. a certificate's
                // signatures are over rebuilt votes; nothing else is free).
                assert_eq!(head, truth, "byte {i} ^ {flip:#x} gave another head");
                accepted_changes += 1;
            }
        }
    }
    assert_eq!(
        accepted_changes, 0,
        "no byte of the history is free to change"
    );
}
