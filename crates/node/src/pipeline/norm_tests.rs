//! The norm bounds and shape rules on what a stage takes from peers, through the pipeline's own
//! handling.

use super::tests::{World, batch, driver, forward_from, forward_of, replica, scaled_gradient};
use super::*;

/// Micro-batch `index` of driver 1's step 0.
fn mb(index: u32) -> MicroBatchId {
    MicroBatchId {
        origin: [1; 32],
        step: 0,
        index,
    }
}

fn l2(data: &[f32]) -> f32 {
    data.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// A tensor of norm `honest` × 20 or so came out at the bound, 8 × the median.
fn assert_scaled_to_the_bound(used: f32, honest: f32) {
    assert!(
        used <= 8.0 * honest * 1.001 && used > 7.0 * honest,
        "{used} against {honest}"
    );
}

/// A downstream replica answers with a gradient 10⁴ times the size of the ones before it
/// (finite, within the codec's limits): the driver refuses it and penalises the sender, and
/// one 20 times the size is scaled down to 8 × the median before the backward pass uses it.
/// Before the bound both were trained in, and AdamW's second moment took the square.
#[test]
fn an_outsized_gradient_is_refused_and_a_large_one_scaled_down() {
    let mut w = World::new(driver(1));
    let next = NodeId([7; 32]);
    let norm_of = |job: &Job| match job {
        Job::Backward {
            upstream: Upstream::Grad(g),
            ..
        } => l2(&g.data),
        _ => 0.0,
    };
    let mut honest = 0.0;
    for step in 0..6u64 {
        w.beat(next);
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(w.answer(0), Ack::Accepted);
        honest = norm_of(
            w.ran
                .iter()
                .rev()
                .find(|j| matches!(j, Job::Backward { .. }))
                .unwrap(),
        );
    }
    w.beat(next);
    let actions = w.p.on_batch(6, batch(6), Vec::new(), w.now);
    w.handle(actions);
    let (from, forward) = w.sent.remove(0);
    let (ack, actions) = w.p.on_message(from, scaled_gradient(&forward, 1e4), w.now);
    w.handle(actions);
    assert!(
        matches!(ack, Ack::Rejected(ref r) if r.contains("norm")),
        "{ack:?}"
    );
    assert!(w.penalties.iter().any(|(p, _)| *p == next));
    let ran = w.ran.len();
    let (ack, actions) = w.p.on_message(from, scaled_gradient(&forward, 20.0), w.now);
    w.handle(actions);
    assert_eq!(ack, Ack::Accepted);
    let used = norm_of(
        w.ran[ran..]
            .iter()
            .find(|j| matches!(j, Job::Backward { .. }))
            .unwrap(),
    );
    assert_scaled_to_the_bound(used, honest);
}

/// The last stage of three takes forward activations 200 times the size of those before them
/// from a staked upstream replica: refused and penalised; 15 times: scaled down to 8 × the
/// median.
#[test]
fn outsized_activations_are_refused_and_large_ones_scaled_down() {
    let mut w = World::new(replica(2, 3, 1));
    let a = NodeId([1; 32]);
    let norm_of = |job: &Job| match job {
        Job::Forward {
            input: StageInput::Hidden(h),
            ..
        }
        | Job::Backward {
            input: StageInput::Hidden(h),
            ..
        } => l2(&h.data),
        _ => 0.0,
    };
    for step in 0..6 {
        let (ack, actions) = w.p.on_message(a, forward_from(1, step, 0), w.now);
        assert_eq!(ack, Ack::Accepted);
        w.handle(actions);
    }
    let honest = w.ran.iter().map(norm_of).fold(0.0, f32::max);
    let (ack, actions) = w.p.on_message(a, forward_from(200, 6, 0), w.now);
    w.handle(actions);
    assert!(
        matches!(ack, Ack::Rejected(ref r) if r.contains("norm")),
        "{ack:?}"
    );
    assert!(w.penalties.iter().any(|(p, _)| *p == a));
    let ran = w.ran.len();
    let (ack, actions) = w.p.on_message(a, forward_from(15, 7, 0), w.now);
    assert_eq!(ack, Ack::Accepted);
    w.handle(actions);
    let used = w.ran[ran..].iter().map(norm_of).fold(0.0, f32::max);
    assert_scaled_to_the_bound(used, honest);
}

/// A staked driver sends micro-batches shorter, or with fewer rows, than the network's: the
/// stage refuses them, so no driver makes its steps (and the stages' paid work for it) as
/// cheap as it likes. Before, any shape up to the largest was trained in.
#[test]
fn a_micro_batch_smaller_than_the_networks_is_refused() {
    let mut p = replica(1, 2, 2);
    p.cfg.min_rows = 2;
    let a = NodeId([1; 32]);
    let forward = |rows: usize, seq: usize, index: u32| forward_of(mb(index), (rows, seq), 0.1, 1);
    let now = Instant::now();
    for (i, (batch, seq)) in [(2, 1), (1, 4)].into_iter().enumerate() {
        let (ack, actions) = p.on_message(a, forward(batch, seq, i as u32), now);
        assert!(
            matches!(ack, Ack::Rejected(ref r) if r.contains("2 to 4 rows of 4")),
            "{ack:?}"
        );
        assert!(
            actions
                .iter()
                .any(|x| matches!(x, Action::Penalize { peer, .. } if *peer == a))
        );
    }
    let (ack, _) = p.on_message(a, forward(2, 4, 2), now);
    assert_eq!(ack, Ack::Accepted);
}

/// A staked upstream replica sends 64 micro-batches of tiny activations the stage refuses
/// for another reason (targets outside the vocabulary), then, with the stage's queue full,
/// 64 more it answers busy. Neither kind counts towards the norms later tensors are judged
/// by, so an honest micro-batch is still taken. When every tensor that passed the norm check
/// was remembered, the window held only the tiny ones, and the honest micro-batch was refused
/// as 10⁴ times their median.
#[test]
fn tensors_refused_or_answered_busy_do_not_pull_the_norms_down() {
    let mut p = replica(1, 2, 1);
    let a = NodeId([1; 32]);
    let now = Instant::now();
    for index in 0..64 {
        let (ack, _) = p.on_message(a, forward_of(mb(index), (2, 4), 1e-5, 1_000), now);
        assert!(
            matches!(ack, Ack::Rejected(ref r) if r.contains("vocabulary")),
            "{ack:?}"
        );
    }
    assert_eq!(p.forward_norms.median(), None);
    // Fill the queue (the engine never answers here), then flood it.
    let mut index = 64;
    while p.on_message(a, forward_from(1, 1, index), now).0 == Ack::Accepted {
        index += 1;
    }
    let median = p.forward_norms.median();
    assert!(median.is_some());
    for i in 0..64 {
        let (ack, _) = p.on_message(a, forward_of(mb(1000 + i), (2, 4), 1e-5, 1), now);
        assert_eq!(ack, Ack::Busy);
    }
    assert_eq!(p.forward_norms.median(), median);
}

/// A gradient refused for its shape leaves the norms as they were: the downstream replica
/// cannot pull them down with gradients it knows will be refused.
#[test]
fn a_gradient_refused_for_its_shape_does_not_count() {
    let mut w = World::new(driver(1));
    let next = NodeId([7; 32]);
    for step in 0..6u64 {
        w.beat(next);
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(w.answer(0), Ack::Accepted);
    }
    let median = w.p.backward_norms.median();
    assert!(median.is_some());
    w.beat(next);
    let actions = w.p.on_batch(6, batch(6), Vec::new(), w.now);
    w.handle(actions);
    let (from, forward) = w.sent.remove(0);
    let Msg::Forward { mb, .. } = forward else {
        panic!("not a forward");
    };
    let tiny = Activations {
        batch: 1,
        seq: 1,
        dim: 8,
        data: vec![1e-6; 8],
    };
    for _ in 0..8 {
        let grad = Msg::Backward {
            mb,
            grad: act_codec::pack(&tiny, ActSpec::default().backward).expect("finite"),
            loss: 2.5,
        };
        let (ack, actions) = w.p.on_message(from, grad, w.now);
        w.handle(actions);
        assert!(matches!(ack, Ack::Rejected(_)), "{ack:?}");
    }
    assert_eq!(w.p.backward_norms.median(), median);
}
