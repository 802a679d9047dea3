//! A mover drains before its restart: it keeps its job log and evidence until no audit of
//! its jobs can come, because a restarted node answers "no such job", which the jurors slash.

use std::time::{Duration, Instant};

use neuroshard_audit::{BEACON_LAG, auditor_for};
use neuroshard_model::Activations;
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{NodeId, Signed};

use super::audit_tests::{BEACON, ask, unbeaconed_worker};
use super::beacon::EVIDENCE_GRACE;
use super::migrate::MAX_DRAIN;
use super::tests::{core_at, drain};
use super::*;
use crate::act_codec::{self, ActSpec};
use crate::records::{Heartbeat, Topic};
use crate::wire::Msg;
use crate::wire::{MicroBatchId, Payload};

/// The `leaving` flag of each heartbeat among `sent`.
fn heartbeats(sent: &[Transmit]) -> Vec<bool> {
    sent.iter()
        .filter_map(|t| match t {
            Transmit::Publish {
                topic: Topic::Heartbeat(_),
                data,
            } => Some(
                Signed::<Heartbeat>::from_bytes(data)
                    .ok()?
                    .verify()
                    .ok()?
                    .leaving,
            ),
            _ => None,
        })
        .collect()
}

fn drained(c: &mut NodeCore) -> Option<bool> {
    std::iter::from_fn(|| c.poll_event()).find_map(|e| match e {
        NodeEvent::Drained { complete, .. } => Some(complete),
        _ => None,
    })
}

/// Makes the job's beacon epoch final at `t0 + 1 s` and the next epoch at `t0 + 2 s`: the job
/// is past its audits once the latter is `EVIDENCE_GRACE` old.
fn finalize_beacon(c: &mut NodeCore, t0: Instant) {
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    c.on_new_beacon(t0 + Duration::from_secs(1));
    c.audit.test_beacons.insert(BEACON_LAG + 1, [6; 32]);
    c.on_new_beacon(t0 + Duration::from_secs(2));
}

#[test]
fn a_mover_answers_its_auditors_until_no_audit_of_its_jobs_can_come() {
    // A worker with one challenged job, its beacon not final yet.
    let (mut c, key, seed) = unbeaconed_worker(1_000_000);
    let t0 = Instant::now();
    c.begin_move(3, 1, t0);
    // Nothing in flight: it says it is leaving at once, so no one routes work to it; and it
    // takes the new stage in the ledger, so the next candidates stay where they are.
    let sent = drain(&mut c);
    assert_eq!(heartbeats(&sent), [true]);
    let me = test_identity(0).node_id();
    assert!(
        sent.iter().any(|t| matches!(
            t,
            Transmit::Publish {
                topic: Topic::Ops,
                ..
            }
        )),
        "its registration for stage 3 goes out"
    );
    assert!(c.economy.ledger().is_registered(&me, 3));
    assert_eq!(c.moving(), Some(3));
    assert_eq!(c.ready_to_move(), None, "its job is not audited yet");

    finalize_beacon(&mut c, t0);
    // The auditor the beacon names gets the evidence from the draining node.
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let assigned = auditor_for(&seed, &key, me, &validators).unwrap();
    assert_eq!(ask(&mut c, assigned, key), (false, true));

    // Within the grace period it stays, and sends no heartbeat that would route work back.
    let mut t = t0 + Duration::from_secs(2);
    while t < t0 + Duration::from_secs(2) + EVIDENCE_GRACE {
        c.handle_timeout(t);
        assert_eq!(c.ready_to_move(), None, "left {:?} after t0", t - t0);
        assert_eq!(heartbeats(&drain(&mut c)), Vec::<bool>::new());
        t += Duration::from_secs(5);
    }
    assert_eq!(drained(&mut c), None);
    c.handle_timeout(t0 + Duration::from_secs(3) + EVIDENCE_GRACE);
    assert_eq!(c.ready_to_move(), Some(3));
    assert_eq!(drained(&mut c), Some(true));
}

#[test]
fn a_demanded_round_keeps_the_mover_for_its_jurors() {
    let (mut c, _, _) = unbeaconed_worker(1_000_000);
    let t0 = Instant::now();
    c.begin_move(3, 1, t0);
    finalize_beacon(&mut c, t0);
    // An auditor demanded one of its jobs: the round is kept for the jurors' attempts.
    let until = t0 + Duration::from_secs(100);
    c.audit.juries.kept.insert(0, until);
    c.handle_timeout(t0 + Duration::from_secs(3) + EVIDENCE_GRACE);
    assert_eq!(c.ready_to_move(), None, "the jurors may still ask");
    c.handle_timeout(until + Duration::from_millis(1));
    assert_eq!(c.ready_to_move(), Some(3));
    assert_eq!(drained(&mut c), Some(true));
}

/// What keeps a drain from ending (no finality, so the job's beacon never comes; a flood of
/// demands; a stage that never answers) holds the new stage empty for `MAX_DRAIN` at most.
#[test]
fn a_drain_that_cannot_end_gives_up_after_max_drain() {
    let (mut c, _, _) = unbeaconed_worker(1_000_000);
    let t0 = Instant::now();
    c.begin_move(3, 1, t0);
    c.handle_timeout(t0 + MAX_DRAIN - Duration::from_secs(1));
    assert_eq!(c.ready_to_move(), None);
    c.handle_timeout(t0 + MAX_DRAIN);
    assert_eq!(c.ready_to_move(), Some(3));
    assert_eq!(drained(&mut c), Some(false), "it says its audits were open");
}

/// A forward from stage 0 for micro-batch `index` of step 0, driven by `test_identity(1)`.
fn forward(index: u32) -> Msg {
    let acts = Activations {
        batch: 1,
        seq: 8,
        dim: 8,
        data: vec![0.1; 8 * 8],
    };
    Msg::Forward {
        mb: MicroBatchId {
            origin: test_identity(1).node_id().0,
            step: 0,
            index,
        },
        version: 0,
        stamp: None,
        route: Vec::new(),
        input: Payload::Hidden(act_codec::pack(&acts, ActSpec::default().forward).unwrap()),
        targets: vec![1; 8].into(),
    }
}

/// A mover that holds a micro-batch says it is leaving only once it is done with it: its
/// peers would otherwise fail the work over to another replica while it still answers.
#[test]
fn a_mover_says_it_is_leaving_only_once_nothing_is_in_flight() {
    let t0 = Instant::now();
    let mut c = core_at(&test_identity(0), t0, 1, 2);
    let from = test_identity(1).node_id();
    let (ack, actions) = c.pipeline.on_message(from, forward(0), t0);
    assert_eq!(ack, crate::wire::Ack::Accepted);
    let jobs: Vec<_> = actions
        .into_iter()
        .filter_map(|a| match a {
            crate::pipeline::Action::Compute(job) => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(
        jobs.len(),
        1,
        "the forward and backward job of the last stage"
    );
    c.begin_move(3, 1, t0);
    assert_eq!(
        heartbeats(&drain(&mut c)),
        Vec::<bool>::new(),
        "still computing"
    );
    // A new micro-batch is declined without blame, and what was admitted finishes.
    let (ack, _) = c.pipeline.on_message(from, forward(1), t0);
    assert_eq!(ack, crate::wire::Ack::Busy);
    let crate::pipeline::Job::Backward { mb, .. } = &jobs[0] else {
        panic!(
            "the last stage runs forward and backward at once: {:?}",
            jobs[0]
        );
    };
    let done = JobDone::Backward {
        mb: *mb,
        input_grad: None,
        loss: Some(2.0),
    };
    c.handle_engine_done(1, EngineOutput::Job(done, None), t0);
    assert_eq!(heartbeats(&drain(&mut c)), [true]);
}
