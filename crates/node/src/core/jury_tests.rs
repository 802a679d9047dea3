//! Jurors: a committee validator judges an auditor's demand for a job's evidence by asking the
//! worker itself, and votes to slash only a worker that served it nothing (or evidence on
//! which the job does not replay); a demand from anyone but the job's assigned auditor makes
//! no one fetch anything.

use std::time::{Duration, Instant};

use neuroshard_audit::{
    AuditRate, BEACON_LAG, ChallengeSeed, JobCommitment, NO_HASH, Replayed, auditor_for,
    is_challenged,
};
use neuroshard_ledger::{EpochItem, VerifiedVerdict};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, NodeId, Signed};

use super::fraud_tests::{forward_job, inputs};
use super::jury::{JURY_ATTEMPTS, JURY_RETRY};
use super::tests::{NETWORK, core_at, drain};
use super::*;
use crate::economy::epochs::Admit;
use crate::records::Topic;
use crate::wire::{AuditAnswer, AuditDemand, AuditRequest};

const BEACON: [u8; 32] = [5; 32];

/// The committee of the unit tests' cores: the first 24 staked identities (0..32 are staked
/// and registered for every stage).
fn committee() -> Vec<NodeId> {
    (0..24).map(|i| test_identity(i).node_id()).collect()
}

struct Case {
    juror: NodeCore,
    worker: Identity,
    auditor: Identity,
    job: JobCommitment,
    now: Instant,
}

/// A juror (a committee validator serving stage 0 of 2) and a challenged forward job of
/// stage 1 by `worker`, with its assigned auditor.
fn case() -> Case {
    case_of_stage(1)
}

/// The same, the job of stage `stage`.
fn case_of_stage(stage: u16) -> Case {
    let now = Instant::now();
    let me = test_identity(0);
    let mut juror = core_at(&me, now, 0, 2);
    juror.audit.test_committee = committee();
    juror.settings.audit.per_million = 1_000_000;
    juror.audit.test_beacons.insert(BEACON_LAG, BEACON);
    juror.audit.final_times.push_back((BEACON_LAG, now));
    drain(&mut juror);
    let worker = (0..32)
        .map(test_identity)
        .find(|id| id.node_id() != me.node_id())
        .unwrap();
    let mut job = forward_job(NETWORK, &worker, 0);
    job.stage = stage;
    let seed = ChallengeSeed::from_beacon(NETWORK, stage, 0, BEACON);
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    assert!(is_challenged(
        &seed,
        &job.key(),
        AuditRate {
            per_million: 1_000_000
        }
    ));
    let assigned = auditor_for(&seed, &job.key(), worker.node_id(), &validators).unwrap();
    let auditor = (0..32)
        .map(test_identity)
        .find(|id| id.node_id() == assigned)
        .unwrap();
    Case {
        juror,
        worker,
        auditor,
        job,
        now,
    }
}

fn demand(c: &Case, by: &Identity, signed_by: &Identity) -> (AuditDemand, Vec<u8>) {
    let d = AuditDemand {
        network: NETWORK,
        jobs: vec![c.job.sign(signed_by)],
        timestamp_ms: 1_800_000_000_000,
    };
    let bytes = Signed::sign(by, &d).to_bytes();
    (d, bytes)
}

/// Delivers gossip on the network-wide topic; the evidence requests to the worker after it.
fn gossip(c: &mut Case, from: NodeId, data: Vec<u8>) -> (Vec<Token>, bool) {
    let topic = Topic::Ops.name();
    c.juror
        .handle_message(from, Inbound::Gossip { topic, data }, c.now);
    let out = drain(&mut c.juror);
    let penalized = out
        .iter()
        .any(|t| matches!(t, Transmit::Penalize { peer, .. } if *peer == from));
    (asks(&c.worker.node_id(), &out), penalized)
}

fn asks(worker: &NodeId, out: &[Transmit]) -> Vec<Token> {
    out.iter()
        .filter_map(|t| match t {
            Transmit::Request { to, token, data }
                if to == worker
                    && matches!(
                        AuditRequest::from_canonical_bytes(data),
                        Ok(AuditRequest::Evidence { .. })
                    ) =>
            {
                Some(*token)
            }
            _ => None,
        })
        .collect()
}

fn answer(c: &mut Case, token: Token, a: AuditAnswer) -> Vec<Transmit> {
    let from = c.worker.node_id();
    let result = Ok(a.to_canonical_bytes());
    c.juror
        .handle_message(from, Inbound::Response { token, result }, c.now);
    drain(&mut c.juror)
}

fn verdict(c: &Case, d: &AuditDemand) -> VerifiedVerdict {
    VerifiedVerdict {
        job: c.job.key().0,
        offender: c.worker.node_id(),
        beneficiary: c.auditor.node_id(),
        evidence_hash: {
            let mut h = blake3::Hasher::new();
            h.update(blake3::hash(&d.to_canonical_bytes()).as_bytes());
            h.update(&c.job.key().0);
            *h.finalize().as_bytes()
        },
        timestamp_ms: d.timestamp_ms,
    }
}

fn admit(c: &Case, v: VerifiedVerdict) -> Admit {
    admit_at(c, v, 1_800_000_100_000)
}

fn admit_at(c: &Case, v: VerifiedVerdict, now_ms: u64) -> Admit {
    let state = c.juror.economy().ledger().clone();
    c.juror
        .economy()
        .admit(&state, &EpochItem::Verdict(v), now_ms)
}

#[test]
fn only_the_assigned_auditors_demand_makes_a_juror_ask() {
    let mut c = case();
    let stranger = (0..32)
        .map(test_identity)
        .find(|id| id.node_id() != c.auditor.node_id() && id.node_id() != c.worker.node_id())
        .unwrap();
    let (auditor, stranger_id) = (c.auditor.node_id(), stranger.node_id());
    // A registered key the beacon did not assign: nobody's juror fetches for it.
    let (_, bytes) = demand(&c, &stranger, &c.worker.clone());
    assert_eq!(gossip(&mut c, stranger_id, bytes).0.len(), 0);
    // A commitment the worker never signed: the demander pays for it.
    let (_, bytes) = demand(&c, &c.auditor.clone(), &stranger);
    let (asked, penalized) = gossip(&mut c, auditor, bytes);
    assert!(asked.is_empty() && penalized);
    // Relayed under another key than its signer's: refused and penalised.
    let (_, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    let (asked, penalized) = gossip(&mut c, stranger_id, bytes.clone());
    assert!(asked.is_empty() && penalized);
    // The assigned auditor's: the juror asks the worker, once however often it comes.
    assert_eq!(gossip(&mut c, auditor, bytes.clone()).0.len(), 1);
    assert_eq!(gossip(&mut c, auditor, bytes).0.len(), 0);
}

#[test]
fn a_juror_the_worker_never_serves_votes_to_slash_after_its_last_attempt() {
    let mut c = case();
    let (d, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    let v = verdict(&c, &d);
    let auditor = c.auditor.node_id();
    let (mut asked, _) = gossip(&mut c, auditor, bytes);
    for attempt in 1..=JURY_ATTEMPTS {
        assert_eq!(asked.len(), 1, "attempt {attempt}");
        // Until the juror has made up its mind, it cannot vote either way.
        assert_eq!(admit(&c, v), Admit::NotYet, "attempt {attempt}");
        let out = answer(&mut c, asked[0], AuditAnswer::Refused("no".into()));
        assert!(asks(&c.worker.node_id(), &out).is_empty());
        c.now += JURY_RETRY + Duration::from_millis(1);
        c.juror.handle_timeout(c.now);
        asked = asks(&c.worker.node_id(), &drain(&mut c.juror));
    }
    assert!(asked.is_empty(), "no attempt past the last");
    assert_eq!(admit(&c, v), Admit::Yes);
    // A finding the committee does not back in time stops being proposed and voted for.
    let late = 1_800_000_100_000 + crate::economy::epochs::JURY_FINDING_TTL_MS;
    assert!(matches!(admit_at(&c, v, late), Admit::No(_)));
    // Another verdict about the job (say, naming another beneficiary) is not this juror's.
    let other = VerifiedVerdict {
        beneficiary: c.worker.node_id(),
        ..v
    };
    assert!(matches!(admit(&c, other), Admit::No(_)));
    // The live ledger waits for finality: one juror's view is not the network's.
    let ledger = c.juror.economy().ledger();
    assert!(!ledger.has_verdict(&v.job));
}

/// The worker's statement that it served the juror the job's evidence.
fn served_to_juror(c: &Case) -> neuroshard_audit::SignedServed {
    neuroshard_proof::Signed::sign(
        &c.worker,
        &neuroshard_audit::Served {
            network: c.job.network,
            job: c.job.key(),
            worker: c.job.worker,
            to: c.juror.node_id(),
            input_hash: c.job.input_hash,
            timestamp_ms: 1,
        },
    )
}

/// The worker's evidence answer: the fixture's inputs, weights of `weights_len` bytes.
fn evidence(weights_len: u64, served: neuroshard_audit::SignedServed) -> AuditAnswer {
    AuditAnswer::Evidence {
        inputs: inputs(),
        weights_blob: [9; 32],
        weights_len,
        served: Box::new(served),
    }
}

/// `worker` answers `asked` with a stage-1 job's evidence and `served`, serves the weights,
/// and `core`'s replay gives `replayed`: what `core` sends after that.
fn replay_on_evidence(
    core: &mut NodeCore,
    worker: NodeId,
    asked: Token,
    served: neuroshard_audit::SignedServed,
    replayed: Replayed,
    now: Instant,
) -> Vec<Transmit> {
    let answer = evidence(core.weights_bytes(1), served);
    let result = Ok(answer.to_canonical_bytes());
    core.handle_message(
        worker,
        Inbound::Response {
            token: asked,
            result,
        },
        now,
    );
    let fetch = drain(core)
        .into_iter()
        .find_map(|t| match t {
            Transmit::FetchBlob { token, .. } => Some(token),
            _ => None,
        })
        .expect("the weights are fetched");
    let len = usize::try_from(core.weights_bytes(1)).unwrap();
    let blob = Inbound::Blob {
        token: fetch,
        result: Ok(vec![0; len]),
    };
    core.handle_message(worker, blob, now);
    let (token, _) = std::iter::from_fn(|| core.poll_engine_job())
        .find(|(_, j)| matches!(j, EngineJob::Replay { .. }))
        .expect("the job is replayed");
    core.handle_engine_done(token, EngineOutput::Replayed(Ok(replayed)), now);
    drain(core)
}

/// Serves the evidence and the weights, and replays with `replayed`; the verdict's admission
/// after it.
fn served(class_of_juror: bool, replayed: Replayed) -> Admit {
    let mut c = case();
    if class_of_juror {
        c.job.class = c.juror.job_log().class();
    }
    let (d, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    let v = verdict(&c, &d);
    let auditor = c.auditor.node_id();
    let (asked, _) = gossip(&mut c, auditor, bytes);
    let served = served_to_juror(&c);
    let (worker, now) = (c.worker.node_id(), c.now);
    replay_on_evidence(&mut c.juror, worker, asked[0], served, replayed, now);
    // A juror never files a fraud report itself: that is the assigned auditor's.
    admit(&c, v)
}

#[test]
fn a_juror_served_evidence_the_job_replays_on_refuses_the_verdict() {
    let job = forward_job(NETWORK, &test_identity(1), 0);
    let same = Replayed {
        output_hash: job.output_hash,
        grads_hash: NO_HASH,
        output: None,
    };
    assert!(matches!(served(true, same), Admit::No(_)));
}

#[test]
fn a_replay_that_disagrees_convicts_only_in_the_jobs_own_class() {
    let other = || Replayed {
        output_hash: [8; 32],
        grads_hash: NO_HASH,
        output: None,
    };
    assert_eq!(served(true, other()), Admit::Yes);
    // Another determinism class cannot tell a cheat from its own rounding: it does not vote
    // to slash (the worker served it).
    assert!(matches!(served(false, other()), Admit::No(_)));
}

/// A demand comes too late once the evidence may be gone (an auditor that waited for that,
/// or replays an old demand, would slash an honest worker); one that comes before the beacon
/// epoch is final here waits for it.
#[test]
fn a_late_demand_is_not_taken_and_an_early_one_waits_for_its_beacon() {
    use super::jury::DEMAND_WINDOW;
    let mut c = case();
    let auditor = c.auditor.node_id();
    let (_, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    c.now += DEMAND_WINDOW + Duration::from_secs(1);
    assert!(gossip(&mut c, auditor, bytes).0.is_empty());

    let mut c = case();
    c.juror.audit.test_beacons.clear();
    c.juror.audit.final_times.clear();
    let (_, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    assert!(gossip(&mut c, auditor, bytes).0.is_empty());
    c.juror.audit.test_beacons.insert(BEACON_LAG, BEACON);
    c.juror.on_new_beacon(c.now);
    assert_eq!(asks(&c.worker.node_id(), &drain(&mut c.juror)).len(), 1);
}

/// An auditor whose worker has not served challenged jobs' evidence `DEMAND_AFTER` after
/// the audits opened demands them in the open (a silent worker must not outlast the window
/// by letting requests time out), each job once, in demands of at most 32 jobs at most one a
/// second (one gossip message per job ran over the topic's rate, and the auditor was banned).
#[test]
fn audits_without_evidence_for_a_while_are_demanded_once_in_paced_batches() {
    use super::audit::Committed;
    use super::jury::{DEMAND_AFTER, DEMAND_EVERY};
    use crate::wire::MAX_DEMAND_JOBS;
    let now = Instant::now();
    let (me, worker) = (test_identity(0), test_identity(1));
    let mut c = core_at(&me, now, 0, 2);
    c.settings.audit.per_million = 1_000_000;
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    drain(&mut c);
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let seed = ChallengeSeed::from_beacon(NETWORK, 0, 0, BEACON);
    let jobs: Vec<JobCommitment> = (0..100_000)
        .map(|i| forward_job(NETWORK, &worker, i))
        .filter(|j| {
            auditor_for(&seed, &j.key(), worker.node_id(), &validators) == Some(me.node_id())
        })
        .take(40)
        .collect();
    assert_eq!(jobs.len(), 40);
    for job in &jobs {
        c.consider_challenge(
            Committed {
                job: job.sign(&worker),
                commitment: *job,
            },
            now,
        );
    }
    // Jobs named by each demand sent.
    let demands = |out: &[Transmit]| -> Vec<usize> {
        out.iter()
            .filter_map(|t| match t {
                Transmit::Publish {
                    topic: Topic::Ops,
                    data,
                } => Signed::<AuditDemand>::from_bytes(data)
                    .ok()
                    .and_then(|d| d.verify().ok())
                    .map(|d| d.jobs.len()),
                _ => None,
            })
            .collect()
    };
    drain(&mut c);
    c.handle_timeout(now + DEMAND_AFTER - Duration::from_millis(1));
    assert!(demands(&drain(&mut c)).is_empty());
    c.handle_timeout(now + DEMAND_AFTER);
    assert_eq!(demands(&drain(&mut c)), vec![MAX_DEMAND_JOBS]);
    // The audits end there: a demanded job is the jury's alone (our replay convicting it
    // too would give it two verdicts of different evidence).
    assert!(c.audit.open.values().all(|o| o.jury.is_some()));
    // The rest waits for the next second, however often the core wakes.
    c.handle_timeout(now + DEMAND_AFTER + Duration::from_millis(500));
    assert!(demands(&drain(&mut c)).is_empty());
    let next = c.poll_timeout().unwrap();
    assert!(next <= now + DEMAND_AFTER + DEMAND_EVERY);
    c.handle_timeout(now + DEMAND_AFTER + DEMAND_EVERY);
    assert_eq!(demands(&drain(&mut c)), vec![40 - MAX_DEMAND_JOBS]);
    c.handle_timeout(now + DEMAND_AFTER * 3);
    assert!(demands(&drain(&mut c)).is_empty());
}

/// A driver's tokens that are not the genesis text they name convict without a replay, so a
/// juror of another determinism class votes on them too (only a replay's bits depend on the
/// class).
#[test]
fn tokens_that_are_not_the_named_text_convict_in_any_class() {
    let mut c = case_of_stage(0);
    assert_ne!(c.job.class, c.juror.job_log().class());
    let (d, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
    let v = verdict(&c, &d);
    let auditor = c.auditor.node_id();
    let (asked, _) = gossip(&mut c, auditor, bytes);
    // Unnamed tokens: the provenance check fails before any weights are fetched.
    let weights_len = c.juror.weights_bytes(0);
    let served = served_to_juror(&c);
    let out = answer(&mut c, asked[0], evidence(weights_len, served));
    assert!(!out.iter().any(|t| matches!(t, Transmit::FetchBlob { .. })));
    assert_eq!(admit(&c, v), Admit::Yes);
}

/// A flood of demands (jobs of many workers, each assigned to the demander) keeps at most
/// `MAX_JURIES` checks open at once; the rest wait and start as checks end.
#[test]
fn a_flood_of_demands_opens_at_most_max_juries_checks_at_once() {
    use super::jury::MAX_JURIES;
    use crate::wire::MAX_DEMAND_JOBS;
    let c = case();
    let mut juror = c.juror;
    let validators: Vec<NodeId> = (0..32).map(|i| test_identity(i).node_id()).collect();
    let seed = ChallengeSeed::from_beacon(NETWORK, 1, 0, BEACON);
    let me = juror.me;
    // Jobs of stage 1 by workers other than us, each assigned to `auditor`.
    let auditor = test_identity(5);
    let mut jobs = Vec::new();
    for w in (1..32)
        .map(test_identity)
        .filter(|w| w.node_id() != auditor.node_id())
    {
        let mine = (0..2_000)
            .map(|i| {
                let mut j = forward_job(NETWORK, &w, i);
                j.stage = 1;
                j
            })
            .filter(|j| {
                auditor_for(&seed, &j.key(), w.node_id(), &validators) == Some(auditor.node_id())
            })
            .take(4)
            .map(|j| j.sign(&w));
        jobs.extend(mine);
    }
    assert!(
        jobs.len() > MAX_JURIES + MAX_DEMAND_JOBS,
        "{} jobs",
        jobs.len()
    );
    let open = |j: &NodeCore| j.audit.open.values().filter(|o| o.jury.is_some()).count();
    for batch in jobs.chunks(MAX_DEMAND_JOBS) {
        let d = AuditDemand {
            network: NETWORK,
            jobs: batch.to_vec(),
            timestamp_ms: 1_800_000_000_000,
        };
        let data = Signed::sign(&auditor, &d).to_bytes();
        let topic = Topic::Ops.name();
        juror.handle_message(auditor.node_id(), Inbound::Gossip { topic, data }, c.now);
        assert!(open(&juror) <= MAX_JURIES);
    }
    assert_eq!(open(&juror), MAX_JURIES);
    assert_ne!(me, auditor.node_id());
    // One check ends (its worker refused every attempt): the next queued one opens.
    let key = *juror
        .audit
        .open
        .iter()
        .find(|(_, o)| o.jury.is_some())
        .unwrap()
        .0;
    for _ in 0..JURY_ATTEMPTS {
        juror.end_audit(key, super::audit::End::Refused("no".into()), c.now);
    }
    assert!(!juror.audit.open.contains_key(&key));
    assert_eq!(open(&juror), MAX_JURIES);
}

/// Evidence counts as served only with the worker's own statement that it served it, about
/// this job, to the asker (an auditor's fee rests on that statement): without it nothing is
/// fetched, as if the worker had refused.
#[test]
fn evidence_without_the_workers_statement_that_it_served_it_counts_as_not_served() {
    let forged: [fn(&Case) -> neuroshard_audit::SignedServed; 3] = [
        // Signed by someone else than the worker.
        |c| Signed::sign(&c.auditor, &served_to_juror(c).verify().unwrap()),
        // To another node.
        |c| {
            let mut s = served_to_juror(c).verify().unwrap();
            s.to = c.auditor.node_id();
            Signed::sign(&c.worker, &s)
        },
        // About another input.
        |c| {
            let mut s = served_to_juror(c).verify().unwrap();
            s.input_hash = [0; 32];
            Signed::sign(&c.worker, &s)
        },
    ];
    for (i, statement) in forged.iter().enumerate() {
        let mut c = case();
        let (_, bytes) = demand(&c, &c.auditor.clone(), &c.worker.clone());
        let auditor = c.auditor.node_id();
        let (asked, _) = gossip(&mut c, auditor, bytes);
        let weights_len = c.juror.weights_bytes(1);
        let served = statement(&c);
        let out = answer(&mut c, asked[0], evidence(weights_len, served));
        assert!(
            !out.iter().any(|t| matches!(t, Transmit::FetchBlob { .. })),
            "statement {i}: the weights were fetched"
        );
    }
}

/// What the assigned auditor publishes after replaying `job`, whose replay gives
/// `output_hash`: (fraud reports, demands, fee claims).
fn audit_to_the_end(same_class: bool, output_hash: [u8; 32]) -> (usize, usize, usize) {
    use super::audit::Committed;
    let now = Instant::now();
    let (me, worker) = (test_identity(0), test_identity(1));
    let mut c = core_at(&me, now, 1, 2);
    c.settings.audit.per_million = 1_000_000;
    c.audit.test_beacons.insert(BEACON_LAG, BEACON);
    drain(&mut c);
    // A stage-1 job (the first stage's tokens would be checked against the genesis first).
    let seed = ChallengeSeed::from_beacon(NETWORK, 1, 0, BEACON);
    let validators: Vec<NodeId> = c.validators();
    let mut job = (0..100_000)
        .map(|i| JobCommitment {
            stage: 1,
            ..forward_job(NETWORK, &worker, i)
        })
        .find(|j| auditor_for(&seed, &j.key(), worker.node_id(), &validators) == Some(me.node_id()))
        .expect("a job assigned to us");
    if same_class {
        job.class = c.job_log().class();
    }
    c.consider_challenge(
        Committed {
            job: job.sign(&worker),
            commitment: job,
        },
        now,
    );
    let asked = drain(&mut c)
        .into_iter()
        .find_map(|t| match t {
            Transmit::Request { token, .. } => Some(token),
            _ => None,
        })
        .expect("the evidence is asked for");
    let served = Signed::sign(
        &worker,
        &neuroshard_audit::Served {
            network: NETWORK,
            job: job.key(),
            worker: worker.node_id(),
            to: me.node_id(),
            input_hash: job.input_hash,
            timestamp_ms: 1,
        },
    );
    let replayed = Replayed {
        output_hash,
        grads_hash: NO_HASH,
        output: None,
    };
    let out = replay_on_evidence(&mut c, worker.node_id(), asked, served, replayed, now);
    let published: Vec<Vec<u8>> = out
        .into_iter()
        .filter_map(|t| match t {
            Transmit::Publish {
                topic: Topic::Ops,
                data,
            } => Some(data),
            _ => None,
        })
        .collect();
    let count = |f: &dyn Fn(&[u8]) -> bool| published.iter().filter(|d| f(d)).count();
    (
        count(&|d| crate::wire::FraudReport::from_canonical_bytes(d).is_ok()),
        count(&|d| Signed::<AuditDemand>::from_bytes(d).is_ok_and(|s| s.verify().is_ok())),
        count(&|d| {
            Signed::<crate::wire::FeeClaims>::from_bytes(d)
                .is_ok_and(|s| s.verify().is_ok_and(|f| f.claims.len() == 1))
        }),
    )
}

/// An auditor of the job's class whose replay disagrees files a fraud report; one of another
/// class cannot tell a cheat from its rounding and hands the job to the committee's
/// validators of its class (a demand) instead: a fraud report would have its checkers of the
/// job's class slash it as a false accuser of an honest worker. Either way it claims its fee
/// (the fee of a passed audit too).
#[test]
fn an_auditor_of_another_class_escalates_to_the_committee_and_never_accuses() {
    let job = forward_job(NETWORK, &test_identity(1), 0);
    assert_eq!(audit_to_the_end(true, [8; 32]), (1, 0, 1));
    assert_eq!(audit_to_the_end(false, [8; 32]), (0, 1, 1));
    assert_eq!(audit_to_the_end(true, job.output_hash), (0, 0, 1));
}

/// A committee validator takes a peer's fee claims into its epochs only where its finalized
/// state admits them: a claim whose beacon is not final here waits aside (a flood of such
/// claims cannot fill finality's queue), one not signed by the worker costs its sender.
#[test]
fn fee_claims_reach_the_epochs_only_when_admitted_and_forged_ones_cost_their_sender() {
    use neuroshard_audit::{AuditFeeClaim, Served};
    let mut c = case();
    let auditor = c.auditor.node_id();
    let served = Served {
        network: NETWORK,
        job: c.job.key(),
        worker: c.job.worker,
        to: auditor,
        input_hash: c.job.input_hash,
        timestamp_ms: 1,
    };
    let batch = |signer: &Identity| {
        let claims = crate::wire::FeeClaims {
            network: NETWORK,
            claims: vec![AuditFeeClaim {
                job: c.job.sign(&c.worker),
                served: Signed::sign(signer, &served),
            }],
        };
        Signed::sign(&c.auditor, &claims).to_bytes()
    };
    let (genuine, forged) = (batch(&c.worker), batch(&c.auditor));
    let pending = |c: &Case| c.juror.finality_head().map(|h| h.2);
    let before = pending(&c);
    assert!(before.is_some(), "the juror runs finality");
    // The economy holds no beacon of the job's epoch: the claim waits, outside the epochs.
    let (_, penalized) = gossip(&mut c, auditor, genuine);
    assert!(!penalized);
    assert_eq!(pending(&c), before);
    assert_eq!(c.juror.audit.fees.held.len(), 1);
    let (_, penalized) = gossip(&mut c, auditor, forged);
    assert!(penalized, "a claim the worker did not sign is forged");
    assert_eq!(pending(&c), before);
    assert_eq!(c.juror.audit.fees.held.len(), 1);
}
