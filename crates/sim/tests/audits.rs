//! Verification by recomputation in the running network (real engine, tiny model): replicas
//! audit their co-replicas' jobs once a round is final, a worker whose replay contradicts its
//! commitment is slashed on every ledger, a false accuser is slashed instead, and honest
//! workers are never.

use std::time::Duration;

use neuroshard_audit::JobKey;
use neuroshard_node::core::Transmit;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::wire::{AuditAnswer, AuditRequest};
use neuroshard_proof::Canonical;
use neuroshard_proof::NodeId;
use neuroshard_sim::{
    Cheat, EngineCosts, EngineKind, Factory, LinkModel, Sim, Tamper, settings, tiny_model,
};

/// 3 stages × 2 replicas (node i serves stage i % 3): node 1 and node 4 serve stage 1, so
/// each is the other's only possible auditor.
const WORKER: usize = 1;
const AUDITOR: usize = 4;
const NODES: usize = 6;

fn run(seed: u64, cheat: Option<(usize, Cheat)>) -> Sim {
    run_with(seed, cheat, None)
}

/// The same, node `tamper.0` an adversary past its core too.
fn run_with(seed: u64, cheat: Option<(usize, Cheat)>, tamper: Option<(usize, Tamper)>) -> Sim {
    // A quarter of the jobs, so that a short run audits enough of them.
    run_at(seed, 250_000, cheat, tamper)
}

/// Jobs audited at `per_million`.
fn run_at(
    seed: u64,
    per_million: u32,
    cheat: Option<(usize, Cheat)>,
    tamper: Option<(usize, Tamper)>,
) -> Sim {
    run_for(24, seed, per_million, cheat, tamper)
}

/// The same for `steps` driver steps.
fn run_for(
    steps: u64,
    seed: u64,
    per_million: u32,
    cheat: Option<(usize, Cheat)>,
    tamper: Option<(usize, Tamper)>,
) -> Sim {
    let mut s = settings(tiny_model(), 3, 2);
    s.steps = steps;
    s.sync.every = 4;
    s.audit.per_million = per_million;
    // Challenges are drawn from finalized epochs: a beacon comes 4 epochs after a commitment.
    s.epoch_ms = 2_000;
    let factory = Factory::new(s.clone(), EngineKind::Real);
    let cheats = factory.cheats.clone();
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    // One staked key for a joiner: offline stake counts against finality's quorum.
    sim.set_spare_keys(1);
    for i in 0..NODES {
        sim.add_node(i % 3, Duration::from_millis(10 * i as u64));
    }
    if let Some((i, cheat)) = cheat {
        cheats.lock().unwrap().insert(sim.node_id(i), cheat);
    }
    if let Some((i, tamper)) = tamper {
        sim.set_tamper(i, tamper);
    }
    sim.run_until(Duration::from_secs(5 * steps));
    sim
}

/// Audits `auditor` ended, by outcome class, about `worker`.
fn audits(sim: &Sim, auditor: usize, worker: NodeId) -> (usize, usize, usize) {
    let (mut passed, mut guilty, mut refused) = (0, 0, 0);
    for e in sim.events(auditor) {
        if let NodeEvent::Audit {
            worker: w, outcome, ..
        } = e
            && *w == worker.to_string()
        {
            match outcome.split(':').next() {
                Some("passed") => passed += 1,
                Some("guilty") => guilty += 1,
                _ => refused += 1,
            }
        }
    }
    (passed, guilty, refused)
}

fn stake(sim: &Sim, on: usize, of: NodeId) -> u64 {
    sim.core(on).unwrap().economy().ledger().account(&of).stake
}

fn verdicts(sim: &Sim, on: usize) -> usize {
    sim.events(on)
        .iter()
        .filter(
            |e| matches!(e, NodeEvent::Ledger { kind: Some(k), .. } if k.starts_with("verdict")),
        )
        .count()
}

#[test]
fn honest_replicas_pass_their_audits_and_are_never_slashed() {
    // Offers are drawn like any job, one a round: counted over both runs, not per run.
    let mut offers_passed = 0;
    for seed in [1, 2] {
        let sim = run(seed, None);
        let (w, a) = (sim.node_id(WORKER), sim.node_id(AUDITOR));
        let (passed, guilty, refused) = audits(&sim, AUDITOR, w);
        assert!(passed >= 3, "seed {seed}: {passed} passed");
        assert_eq!((guilty, refused), (0, 0), "seed {seed}");
        // Honest offers re-encode to what their replicas committed.
        offers_passed += sim
            .events(AUDITOR)
            .iter()
            .filter(|e| matches!(e, NodeEvent::Audit { kind, outcome, .. } if kind == "offer" && outcome == "passed"))
            .count();
        let (passed, guilty, _) = audits(&sim, WORKER, a);
        assert!(passed >= 3 && guilty == 0, "seed {seed}");
        // The drivers' tokens are the genesis windows they name.
        let (passed, guilty, refused) = audits(&sim, 3, sim.node_id(0));
        assert!(passed >= 3, "seed {seed}: {passed} driver audits passed");
        assert_eq!((guilty, refused), (0, 0), "seed {seed}");
        for i in 0..NODES {
            assert_eq!(
                verdicts(&sim, i),
                0,
                "seed {seed}: node {i} applied a verdict"
            );
        }
        fees_paid_alike(&sim, seed);
    }
    assert!(offers_passed >= 1, "no offer audit passed");
}

/// Validators were paid fees for their audits, on every ledger alike: each ledger's fee
/// count is what its finalized epochs hold, and nodes at the same finalized epoch hold the
/// same fees and balances.
fn fees_paid_alike(sim: &Sim, seed: u64) {
    let ledger = |i: usize| sim.core(i).unwrap().economy().ledger();
    let head = |i: usize| sim.core(i).unwrap().finality_head().map(|h| h.0);
    let fee = ledger(0).audit_fee();
    let auditor = sim.node_id(AUDITOR);
    for i in 0..NODES {
        let paid = fee_events(sim, i);
        assert!(paid >= 3, "seed {seed}: node {i} paid {paid} fees");
        assert_eq!(ledger(i).audit_fee_count(), paid, "seed {seed}: node {i}");
        if head(i) == head(0) {
            assert_eq!(paid, fee_events(sim, 0), "seed {seed}: node {i}");
            assert_eq!(
                ledger(i).account(&auditor).balance,
                ledger(0).account(&auditor).balance,
                "seed {seed}: node {i}"
            );
        }
    }
    // The auditor was paid for its audits of the worker (its only co-replica).
    let auditor_fees = sim
        .events(0)
        .iter()
        .filter(|e| matches!(e, NodeEvent::Ledger { kind: Some(k), .. } if k == "audit fee"))
        .count();
    assert!(auditor_fees > 0 && fee > 0, "seed {seed}");
}

fn fee_events(sim: &Sim, on: usize) -> usize {
    sim.events(on)
        .iter()
        .filter(|e| matches!(e, NodeEvent::Ledger { kind: Some(k), .. } if k == "audit fee"))
        .count()
}

fn slashed_everywhere(sim: &Sim, offender: usize, beneficiary: usize) {
    let (o, b) = (sim.node_id(offender), sim.node_id(beneficiary));
    // Node 2 (the last stage) is neither side in any of these tests.
    let honest = sim.node_id(2);
    let before = stake(sim, 0, honest);
    for i in 0..NODES {
        assert!(verdicts(sim, i) >= 1, "node {i} applied no verdict");
        assert!(
            stake(sim, i, o) < before,
            "node {i}: the offender kept its stake"
        );
        // Every ledger moved alike.
        assert_eq!(stake(sim, i, o), stake(sim, 0, o), "node {i}");
        let bal = |n: usize| sim.core(n).unwrap().economy().ledger().account(&b).balance;
        assert_eq!(
            bal(i),
            bal(0),
            "node {i}: the beneficiary's balance differs"
        );
        assert_eq!(
            stake(sim, i, honest),
            before,
            "node {i}: an honest stake moved"
        );
    }
}

#[test]
fn a_worker_that_sends_noise_is_caught_and_slashed_on_every_ledger() {
    let sim = run(1, Some((WORKER, Cheat::Noise)));
    let (_, guilty, _) = audits(&sim, AUDITOR, sim.node_id(WORKER));
    assert!(guilty >= 1, "no audit caught the noise");
    slashed_everywhere(&sim, WORKER, AUDITOR);
}

/// The worker lists none of its jobs to its auditors (it can compute which are challenged
/// before it answers). The stage-2 replicas that received its outputs hand each challenged
/// commitment to the auditor its beacon names, so it is caught all the same.
#[test]
fn a_worker_that_lists_none_of_its_jobs_is_still_audited_and_slashed() {
    let hide: Tamper = Box::new(|t| match t {
        Transmit::Respond { token, data } => {
            let data = match AuditAnswer::from_canonical_bytes(&data) {
                Ok(AuditAnswer::List(_)) => AuditAnswer::List(Vec::new()).to_canonical_bytes(),
                _ => data,
            };
            Some(Transmit::Respond { token, data })
        }
        other => Some(other),
    });
    let sim = run_with(1, Some((WORKER, Cheat::Noise)), Some((WORKER, hide)));
    let (_, guilty, _) = audits(&sim, AUDITOR, sim.node_id(WORKER));
    assert!(guilty >= 1, "no audit caught the noise");
    slashed_everywhere(&sim, WORKER, AUDITOR);
}

#[test]
fn a_worker_that_skips_its_layers_is_caught_and_slashed_on_every_ledger() {
    let sim = run(1, Some((WORKER, Cheat::PassThrough)));
    let (_, guilty, _) = audits(&sim, AUDITOR, sim.node_id(WORKER));
    assert!(guilty >= 1, "no audit caught the skipped layers");
    slashed_everywhere(&sim, WORKER, AUDITOR);
}

#[test]
fn a_driver_training_on_other_text_than_it_names_is_caught_and_slashed_on_every_ledger() {
    // Nodes 0 and 3 drive (stage 0). The cheater's targets are genuine, so the last stage
    // accepts them; only the audit of its tokens against the genesis windows catches it.
    // Long enough that the cheater is slashed before its last step: which jobs are audited
    // follows the finalized epochs' hashes, so any change to what the ledger hashes moves
    // the slash (at 60 steps the run of 0a444bd, which added unbonding to the account
    // digest, ended before its slash; at 100 it stops at step 48).
    let steps = 100;
    let sim = run_for(steps, 1, 250_000, Some((0, Cheat::OtherData)), None);
    let (_, guilty, _) = audits(&sim, 3, sim.node_id(0));
    assert!(guilty >= 1, "no audit caught the other text");
    // Its offers are honest (the pseudo-gradient of the weights it trained to), so an offer
    // audit may pass; no audit of a job on its text does.
    let passed_jobs = sim
        .events(3)
        .iter()
        .filter(|e| {
            matches!(e, NodeEvent::Audit { worker, kind, outcome, .. }
                if *worker == sim.node_id(0).to_string()
                    && kind != "offer"
                    && outcome.starts_with("passed"))
        })
        .count();
    assert_eq!(passed_jobs, 0, "an audit passed a job on other text");
    slashed_everywhere(&sim, 0, 3);
    driver_stopped(&sim, 0, steps);
}

/// Slashed below the minimum stake, driver `i` is no longer registered on its own ledger
/// and stopped driving before its steps were done (every stage refuses its micro-batches:
/// it would re-send them for ever) saying why; the honest driver of its stage finished.
fn driver_stopped(sim: &Sim, i: usize, steps: u64) {
    let me = sim.node_id(i);
    let ledger = sim.core(i).unwrap().economy().ledger();
    assert!(
        !ledger.is_registered(&me, 0),
        "node {i} is still registered"
    );
    let finished: Vec<(u64, Option<String>)> = sim
        .events(i)
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Finished { steps, reason, .. } => Some((*steps, reason.clone())),
            _ => None,
        })
        .collect();
    assert!(
        matches!(finished.as_slice(), [(done, Some(why))] if *done < steps && why.contains("lapsed")),
        "{finished:?}"
    );
    let honest = (0..NODES).find(|&j| j != i && j % 3 == 0).unwrap();
    assert!(
        sim.events(honest).iter().any(
            |e| matches!(e, NodeEvent::Finished { steps: s, reason: None, .. } if *s == steps)
        ),
        "the honest driver did not finish"
    );
}

/// The worker trains, but offers each round its pseudo-gradient of the round before, and
/// commits to it as its offer of the weights it trained to. An offer is a job: its auditor
/// re-encodes θ₀ − θ from the committed weights and outer state and gets other bytes.
#[test]
fn a_replica_offering_last_rounds_pseudo_gradient_is_caught_and_slashed_on_every_ledger() {
    // One offer a round, each audited with probability 1/2: 11 stale offers (48 steps, a
    // round every 4) miss them all with probability 1/2048. Which ones are drawn depends on
    // the beacons, so on the engine's bits: 5 offers (24 steps) passed on one machine and
    // all went unaudited on another, whose kernels round differently.
    let sim = run_for(48, 1, 500_000, Some((WORKER, Cheat::StaleOffer)), None);
    let worker = sim.node_id(WORKER);
    let offers = |outcome: &str| {
        sim.events(AUDITOR)
            .iter()
            .filter(|e| {
                matches!(e, NodeEvent::Audit { worker: w, kind, outcome: o, .. }
                    if *w == worker.to_string() && kind == "offer" && o.starts_with(outcome))
            })
            .count()
    };
    assert!(offers("guilty") >= 1, "no audit caught the stale offer");
    // Its forward and backward passes were honest: only offers are found out.
    let (_, guilty, _) = audits(&sim, AUDITOR, worker);
    assert_eq!(guilty, offers("guilty"));
    slashed_everywhere(&sim, WORKER, AUDITOR);
}

#[test]
fn a_false_accuser_is_slashed_and_the_worker_keeps_its_stake() {
    let sim = run(1, Some((AUDITOR, Cheat::AccusesFalsely)));
    slashed_everywhere(&sim, AUDITOR, WORKER);
}

/// A refusal cannot be shown to a third party, so the auditor demands the evidence in the
/// open and the committee's validators ask the worker themselves: a worker that serves no
/// one is slashed on every ledger once more than two thirds of the committee's power found
/// it so (before jurors, it was reported and kept its stake).
#[test]
fn a_worker_that_serves_no_evidence_is_slashed_on_every_ledger_by_the_committees_jurors() {
    let sim = run(1, Some((WORKER, Cheat::RefusesEvidence)));
    let (passed, guilty, refused) = audits(&sim, AUDITOR, sim.node_id(WORKER));
    assert!(refused >= 1 && passed == 0 && guilty == 0);
    let guilty_votes = (0..NODES)
        .filter(|&i| juries(&sim, i, WORKER).0 > 0)
        .count();
    assert!(guilty_votes >= 4, "{guilty_votes} jurors found it unserved");
    slashed_everywhere(&sim, WORKER, AUDITOR);
}

/// An auditor that claims the worker refused it (it asks for a job nobody committed, so its
/// audits end refused, and demands the evidence of the real ones) slashes no one: the other
/// jurors are served, replay the job, and refuse the verdict.
#[test]
fn an_auditor_claiming_refusals_cannot_slash_a_worker_that_serves_the_committee() {
    let lie: Tamper = Box::new(|t| match t {
        Transmit::Request { to, token, data } => {
            let data = match AuditRequest::from_canonical_bytes(&data) {
                Ok(AuditRequest::Evidence { network, round, .. }) => AuditRequest::Evidence {
                    network,
                    round,
                    job: JobKey([0; 32]),
                }
                .to_canonical_bytes(),
                _ => data,
            };
            Some(Transmit::Request { to, token, data })
        }
        other => Some(other),
    });
    let sim = run_with(1, None, Some((AUDITOR, lie)));
    let (_, _, refused) = audits(&sim, AUDITOR, sim.node_id(WORKER));
    assert!(refused >= 1, "the auditor demanded nothing");
    let w = sim.node_id(WORKER);
    let before = stake(&sim, 0, sim.node_id(2));
    for i in 0..NODES {
        assert_eq!(verdicts(&sim, i), 0, "node {i} applied a verdict");
        assert_eq!(stake(&sim, i, w), before, "node {i}: the worker lost stake");
    }
    let served = (0..NODES).map(|i| juries(&sim, i, WORKER).1).sum::<usize>();
    assert!(served >= 3, "{served} jurors were served");
}

/// Juror checks of `worker`'s jobs on node `on`: (found guilty, found served).
fn juries(sim: &Sim, on: usize, worker: usize) -> (usize, usize) {
    let w = sim.node_id(worker).to_string();
    let (mut guilty, mut served) = (0, 0);
    for e in sim.events(on) {
        if let NodeEvent::Jury {
            worker, guilty: g, ..
        } = e
            && *worker == w
        {
            if *g {
                guilty += 1;
            } else {
                served += 1;
            }
        }
    }
    (guilty, served)
}

/// A node that joins after a verdict was gossiped gets it by anti-entropy with the rest of
/// the ledger: it settles the report itself (a provenance charge from its own genesis; a
/// replay charge on weights fetched from the ledger that relayed it) and ends on the same
/// stakes and state as everyone else. Without reports in anti-entropy its ledger would keep
/// the cheater's stake forever.
#[test]
fn a_node_joining_after_a_verdict_settles_it_from_anti_entropy() {
    for (offender, cheat) in [(0, Cheat::OtherData), (WORKER, Cheat::Noise)] {
        let mut sim = run(1, Some((offender, cheat)));
        assert!(
            verdicts(&sim, 2) >= 1,
            "{cheat:?}: no verdict before the joiner"
        );
        let joiner = sim.add_node(2, Duration::from_secs(121));
        sim.run_until(Duration::from_secs(300));
        assert!(
            verdicts(&sim, joiner) >= 1,
            "{cheat:?}: the joiner applied no verdict"
        );
        let o = sim.node_id(offender);
        assert_eq!(stake(&sim, joiner, o), stake(&sim, 2, o), "{cheat:?}");
        let state = |i: usize| sim.core(i).unwrap().economy().state_hash();
        assert_eq!(
            state(joiner),
            state(2),
            "{cheat:?}: the joiner's ledger differs"
        );
    }
}

/// A replay verdict settles on a node that joins after every node that applied it restarted:
/// the weights its replay needs come back from their ledger databases (without them, the
/// joiner could not replay the job and would keep the offender's stake).
#[test]
fn a_joiner_settles_a_replay_verdict_after_every_holder_restarted() {
    let mut sim = run(1, Some((WORKER, Cheat::Noise)));
    assert!(verdicts(&sim, 2) >= 1, "no verdict before the restarts");
    for i in 0..NODES {
        sim.crash_at(i, Duration::from_secs(121));
        sim.restart_at(i, Duration::from_secs(123));
    }
    let joiner = sim.add_node(2, Duration::from_secs(130));
    sim.run_until(Duration::from_secs(320));
    assert!(verdicts(&sim, joiner) >= 1, "the joiner applied no verdict");
    let o = sim.node_id(WORKER);
    assert_eq!(stake(&sim, joiner, o), stake(&sim, 2, o));
    let state = |i: usize| sim.core(i).unwrap().economy().state_hash();
    assert_eq!(state(joiner), state(2), "the joiner's ledger differs");
}
