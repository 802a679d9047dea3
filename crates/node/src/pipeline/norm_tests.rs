//! The norm bounds and shape rules on what a stage takes from peers, through the pipeline's own
//! handling.

use super::tests::{World, batch, driver, forward_from, replica, scaled_gradient};
use super::*;

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
        let actions = w.p.on_batch(step, batch(step), Vec::new());
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
    let actions = w.p.on_batch(6, batch(6), Vec::new());
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

/// The last stage takes forward activations 200 times the size of those before them from a
/// staked upstream replica: refused and penalised; 15 times: scaled down to 8 × the median.
#[test]
fn outsized_activations_are_refused_and_large_ones_scaled_down() {
    let mut w = World::new(replica(1, 2, 1));
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
    let forward = |batch: usize, seq: usize, index: u32| Msg::Forward {
        mb: MicroBatchId {
            origin: [1; 32],
            step: 0,
            index,
        },
        version: 0,
        stamp: None,
        input: crate::wire::Payload::Hidden(
            act_codec::pack(
                &Activations {
                    batch,
                    seq,
                    dim: 8,
                    data: vec![0.1; batch * seq * 8],
                },
                ActSpec::default().forward,
            )
            .expect("finite"),
        ),
        targets: vec![1; batch * seq].into(),
    };
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
