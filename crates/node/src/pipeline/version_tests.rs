//! A network that grew: version 1 puts a new stage (id 3) between stages 1 and 2. Drivers
//! move to it at a round boundary once it is held, each micro-batch keeps the version it was
//! started under, and a relabelled one is refused.

use super::*;
use crate::layout::{Layout, Layouts};
use neuroshard_growth::{Architecture, StageLayout};

/// Versions 0 (stages 0, 1, 2 of two, one and one blocks) and 1 (a block in stage 3 between
/// 1 and 2).
fn grown() -> Layouts {
    let base = ModelConfig {
        layers: 4,
        ..model()
    };
    let mut all = Layouts::fixed(&base, 3).unwrap();
    let mut shape = crate::network::shape_of(&base);
    shape.layers = 5;
    let arch = Architecture {
        version: 1,
        shape,
        stages: [(0, 2), (1, 1), (3, 1), (2, 1)]
            .map(|(id, layers)| StageLayout { id, layers })
            .to_vec(),
    };
    all.insert(Layout::of(&base, &arch).unwrap());
    all
}

fn stage(stage: usize, version_every: u64) -> Pipeline {
    let mut p = replica(stage, 2, 1);
    p.cfg.layouts = grown();
    p.cfg.version_every = version_every;
    p
}

fn versioned(mut msg: Msg, v: u32) -> Msg {
    if let Msg::Forward { version, .. } = &mut msg {
        *version = v;
    }
    msg
}

fn version_of(msg: &Msg) -> u32 {
    match msg {
        Msg::Forward { version, .. } => *version,
        Msg::Backward { .. } => panic!("not a forward"),
    }
}

#[test]
fn a_driver_moves_to_a_new_version_at_a_round_boundary_once_its_new_stage_is_held() {
    let mut w = World::new(stage(0, 2));
    let next = NodeId([7; 32]);
    let mut versions = Vec::new();
    for step in 0..6u64 {
        w.beat_as(next, 1);
        if step == 1 {
            // The new stage gets its first replica during step 1: not a round boundary.
            w.beat_as(NodeId([3; 32]), 3);
        }
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(w.sent.len(), 1);
        versions.push(version_of(&w.sent[0].1));
        assert_eq!(
            w.sent[0].0, next,
            "the driver's next stage is 1 in every version"
        );
        assert_eq!(w.answer(0), Ack::Accepted);
    }
    assert_eq!(versions, [0, 0, 1, 1, 1, 1]);
    assert_eq!(w.p.driving(), 1);
    assert!(w.penalties.is_empty(), "{:?}", w.penalties);
}

#[test]
fn a_driver_stays_on_its_version_while_the_new_stage_has_no_replica() {
    let mut w = World::new(stage(0, 1));
    let next = NodeId([7; 32]);
    for step in 0..3u64 {
        w.beat_as(next, 1);
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(version_of(&w.sent[0].1), 0, "step {step}");
        assert_eq!(w.answer(0), Ack::Accepted);
    }
}

#[test]
fn a_middle_stage_routes_each_micro_batch_by_its_own_version() {
    let mut w = World::new(stage(1, 1));
    let (old_next, new_next) = (NodeId([8; 32]), NodeId([9; 32]));
    w.beat_as(old_next, 2);
    w.beat_as(new_next, 3);
    let driver = NodeId([1; 32]);
    for (step, v, to) in [(0, 0, old_next), (1, 1, new_next)] {
        let (ack, actions) =
            w.p.on_message(driver, versioned(forward_from(1, step, 0), v), w.now);
        assert_eq!(ack, Ack::Accepted);
        w.handle(actions);
        let (sent_to, msg) = w.sent.last().expect("sent");
        assert_eq!((*sent_to, version_of(msg)), (to, v), "step {step}");
        // Who may answer: the stage it was sent to.
        let want = if v == 0 { 2 } else { 3 };
        assert_eq!(w.p.sender_stage(&gradient(msg)), Some(want));
        assert_eq!(w.answer(0), Ack::Accepted);
    }
    assert!(w.penalties.is_empty(), "{:?}", w.penalties);
    // A gradient for a micro-batch no longer here: the newest version's next stage.
    let gone = gradient(&versioned(forward_from(1, 9, 0), 0));
    assert_eq!(w.p.sender_stage(&gone), Some(3));
}

#[test]
fn the_last_stage_expects_each_version_from_the_stage_before_it_there() {
    let p = stage(2, 1);
    assert_eq!(
        p.sender_stage(&versioned(forward_from(1, 0, 0), 0)),
        Some(1)
    );
    assert_eq!(
        p.sender_stage(&versioned(forward_from(1, 0, 0), 1)),
        Some(3)
    );
    assert_eq!(p.sender_stage(&versioned(forward_from(1, 0, 0), 7)), None);
    let new = stage(3, 1);
    assert_eq!(
        new.sender_stage(&versioned(forward_from(1, 0, 0), 1)),
        Some(1)
    );
}

#[test]
fn a_version_not_final_here_yet_is_busy_and_one_without_this_stage_is_refused() {
    let mut w = World::new(stage(2, 1));
    let from = NodeId([5; 32]);
    let (ack, actions) =
        w.p.on_message(from, versioned(forward_from(1, 0, 0), 2), w.now);
    assert_eq!(ack, Ack::Busy, "our ledger may lag the driver's");
    assert!(actions.is_empty(), "no penalty: {actions:?}");
    let mut w = World::new(stage(3, 1));
    let (ack, _) =
        w.p.on_message(from, versioned(forward_from(1, 0, 0), 0), w.now);
    assert!(matches!(ack, Ack::Rejected(r) if r.contains("not part of architecture version 0")));
}
