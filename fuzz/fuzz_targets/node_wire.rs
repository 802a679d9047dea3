//! Pipeline requests (with their job commitments) and their acks and answers between stage
//! replicas, and inference steps and replies: a decoded message re-encodes to
//! its input, every tensor it carries has the bytes its shape and scheme need, and unpacking
//! one (as a stage does, against the shape it accepts) gives an error or finite values; ledger
//! finality's gossip, requests and answers (bodies checked item by item); auditors' demands.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_node::act_codec::{Expect, Packed};
use neuroshard_node::finality::{FinalityAnswer, FinalityGossip, FinalityRequest};
use neuroshard_node::serve::{InferMsg, InferReply};
use neuroshard_node::wire::{Ack, AuditDemand, FeeClaims, Msg, Payload, PipeAnswer, PipeRequest};
use neuroshard_proof::{Canonical, ProofVerifier};

fn check(p: &Packed) {
    let (b, s, d) = p.shape();
    assert_eq!(Some(p.bytes().len()), p.scheme().encoded_len(b * s, d));
    let expect = Expect {
        scheme: p.scheme(),
        dim: d,
        max_batch: 64,
        max_seq: 64,
    };
    if let Ok(a) = p.unpack(&expect) {
        assert_eq!(a.data.len(), b * s * d);
        assert!(a.data.iter().all(|x| x.is_finite()));
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = Msg::from_canonical_bytes(data) {
        assert_eq!(msg.to_canonical_bytes(), data);
        match &msg {
            Msg::Forward { input, .. } => match input {
                Payload::Tokens(t) => assert_eq!(t.ids.len(), t.batch * t.seq),
                Payload::Hidden(p) => check(p),
            },
            Msg::Backward { grad, .. } => check(grad),
        }
    }
    if let Ok(req) = PipeRequest::from_canonical_bytes(data) {
        // The message is exact; the commitment is an opaque signed envelope here (the stage
        // checks it), which re-encodes to the bytes it was read from.
        assert_eq!(req.to_canonical_bytes(), data);
    }
    if let Ok(a) = PipeAnswer::from_canonical_bytes(data) {
        let enc = a.to_canonical_bytes();
        assert_eq!(
            PipeAnswer::from_canonical_bytes(&enc).map(|x| x.to_canonical_bytes()),
            Ok(enc)
        );
    }
    if let Ok(d) = AuditDemand::from_canonical_bytes(data) {
        // An auditor's demand: exact (the commitment is an opaque envelope until a juror
        // verifies it).
        assert_eq!(d.to_canonical_bytes(), data);
    }
    if let Ok(f) = FeeClaims::from_canonical_bytes(data) {
        // An auditor's fee claims: exact, and each claim's check is an error, never a panic.
        assert_eq!(f.to_canonical_bytes(), data);
        for c in &f.claims {
            let _ = neuroshard_ledger::VerifiedAuditFee::from_claim(c);
        }
    }
    if let Ok(m) = InferMsg::from_canonical_bytes(data) {
        assert_eq!(m.to_canonical_bytes(), data);
    }
    if let Ok(r) = InferReply::from_canonical_bytes(data) {
        // A lossily read reason changes the bytes, so the re-encoding is what must be stable
        // (as bytes: hidden values may be NaN).
        let enc = r.to_canonical_bytes();
        let again = InferReply::from_canonical_bytes(&enc).map(|x| x.to_canonical_bytes());
        assert_eq!(again, Ok(enc));
    }
    // Ledger finality's gossip, requests and answers: exact, and every body's items checked
    // (an error, never a panic) as a node checks a peer's.
    if let Ok(g) = FinalityGossip::from_canonical_bytes(data) {
        assert_eq!(g.to_canonical_bytes(), data);
        if let FinalityGossip::Body(b) = &g {
            let _ = b.verify(&mut ProofVerifier::new(), &|_| None);
        }
    }
    if let Ok(r) = FinalityRequest::from_canonical_bytes(data) {
        assert_eq!(r.to_canonical_bytes(), data);
    }
    if let Ok(FinalityAnswer::Chain(links)) = FinalityAnswer::from_canonical_bytes(data) {
        for l in &links {
            let _ = l.body.verify(&mut ProofVerifier::new(), &|_| None);
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
