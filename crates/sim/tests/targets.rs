//! Stage input a staked node has no right to send: a driver that rewrites the targets it sends
//! downstream (the last stage checks every micro-batch's targets against the data the driver
//! names and trains none of its own text), and a replica that sends on micro-batches no one
//! passed to it (refused by their hand-offs).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use neuroshard_node::core::Transmit;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::wire::{Msg, PipeRequest};
use neuroshard_proof::Canonical;
use neuroshard_sim::{EngineKind, Sim, network, settings, tiny_model};

const LIAR: usize = 2;

/// 2 stages × 2 replicas on the stand-in (nodes alternate stages); node 2, a driver, shifts
/// every target id it sends by one when `lie` is set.
fn run(lie: bool) -> Sim {
    let mut s = settings(tiny_model(), 2, 2);
    s.steps = 40;
    let vocab = s.model.vocab as u32;
    let mut sim = network(8, s, 2, EngineKind::StandIn);
    if lie {
        sim.set_tamper(
            LIAR,
            Box::new(move |t| match t {
                Transmit::Request { to, token, data } => {
                    // The commitment names the hidden states, not the targets: it still holds.
                    let data = match PipeRequest::from_canonical_bytes(&data) {
                        Ok(PipeRequest {
                            msg:
                                Msg::Forward {
                                    mb,
                                    version,
                                    stamp,
                                    route,
                                    input,
                                    mut targets,
                                },
                            job,
                        }) => {
                            for id in &mut targets.ids {
                                *id = (*id + 1) % vocab;
                            }
                            let msg = Msg::Forward {
                                mb,
                                version,
                                stamp,
                                route,
                                input,
                                targets,
                            };
                            PipeRequest { msg, job }.to_canonical_bytes()
                        }
                        _ => data,
                    };
                    Some(Transmit::Request { to, token, data })
                }
                other => Some(other),
            }),
        );
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

fn refused_targets(sim: &Sim) -> usize {
    [1, 3]
        .iter()
        .flat_map(|&i| sim.events(i))
        .filter(|e| matches!(e, NodeEvent::Dropped { reason, .. } if reason.starts_with("targets")))
        .count()
}

#[test]
fn targets_that_are_not_the_named_data_are_refused_at_the_last_stage() {
    let honest = run(false);
    assert_eq!(refused_targets(&honest), 0, "honest targets refused");
    assert!(steps(&honest, LIAR) >= 20, "{}", steps(&honest, LIAR));

    let sim = run(true);
    assert!(refused_targets(&sim) > 0);
    // None of the liar's micro-batches completed a step; the honest driver trained on.
    assert_eq!(
        steps(&sim, LIAR),
        0,
        "the rewritten targets were trained in"
    );
    assert!(steps(&sim, 0) >= 20, "{}", steps(&sim, 0));
}

/// 3 stages × 2 replicas (node `i` serves stage `i % 3`). Stage-1 replica 4 is a Sybil with
/// stake that no one routes micro-batches to on purpose: it copies each forward its honest
/// co-replica 1 sends (stamp, commitment and all, the commitment re-signed as its own work) to
/// both stage-2 replicas, to be paid for 1's jobs and have input of its choosing trained in.
/// Returns the simulation and how many copies it sent.
fn run_stolen_forwards(steal: bool) -> (Sim, usize) {
    const HONEST: usize = 1;
    const SYBIL: usize = 4;
    let mut s = settings(tiny_model(), 3, 2);
    s.steps = 30;
    let mut sim = network(8, s, 2, EngineKind::StandIn);
    let seen: Rc<RefCell<Vec<PipeRequest>>> = Rc::default();
    let tap = seen.clone();
    sim.set_tamper(
        HONEST,
        Box::new(move |t| {
            if let Transmit::Request { data, .. } = &t
                && let Ok(req) = PipeRequest::from_canonical_bytes(data)
                && matches!(req.msg, Msg::Forward { .. })
            {
                tap.borrow_mut().push(req);
            }
            Some(t)
        }),
    );
    let sybil = sim.identity(SYBIL).clone();
    let receivers = [sim.node_id(2), sim.node_id(5)];
    let mut sent = 0;
    let mut at = Duration::ZERO;
    while at < Duration::from_secs(60) {
        at += Duration::from_millis(200);
        sim.run_until(at);
        if !steal {
            continue;
        }
        for req in seen.borrow_mut().drain(..) {
            let mut c = req.job.verify().unwrap();
            c.worker = sybil.node_id();
            let stolen = PipeRequest {
                msg: req.msg,
                job: c.sign(&sybil),
            };
            for to in receivers {
                let token = u64::MAX - sent as u64;
                let data = stolen.to_canonical_bytes();
                sim.transmit_as(SYBIL, Transmit::Request { to, token, data });
                sent += 1;
            }
        }
    }
    (sim, sent)
}

fn refused_routes(sim: &Sim, from: Option<usize>) -> usize {
    let from = from.map(|i| sim.node_id(i).to_string());
    [2, 5]
        .iter()
        .flat_map(|&i| sim.events(i))
        .filter(|e| {
            matches!(e, NodeEvent::Dropped { reason, peer, .. }
                if reason.starts_with("route") && (from.is_none() || *peer == from))
        })
        .count()
}

/// Past the first hop any registered replica of the stage before may send (failover picks
/// among them), but only one a sender of this micro-batch chose, as its signed hand-offs show:
/// the Sybil's copies of another replica's forwards are all refused, and honest routing,
/// failovers included, never is.
#[test]
fn forwards_copied_by_a_replica_no_one_routed_them_to_are_refused() {
    let (honest, _) = run_stolen_forwards(false);
    assert_eq!(refused_routes(&honest, None), 0, "an honest route refused");
    let (sim, sent) = run_stolen_forwards(true);
    assert!(sent >= 20, "only {sent} copies sent");
    assert_eq!(
        refused_routes(&sim, Some(4)),
        sent,
        "some of the Sybil's {sent} copies were taken"
    );
    assert_eq!(refused_routes(&sim, Some(1)), 0);
    for driver in [0, 3] {
        assert!(steps(&sim, driver) >= 15, "{}", steps(&sim, driver));
    }
}
