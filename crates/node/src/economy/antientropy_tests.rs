//! Ledger anti-entropy between economies: whole reconciliation sessions through the wire
//! forms, their budgets, and the bounds on what a peer can make a node hold or fetch.

use neuroshard_proof::Canonical;
use neuroshard_proof::fixtures::test_identity;

use super::tests::{T, decode, economy, prove, register, registered};
use super::*;

/// A node that missed a proof and the registrations behind it gets both from one answer:
/// ops first, so the proof applies at once.
#[test]
fn anti_entropy_delivers_missed_proofs_and_the_registrations_they_need() -> Result<(), EconomyError>
{
    let (mut a, mut b, mut c) = (economy(13), economy(14), economy(15));
    registered(&mut [&mut a, &mut b]);
    let first = prove(&mut a, &b, 1, T);
    let second = prove(&mut a, &b, 2, T + 5_000);
    for w in [&first, &second] {
        assert!(matches!(
            b.on_proof(w, T + 6_000),
            ProofOutcome::Applied { .. }
        ));
    }
    assert!(matches!(c.on_proof(&first, T), ProofOutcome::Parked(_)));
    // A byte budget too small for any item: the range answer comes, the items do not.
    let (summary, _) = sync_with(&mut c, &mut b, T + 7_000, 10);
    assert_eq!(summary.applied, 0);
    // Hours later: old proofs and ops still apply; the registrations come first.
    let (summary, requests) = sync_with(&mut c, &mut b, T + 10 * 3_600_000, 1 << 20);
    assert_eq!(summary.applied, 2);
    assert!(requests <= 3, "{requests} requests");
    assert_eq!(c.state_hash(), b.state_hash());
    assert_eq!(c.proof_hashes()?, b.proof_hashes()?);
    // In agreement, a session is one request that carries nothing back.
    let (summary, requests) = sync_with(&mut c, &mut b, T + 10 * 3_600_000 + 2_000, 1 << 20);
    assert_eq!((summary.applied, requests), (0, 1));
    Ok(())
}

/// Runs one whole reconciliation of `from` against `to`, every message through its wire
/// form, answers limited to `max_bytes`; returns what it applied and the requests it took.
pub(crate) fn sync_with(
    from: &mut Economy,
    to: &mut Economy,
    now_ms: u64,
    max_bytes: usize,
) -> (SyncSummary, usize) {
    let peer = NodeId([0xee; 32]);
    let mut request = from.start_sync(peer, now_ms);
    let mut total = SyncSummary::default();
    for requests in 1..=200 {
        let bytes = request.to_canonical_bytes();
        let request_back = LedgerSyncRequest::from_canonical_bytes(&bytes).expect("decodes");
        let answer = to.answer_sync(&request_back, max_bytes, now_ms);
        let answer = LedgerSyncResponse::from_canonical_bytes(&answer.to_canonical_bytes())
            .expect("decodes");
        let (summary, next) = from.on_sync_response(peer, &answer, now_ms);
        total.applied += summary.applied;
        total.parked += summary.parked;
        total.rejected += summary.rejected;
        match next {
            Some(next) => request = next,
            None => return (total, requests),
        }
    }
    panic!("the session did not end");
}

#[test]
fn sync_messages_enforce_their_caps() {
    let too_many = LedgerSyncRequest {
        neg: Vec::new(),
        want: vec![[1; 32]; MAX_SYNC_WANT + 1],
    };
    let too_long = LedgerSyncRequest {
        neg: vec![0x61; reconcile::MAX_NEG_BYTES + 1],
        want: Vec::new(),
    };
    let fine = LedgerSyncRequest {
        neg: vec![0x61, 0],
        want: vec![[2; 32]; 3],
    };
    assert_eq!(
        LedgerSyncRequest::from_canonical_bytes(&fine.to_canonical_bytes()),
        Ok(fine)
    );
    for bad in [too_many, too_long] {
        assert!(LedgerSyncRequest::from_canonical_bytes(&bad.to_canonical_bytes()).is_err());
    }
    let too_big = LedgerSyncResponse {
        proofs: vec![vec![0; MAX_PROOF_WIRE + 1]],
        ..Default::default()
    };
    assert!(LedgerSyncResponse::from_canonical_bytes(&too_big.to_canonical_bytes()).is_err());
    let too_many_ops = LedgerSyncResponse {
        ops: vec![vec![1]; MAX_SYNC_OPS + 1],
        ..Default::default()
    };
    assert!(LedgerSyncResponse::from_canonical_bytes(&too_many_ops.to_canonical_bytes()).is_err());
    let too_many_reports = LedgerSyncResponse {
        reports: vec![vec![1]; MAX_SYNC_REPORTS + 1],
        ..Default::default()
    };
    assert!(
        LedgerSyncResponse::from_canonical_bytes(&too_many_reports.to_canonical_bytes()).is_err()
    );
    let ok = LedgerSyncResponse {
        neg: vec![0x61],
        proofs: vec![vec![1, 2, 3], Vec::new()],
        ops: vec![vec![4]],
        reports: vec![vec![5, 6]],
    };
    assert_eq!(
        LedgerSyncResponse::from_canonical_bytes(&ok.to_canonical_bytes()),
        Ok(ok)
    );
}

/// A node that holds a prover's first and third proofs but missed the second gets it, and
/// once the ledgers agree a session carries nothing back.
///
/// The per-prover summaries this reconciliation replaced (count, highest nonce, XOR of the
/// hashes' first 8 bytes) missed a hole whenever the XOR happened to match, which a prover
/// could arrange with a few dozen of its own proofs and so split ledgers for good. Here the
/// two sides compare fingerprints of id ranges and then the ids themselves.
#[test]
fn anti_entropy_fills_a_hole_below_the_highest_nonce() -> Result<(), EconomyError> {
    let (mut a, mut b, mut c) = (economy(40), economy(41), economy(42));
    registered(&mut [&mut a, &mut b, &mut c]);
    let wires: Vec<Vec<u8>> = (1..=3)
        .map(|r| prove(&mut a, &b, r, T + 5_000 * r))
        .collect();
    for w in &wires {
        assert!(matches!(
            b.on_proof(w, T + 20_000),
            ProofOutcome::Applied { .. }
        ));
    }
    for w in [&wires[0], &wires[2]] {
        assert!(matches!(
            c.on_proof(w, T + 20_000),
            ProofOutcome::Applied { .. }
        ));
    }
    assert_ne!(c.state_hash(), b.state_hash());
    let (summary, _) = sync_with(&mut c, &mut b, T + 21_000, 1 << 20);
    assert_eq!(summary.applied, 1);
    assert_eq!(c.state_hash(), b.state_hash());
    let (summary, requests) = sync_with(&mut c, &mut b, T + 23_000, 1 << 20);
    assert_eq!((summary.applied, requests), (0, 1));
    Ok(())
}

/// A responder's answer is applied item by item (each verified), but only an open session
/// with that peer continues: an unsolicited answer gets no follow-up request, and a session
/// with another peer is not disturbed by it.
#[test]
fn unsolicited_answers_start_nothing_and_sessions_stay_bounded() {
    let mut c = economy(43);
    let junk = LedgerSyncResponse {
        neg: vec![0x61, 0, 0],
        proofs: vec![vec![1, 2, 3]],
        ops: vec![vec![4]],
        reports: Vec::new(),
    };
    let (summary, next) = c.on_sync_response(NodeId([1; 32]), &junk, T);
    assert!(next.is_none());
    assert_eq!(summary.rejected, 1, "the junk proof is refused");
    // One session per peer, at most MAX_SYNC_SESSIONS: a flood of peers evicts the oldest.
    for i in 0..(MAX_SYNC_SESSIONS as u8 + 3) {
        c.start_sync(NodeId([i; 32]), T);
    }
    assert_eq!(c.sync.sessions_open(), MAX_SYNC_SESSIONS);
}

/// A cheat signs three proofs for one round and shows `b` one pair, `c` another. Both settle
/// alike (one state hash) but each refuses the proof it did not see: after one session that
/// fetched and refused it, later sessions do not fetch it again (for a while), so the pair
/// cannot make every reconciliation between them carry it.
#[test]
fn a_refused_item_is_not_fetched_again_every_session() {
    let (mut a, mut b, mut c) = (economy(70), economy(71), economy(72));
    registered(&mut [&mut a, &mut b, &mut c]);
    let ida = test_identity(70);
    let first = prove(&mut a, &b, 1, T);
    let variant = |n: u64| {
        let mut p = decode(&first);
        p.nonce += n;
        p.tokens += n;
        p.sign(&ida).to_bytes()
    };
    let (second, third) = (variant(1), variant(2));
    for w in [&first, &second] {
        assert!(matches!(b.on_proof(w, T), ProofOutcome::Applied { .. }));
    }
    for w in [&second, &third] {
        assert!(matches!(c.on_proof(w, T), ProofOutcome::Applied { .. }));
    }
    assert_eq!(b.state_hash(), c.state_hash());
    let (once, _) = sync_with(&mut c, &mut b, T + 2_000, 1 << 20);
    assert_eq!(
        once.rejected, 1,
        "the first fetch of the proof c never saw is refused"
    );
    let (again, requests) = sync_with(&mut c, &mut b, T + 4_000, 1 << 20);
    assert_eq!((again.rejected, requests), (0, 1), "not fetched again");
    // Once the pause is over it may be asked for again.
    let later = T + 4_000 + antientropy::REFUSED_FOR_MS;
    let (after, _) = sync_with(&mut c, &mut b, later, 1 << 20);
    assert_eq!(after.rejected, 1);
    assert_eq!(b.state_hash(), c.state_hash());
}

/// Proofs waiting for a registration are held up to [`MAX_PARKED`]: a flood of them (here
/// from a prover this node has no registration of) keeps the newest and drops the oldest,
/// which anti-entropy delivers again once the registration arrives.
#[test]
fn parked_proofs_are_bounded_and_the_newest_stay() {
    let (mut a, mut b) = (economy(73), economy(74));
    registered(&mut [&mut a, &mut b]);
    let mut c = economy(75);
    let ida = test_identity(73);
    let base = decode(&prove(&mut a, &b, 1, T));
    let flood = MAX_PARKED + 10;
    let wires: Vec<Vec<u8>> = (0..flood as u64)
        .map(|i| {
            let mut p = base.clone();
            p.nonce += i;
            p.tokens += i;
            p.sign(&ida).to_bytes()
        })
        .collect();
    for w in &wires {
        assert!(matches!(c.on_proof(w, T), ProofOutcome::Parked(_)));
    }
    assert_eq!(c.parked_count(), MAX_PARKED);
    match c.on_proof(&wires[flood - 1], T) {
        ProofOutcome::Parked(why) => assert!(why.contains("already waiting"), "{why}"),
        other => panic!("the newest proof is no longer parked: {other:?}"),
    }
    assert!(matches!(c.on_proof(&wires[0], T), ProofOutcome::Parked(_)));
    assert_eq!(c.parked_count(), MAX_PARKED);
}

/// A node that heard from a peer before the peer's registration reached it asks that peer
/// for its ledger: the first answer already carries the peer's own registration, so held
/// messages are released after one round trip, not after the two a reconciliation takes.
#[test]
fn the_first_answer_carries_the_responders_own_registration() {
    let mut joiner = economy(76);
    register(&mut joiner);
    let mut other = economy(77);
    let first = other.start_sync(NodeId([0xee; 32]), T);
    let answer = joiner.answer_sync(&first, 1 << 20, T);
    assert_eq!(answer.ops.len(), 1);
    let (_, _) = other.on_sync_response(NodeId([0xee; 32]), &answer, T);
    assert!(other.ledger().is_registered(&joiner.node_id(), 0));
}

/// Registrations a node applied last travel with every first answer, so a third node learns
/// a new replica's registration in one round trip from anyone who has it.
#[test]
fn the_first_answer_carries_the_registrations_applied_last() {
    let (mut a, mut b) = (economy(78), economy(79));
    registered(&mut [&mut a, &mut b]);
    let mut c = economy(80);
    let first = c.start_sync(NodeId([0xee; 32]), T);
    let answer = b.answer_sync(&first, 1 << 20, T);
    assert_eq!(answer.ops.len(), 2);
    c.on_sync_response(NodeId([0xee; 32]), &answer, T);
    assert!(c.ledger().is_registered(&a.node_id(), 0));
}

/// Fraud reports of applied verdicts reconcile like proofs and ops: a ledger that lacks one
/// is sent its bytes (its core settles it), one it refused is not asked for again for a
/// while, and two ledgers holding the same reports exchange none.
#[test]
fn reports_of_verdicts_reach_a_ledger_that_lacks_them() {
    let (mut a, mut b) = (economy(21), economy(22));
    let report = a_report(1, 7);
    b.keep_report(report.clone());
    let session = |a: &mut Economy, b: &mut Economy, now: u64| {
        let peer = NodeId([0xee; 32]);
        let (mut got, mut requests) = (Vec::new(), 0);
        let mut request = a.start_sync(peer, now);
        loop {
            requests += 1;
            let answer = b.answer_sync(&request, 1 << 20, now);
            let answer = LedgerSyncResponse::from_canonical_bytes(&answer.to_canonical_bytes())
                .expect("decodes");
            got.extend(answer.reports.clone());
            match a.on_sync_response(peer, &answer, now).1 {
                Some(next) if requests < 50 => request = next,
                _ => return (got, requests),
            }
        }
    };
    let (got, _) = session(&mut a, &mut b, T);
    assert_eq!(got, vec![report.clone()]);
    // The core could not settle it: not asked for in the next session.
    a.refuse_item(report_id(&report), T);
    let (got, _) = session(&mut a, &mut b, T + 1_000);
    assert!(got.is_empty());
    // Settled and kept: the two agree, and a session is one request with nothing in it.
    a.keep_report(report.clone());
    let (got, requests) = session(&mut a, &mut b, T + 2_000);
    assert!(got.is_empty());
    assert_eq!(requests, 1);
}

/// A report kept to relay is persisted once (a write for the store), and one resumed from
/// the store is relayed again without being written twice.
#[test]
fn a_kept_report_is_written_once_and_resumes_from_the_store() {
    let mut a = economy(23);
    while a.poll_write().is_some() {}
    let report = a_report(1, 7);
    a.keep_report(report.clone());
    a.keep_report(report.clone());
    // Another report of the same job (its auditor re-signed it later): not kept, so an
    // auditor cannot fill the store with copies of one verdict. Bytes that are no report
    // are not kept either.
    a.keep_report(a_report(1, 8));
    a.keep_report(vec![9; 40]);
    let writes: Vec<_> = std::iter::from_fn(|| a.poll_write()).collect();
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].report.as_ref().map(|(id, w)| (*id, w.to_vec())),
        Some((report_id(&report), report.clone()))
    );
    // A report of another job is.
    a.keep_report(a_report(2, 7));
    assert_eq!(std::iter::from_fn(|| a.poll_write()).count(), 1);
    let snapshot = a.snapshot();
    assert_eq!(snapshot.reports, vec![report.clone(), a_report(2, 7)]);
    let mut b = Economy::resume(test_identity(23), a.cfg.clone(), snapshot);
    assert!(b.poll_write().is_none());
    assert!(b.holds(&report_id(&report)));
}

/// A provenance report about job `index` of a made-up commitment, signed at `timestamp`.
fn a_report(index: u32, timestamp: u64) -> Vec<u8> {
    use crate::core::fraud_tests::{forward_job, inputs};
    use neuroshard_audit::{FraudProof, NO_HASH};
    let worker = test_identity(1);
    let (c, inputs) = (forward_job([0; 32], &worker, index), inputs());
    let proof = FraudProof::provenance(&test_identity(2), c.sign(&worker), &c, inputs, timestamp);
    crate::wire::FraudReport {
        proof,
        beacon: [5; 32],
        weights_blob: NO_HASH,
    }
    .to_canonical_bytes()
}
