//! DiLoCo offers and announcements on a stage's sync topic, round pulls and their answers, and
//! the θ₀ record in the DHT.
//! First byte 0: envelope bytes as gossip delivers them; otherwise a payload signed by the
//! author, so mutants reach the decoder and the checks behind the signature.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::node::NETWORK;
use neuroshard_fuzz::{ALICE, T0, signed_by};
use neuroshard_net::Validation;
use neuroshard_node::records::{Topic, validate_gossip, validate_record};
use neuroshard_node::sync::{SyncMsg, SyncPull, SyncPullAnswer, ThetaRecord, theta_key};
use neuroshard_proof::{Canonical, Signed};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let decoded = SyncMsg::from_canonical_bytes(rest);
    if let Ok(m) = &decoded {
        assert_eq!(m.to_canonical_bytes(), rest);
    }
    if let Ok(r) = ThetaRecord::from_canonical_bytes(rest) {
        assert_eq!(r.to_canonical_bytes(), rest);
    }
    // Round pulls and their answers (requests between co-replicas).
    if let Ok(p) = SyncPull::from_canonical_bytes(rest) {
        assert_eq!(p.to_canonical_bytes(), rest);
    }
    if let Ok(a) = SyncPullAnswer::from_canonical_bytes(rest) {
        assert_eq!(a.to_canonical_bytes(), rest);
    }
    let author = ALICE.node_id();
    let (sync_wire, theta_wire) = if mode == 0 {
        (rest.to_vec(), rest.to_vec())
    } else {
        (
            signed_by::<SyncMsg>(&ALICE, rest).to_bytes(),
            signed_by::<ThetaRecord>(&ALICE, rest).to_bytes(),
        )
    };
    for stage in [0, 1] {
        let verdict = validate_gossip(&Topic::Sync(stage).name(), &author, &sync_wire);
        if verdict == Validation::Accept {
            // Accepted means: signed by the author, decodes, and names the topic's stage.
            let m = Signed::<SyncMsg>::from_bytes(&sync_wire)
                .ok()
                .and_then(|s| s.verify().ok());
            assert_eq!(m.map(|m| m.stage()), Some(stage));
        }
    }
    let _ = validate_record(&theta_key(&NETWORK, 1), &theta_wire, Some(&author), T0);
    if let Ok(Ok(rec)) = Signed::<ThetaRecord>::from_bytes(&theta_wire).map(|s| s.verify()) {
        let key = theta_key(&rec.network, usize::from(rec.stage));
        let _ = validate_record(&key, &theta_wire, None, T0);
    }
});
