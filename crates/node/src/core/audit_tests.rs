//! What a worker serves to auditors: its evidence only for a challenged job, only to the
//! auditor the job's beacon names (a registered replica of its stage) or to a validator of
//! the ledger committee, which judges demands.

use std::time::Instant;

use neuroshard_audit::{AuditRate, BEACON_LAG, ChallengeSeed, JobKey, auditor_for};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, NodeId};

use super::tests::{NETWORK, core_at, drain};
use super::*;
use crate::pipeline::JobDone;
use crate::wire::{AuditAnswer, AuditRequest, MicroBatchId};

/// A stage-0 core holding one commitment of round 0 (a driver's backward pass, committed at
/// once, naming epoch 0), and the audit rate `per_million`; the seed its beacon will give.
pub(super) fn unbeaconed_worker(per_million: u32) -> (NodeCore, JobKey, ChallengeSeed) {
    let now = Instant::now();
    let mut c = core_at(&test_identity(0), now, 0, 2);
    c.settings.audit.per_million = per_million;
    let done = JobDone::Backward {
        mb: MicroBatchId {
            origin: [0; 32],
            step: 0,
            index: 0,
        },
        input_grad: None,
        loss: Some(1.0),
    };
    let hashes = JobHashes {
        step: 0,
        weights: [1; 32],
        input: [2; 32],
        upstream: [3; 32],
        grads: [4; 32],
    };
    c.handle_engine_done(1, EngineOutput::Job(done, Some(hashes)), now);
    let logged = c.job_log().iter().next().unwrap().commitment;
    assert_eq!(logged.epoch, 0);
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, BEACON);
    drain(&mut c);
    while c.poll_engine_job().is_some() {}
    (c, logged.key(), seed)
}

pub(super) const BEACON: [u8; 32] = [5; 32];

/// The same, with the job's beacon epoch final.
fn worker(per_million: u32) -> (NodeCore, JobKey, ChallengeSeed) {
    let (mut c, key, seed) = unbeaconed_worker(per_million);
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    (c, key, seed)
}

/// (refused, an evidence job started) after `from` asks for `key`'s evidence.
pub(super) fn ask(c: &mut NodeCore, from: NodeId, key: JobKey) -> (bool, bool) {
    let data = AuditRequest::Evidence {
        network: NETWORK,
        round: 0,
        job: key,
    }
    .to_canonical_bytes();
    c.handle_message(from, Inbound::Request { token: 9, data }, Instant::now());
    let refused = drain(c).iter().any(|t| {
        matches!(t, Transmit::Respond { data, .. }
            if matches!(AuditAnswer::from_canonical_bytes(data), Ok(AuditAnswer::Refused(_))))
    });
    let started = std::iter::from_fn(|| c.poll_engine_job())
        .any(|(_, j)| matches!(j, EngineJob::Evidence { .. }));
    (refused, started)
}

#[test]
fn evidence_goes_only_to_the_assigned_auditor_of_a_challenged_job() {
    // Every job challenged: the seed's auditor gets the evidence, another replica does not.
    let (mut c, key, seed) = worker(1_000_000);
    let me = test_identity(0).node_id();
    // The test economy registers identities 0..32 for every stage; the first 24 sit on the
    // ledger committee here.
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    c.audit.test_committee = validators[..24].to_vec();
    let assigned = auditor_for(&seed, &key, me, &validators).unwrap();
    let other = validators[24..]
        .iter()
        .copied()
        .find(|v| *v != assigned && *v != me)
        .unwrap();
    assert_eq!(ask(&mut c, other, key), (true, false));
    assert_eq!(ask(&mut c, assigned, key), (false, true));
    // A committee validator gets it too: it judges auditors' demands (`core/jury.rs`).
    let juror = validators[..24]
        .iter()
        .copied()
        .find(|v| *v != assigned && *v != me)
        .unwrap();
    assert_eq!(ask(&mut c, juror, key), (false, true));
    // An unregistered key, and a job nobody committed.
    assert_eq!(ask(&mut c, test_identity(40).node_id(), key), (true, false));
    assert_eq!(ask(&mut c, assigned, JobKey([7; 32])), (true, false));

    // At a rate that challenges nothing, no one gets it.
    let (mut c, key, _) = worker(1);
    c.audit.test_committee = validators[..24].to_vec();
    assert!(!neuroshard_audit::is_challenged(
        &seed,
        &key,
        AuditRate { per_million: 1 }
    ));
    assert_eq!(ask(&mut c, assigned, key), (true, false));
    assert_eq!(ask(&mut c, juror, key), (true, false));
}

#[test]
fn evidence_asked_before_the_beacon_is_final_here_is_served_once_it_is() {
    let (mut c, key, seed) = unbeaconed_worker(1_000_000);
    let me = test_identity(0).node_id();
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let assigned = auditor_for(&seed, &key, me, &validators).unwrap();
    // The auditor holds the epoch, this worker not yet: no refusal (an honest worker that
    // lags would be reported as refusing), no answer either.
    assert_eq!(ask(&mut c, assigned, key), (false, false));
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    c.on_new_beacon(Instant::now());
    let started = std::iter::from_fn(|| c.poll_engine_job())
        .any(|(_, j)| matches!(j, EngineJob::Evidence { .. }));
    assert!(
        started,
        "the deferred request is served once the epoch is final"
    );
}

/// An auditor (stage 0 of 2) handed a co-replica's commitment by a replica of the next stage
/// audits it as if it were listed; a key registered for no neighbouring stage is refused
/// and a forged commitment costs its sender.
#[test]
fn a_neighbours_notice_opens_the_audit_and_a_strangers_does_not() {
    let now = Instant::now();
    let me = test_identity(0);
    let worker = test_identity(1);
    let mut c = core_at(&me, now, 0, 2);
    c.settings.audit.per_million = 1_000_000;
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    drain(&mut c);
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, BEACON);
    // A job of the worker's that the beacon assigns to us.
    let job = (0..10_000)
        .map(|i| {
            let mut j = super::fraud_tests::forward_job(NETWORK, &worker, i);
            j.stage = 0;
            j.round = 0;
            j
        })
        .find(|j| auditor_for(&seed, &j.key(), worker.node_id(), &validators) == Some(me.node_id()))
        .unwrap();
    let notice = |from: &Identity, c: &mut NodeCore, job: neuroshard_audit::SignedJob| {
        let data = AuditRequest::Notice(job).to_canonical_bytes();
        c.handle_message(from.node_id(), Inbound::Request { token: 5, data }, now);
        let out = drain(c);
        let answer = out.iter().find_map(|t| match t {
            Transmit::Respond { data, .. } => AuditAnswer::from_canonical_bytes(data).ok(),
            _ => None,
        });
        let asked = out.iter().any(|t| {
            matches!(t, Transmit::Request { to, data, .. }
                if *to == worker.node_id()
                && matches!(AuditRequest::from_canonical_bytes(data), Ok(AuditRequest::Evidence { .. })))
        });
        (answer, asked)
    };
    // Not registered for stage 1 (the test economy registers identities 0..32).
    let (answer, asked) = notice(&test_identity(40), &mut c, job.sign(&worker));
    assert!(matches!(answer, Some(AuditAnswer::Refused(_))) && !asked);
    // Signed by someone other than the worker it names: penalised, nothing asked.
    let (answer, asked) = notice(&test_identity(2), &mut c, job.sign(&test_identity(3)));
    assert!(answer.is_none() && !asked);
    // A registered replica of stage 1 with the worker's own commitment: the audit starts.
    let (answer, asked) = notice(&test_identity(2), &mut c, job.sign(&worker));
    assert!(matches!(answer, Some(AuditAnswer::List(_))) && asked);
    // The same job again (listed, or noticed twice): audited once.
    let (_, asked) = notice(&test_identity(4), &mut c, job.sign(&worker));
    assert!(!asked);
}

/// A worker (or an accuser) names the outer state an offer's evidence carries, with its
/// length: what an auditor, juror or settling node then fetches. A length past what any
/// outer state of the stage can be (θ₀, momentum and last aggregate, and a header), or an
/// outer state given for another kind of job, is refused before anything is fetched.
#[test]
fn an_offers_evidence_blob_is_bounded_by_the_stages_outer_state() {
    let now = Instant::now();
    let c = core_at(&test_identity(0), now, 1, 2);
    let weights = c.weights_bytes(1);
    assert!(weights > 0);
    let mut offer = super::tests::committed_offer(&test_identity(1), 1, 7)
        .commitment(test_identity(1).node_id())
        .unwrap()
        .0;
    offer.stage = 1;
    let outer = |len: u64| neuroshard_audit::JobInputs {
        input: neuroshard_audit::StageData::Outer { hash: [0; 32], len },
        upstream: neuroshard_audit::UpstreamData::None,
    };
    let most = 3 * weights + 64;
    assert_eq!(
        c.evidence_blob_bytes(&offer, &outer(most)),
        Some(weights + most)
    );
    assert_eq!(c.evidence_blob_bytes(&offer, &outer(most + 1)), None);
    assert_eq!(c.evidence_blob_bytes(&offer, &outer(u64::MAX)), None);
    let forward = neuroshard_audit::JobCommitment {
        kind: neuroshard_audit::JobKind::Forward,
        ..offer
    };
    assert_eq!(c.evidence_blob_bytes(&forward, &outer(8)), None);
    let tokens = neuroshard_audit::JobInputs {
        input: neuroshard_audit::StageData::Tokens(neuroshard_audit::TokenIds {
            batch: 1,
            seq: 1,
            ids: vec![3],
        }),
        upstream: neuroshard_audit::UpstreamData::None,
    };
    assert_eq!(c.evidence_blob_bytes(&offer, &tokens), None);
    assert_eq!(c.evidence_blob_bytes(&forward, &tokens), Some(weights));
}
