//! The serving path under attack, on one core with its real engine: streams keyed by their
//! coordinator, positions and values checked before the engine, bounded caches, and answers
//! that do not answer the hop.

use std::time::{Duration, Instant};

use neuroshard_model::{AdamW, AdamWConfig, Stage, StageSpec};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, NodeId};

use super::tests::core_at;
use super::*;
use crate::compute::Engine;
use crate::serve::{
    Chunk, Completion, Head, InferMsg, InferReply, SampleSpec, ServeEvent, ServeLimits,
};

const D: usize = 8;

fn sample() -> SampleSpec {
    SampleSpec {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 1,
        draws: 0,
    }
}

/// The last stage of two (takes hidden states, samples) with its engine.
fn replica(start: Instant) -> (NodeCore, Engine) {
    let core = core_at(&test_identity(0), start, 1, 2);
    let model = core.settings.model.clone();
    let spec = StageSpec::split(&model, 2).unwrap()[1];
    let stage = Stage::init(model, spec, 1).unwrap();
    let opt = AdamW::new(AdamWConfig::default(), stage.params());
    (core, Engine::new(stage, opt, None))
}

fn step(stream: u64, pos: u32, rows: usize) -> InferMsg {
    InferMsg::Step {
        stream,
        pos,
        chunks: vec![Chunk::Hidden(vec![0.25; rows * D])],
        head: Some(Head::Sample(sample())),
    }
}

/// Sends `msg` from `from`, runs the engine, returns the answer.
fn ask(
    core: &mut NodeCore,
    engine: &mut Engine,
    from: NodeId,
    msg: InferMsg,
    now: Instant,
) -> InferReply {
    core.handle_message(
        from,
        Inbound::Request {
            token: 777,
            data: msg.to_canonical_bytes(),
        },
        now,
    );
    run_engine(core, engine, now);
    let mut answer = None;
    while let Some(t) = core.poll_transmit() {
        if let Transmit::Respond { token: 777, data } = t {
            answer = Some(InferReply::from_canonical_bytes(&data).unwrap());
        }
    }
    answer.expect("an answer")
}

pub(super) fn run_engine(core: &mut NodeCore, engine: &mut Engine, now: Instant) {
    while let Some((token, job)) = core.poll_engine_job() {
        if matches!(job, EngineJob::Infer { .. }) {
            let out = engine.execute(job);
            core.handle_engine_done(token, out, now);
        }
    }
}

#[test]
fn a_peer_cannot_feed_or_close_a_stream_it_did_not_open() {
    let now = Instant::now();
    let (mut core, mut engine) = replica(now);
    let (a, b) = (test_identity(1).node_id(), test_identity(2).node_id());
    let r = ask(&mut core, &mut engine, a, step(7, 0, 2), now);
    assert!(
        matches!(
            r,
            InferReply::Token {
                stream: 7,
                pos: 2,
                ..
            }
        ),
        "{r:?}"
    );
    // B names A's stream: to the replica it is B's own, unknown stream.
    let r = ask(&mut core, &mut engine, b, step(7, 2, 1), now);
    assert_eq!(r, InferReply::Restart { stream: 7, have: 0 });
    assert_eq!(
        ask(
            &mut core,
            &mut engine,
            b,
            InferMsg::Close { stream: 7 },
            now
        ),
        InferReply::Closed
    );
    // A's cache is untouched and goes on at position 2.
    let r = ask(&mut core, &mut engine, a, step(7, 2, 1), now);
    assert!(
        matches!(
            r,
            InferReply::Token {
                stream: 7,
                pos: 3,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(engine.cached_streams(), 1);
}

#[test]
fn positions_beyond_max_seq_and_non_finite_states_are_refused_and_penalised() {
    let now = Instant::now();
    let (mut core, mut engine) = replica(now);
    let a = test_identity(1).node_id();
    let mut nan = vec![0.25; D];
    nan[3] = f32::NAN;
    let bad = [
        step(1, u32::MAX, 2),
        step(1, 0, 9),
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Hidden(nan)],
            head: Some(Head::Sample(sample())),
        },
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Hidden(vec![0.5; D + 3])],
            head: Some(Head::Sample(sample())),
        },
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Tokens(vec![1])],
            head: Some(Head::Sample(sample())),
        },
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Hidden(vec![0.5; D])],
            head: Some(Head::Sample(SampleSpec {
                top_k: 1 << 30,
                ..sample()
            })),
        },
        // Scoring: a target per position of the last chunk, each inside the vocabulary.
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Hidden(vec![0.5; 2 * D])],
            head: Some(Head::Score(vec![1])),
        },
        InferMsg::Step {
            stream: 1,
            pos: 0,
            chunks: vec![Chunk::Hidden(vec![0.5; 2 * D])],
            head: Some(Head::Score(vec![1, 1 << 30])),
        },
    ];
    for msg in bad {
        core.handle_message(
            a,
            Inbound::Request {
                token: 5,
                data: msg.to_canonical_bytes(),
            },
            now,
        );
        let out: Vec<Transmit> = std::iter::from_fn(|| core.poll_transmit()).collect();
        assert!(
            out.iter().any(|t| matches!(t, Transmit::Penalize { .. })),
            "{msg:?} not penalised"
        );
        assert!(
            out.iter()
                .any(|t| matches!(t, Transmit::Respond { data, .. }
            if matches!(InferReply::from_canonical_bytes(data), Ok(InferReply::Rejected(_)))))
        );
        assert!(
            core.poll_engine_job().is_none(),
            "nothing reaches the engine"
        );
    }
    // Exactly max_seq positions are fine.
    let r = ask(&mut core, &mut engine, a, step(1, 0, 8), now);
    assert!(matches!(r, InferReply::Token { pos: 8, .. }), "{r:?}");
    // And a well-formed scoring step is scored.
    let score = InferMsg::Step {
        stream: 2,
        pos: 0,
        chunks: vec![Chunk::Hidden(vec![0.5; 2 * D])],
        head: Some(Head::Score(vec![1, 3])),
    };
    let r = ask(&mut core, &mut engine, a, score, now);
    assert!(
        matches!(r, InferReply::Scored { stream: 2, pos: 2, nll } if nll.is_finite() && nll > 0.0),
        "{r:?}"
    );
}

#[test]
fn a_flood_of_stream_openings_holds_bounded_caches_and_idle_ones_are_evicted() {
    let now = Instant::now();
    let (mut core, mut engine) = replica(now);
    core.set_serve_limits(ServeLimits {
        per_peer: 3,
        cached: 5,
        idle: Duration::from_secs(30),
        ..ServeLimits::default()
    });
    let (a, b) = (test_identity(1).node_id(), test_identity(2).node_id());
    for s in 0..20 {
        let r = ask(&mut core, &mut engine, a, step(s, 0, 1), now);
        assert!(matches!(r, InferReply::Token { .. }), "{r:?}");
    }
    assert_eq!(engine.cached_streams(), 3, "one peer keeps its latest 3");
    // The oldest of A's streams went; its latest stays.
    assert_eq!(
        ask(&mut core, &mut engine, a, step(0, 1, 1), now),
        InferReply::Restart { stream: 0, have: 0 }
    );
    assert!(matches!(
        ask(&mut core, &mut engine, a, step(19, 1, 1), now),
        InferReply::Token { .. }
    ));
    for s in 0..2 {
        assert!(matches!(
            ask(&mut core, &mut engine, b, step(s, 0, 1), now),
            InferReply::Token { .. }
        ));
    }
    // Five cached in all: a third peer's new stream is turned away.
    assert_eq!(
        ask(&mut core, &mut engine, b, step(9, 0, 1), now),
        InferReply::Busy
    );
    let later = now + Duration::from_secs(31);
    core.handle_timeout(later);
    run_engine(&mut core, &mut engine, later);
    assert_eq!(engine.cached_streams(), 0, "idle caches are dropped");
}

/// A few keys holding every cache slot of a replica cannot keep another entry node out: a
/// full replica gives the newcomer the least recently used idle stream of the peer holding
/// the most.
#[test]
fn a_full_replica_makes_room_for_a_peer_holding_fewer_streams() {
    let now = Instant::now();
    let (mut core, mut engine) = replica(now);
    core.set_serve_limits(ServeLimits {
        per_peer: 3,
        cached: 6,
        idle: Duration::from_secs(30),
        ..ServeLimits::default()
    });
    let [a, b, c] = [1, 2, 3].map(|i| test_identity(i).node_id());
    for peer in [a, b] {
        for s in 0..3 {
            let r = ask(&mut core, &mut engine, peer, step(s, 0, 1), now);
            assert!(matches!(r, InferReply::Token { .. }), "{r:?}");
        }
    }
    let r = ask(&mut core, &mut engine, c, step(0, 0, 1), now);
    assert!(matches!(r, InferReply::Token { .. }), "{r:?}");
    assert_eq!(engine.cached_streams(), 6);
}

#[test]
fn answers_that_do_not_answer_the_hop_move_the_stream_to_another_replica() {
    let now = Instant::now();
    // Stage 0 of 2: the coordinator feeds itself, then asks a stage-1 replica.
    let mut core = core_at(&test_identity(0), now, 0, 2);
    let model = core.settings.model.clone();
    let spec = StageSpec::split(&model, 2).unwrap()[0];
    let stage = Stage::init(model, spec, 1).unwrap();
    let opt = AdamW::new(AdamWConfig::default(), stage.params());
    let mut engine = Engine::new(stage, opt, None);
    let id = core
        .open_stream(
            Completion {
                prompt: vec![1, 2],
                max_tokens: 3,
                sample: sample(),
                stop_token: None,
                payment: None,
            },
            now,
        )
        .unwrap();
    run_engine(&mut core, &mut engine, now);
    let request = |core: &mut NodeCore| -> (NodeId, Token) {
        let out: Vec<Transmit> = std::iter::from_fn(|| core.poll_transmit()).collect();
        out.into_iter()
            .find_map(|t| match t {
                Transmit::Request { to, token, .. } => Some((to, token)),
                _ => None,
            })
            .expect("a hop to stage 1")
    };
    let (first, token) = request(&mut core);
    let answer = |core: &mut NodeCore, from, token, r: InferReply| {
        let result = Ok(r.to_canonical_bytes());
        core.handle_message(from, Inbound::Response { token, result }, now);
    };
    // A reply for a token we never used, and one for another stream: no token comes out.
    answer(
        &mut core,
        first,
        4242,
        InferReply::Token {
            stream: id,
            pos: 2,
            token: 5,
            draws: 0,
        },
    );
    assert!(core.poll_serve().is_none());
    answer(
        &mut core,
        first,
        token,
        InferReply::Token {
            stream: id + 9,
            pos: 2,
            token: 5,
            draws: 0,
        },
    );
    assert!(core.poll_serve().is_none());
    let (second, token) = request(&mut core);
    assert_ne!(second, first, "the stream moved on");
    // The stale reply to the abandoned hop is ignored; the right one is taken.
    answer(
        &mut core,
        second,
        token,
        InferReply::Token {
            stream: id,
            pos: 2,
            token: 5,
            draws: 0,
        },
    );
    assert_eq!(
        core.poll_serve(),
        Some(ServeEvent::Token {
            stream: id,
            token: 5
        })
    );
    assert_eq!(core.stream_holders(id).unwrap()[1], Some(second));
}

#[test]
fn a_replica_signs_a_receipt_only_for_positions_it_holds_for_that_coordinator() {
    use neuroshard_ledger::ServeReceipt;
    use neuroshard_proof::Signed;
    let now = Instant::now();
    let (mut core, mut engine) = replica(now);
    let (a, b) = (test_identity(1).node_id(), test_identity(2).node_id());
    let settle = |stream| InferMsg::Settle {
        stream,
        request: [4; 32],
    };
    // Nothing served yet: no receipt to collect for an idle stream.
    let r = ask(&mut core, &mut engine, a, settle(7), now);
    assert!(matches!(r, InferReply::Rejected(_)), "{r:?}");
    assert!(matches!(
        ask(&mut core, &mut engine, a, step(7, 0, 2), now),
        InferReply::Token { .. }
    ));
    // B cannot collect a receipt for A's stream (to the replica it is B's own, unknown one).
    let r = ask(&mut core, &mut engine, b, settle(7), now);
    assert!(matches!(r, InferReply::Rejected(_)), "{r:?}");
    let InferReply::Receipt(wire) = ask(&mut core, &mut engine, a, settle(7), now) else {
        panic!("the coordinator gets a receipt");
    };
    let envelope = Signed::<ServeReceipt>::from_bytes(&wire).unwrap();
    let receipt = envelope.verify().unwrap();
    assert_eq!(envelope.signer().node_id(), core.node_id());
    assert_eq!(
        (
            receipt.entry,
            receipt.stage,
            receipt.positions,
            receipt.request
        ),
        (a, 1, 2, [4; 32])
    );
    // Settling closed the stream: a second receipt for it is refused.
    let r = ask(&mut core, &mut engine, a, settle(7), now);
    assert!(matches!(r, InferReply::Rejected(_)), "{r:?}");
}

#[test]
fn a_receipt_that_is_not_the_replicas_own_for_this_request_is_left_out_and_penalised() {
    use super::serve_pay::Paid;
    use neuroshard_ledger::ServeReceipt;
    use neuroshard_proof::Signed;
    let now = Instant::now();
    let mut core = core_at(&test_identity(0), now, 0, 2);
    let (replica, forger) = (test_identity(1), test_identity(2));
    let receipt = |signer: &neuroshard_proof::Identity, request| {
        let r = ServeReceipt {
            network: core.network,
            request,
            entry: core.node_id(),
            stage: 1,
            server: replica.node_id(),
            positions: 3,
        };
        InferReply::Receipt(Signed::sign(signer, &r).to_bytes())
    };
    // Forged by another key; genuine but for another request; genuine.
    let answers = [
        (receipt(&forger, [4; 32]), true),
        (receipt(&replica, [5; 32]), true),
        (receipt(&replica, [4; 32]), false),
    ];
    for (stream, (answer, lie)) in answers.into_iter().enumerate() {
        let paid = Paid {
            wire: vec![1, 2, 3],
            payer: test_identity(3).node_id(),
            request: [4; 32],
        };
        core.start_settling(stream as u64, paid, vec![(1, replica.node_id())], now);
        let token = std::iter::from_fn(|| core.poll_transmit())
            .find_map(|t| match t {
                Transmit::Request { to, token, .. } if to == replica.node_id() => Some(token),
                _ => None,
            })
            .expect("the replica is asked for its receipt");
        let result = Ok(answer.to_canonical_bytes());
        core.handle_message(replica.node_id(), Inbound::Response { token, result }, now);
        let out: Vec<Transmit> = std::iter::from_fn(|| core.poll_transmit()).collect();
        let events: Vec<NodeEvent> = std::iter::from_fn(|| core.poll_event()).collect();
        let penalised = out.iter().any(|t| matches!(t, Transmit::Penalize { .. }));
        // Without a receipt nothing is settled; with one the settlement goes to the ledger
        // (which refuses this fixture's unfunded payment: no publish either way).
        let settled = events
            .iter()
            .any(|e| matches!(e, NodeEvent::Dropped { what: Some(w), .. } if w == "op"));
        assert_eq!((penalised, settled), (lie, !lie), "answer {stream}");
        assert!(!out.iter().any(|t| matches!(t, Transmit::Publish { .. })));
    }
}
