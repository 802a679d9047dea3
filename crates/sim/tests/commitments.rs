//! Job commitments on the pipeline's messages (verification by recomputation): a worker's
//! tensor travels with its signed commitment, the receiver refuses a tensor the commitment
//! does not name (or a commitment that is not the sender's, or not this job's), and the
//! worker holds the receiver's countersignature of exactly what it sent.

use std::time::Duration;

use neuroshard_audit::{JobKind, SignedJob};
use neuroshard_node::act_codec::{Expect, pack};
use neuroshard_node::core::Transmit;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::wire::{DriverStamp, Msg, Payload, PipeAnswer, PipeRequest};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Receipt, Signed};
use neuroshard_sim::{EngineKind, Sim, network, settings, tiny_model};

/// A driver (stage 0); nodes alternate stages, so 1 and 3 are the stage-1 replicas.
const LIAR: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Attack {
    None,
    /// Commits to its forward output but sends other values (half of them).
    SendsOther,
    /// Its messages carry a commitment signed by another key (a Sybil of its own).
    SybilSigned,
    /// Every message carries the first commitment it ever sent.
    Replays,
    /// Stage-1 replica 3 accepts tensors but strips its countersignature.
    WithholdsCountersign,
    /// Stage-1 replica 3 countersigns but strips its work tally (denying the worker its
    /// round's share).
    WithholdsTally,
    /// Stage-1 replica 3 answers with a tally of a thousand jobs more than it signed.
    InflatesTally,
    /// Names the genesis epoch in every commitment, whose beacon it knows once epochs run.
    StaleEpoch,
    /// Sends its micro-batches under another architecture version than it stamped them
    /// with (a relay relabelling a micro-batch to send it past a stage does the same).
    RelabelsVersion,
    /// Stamps its micro-batches with a Sybil key: a claim about a driver it is not.
    SybilStamp,
    /// Sends its micro-batches without a stamp.
    Unstamped,
}

fn run(attack: Attack) -> Sim {
    let mut s = settings(tiny_model(), 2, 2);
    s.steps = 40;
    // Epochs finalize every second (no offline stake), so commitments name moving epochs.
    s.epoch_ms = 1_000;
    let mut sim = network(8, s.clone(), 2, EngineKind::StandIn);
    sim.set_spare_keys(0);
    let liar_key = sim.identity(LIAR).clone();
    let dim = s.model.d_model;
    let mut first: Option<SignedJob> = None;
    let sybil = test_identity(99);
    let liar_request = move |req: PipeRequest| -> PipeRequest {
        let PipeRequest { msg, job } = req;
        match attack {
            Attack::SendsOther => match msg {
                Msg::Forward {
                    mb,
                    version,
                    stamp,
                    route,
                    input: Payload::Hidden(p),
                    targets,
                } => {
                    let expect = Expect {
                        scheme: p.scheme(),
                        dim,
                        max_batch: 1 << 10,
                        max_seq: 1 << 10,
                    };
                    let mut a = p.unpack(&expect).unwrap();
                    a.data.iter_mut().for_each(|x| *x *= 0.5);
                    let input = Payload::Hidden(pack(&a, p.scheme()).unwrap());
                    let msg = Msg::Forward {
                        mb,
                        version,
                        stamp,
                        route,
                        input,
                        targets,
                    };
                    PipeRequest { msg, job }
                }
                msg => PipeRequest { msg, job },
            },
            Attack::RelabelsVersion | Attack::SybilStamp | Attack::Unstamped => {
                let mut msg = msg;
                if let Msg::Forward {
                    mb, version, stamp, ..
                } = &mut msg
                {
                    let s = DriverStamp {
                        network: stamp.take().unwrap().verify().unwrap().network,
                        mb: *mb,
                        version: *version,
                    };
                    *stamp = match attack {
                        // Stamped under version 1 and sent under 0: what a relay that
                        // relabels a driver's new-version micro-batch sends.
                        Attack::RelabelsVersion => Some(Signed::sign(
                            &liar_key,
                            &DriverStamp {
                                version: s.version + 1,
                                ..s
                            },
                        )),
                        Attack::SybilStamp => Some(Signed::sign(&sybil, &s)),
                        _ => None,
                    };
                }
                PipeRequest { msg, job }
            }
            Attack::SybilSigned => {
                let mut c = job.verify().unwrap();
                c.worker = sybil.node_id();
                PipeRequest {
                    msg,
                    job: c.sign(&sybil),
                }
            }
            Attack::Replays => {
                let job = first.get_or_insert(job).clone();
                PipeRequest { msg, job }
            }
            Attack::StaleEpoch => {
                let mut c = job.verify().unwrap();
                c.epoch = 0;
                PipeRequest {
                    msg,
                    job: c.sign(&liar_key),
                }
            }
            Attack::None
            | Attack::WithholdsCountersign
            | Attack::WithholdsTally
            | Attack::InflatesTally => PipeRequest { msg, job },
        }
    };
    let mut liar_request = Some(liar_request);
    match attack {
        Attack::None => {}
        Attack::WithholdsCountersign | Attack::WithholdsTally | Attack::InflatesTally => sim
            .set_tamper(
                3,
                Box::new(move |t| match t {
                    Transmit::Respond { token, data } => {
                        let data = match PipeAnswer::from_canonical_bytes(&data) {
                            Ok(a) => tamper_answer(attack, a).to_canonical_bytes(),
                            Err(_) => data,
                        };
                        Some(Transmit::Respond { token, data })
                    }
                    other => Some(other),
                }),
            ),
        _ => {
            let mut f = liar_request.take().unwrap();
            sim.set_tamper(
                LIAR,
                Box::new(move |t| match t {
                    Transmit::Request { to, token, data } => {
                        let data = match PipeRequest::from_canonical_bytes(&data) {
                            Ok(req) => f(req).to_canonical_bytes(),
                            Err(_) => data,
                        };
                        Some(Transmit::Request { to, token, data })
                    }
                    other => Some(other),
                }),
            )
        }
    }
    sim.run_until(Duration::from_secs(60));
    sim
}

fn steps(sim: &Sim, i: usize) -> usize {
    sim.events(i)
        .iter()
        .filter(|e| matches!(e, NodeEvent::Step { .. }))
        .count()
}

/// Messages stage 1 refused for their commitment.
fn refused(sim: &Sim) -> usize {
    refused_for(sim, "commitment")
}

/// Messages stage 1 refused for a reason starting with `why`.
fn refused_for(sim: &Sim, why: &str) -> usize {
    [1, 3]
        .iter()
        .flat_map(|&i| sim.events(i))
        .filter(|e| matches!(e, NodeEvent::Dropped { reason, .. } if reason.starts_with(why)))
        .count()
}

/// (commitments of `kind` that sent a tensor, those countersigned by their receiver).
fn countersigned(sim: &Sim, i: usize, kind: JobKind) -> (usize, usize) {
    let log = sim.core(i).unwrap().job_log();
    let sent: Vec<_> = log
        .iter()
        .filter(|l| {
            l.commitment.kind == kind && l.commitment.output_hash != neuroshard_audit::NO_HASH
        })
        .collect();
    (
        sent.len(),
        sent.iter().filter(|l| l.countersign.is_some()).count(),
    )
}

/// Receiver 3's answer as `attack` sends it.
fn tamper_answer(attack: Attack, a: PipeAnswer) -> PipeAnswer {
    match attack {
        Attack::WithholdsCountersign => PipeAnswer {
            countersign: None,
            ..a
        },
        Attack::WithholdsTally => PipeAnswer { tally: None, ..a },
        _ => PipeAnswer {
            tally: a.tally.map(|t| {
                let inflated = neuroshard_proof::WorkTally::from_hash(&t.hash).map(|w| {
                    neuroshard_proof::WorkTally {
                        jobs: w.jobs.saturating_add(1_000),
                        ..w
                    }
                });
                Receipt {
                    hash: inflated.map_or(t.hash, |w| w.to_hash()),
                    ..t
                }
            }),
            ..a
        },
    }
}

/// Warnings at node `i` about a receiver that accepted without a valid work tally.
fn missing_tally_warnings(sim: &Sim, i: usize) -> usize {
    warnings_saying(sim, i, "without a valid work tally")
}

/// Warnings at node `i` about a receiver that accepted without countersigning.
fn missing_countersign_warnings(sim: &Sim, i: usize) -> usize {
    warnings_saying(sim, i, "without countersigning")
}

fn warnings_saying(sim: &Sim, i: usize, text: &str) -> usize {
    sim.events(i)
        .iter()
        .filter(|e| matches!(e, NodeEvent::Warning { message, .. } if message.contains(text)))
        .count()
}

#[test]
fn honest_workers_commit_every_job_and_hold_their_receivers_countersignatures() {
    let sim = run(Attack::None);
    assert_eq!(refused(&sim), 0, "honest commitments refused");
    assert!(steps(&sim, LIAR) >= 20, "{}", steps(&sim, LIAR));
    for driver in [0, LIAR] {
        let (sent, signed) = countersigned(&sim, driver, JobKind::Forward);
        assert!(sent >= 40, "driver {driver} committed {sent} forward jobs");
        // All but those still in flight when the run stopped.
        assert!(
            signed + 4 >= sent,
            "driver {driver}: {signed} of {sent} countersigned"
        );
        // The driver's backward passes send nothing, and are committed too.
        let log = sim.core(driver).unwrap().job_log();
        assert!(log.iter().any(|l| l.commitment.kind == JobKind::Backward));
        assert_eq!(missing_countersign_warnings(&sim, driver), 0);
        assert_eq!(missing_tally_warnings(&sim, driver), 0);
    }
    // The last stage's backward passes send the input gradient back, countersigned.
    for last in [1, 3] {
        let (sent, signed) = countersigned(&sim, last, JobKind::Backward);
        assert!(
            sent >= 20 && signed + 4 >= sent,
            "node {last}: {signed} of {sent}"
        );
    }
}

#[test]
fn a_tensor_other_than_the_committed_one_is_refused_and_never_trained() {
    let sim = run(Attack::SendsOther);
    assert!(refused(&sim) > 0);
    assert_eq!(
        steps(&sim, LIAR),
        0,
        "the altered activations were trained in"
    );
    assert!(steps(&sim, 0) >= 20, "{}", steps(&sim, 0));
}

#[test]
fn a_commitment_signed_by_another_key_is_refused() {
    let sim = run(Attack::SybilSigned);
    assert!(refused(&sim) > 0);
    assert_eq!(steps(&sim, LIAR), 0);
    assert!(steps(&sim, 0) >= 20, "{}", steps(&sim, 0));
}

#[test]
fn a_replayed_commitment_is_refused_for_every_other_job() {
    let sim = run(Attack::Replays);
    assert!(refused(&sim) > 0);
    assert_eq!(steps(&sim, LIAR), 0);
    assert!(steps(&sim, 0) >= 20, "{}", steps(&sim, 0));
}

#[test]
fn a_commitment_naming_an_epoch_long_final_is_not_taken() {
    // Its beacon (epoch 0 + lag) is final a few seconds in: the worker would know which of
    // its jobs are challenged when it signs. Receivers take no such job once they are at
    // epoch 3; the driver's first steps, before that, go through.
    let sim = run(Attack::StaleEpoch);
    let stale = [1, 3]
        .iter()
        .flat_map(|&i| sim.events(i))
        .filter(|e| matches!(e, NodeEvent::Dropped { reason, .. } if reason.contains("epoch")))
        .count();
    assert!(stale > 0);
    assert!(steps(&sim, LIAR) < 10, "{} steps", steps(&sim, LIAR));
    assert!(steps(&sim, 0) >= 20, "{}", steps(&sim, 0));
    let head = sim.core(1).unwrap().finality_head().unwrap().0;
    assert!(head >= 20, "epochs stalled at {head}");
}

#[test]
fn a_receiver_that_withholds_its_countersignature_is_reported() {
    let sim = run(Attack::WithholdsCountersign);
    let warned: usize = [0, LIAR]
        .iter()
        .map(|&d| missing_countersign_warnings(&sim, d))
        .sum();
    assert!(warned > 0);
    // Only what node 3 received lacks a countersignature: node 1's are there.
    for driver in [0, LIAR] {
        let (sent, signed) = countersigned(&sim, driver, JobKind::Forward);
        assert!(
            signed > 0 && signed < sent,
            "driver {driver}: {signed} of {sent}"
        );
    }
}

/// A receiver that withholds its tally of a worker's jobs, or sends one claiming more jobs
/// than it signed (its signature then fails, so the worker keeps nothing of it), is reported
/// and penalised by the worker; the countersignatures and the training go on.
#[test]
fn a_receiver_that_withholds_or_inflates_its_work_tally_is_reported() {
    for attack in [Attack::WithholdsTally, Attack::InflatesTally] {
        let sim = run(attack);
        let warned: usize = [0, LIAR]
            .iter()
            .map(|&d| missing_tally_warnings(&sim, d))
            .sum();
        assert!(warned > 0, "{attack:?}: no worker reported receiver 3");
        // The countersignatures are untouched: only the tallies were.
        for driver in [0, LIAR] {
            assert_eq!(missing_countersign_warnings(&sim, driver), 0, "{attack:?}");
        }
        assert!(steps(&sim, 0) >= 20, "{attack:?}: {}", steps(&sim, 0));
    }
}

/// A micro-batch's version is its driver's signed word: a relabelled version, a stamp by
/// another key, or none, is refused at the next stage and nothing of it is trained; the
/// honest driver beside it trains on. (Without the stamp a relay could send a driver's
/// micro-batches past a stage the network grew, or claim a version for them that made
/// later stages refuse the driver's honest ones.)
#[test]
fn a_micro_batch_whose_version_its_driver_did_not_sign_is_refused() {
    for attack in [
        Attack::RelabelsVersion,
        Attack::SybilStamp,
        Attack::Unstamped,
    ] {
        let sim = run(attack);
        assert!(refused_for(&sim, "driver stamp") > 0, "{attack:?}");
        assert_eq!(steps(&sim, LIAR), 0, "{attack:?}: trained in");
        assert!(steps(&sim, 0) >= 20, "{attack:?}: {}", steps(&sim, 0));
    }
}
