//! Pipeline requests and their acks between stage replicas: a decoded message re-encodes to
//! its input and every tensor it carries has the shape it declares.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_node::wire::{Ack, Msg, Payload};
use neuroshard_proof::Canonical;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = Msg::from_canonical_bytes(data) {
        assert_eq!(msg.to_canonical_bytes(), data);
        match &msg {
            Msg::Forward { input, .. } => match input {
                Payload::Tokens(t) => assert_eq!(t.ids.len(), t.batch * t.seq),
                Payload::Hidden(a) => assert_eq!(a.data.len(), a.batch * a.seq * a.dim),
            },
            Msg::Backward { grad, .. } => {
                assert_eq!(grad.data.len(), grad.batch * grad.seq * grad.dim);
            }
        }
    }
    if let Ok(ack) = Ack::from_canonical_bytes(data) {
        // A reason read lossily re-encodes to other bytes; the decoded value is stable.
        assert_eq!(
            Ack::from_canonical_bytes(&ack.to_canonical_bytes()),
            Ok(ack)
        );
    }
});
