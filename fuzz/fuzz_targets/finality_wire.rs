//! Consensus messages from peers. Mode 0: the bytes go to a validator of a 4-member committee
//! at epoch 1 (Malachite's core behind it), then its timeouts fire; whatever decodes as a
//! message must re-encode to its bytes. Mode 1: a certified epoch as a joiner receives it,
//! verified from the committee's genesis head. Mode 2: a write-ahead log (length-prefixed
//! entries) a restarting validator replays.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_finality::{
    CertifiedEpoch, ChainHead, ConsensusWire, Finality, Timeouts, verify_chain,
};
use neuroshard_fuzz::{ALICE, BOB, finality_committee, finality_value};
use neuroshard_proof::{Canonical, Reader};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode == 0 {
        if let Ok(m) = ConsensusWire::from_canonical_bytes(rest) {
            assert_eq!(m.to_canonical_bytes(), rest);
        }
        let now = std::time::Instant::now();
        let mut node = Finality::new(ALICE.clone(), Timeouts::default());
        if node.start_epoch(1, finality_committee(), now).is_err() {
            return;
        }
        node.set_value(finality_value(1), now);
        node.handle_message(BOB.node_id(), rest, now);
        while let Some(e) = node.poll_event() {
            if let neuroshard_finality::FinalityEvent::Judge { value } = e {
                node.judge(value, value == finality_value(value.epoch), now);
            }
        }
        node.handle_timeout(now + std::time::Duration::from_secs(3600));
        while node.poll_transmit().is_some() {}
    } else if mode == 2 {
        let mut r = Reader::new(rest);
        let mut log = Vec::new();
        while let Ok(entry) = r.bytes(1 << 20) {
            log.push(entry.to_vec());
        }
        let now = std::time::Instant::now();
        let mut node = Finality::new(ALICE.clone(), Timeouts::default());
        if node.restore(1, finality_committee(), &log, now).is_ok() {
            node.set_value(finality_value(1), now);
            node.handle_timeout(now + std::time::Duration::from_secs(3600));
            while node.poll_transmit().is_some() {}
        }
    } else {
        let mut r = Reader::new(rest);
        let Ok(epoch) = CertifiedEpoch::decode(&mut r) else {
            return;
        };
        let head = ChainHead {
            epoch: 0,
            state: [0; 32],
            committee: finality_committee(),
        };
        let _ = verify_chain(&head, &[epoch]);
    }
});
