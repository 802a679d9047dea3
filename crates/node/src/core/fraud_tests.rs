//! Fraud reports that cannot convict cost a node nothing: refused before any weights are
//! fetched, their author penalised.

use std::time::Instant;

use neuroshard_audit::{
    AuditRate, ChallengeSeed, DeterminismClass, FraudProof, IsaLevel, JobCommitment, JobInputs,
    JobKind, MicroBatchRef, NO_HASH, Replayed, StageData, TokenIds, UpstreamData, auditor_for,
    is_challenged,
};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, NodeId};

use super::tests::{NETWORK, core_at, drain};
use super::*;
use crate::records::Topic;
use crate::wire::FraudReport;

const FINAL: [u8; 32] = [5; 32];

pub(crate) fn inputs() -> JobInputs {
    JobInputs {
        input: StageData::Tokens(TokenIds {
            batch: 1,
            seq: 2,
            ids: vec![1, 2],
        }),
        upstream: UpstreamData::None,
    }
}

/// Job `index` of `worker`: a forward pass of stage 0, round 0, on [`inputs`].
pub(crate) fn forward_job(network: Hash32, worker: &Identity, index: u32) -> JobCommitment {
    JobCommitment {
        network,
        worker: worker.node_id(),
        stage: 0,
        round: 0,
        step: 1,
        micro_batch: MicroBatchRef {
            origin: worker.node_id(),
            step: 1,
            index,
        },
        kind: JobKind::Forward,
        class: DeterminismClass {
            build: [1; 32],
            isa: IsaLevel::X86V3,
            cache_bytes: [1, 2, 3],
            micro_batches: 2,
        },
        weights_hash: [2; 32],
        input_hash: inputs().input.hash(),
        upstream_hash: inputs().upstream.hash(),
        output_hash: [3; 32],
        grads_hash: NO_HASH,
        epoch: 0,
    }
}

/// A forward job of stage 0, round 0, by `worker` that the default rate challenges.
fn challenged_job(worker: &Identity) -> JobCommitment {
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, FINAL);
    (0..10_000)
        .map(|index| forward_job(NETWORK, worker, index))
        .find(|c| is_challenged(&seed, &c.key(), AuditRate::default()))
        .unwrap()
}

fn report(accuser: &Identity, job: &JobCommitment, inputs: JobInputs) -> Vec<u8> {
    let claimed = Replayed {
        output_hash: [4; 32],
        grads_hash: NO_HASH,
        output: None,
    };
    let proof = FraudProof::new(
        accuser,
        job.sign(&test_identity(1)),
        job,
        inputs,
        &claimed,
        None,
        0,
    );
    FraudReport {
        proof,
        beacon: FINAL,
        weights_blob: [6; 32],
    }
    .to_canonical_bytes()
}

/// A stage-1 core whose finalized epochs include the test jobs' beacon (epoch 0 + lag).
fn judge(now: Instant) -> NodeCore {
    let mut c = core_at(&test_identity(0), now, 1, 2);
    c.audit
        .test_beacons
        .insert(neuroshard_audit::BEACON_LAG, FINAL);
    c
}

/// The auditor the test beacon assigns `job` to (the test economy registers identities 0..32
/// for every stage).
fn assigned_auditor(job: &JobCommitment, worker: &Identity) -> Identity {
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, FINAL);
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let assigned = auditor_for(&seed, &job.key(), worker.node_id(), &validators).unwrap();
    (0..32)
        .map(test_identity)
        .find(|i| i.node_id() == assigned)
        .unwrap()
}

/// Whether `c` asked for a report's weights since last drained.
fn fetched(c: &mut NodeCore) -> bool {
    drain(c)
        .iter()
        .any(|t| matches!(t, Transmit::FetchBlob { .. }))
}

/// (fetched weights, dropped the report) after `from` gossips `data`.
fn receive(from: NodeId, data: Vec<u8>) -> (bool, bool) {
    let now = Instant::now();
    let mut c = judge(now);
    drain(&mut c);
    let topic = Topic::Ops.name();
    c.handle_message(from, Inbound::Gossip { topic, data }, now);
    let fetched = fetched(&mut c);
    let dropped = std::iter::from_fn(|| c.poll_event())
        .any(|e| matches!(e, NodeEvent::Dropped { what: Some(w), .. } if w == "fraud report"));
    (fetched, dropped)
}

#[test]
fn only_the_assigned_auditors_consistent_evidence_is_worth_fetching_weights_for() {
    let worker = test_identity(1);
    let job = challenged_job(&worker);
    let auditor = assigned_auditor(&job, &worker);
    let assigned = auditor.node_id();
    let other = (2..32)
        .map(test_identity)
        .find(|i| i.node_id() != assigned)
        .unwrap();

    // The assigned auditor's evidence: weights are fetched to replay it.
    assert_eq!(
        receive(assigned, report(&auditor, &job, inputs())),
        (true, false)
    );
    // Anyone else's: refused before any transfer.
    assert_eq!(
        receive(other.node_id(), report(&other, &job, inputs())),
        (false, true)
    );
    // The assigned auditor's, relayed under another key.
    assert_eq!(
        receive(other.node_id(), report(&auditor, &job, inputs())),
        (false, true)
    );
    // Inputs other than the committed ones.
    let mut bad = inputs();
    bad.input = StageData::Tokens(TokenIds {
        batch: 1,
        seq: 2,
        ids: vec![2, 1],
    });
    assert_eq!(
        receive(assigned, report(&auditor, &job, bad)),
        (false, true)
    );
    // Garbage on the ops topic is still an op (refused as one), not a fraud report.
    assert_eq!(receive(assigned, vec![1, 2, 3]), (false, false));
    // Drawn from a beacon other than the one this node's finalized epochs give (an accuser
    // that picks its own seed makes any job "assigned" to it).
    let mut forged = FraudReport::from_canonical_bytes(&report(&auditor, &job, inputs())).unwrap();
    forged.beacon = [6; 32];
    assert_eq!(
        receive(assigned, forged.to_canonical_bytes()),
        (false, true)
    );
}

/// A report about a job whose beacon epoch is not final here yet waits for it, then is
/// settled (before, a node of another stage took the round hash a report claimed on trust).
#[test]
fn a_report_waits_for_its_beacon_epoch_then_is_settled() {
    let worker = test_identity(1);
    let job = challenged_job(&worker);
    let auditor = assigned_auditor(&job, &worker);
    let assigned = auditor.node_id();
    let now = Instant::now();
    let mut c = core_at(&test_identity(0), now, 1, 2);
    drain(&mut c);
    let data = report(&auditor, &job, inputs());
    let topic = Topic::Ops.name();
    c.handle_message(assigned, Inbound::Gossip { topic, data }, now);
    assert!(!fetched(&mut c), "settled before its beacon was final");
    assert!(!std::iter::from_fn(|| c.poll_event()).any(|e| matches!(e, NodeEvent::Dropped { .. })));
    c.audit
        .test_beacons
        .insert(neuroshard_audit::BEACON_LAG, FINAL);
    c.on_new_beacon(now);
    assert!(fetched(&mut c), "not settled once its beacon was final");
}

/// The transport forwards a fraud report only from its accuser: without this, gossip
/// validation (which knew only ops on this topic) dropped every report, and only the
/// auditor's own ledger applied the verdict.
#[test]
fn the_transport_forwards_a_fraud_report_from_its_accuser_only() {
    use crate::records::validate_gossip;
    use neuroshard_net::Validation;
    let worker = test_identity(1);
    let job = challenged_job(&worker);
    let accuser = test_identity(3);
    let data = report(&accuser, &job, inputs());
    let topic = Topic::Ops.name();
    assert_eq!(
        validate_gossip(&topic, &accuser.node_id(), &data),
        Validation::Accept
    );
    assert_eq!(
        validate_gossip(&topic, &test_identity(4).node_id(), &data),
        Validation::Reject
    );
}

/// A provenance charge (the driver's tokens are not the genesis text they name) needs no
/// weights: every node reads its own genesis. The test core has none, so no named window
/// exists and the charge convicts; an unassigned accuser's charge is refused unread.
#[test]
fn a_provenance_charge_is_settled_from_the_genesis_without_fetching_weights() {
    use neuroshard_audit::{GenesisTokens, WindowRef};
    let worker = test_identity(1);
    let named = JobInputs {
        input: StageData::Genesis(GenesisTokens {
            tokens: TokenIds {
                batch: 1,
                seq: 2,
                ids: vec![1, 2],
            },
            windows: vec![WindowRef {
                shard: 0,
                window: 3,
            }],
        }),
        upstream: UpstreamData::None,
    };
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, FINAL);
    let mut job = challenged_job(&worker);
    job.input_hash = named.input.hash();
    let job = (0..10_000)
        .map(|index| JobCommitment {
            micro_batch: MicroBatchRef {
                index,
                ..job.micro_batch
            },
            ..job
        })
        .find(|c| is_challenged(&seed, &c.key(), AuditRate::default()))
        .unwrap();
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let assigned = auditor_for(&seed, &job.key(), worker.node_id(), &validators).unwrap();
    let identity = |id: NodeId| {
        (0..32)
            .map(test_identity)
            .find(|i| i.node_id() == id)
            .unwrap()
    };
    let charge = |accuser: &Identity| {
        FraudReport {
            proof: FraudProof::provenance(accuser, job.sign(&worker), &job, named.clone(), 0),
            beacon: FINAL,
            weights_blob: NO_HASH,
        }
        .to_canonical_bytes()
    };

    let now = Instant::now();
    let mut c = judge(now);
    drain(&mut c);
    let before = c.economy().ledger().account(&worker.node_id()).stake;
    let topic = Topic::Ops.name();
    c.handle_message(
        assigned,
        Inbound::Gossip {
            topic: topic.clone(),
            data: charge(&identity(assigned)),
        },
        now,
    );
    assert!(
        !drain(&mut c)
            .iter()
            .any(|t| matches!(t, Transmit::FetchBlob { .. })),
        "weights fetched for a provenance charge"
    );
    let verdicts = std::iter::from_fn(|| c.poll_event())
        .filter(|e| matches!(e, NodeEvent::Ledger { kind: Some(k), .. } if k == "verdict: guilty"))
        .count();
    assert_eq!(verdicts, 1);
    assert!(c.economy().ledger().account(&worker.node_id()).stake < before);

    // Someone the seed did not assign: refused, nothing moves.
    let other = (2..32)
        .map(test_identity)
        .find(|i| i.node_id() != assigned)
        .unwrap();
    let mut c = judge(now);
    drain(&mut c);
    c.handle_message(
        other.node_id(),
        Inbound::Gossip {
            topic,
            data: charge(&other),
        },
        now,
    );
    assert_eq!(
        c.economy().ledger().account(&worker.node_id()).stake,
        before
    );
    assert!(
        std::iter::from_fn(|| c.poll_event())
            .any(|e| matches!(e, NodeEvent::Dropped { what: Some(w), .. } if w == "fraud report"))
    );
}

/// A report relayed by a peer's ledger (anti-entropy) is settled like a gossiped one, with
/// the weights fetched from the relaying peer, and costs that peer nothing when it cannot
/// convict (its ledger may know registrations ours does not). A withheld weights transfer
/// leaves the job open: the next copy of the report is settled.
#[test]
fn relayed_reports_fetch_from_the_relayer_and_a_failed_fetch_leaves_the_job_open() {
    let worker = test_identity(1);
    let job = challenged_job(&worker);
    let auditor = assigned_auditor(&job, &worker);
    let assigned = auditor.node_id();
    let relayer = (2..32)
        .map(test_identity)
        .find(|i| i.node_id() != assigned)
        .unwrap()
        .node_id();
    let wire = report(&auditor, &job, inputs());

    let now = Instant::now();
    let mut c = judge(now);
    drain(&mut c);
    let fetch = |c: &mut NodeCore| {
        drain(c).into_iter().find_map(|t| match t {
            Transmit::FetchBlob { from, token, .. } => Some((from, token)),
            _ => None,
        })
    };
    c.on_relayed_report(relayer, &wire, now);
    let (from, token) = fetch(&mut c).expect("the weights are fetched");
    assert_eq!(from, relayer, "fetched from the ledger that relayed it");
    // The transfer fails: a second copy of the report is taken up again.
    c.handle_message(
        relayer,
        Inbound::Blob {
            token,
            result: Err(TransferError("withheld".into())),
        },
        now,
    );
    c.on_relayed_report(assigned, &wire, now);
    assert!(
        fetch(&mut c).is_some(),
        "the job stayed closed after a failed fetch"
    );

    // A relayed report that cannot convict (not the assigned auditor's) penalises no one.
    let other = (2..32)
        .map(test_identity)
        .find(|i| i.node_id() != assigned)
        .unwrap();
    let mut c = judge(now);
    drain(&mut c);
    c.on_relayed_report(relayer, &report(&other, &job, inputs()), now);
    assert!(fetch(&mut c).is_none());
    assert!(!std::iter::from_fn(|| c.poll_event()).any(|e| matches!(e, NodeEvent::Dropped { .. })));
}

/// Reports wait for their beacon epoch only when it is near this node's: a made-up far one
/// (any key can sign a commitment naming epoch 10 and accuse it) is not held, so a flood of
/// them cannot push out genuine reports waiting for an epoch.
#[test]
fn a_report_naming_a_beacon_far_past_ours_is_not_held() {
    let worker = test_identity(1);
    let job = JobCommitment {
        epoch: 10,
        ..challenged_job(&worker)
    };
    let auditor = assigned_auditor(&job, &worker);
    let now = Instant::now();
    let mut c = core_at(&test_identity(0), now, 1, 2);
    drain(&mut c);
    let gossip = |c: &mut NodeCore| {
        let data = report(&auditor, &job, inputs());
        let topic = Topic::Ops.name();
        c.handle_message(auditor.node_id(), Inbound::Gossip { topic, data }, now);
    };
    gossip(&mut c);
    assert!(!fetched(&mut c));
    // Its beacon epoch (14) becomes final: nothing was held to settle.
    c.audit
        .test_beacons
        .insert(10 + neuroshard_audit::BEACON_LAG, FINAL);
    c.on_new_beacon(now);
    assert!(!fetched(&mut c), "a report 14 epochs past ours was held");
    // Gossiped again now, it is settled.
    gossip(&mut c);
    assert!(fetched(&mut c));
}
