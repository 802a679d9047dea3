//! Heartbeats on gossip and node / network records in the DHT. First byte 0: envelope bytes;
//! 1: a heartbeat payload, 2: a node record payload, otherwise a network record payload,
//! each signed by the author so mutants get past the signature.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::{ALICE, T0, signed_by};
use neuroshard_net::Validation;
use neuroshard_node::network::NetworkGenesis;
use neuroshard_node::records::{
    Heartbeat, NETWORK_KEY, NodeRecord, Topic, node_key, validate_gossip, validate_record,
};
use neuroshard_proof::{Canonical, Signed};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if let Ok(hb) = Heartbeat::from_canonical_bytes(rest) {
        assert_eq!(hb.to_canonical_bytes(), rest);
    }
    if let Ok(r) = NodeRecord::from_canonical_bytes(rest) {
        assert_eq!(r.to_canonical_bytes(), rest);
    }
    if let Ok(g) = NetworkGenesis::from_canonical_bytes(rest) {
        // The protocol section is JSON: the value, not the bytes, is stable.
        let again = NetworkGenesis::from_canonical_bytes(&g.to_canonical_bytes());
        assert!(again.is_ok_and(|a| a == g));
    }
    let wire = match mode {
        0 => rest.to_vec(),
        1 => signed_by::<Heartbeat>(&ALICE, rest).to_bytes(),
        2 => signed_by::<NodeRecord>(&ALICE, rest).to_bytes(),
        _ => signed_by::<NetworkGenesis>(&ALICE, rest).to_bytes(),
    };
    let author = ALICE.node_id();
    for stage in [0, 1] {
        let verdict = validate_gossip(&Topic::Heartbeat(stage).name(), &author, &wire);
        if verdict == Validation::Accept {
            let hb = Signed::<Heartbeat>::from_bytes(&wire)
                .ok()
                .and_then(|s| s.verify().ok());
            assert!(hb.is_some_and(|hb| hb.node == author && hb.stage == stage));
        }
        let _ = validate_gossip(&Topic::Proof(stage).name(), &author, &wire);
    }
    if validate_record(&node_key(&author), &wire, Some(&author), T0) {
        let rec = Signed::<NodeRecord>::from_bytes(&wire)
            .ok()
            .and_then(|s| s.verify().ok());
        assert!(rec.is_some_and(|r| r.node == author && r.expires_ms > T0));
    }
    let _ = validate_record(NETWORK_KEY, &wire, None, T0);
});
