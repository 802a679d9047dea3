//! The driver's pipeline against a scripted engine and downstream stage: what happens when
//! compute fails and when a slow replica answers after a failover.

use std::collections::VecDeque;

use super::*;
use crate::act_codec;
use crate::records::Heartbeat;

const D: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(1);

fn model() -> ModelConfig {
    ModelConfig {
        layers: 2,
        d_model: D,
        heads: 2,
        kv_heads: 2,
        ffn: 16,
        vocab: 16,
        max_seq: 8,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
    }
}

/// Stage 0 of 2: the driver.
pub(super) fn driver(micro_batches: usize) -> Pipeline {
    replica(0, 2, micro_batches)
}

/// Version 0 of a fixed network of `stages` stages (one block each at least).
fn layouts(stages: usize) -> crate::layout::Layouts {
    let m = ModelConfig {
        layers: model().layers.max(stages),
        ..model()
    };
    crate::layout::Layouts::fixed(&m, stages).unwrap()
}

/// Stage `stage` of `stages`.
pub(super) fn replica(stage: usize, stages: usize, micro_batches: usize) -> Pipeline {
    lagging(stage, stages, micro_batches, 0)
}

/// Stage `stage` of `stages` with a weight lag.
fn lagging(stage: usize, stages: usize, micro_batches: usize, weight_lag: u64) -> Pipeline {
    let cfg = PipelineConfig {
        stage,
        layouts: layouts(stages),
        version_every: 1,
        model: model(),
        micro_batches,
        queue_capacity: 8,
        candidates: 3,
        grad_timeout: TIMEOUT,
        retry_after: Duration::from_millis(10),
        steps: 0,
        clock: Clock::new(Instant::now(), 0),
        activations: ActSpec::default(),
        max_rows: 4,
        min_rows: 1,
        seq: 4,
        weight_lag,
    };
    Pipeline::new(cfg, [1; 32], 0)
}

pub(super) fn batch(step: u64) -> Batch {
    let windows: Vec<Vec<u32>> = (0..4u32)
        .map(|r| (0..5u32).map(|i| (r * 5 + i + step as u32) % 16).collect())
        .collect();
    Batch::from_windows(&windows, 4).expect("batch")
}

fn shape(input: &StageInput) -> (usize, usize) {
    match input {
        StageInput::Tokens(t) => (t.batch, t.seq),
        StageInput::Hidden(a) => (a.batch, a.seq),
    }
}

/// The engine's answer to a job: outputs of the right shape, or a failure when asked.
fn run(job: &Job, fail: bool) -> JobDone {
    match job {
        Job::Forward { mb, input, .. } => {
            let (batch, seq) = shape(input);
            JobDone::Forward {
                mb: *mb,
                output: Activations {
                    batch,
                    seq,
                    dim: D,
                    data: vec![0.5; batch * seq * D],
                },
            }
        }
        Job::Backward { mb, .. } if fail => JobDone::Failed {
            mb: Some(*mb),
            error: "non-finite parameter gradient".into(),
        },
        Job::Backward {
            mb,
            input,
            upstream,
            ..
        } => JobDone::Backward {
            mb: *mb,
            input_grad: match input {
                StageInput::Hidden(a) => Some(Activations {
                    data: vec![0.02; a.data.len()],
                    ..a.clone()
                }),
                StageInput::Tokens(_) => None,
            },
            loss: matches!(upstream, Upstream::Targets(_)).then_some(2.0),
        },
        Job::Step { step } => JobDone::Step {
            step: *step,
            lr: 1e-3,
            grad_norm: 1.0,
            model_hash: [0; 32],
        },
    }
}

/// The gradient a stage-1 replica sends back for a forward request.
fn gradient(forward: &Msg) -> Msg {
    scaled_gradient(forward, 1.0)
}

/// [`gradient`] with every value multiplied by `k`.
pub(super) fn scaled_gradient(forward: &Msg, k: f32) -> Msg {
    let Msg::Forward {
        mb,
        input: Payload::Hidden(a),
        ..
    } = forward
    else {
        panic!("not a hidden-state forward: {forward:?}");
    };
    let (batch, seq, dim) = a.shape();
    let grad = Activations {
        batch,
        seq,
        dim,
        data: vec![0.01 * k; batch * seq * dim],
    };
    Msg::Backward {
        mb: *mb,
        grad: act_codec::pack(&grad, ActSpec::default().backward).expect("finite"),
        loss: 2.5,
    }
}

/// The driver, its clock, and what it asked of the world.
pub(super) struct World {
    pub(super) p: Pipeline,
    pub(super) now: Instant,
    /// Forward requests accepted downstream whose gradient has not been delivered.
    pub(super) sent: Vec<(NodeId, Msg)>,
    asked: Vec<u64>,
    pub(super) penalties: Vec<(NodeId, String)>,
    /// Backward jobs still to fail.
    failing: usize,
    /// Every job the engine ran, in order.
    pub(super) ran: Vec<Job>,
    /// Gradients sent back upstream.
    answers: Vec<(NodeId, Msg)>,
}

impl World {
    pub(super) fn new(p: Pipeline) -> Self {
        Self {
            p,
            now: Instant::now(),
            sent: Vec::new(),
            asked: Vec::new(),
            penalties: Vec::new(),
            failing: 0,
            ran: Vec::new(),
            answers: Vec::new(),
        }
    }

    pub(super) fn beat(&mut self, peer: NodeId) {
        self.beat_as(peer, 1);
    }

    fn beat_as(&mut self, peer: NodeId, stage: u16) {
        let hb = Heartbeat {
            node: peer,
            network: [0; 32],
            stage,
            step: 0,
            queue: 0,
            time_ms: 0,
            every_ms: 2_000,
            leaving: false,
            arch: Default::default(),
        };
        self.p.peers.on_heartbeat(peer, &hb, self.now);
    }

    /// Carries out actions (compute at once, sends accepted at once) until none is left.
    pub(super) fn handle(&mut self, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Compute(job) => {
                    let fail = self.failing > 0 && matches!(job, Job::Backward { .. });
                    self.failing -= usize::from(fail);
                    queue.extend(self.p.on_job_done(run(&job, fail), self.now));
                    self.ran.push(job);
                }
                Action::Send { to, msg } if msg.kind() == "backward" => {
                    self.answers.push((to, msg))
                }
                Action::Send { to, msg } => {
                    let (mb, kind) = (msg.mb(), msg.kind());
                    self.sent.push((to, msg));
                    queue.extend(
                        self.p
                            .on_send_result(to, mb, kind, Ok(Ack::Accepted), self.now),
                    );
                }
                Action::NeedBatch { step } => self.asked.push(step),
                Action::Penalize { peer, reason } => self.penalties.push((peer, reason)),
                Action::Event(_) => {}
            }
        }
    }

    /// The replica holding the i-th undelivered request sends its gradient now.
    pub(super) fn answer(&mut self, i: usize) -> Ack {
        let (from, forward) = self.sent.remove(i);
        let (ack, actions) = self.p.on_message(from, gradient(&forward), self.now);
        self.handle(actions);
        ack
    }

    pub(super) fn tick(&mut self, by: Duration) {
        self.now += by;
        let actions = self.p.on_tick(self.now);
        self.handle(actions);
    }
}

#[test]
fn a_failed_backward_on_the_driver_does_not_stall_training() {
    let mut w = World::new(driver(2));
    let next = NodeId([7; 32]);
    w.beat(next);
    let start = w.p.start();
    w.handle(start);
    assert_eq!(w.asked, [0]);
    let first = w.p.on_batch(0, batch(0), Vec::new(), w.now);
    w.handle(first);
    assert_eq!(w.sent.len(), 2, "both micro-batches go downstream");
    // The first gradient's backward pass fails on the driver, the second succeeds.
    w.failing = 1;
    assert_eq!(w.answer(0), Ack::Accepted);
    assert_eq!(w.failing, 0);
    assert_eq!(w.answer(0), Ack::Accepted);
    // Nothing is left that a timeout could re-send; wait past every deadline anyway.
    w.beat(next);
    w.tick(TIMEOUT * 4);
    assert_eq!(w.asked, [0, 1], "the driver must go on to step 1");
    assert_eq!(w.p.steps_done(), 1);
    assert!(w.penalties.is_empty(), "{:?}", w.penalties);
}

#[test]
fn a_replica_answering_after_a_failover_is_not_penalised() {
    let mut w = World::new(driver(1));
    let (x, y) = (NodeId([7; 32]), NodeId([8; 32]));
    // More rounds than the penalties it takes to ban a peer (about five).
    for step in 0..8u64 {
        w.beat(x);
        w.beat(y);
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(w.sent.len(), 1);
        let slow = w.sent[0].0;
        // No gradient within the timeout: the micro-batch goes to the other replica.
        w.tick(TIMEOUT + Duration::from_millis(10));
        assert_eq!(w.sent.len(), 2, "step {step}: re-sent after the timeout");
        assert_ne!(w.sent[1].0, slow);
        // The slow replica was honest: its gradient arrives now and is used; the other
        // replica's answer comes second and is declined, with no penalty for either.
        assert_eq!(w.answer(0), Ack::Accepted, "step {step}");
        assert!(matches!(w.answer(0), Ack::Rejected(_)), "step {step}");
        assert!(w.penalties.is_empty(), "step {step}: {:?}", w.penalties);
        assert_eq!(w.asked.last(), Some(&(step + 1)));
    }
    // A replica the micro-batch never went to is still refused and penalised.
    let actions = w.p.on_batch(8, batch(8), Vec::new(), w.now);
    w.handle(actions);
    let (_, forward) = w.sent.remove(0);
    let stranger = NodeId([9; 32]);
    let (ack, actions) = w.p.on_message(stranger, gradient(&forward), w.now);
    assert!(matches!(ack, Ack::Rejected(_)));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Penalize { peer, .. } if *peer == stranger))
    );
}

#[test]
fn the_gradient_wait_grows_with_the_stages_downstream() {
    // Stage 0 of 4: the gradient crosses three later stages and back, so it may take three
    // per-stage budgets; a fixed wait resent every micro-batch of a deep pipeline.
    let mut w = World::new(replica(0, 4, 1));
    let x = NodeId([7; 32]);
    w.beat(x);
    let start = w.p.start();
    w.handle(start);
    let actions = w.p.on_batch(0, batch(0), Vec::new(), w.now);
    w.handle(actions);
    assert_eq!(w.sent.len(), 1);
    for _ in 0..2 {
        w.tick(TIMEOUT + Duration::from_millis(10));
        w.beat(x);
    }
    assert_eq!(w.sent.len(), 1, "not resent within three budgets");
    w.tick(TIMEOUT);
    w.beat(NodeId([8; 32]));
    w.tick(Duration::from_millis(10));
    assert_eq!(w.sent.len(), 2, "resent once three budgets passed");
}

/// A forward request from a stage-0 replica for its micro-batch `index` of `step`.
pub(super) fn forward_from(origin: u8, step: u64, index: u32) -> Msg {
    let mb = MicroBatchId {
        origin: [origin; 32],
        step,
        index,
    };
    forward_of(mb, (2, 4), 0.1 * f32::from(origin), 1)
}

/// A forward of `mb` with `rows` rows of `seq` positions, every value `value`, every target
/// `target`.
pub(super) fn forward_of(
    mb: MicroBatchId,
    (rows, seq): (usize, usize),
    value: f32,
    target: u32,
) -> Msg {
    Msg::Forward {
        mb,
        version: 0,
        stamp: None,
        route: Vec::new(),
        input: Payload::Hidden(
            act_codec::pack(
                &Activations {
                    batch: rows,
                    seq,
                    dim: D,
                    data: vec![value; rows * seq * D],
                },
                ActSpec::default().forward,
            )
            .expect("finite"),
        ),
        targets: vec![target; rows * seq].into(),
    }
}

/// Every backward pass ran on the weights of its own forward pass: no optimizer step between
/// them, and each step counted exactly `micro_batches` backward passes.
fn assert_exact(ran: &[Job], micro_batches: usize) {
    let mut open = BTreeSet::new();
    let mut since_step = 0;
    for job in ran {
        match job {
            Job::Forward { mb, .. } => {
                open.insert(*mb);
            }
            Job::Backward { mb, .. } => {
                open.remove(mb);
                since_step += 1;
            }
            Job::Step { step } => {
                assert!(open.is_empty(), "step {step} ran with {open:?} forwarded");
                assert_eq!(since_step, micro_batches, "step {step}");
                since_step = 0;
            }
        }
    }
}

/// Stage 1 of 3 fed by two drivers sending alternately, two micro-batches each per step, for
/// three steps; after each step's sends the stage below answers all it holds, `pick(held)`
/// choosing which of the `held` requests next.
fn feed_two_drivers(w: &mut World, pick: impl Fn(usize) -> usize) {
    let (a, b, next) = (NodeId([1; 32]), NodeId([2; 32]), NodeId([7; 32]));
    w.beat_as(next, 2);
    for step in 0..3 {
        for index in 0..2 {
            for (from, origin) in [(a, 1), (b, 2)] {
                let (ack, actions) =
                    w.p.on_message(from, forward_from(origin, step, index), w.now);
                assert_eq!(ack, Ack::Accepted);
                w.handle(actions);
            }
        }
        while !w.sent.is_empty() {
            w.beat_as(next, 2);
            let i = pick(w.sent.len());
            assert_eq!(w.answer(i), Ack::Accepted);
        }
    }
}

#[test]
fn a_middle_stage_fed_by_two_drivers_never_steps_between_a_forward_and_its_backward() {
    // Stage 1 of 3, two micro-batches per step, two drivers sending alternately.
    let mut w = World::new(replica(1, 3, 2));
    // Downstream answers whatever it holds, oldest first, until nothing is left.
    feed_two_drivers(&mut w, |_| 0);
    assert_eq!(w.p.steps_done(), 6, "12 micro-batches, 2 per step");
    assert_exact(&w.ran, 2);
    assert_eq!(w.answers.len(), 12, "every sender gets its gradient");
}

/// A replica of the first stage that is not a micro-batch's driver sends that micro-batch's
/// activations on (it was handed the driver's stamp by a colluding receiver): the stage after
/// refuses and penalises it, and trains nothing of it; the driver's own forward is taken.
/// Before, any key registered for the first stage got its activations trained in under
/// another driver's stamp. A later hop may come from any replica (failover).
#[test]
fn a_first_hop_from_another_replica_than_the_driver_is_refused() {
    let mut w = World::new(replica(1, 2, 2));
    let (driver, other) = (NodeId([1; 32]), NodeId([2; 32]));
    let (ack, actions) = w.p.on_message(other, forward_from(1, 0, 0), w.now);
    w.handle(actions);
    assert!(
        matches!(ack, Ack::Rejected(ref r) if r.contains("first hop")),
        "{ack:?}"
    );
    assert!(w.penalties.iter().any(|(p, _)| *p == other));
    assert!(w.ran.is_empty(), "nothing of it trained");
    let (ack, actions) = w.p.on_message(driver, forward_from(1, 0, 0), w.now);
    w.handle(actions);
    assert_eq!(ack, Ack::Accepted);
    assert!(!w.ran.is_empty());
    let mut later = World::new(replica(2, 3, 2));
    let (ack, _) = later.p.on_message(other, forward_from(1, 0, 0), later.now);
    assert_eq!(ack, Ack::Accepted, "a later hop after a failover");
}

#[test]
fn a_repeated_micro_batch_is_computed_and_counted_once() {
    // The last stage of 3 (a micro-batch's later hops may fail over), two micro-batches per
    // step.
    let mut w = World::new(replica(2, 3, 2));
    let (a, b) = (NodeId([1; 32]), NodeId([2; 32]));
    let send = |w: &mut World, from: NodeId, msg: Msg| {
        let (ack, actions) = w.p.on_message(from, msg, w.now);
        w.handle(actions);
        ack
    };
    assert_eq!(send(&mut w, a, forward_from(1, 0, 0)), Ack::Accepted);
    assert_eq!(w.answers.len(), 1);
    // The sender lost the answer and asks again: it gets the same answer, nothing is recomputed.
    assert_eq!(send(&mut w, a, forward_from(1, 0, 0)), Ack::Accepted);
    assert_eq!(w.answers.len(), 2);
    assert_eq!(w.answers[0], w.answers[1]);
    assert_eq!(w.p.steps_done(), 0, "one micro-batch counted, not two");
    assert_eq!(send(&mut w, a, forward_from(1, 0, 1)), Ack::Accepted);
    assert_eq!(w.p.steps_done(), 1);
    // Another sender with the same micro-batch (its upstream failed over) is computed for
    // afresh, never penalised: its input differs, and it may have no other replica to go to.
    assert_eq!(send(&mut w, b, forward_from(1, 0, 0)), Ack::Accepted);
    assert!(w.penalties.is_empty());
    assert_eq!(w.answers.last().map(|(to, _)| *to), Some(b));
    // ...and asking again gets that answer, not a third computation.
    assert_eq!(send(&mut w, b, forward_from(1, 0, 0)), Ack::Accepted);
    assert_exact(&w.ran, 2);
    let backwards = w.ran.iter().filter(|j| matches!(j, Job::Backward { .. }));
    assert_eq!(backwards.count(), 3);
}

#[test]
fn a_micro_batch_repeated_while_queued_runs_once_for_the_latest_sender() {
    // Stage 2 of 4 (a micro-batch's later hops may fail over; its first comes from its
    // driver only): the engine is kept busy so requests queue.
    let mut w = World::new(replica(2, 4, 2));
    let (a, b, next) = (NodeId([1; 32]), NodeId([2; 32]), NodeId([7; 32]));
    w.beat_as(next, 3);
    // Two micro-batches fill the step; the third waits for it.
    for index in 0..2 {
        let (_, actions) = w.p.on_message(a, forward_from(1, 0, index), w.now);
        w.handle(actions);
    }
    let (ack, actions) = w.p.on_message(a, forward_from(1, 1, 0), w.now);
    assert_eq!(ack, Ack::Accepted);
    w.handle(actions);
    // Its sender failed over: the same micro-batch arrives from b; it replaces the queued one.
    let (ack, actions) = w.p.on_message(b, forward_from(1, 1, 0), w.now);
    assert_eq!(ack, Ack::Accepted);
    w.handle(actions);
    while !w.sent.is_empty() {
        w.beat_as(next, 3);
        w.answer(0);
    }
    let forwards: Vec<&Job> = w
        .ran
        .iter()
        .filter(|j| matches!(j, Job::Forward { .. }))
        .collect();
    assert_eq!(forwards.len(), 3, "the repeat ran once");
    assert_exact(&w.ran, 2);
    let last = w.answers.last().expect("answered");
    assert_eq!(
        last.0, b,
        "the gradient goes to the sender that holds the path now"
    );
}

/// The weights each job ran at, checked as it ran: a backward pass at its own forward pass's
/// weights, every job at most `lag` steps behind the current ones and never ahead, a
/// backward pass only for the step about to run, and exactly `micro_batches` per step.
fn assert_consistent(ran: &[Job], micro_batches: usize, lag: u64) {
    let mut forward_at = BTreeMap::new();
    let (mut steps, mut since_step) = (0u64, 0);
    for job in ran {
        match job {
            Job::Forward { mb, weights, .. } => {
                assert!(
                    *weights <= steps && steps - weights <= lag,
                    "{job:?} at step {steps}"
                );
                forward_at.insert(*mb, *weights);
            }
            Job::Backward { mb, weights, .. } => {
                assert!(
                    *weights <= steps && steps - weights <= lag,
                    "{job:?} at step {steps}"
                );
                if let Some(at) = forward_at.remove(mb) {
                    assert_eq!(at, *weights, "{mb:?}: backward at other weights");
                }
                assert_eq!(
                    *weights,
                    steps.saturating_sub(lag),
                    "{mb:?} counts toward step {steps}"
                );
                since_step += 1;
            }
            Job::Step { step } => {
                assert_eq!(*step, steps);
                assert_eq!(since_step, micro_batches, "step {step}");
                assert!(
                    forward_at.values().all(|w| step - w < lag.max(1)),
                    "step {step} leaves a forward pass {lag} steps behind: {forward_at:?}"
                );
                since_step = 0;
                steps += 1;
            }
        }
    }
}

#[test]
fn without_a_weight_lag_the_driver_asks_for_one_step_at_a_time() {
    let mut w = World::new(driver(2));
    w.beat(NodeId([7; 32]));
    let start = w.p.start();
    w.handle(start);
    assert_eq!(w.asked, [0]);
    let first = w.p.on_batch(0, batch(0), Vec::new(), w.now);
    w.handle(first);
    assert_eq!(w.asked, [0], "step 1 waits for step 0 (a flush)");
    w.answer(0);
    w.answer(0);
    assert_eq!(w.asked, [0, 1]);
    assert_consistent(&w.ran, 2, 0);
}

#[test]
fn with_a_weight_lag_the_driver_sends_the_next_step_while_the_last_one_drains() {
    let mut w = World::new(lagging(0, 2, 2, 1));
    let next = NodeId([7; 32]);
    w.beat(next);
    let start = w.p.start();
    w.handle(start);
    assert_eq!(w.asked, [0, 1], "two steps in flight");
    for step in 0..2 {
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
    }
    assert_eq!(w.sent.len(), 4, "both steps' micro-batches went downstream");
    for step in 2..6u64 {
        // The oldest step's gradients come back: it runs, and the driver asks for the one
        // after the step still in flight, never a third.
        w.beat(next);
        w.answer(0);
        w.answer(0);
        assert_eq!(w.p.steps_done(), step - 1);
        assert_eq!(w.asked.last(), Some(&step));
        let actions = w.p.on_batch(step, batch(step), Vec::new(), w.now);
        w.handle(actions);
        assert_eq!(w.sent.len(), 4, "step {step}: at most two steps in flight");
    }
    assert_consistent(&w.ran, 2, 1);
    assert!(w.penalties.is_empty(), "{:?}", w.penalties);
}

#[test]
fn a_lagging_stage_never_runs_a_later_steps_backward_before_the_current_step() {
    // Stage 1 of 3, lag 1, fed by two drivers; downstream answers the newest micro-batch
    // first, so gradients of the next step come back before the current step's.
    let mut w = World::new(lagging(1, 3, 2, 1));
    feed_two_drivers(&mut w, |held| held - 1);
    assert_eq!(w.p.steps_done(), 6, "12 micro-batches, 2 per step");
    assert_consistent(&w.ran, 2, 1);
    assert_eq!(w.answers.len(), 12, "every sender gets its gradient");
}

#[path = "version_tests.rs"]
mod versions;

/// A replica leaving its stage (a mover) finishes what it holds and takes nothing new: the
/// driver asks for no further batch and drops one asked for earlier; a later stage answers
/// new forwards Busy, which costs their sender nothing.
#[test]
fn a_draining_replica_finishes_its_work_and_takes_no_more() {
    let mut w = World::new(lagging(0, 2, 2, 1));
    let next = NodeId([7; 32]);
    w.beat(next);
    let start = w.p.start();
    w.handle(start);
    assert_eq!(w.asked, [0, 1], "a weight lag of 1 asks one step ahead");
    let actions = w.p.on_batch(0, batch(0), Vec::new(), w.now);
    w.handle(actions);
    assert_eq!(w.sent.len(), 2);
    w.p.drain();
    assert!(!w.p.idle(), "step 0's micro-batches are downstream");
    // Step 1's batch, asked for before the drain, starts nothing.
    let late = w.p.on_batch(1, batch(1), Vec::new(), w.now);
    assert!(late.is_empty(), "{late:?}");
    while !w.sent.is_empty() {
        w.beat(next);
        assert_eq!(w.answer(0), Ack::Accepted);
    }
    assert_eq!(w.p.steps_done(), 1, "step 0 completes");
    assert!(w.p.idle());
    assert_eq!(w.asked, [0, 1], "no batch asked for after the drain");
    w.tick(TIMEOUT * 4);
    assert!(w.sent.is_empty() && w.p.idle());

    // The last stage: Accepted before, Busy after (no penalty), and what it admitted before
    // is answered.
    let mut w = World::new(replica(1, 2, 2));
    let a = NodeId([1; 32]);
    let (ack, actions) = w.p.on_message(a, forward_from(1, 0, 0), w.now);
    assert_eq!(ack, Ack::Accepted);
    w.p.drain();
    w.handle(actions);
    assert_eq!(w.answers.len(), 1, "admitted before the drain: answered");
    let (ack, actions) = w.p.on_message(a, forward_from(1, 0, 1), w.now);
    assert_eq!(ack, Ack::Busy);
    assert!(actions.is_empty(), "{actions:?}");
    assert!(w.penalties.is_empty());
    assert!(
        w.p.idle(),
        "step 0 waits for a micro-batch that will not come"
    );
}

/// The service time routing ranks replicas by is measured on the instants the pipeline is
/// handed (virtual in the simulator), never on the wall clock, or one seed could route
/// differently from run to run: jobs dispatched and done at one instant, an hour ahead of
/// the wall clock, took no time.
#[test]
fn the_service_estimate_is_measured_on_the_instants_it_is_given() {
    let mut w = World::new(driver(2));
    w.now += Duration::from_secs(3600);
    w.beat(NodeId([7; 32]));
    let start = w.p.start();
    w.handle(start);
    let first = w.p.on_batch(0, batch(0), Vec::new(), w.now);
    w.handle(first);
    assert!(!w.ran.is_empty());
    assert!(
        w.p.service <= Duration::from_millis(20),
        "{:?}",
        w.p.service
    );
}
