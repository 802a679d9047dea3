//! A staked driver that rewrites the targets it sends downstream: the last stage checks every
//! micro-batch's targets against the data the driver names and trains none of its own text.

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
