//! The validation loss on one driver core with its real engine: held-out windows go through
//! the serving path, and a score that cannot be a loss, or an answer of the wrong kind, moves
//! the window to another replica and costs the liar.

use std::time::Instant;

use neuroshard_model::{AdamW, AdamWConfig, Stage, StageSpec};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, NodeId};

use super::serve_tests::run_engine;
use super::tests::core_at;
use super::*;
use crate::compute::Engine;
use crate::serve::{Head, InferMsg, InferReply};

/// A started driver of 2 stages with one held-out window of 3 positions.
fn driver(now: Instant) -> (NodeCore, Engine) {
    let mut core = core_at(&test_identity(0), now, 0, 2);
    let model = core.settings.model.clone();
    let spec = StageSpec::split(&model, 2).unwrap()[0];
    let stage = Stage::init(model, spec, 1).unwrap();
    let opt = AdamW::new(AdamWConfig::default(), stage.params());
    core.settings.eval_windows = 1;
    core.started = true;
    core.eval.windows = Some(vec![(vec![1, 2, 3], vec![2, 3, 4])]);
    (core, Engine::new(stage, opt, None))
}

/// The step the driver sent to a stage-1 replica: (replica, token, message).
fn hop(core: &mut NodeCore) -> Option<(NodeId, Token, InferMsg)> {
    std::iter::from_fn(|| core.poll_transmit()).find_map(|t| match t {
        Transmit::Request { to, token, data } => {
            let msg = InferMsg::from_canonical_bytes(&data).unwrap();
            matches!(msg, InferMsg::Step { .. }).then_some((to, token, msg))
        }
        _ => None,
    })
}

fn answer(core: &mut NodeCore, from: NodeId, token: Token, r: InferReply, now: Instant) {
    let result = Ok(r.to_canonical_bytes());
    core.handle_message(from, Inbound::Response { token, result }, now);
}

fn validation(core: &mut NodeCore) -> Option<(u64, f64, u64)> {
    std::iter::from_fn(|| core.poll_event()).find_map(|e| match e {
        NodeEvent::Validation {
            round,
            loss,
            tokens,
            ..
        } => Some((round, loss, tokens)),
        _ => None,
    })
}

#[test]
fn a_score_that_cannot_be_a_loss_moves_the_window_and_the_liar_pays() {
    let now = Instant::now();
    let (mut core, mut engine) = driver(now);
    core.handle_timeout(now);
    run_engine(&mut core, &mut engine, now);
    let (first, token, msg) = hop(&mut core).expect("the window goes to stage 1");
    let InferMsg::Step {
        stream,
        head: Some(Head::Score(targets)),
        ..
    } = msg
    else {
        panic!("the last stage is asked to score: {msg:?}")
    };
    assert_eq!(targets, vec![2, 3, 4]);
    // Replies that cannot be the window's loss: each costs its sender, none is counted.
    let lies = [
        InferReply::Scored {
            stream,
            pos: 3,
            nll: f64::NAN,
        },
        InferReply::Scored {
            stream,
            pos: 3,
            nll: -1.0,
        },
        InferReply::Scored {
            stream,
            pos: 2,
            nll: 1.0,
        },
        InferReply::Token {
            stream,
            pos: 3,
            token: 1,
            draws: 0,
        },
    ];
    let (mut to, mut token) = (first, token);
    let mut tried = vec![first];
    for lie in lies {
        answer(&mut core, to, token, lie.clone(), now);
        let out: Vec<Transmit> = std::iter::from_fn(|| core.poll_transmit()).collect();
        assert!(
            out.iter()
                .any(|t| matches!(t, Transmit::Penalize { peer, .. } if *peer == to)),
            "{lie:?} not penalised"
        );
        (to, token) = out
            .into_iter()
            .find_map(|t| match t {
                Transmit::Request { to, token, .. } => Some((to, token)),
                _ => None,
            })
            .expect("the window moves to another replica");
        assert!(
            !tried.contains(&to),
            "a replica that lied is not asked again"
        );
        tried.push(to);
        assert!(validation(&mut core).is_none(), "{lie:?} was counted");
    }
    answer(
        &mut core,
        to,
        token,
        InferReply::Scored {
            stream,
            pos: 3,
            nll: 6.0,
        },
        now,
    );
    assert_eq!(validation(&mut core), Some((0, 2.0, 3)));
    // The same round is not evaluated twice.
    core.handle_timeout(now);
    run_engine(&mut core, &mut engine, now);
    assert!(hop(&mut core).is_none());
}

#[test]
fn a_failed_evaluation_waits_before_it_is_tried_again() {
    let now = Instant::now();
    let (mut core, mut engine) = driver(now);
    core.handle_timeout(now);
    run_engine(&mut core, &mut engine, now);
    let (to, token, _) = hop(&mut core).unwrap();
    // A transfer error at every replica ends the stream: the evaluation fails.
    let (mut to, mut token) = (to, token);
    for _ in 0..64 {
        core.handle_message(
            to,
            Inbound::Response {
                token,
                result: Err(TransferError("timed out".into())),
            },
            now,
        );
        match hop(&mut core) {
            Some((t, k, _)) => (to, token) = (t, k),
            None => break,
        }
    }
    assert!(core.eval.running.is_none());
    assert!(validation(&mut core).is_none());
    core.handle_timeout(now + evaluate::EVAL_RETRY / 2);
    run_engine(&mut core, &mut engine, now);
    assert!(hop(&mut core).is_none(), "retried too soon");
    let later = now + evaluate::EVAL_RETRY;
    core.handle_timeout(later);
    run_engine(&mut core, &mut engine, later);
    assert!(hop(&mut core).is_some(), "tried again after the pause");
}

/// A failure holds back its own round only: once θ₀ moved (the network made progress), the
/// new round is evaluated at once. Training can be over before a pause ends, and a curve
/// that missed every round but the last would be a single point.
#[test]
fn a_new_round_is_evaluated_at_once_after_a_failure() {
    let now = Instant::now();
    let (mut core, mut engine) = driver(now);
    core.settings.sync.every = 10;
    core.handle_timeout(now);
    run_engine(&mut core, &mut engine, now);
    let (to, token, _) = hop(&mut core).unwrap();
    let (mut to, mut token) = (to, token);
    for _ in 0..64 {
        let result = Err(TransferError("timed out".into()));
        core.handle_message(to, Inbound::Response { token, result }, now);
        match hop(&mut core) {
            Some((t, k, _)) => (to, token) = (t, k),
            None => break,
        }
    }
    assert!(core.eval.running.is_none(), "the evaluation failed");
    let soon = now + evaluate::EVAL_RETRY / 10;
    core.handle_timeout(soon);
    run_engine(&mut core, &mut engine, soon);
    assert!(hop(&mut core).is_none(), "round 0 retried too soon");
    core.rounds.syncer.jump_to(1);
    core.handle_timeout(soon);
    run_engine(&mut core, &mut engine, soon);
    let (to, token, msg) = hop(&mut core).expect("round 1 is evaluated at once");
    let InferMsg::Step { stream, .. } = msg else {
        panic!("not a step: {msg:?}")
    };
    let scored = InferReply::Scored {
        stream,
        pos: 3,
        nll: 6.0,
    };
    answer(&mut core, to, token, scored, soon);
    assert_eq!(validation(&mut core), Some((1, 2.0, 3)));
}

/// A driver evaluates as soon as it can, not at its next timer: the first point (the θ₀ every
/// replica starts from) is taken before a fast pipeline's first round moves θ₀.
#[test]
fn any_input_starts_a_due_evaluation() {
    let now = Instant::now();
    let (mut core, mut engine) = driver(now);
    core.handle_message(NodeId([9; 32]), Inbound::Connected, now);
    run_engine(&mut core, &mut engine, now);
    assert!(hop(&mut core).is_some(), "a message did not start it");
}
