//! Deterministic in-process simulation: pipeline state machines and real engines, joined by
//! a message bus instead of sockets.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_model::{AdamW, AdamWConfig, Batch, ModelConfig, Stage, StageSpec, Trainer};
use neuroshard_node::act_codec::{ActSpec, Packed, Scheme, pack};
use neuroshard_node::compute::Engine;
use neuroshard_node::core::TransferError;
use neuroshard_node::events::{Clock, NodeEvent};
use neuroshard_node::records::Heartbeat;
use neuroshard_node::wire::Msg;
use neuroshard_node::{Action, Pipeline, PipelineConfig};
use neuroshard_proof::{Canonical, NodeId};
use rand::{Rng, SeedableRng};

fn config() -> ModelConfig {
    ModelConfig {
        layers: 3,
        d_model: 32,
        heads: 4,
        kv_heads: 2,
        ffn: 64,
        vocab: 50,
        max_seq: 16,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    }
}

fn optim() -> AdamWConfig {
    AdamWConfig {
        lr: 3e-3,
        warmup_steps: 2,
        total_steps: 20,
        // Each stage clips its own gradient norm; the single process clips the global one.
        // Exactness holds with clipping off (see the crate README).
        clip_norm: None,
        ..Default::default()
    }
}

fn batch(step: u64) -> Batch {
    let mut rng = rand::rngs::StdRng::seed_from_u64(step);
    let windows: Vec<Vec<u32>> = (0..4)
        .map(|_| (0..13).map(|_| rng.random_range(0..50)).collect())
        .collect();
    Batch::from_windows(&windows, 12).expect("batch")
}

struct Replica {
    peer: NodeId,
    stage: usize,
    pipeline: Pipeline,
    engine: Engine,
    alive: bool,
}

struct Sim {
    replicas: Vec<Replica>,
    /// (to, from, message) in flight.
    bus: VecDeque<(NodeId, NodeId, Msg)>,
    losses: Vec<f32>,
    failovers: usize,
    steps_per_stage: HashMap<usize, u64>,
}

impl Sim {
    fn new(layout: &[usize], steps: u64, micro: usize, activations: ActSpec) -> Self {
        Self::with_lag(layout, steps, micro, activations, 0)
    }

    fn with_lag(
        layout: &[usize],
        steps: u64,
        micro: usize,
        activations: ActSpec,
        weight_lag: u64,
    ) -> Self {
        let cfg = config();
        let specs = StageSpec::split(&cfg, layout.len()).expect("split");
        let mut replicas = Vec::new();
        for (s, &n) in layout.iter().enumerate() {
            for r in 0..n {
                let stage = Stage::init(cfg.clone(), specs[s], 7).expect("stage");
                let opt = AdamW::new(optim(), stage.params());
                let pcfg = PipelineConfig {
                    stage: s,
                    layouts: neuroshard_node::layout::Layouts::fixed(&cfg, layout.len())
                        .expect("layout"),
                    version_every: 1,
                    model: cfg.clone(),
                    micro_batches: micro,
                    queue_capacity: 8,
                    candidates: 3,
                    grad_timeout: Duration::from_secs(30),
                    retry_after: Duration::from_millis(1),
                    steps,
                    clock: Clock::new(std::time::Instant::now(), 0),
                    activations,
                    max_rows: 4,
                    min_rows: 1,
                    seq: 12,
                    weight_lag,
                };
                // A node's peer id is its pipeline's id: a micro-batch's first hop must come
                // from its driver.
                let mut node = [0u8; 32];
                node[0] = s as u8;
                node[1] = r as u8;
                let peer = NodeId(node);
                replicas.push(Replica {
                    peer,
                    stage: s,
                    pipeline: Pipeline::new(pcfg, node, 0),
                    engine: Engine::new(stage, opt, None).with_weight_lag(weight_lag),
                    alive: true,
                });
            }
        }
        // Everyone hears everyone's heartbeat.
        let beats: Vec<(NodeId, usize)> = replicas.iter().map(|r| (r.peer, r.stage)).collect();
        for r in &mut replicas {
            for &(p, s) in &beats {
                if p != r.peer {
                    let hb = heartbeat_of(s as u16);
                    r.pipeline.peers.on_heartbeat(p, &hb, Instant::now());
                }
            }
        }
        Sim {
            replicas,
            bus: VecDeque::new(),
            losses: Vec::new(),
            failovers: 0,
            steps_per_stage: HashMap::new(),
        }
    }

    fn idx(&self, peer: NodeId) -> Option<usize> {
        self.replicas.iter().position(|r| r.peer == peer)
    }

    /// Carries out actions of replica `i` until nothing is left; compute runs at once.
    fn apply(&mut self, i: usize, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            let me = self.replicas[i].peer;
            match a {
                Action::Send { to, msg } => {
                    // Round-trip through the wire encoding, as the runtime does.
                    let msg = Msg::from_canonical_bytes(&msg.to_canonical_bytes()).expect("codec");
                    self.bus.push_back((to, me, msg));
                }
                Action::Compute(job) => {
                    let done = self.replicas[i].engine.run(job);
                    queue.extend(self.replicas[i].pipeline.on_job_done(done, Instant::now()));
                }
                Action::NeedBatch { step } => {
                    queue.extend(self.replicas[i].pipeline.on_batch(
                        step,
                        batch(step),
                        Vec::new(),
                        Instant::now(),
                    ));
                }
                Action::Penalize { reason, .. } => panic!("unexpected penalty: {reason}"),
                Action::Event(NodeEvent::Step { stage, loss, .. }) => {
                    *self.steps_per_stage.entry(stage).or_default() += 1;
                    if let Some(l) = loss {
                        self.losses.push(l);
                    }
                }
                Action::Event(NodeEvent::Failover { .. }) => self.failovers += 1,
                Action::Event(_) => {}
            }
        }
    }

    fn run(&mut self, kill: Option<(usize, usize)>) {
        for i in 0..self.replicas.len() {
            let a = self.replicas[i].pipeline.start();
            self.apply(i, a);
        }
        let mut delivered = 0usize;
        while let Some((to, from, msg)) = self.bus.pop_front() {
            delivered += 1;
            if let Some((after, victim)) = kill
                && delivered == after
            {
                self.replicas[victim].alive = false;
                let dead = self.replicas[victim].peer;
                for i in 0..self.replicas.len() {
                    if self.replicas[i].alive {
                        let a =
                            self.replicas[i]
                                .pipeline
                                .on_peer_down(dead, "killed", Instant::now());
                        self.apply(i, a);
                    }
                }
            }
            let (mb, kind) = (msg.mb(), msg.kind());
            let Some(from_i) = self.idx(from) else {
                continue;
            };
            let result = match self.idx(to) {
                Some(t) if self.replicas[t].alive => {
                    let (ack, actions) =
                        self.replicas[t]
                            .pipeline
                            .on_message(from, msg, Instant::now());
                    self.apply(t, actions);
                    Ok(ack)
                }
                _ => Err(TransferError("connection closed".to_string())),
            };
            if self.replicas[from_i].alive {
                let a = self.replicas[from_i].pipeline.on_send_result(
                    to,
                    mb,
                    kind,
                    result,
                    Instant::now(),
                );
                self.apply(from_i, a);
            }
            // Retries wait for a tick.
            if self.bus.is_empty() {
                for i in 0..self.replicas.len() {
                    if self.replicas[i].alive {
                        let a = self.replicas[i]
                            .pipeline
                            .on_tick(Instant::now() + Duration::from_millis(5));
                        self.apply(i, a);
                    }
                }
            }
            assert!(delivered < 100_000, "simulation did not settle");
        }
    }
}

/// One process's losses over `steps`, and its trainer after them.
fn reference(steps: u64) -> (Vec<f32>, Trainer) {
    reference_with_lag(steps, 0)
}

/// The same with each gradient taken `lag` steps behind the weights it updates.
fn reference_with_lag(steps: u64, lag: usize) -> (Vec<f32>, Trainer) {
    let mut trainer = Trainer::new(config(), optim(), 7).expect("trainer");
    trainer.micro_batches = 2;
    trainer.weight_lag = lag;
    let losses = (0..steps)
        .map(|s| trainer.step(&batch(s)).expect("step").loss)
        .collect();
    (losses, trainer)
}

/// Compressed boundaries: every step runs, the losses stay near the exact ones, and two runs
/// give the same bits (packing is deterministic and both sides compute on what was sent).
#[test]
fn compressed_pipelines_train_close_to_one_process_and_reproducibly() {
    let steps = 12;
    let (reference, _) = reference(steps);
    for spec in ["bf16", "int8", "int8/int4", "int4"] {
        let spec: ActSpec = spec.parse().expect("spec");
        let mut sim = Sim::new(&[1, 1, 1], steps, 2, spec);
        sim.run(None);
        assert_eq!(sim.losses.len(), steps as usize, "{spec}");
        for (got, want) in sim.losses.iter().zip(&reference) {
            assert!((got - want).abs() <= 0.05 * want, "{spec}: {got} vs {want}");
        }
        let mut again = Sim::new(&[1, 1, 1], steps, 2, spec);
        again.run(None);
        let bits = |s: &Sim| s.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sim), bits(&again), "{spec}");
    }
}

/// A 3-stage run of `steps` computed what one process computes with the same weight lag: the
/// same losses and weights to 1e-4, every stage stepping once per driver step.
fn assert_one_process(sim: &Sim, steps: u64, lag: usize) {
    let (reference, trainer) = reference_with_lag(steps, lag);
    assert_eq!(sim.losses.len(), steps as usize);
    for (got, want) in sim.losses.iter().zip(&reference) {
        assert!(
            (got - want).abs() <= 1e-4,
            "lag {lag}: pipeline {got} vs single process {want}"
        );
    }
    for s in 0..3 {
        assert_eq!(sim.steps_per_stage.get(&s), Some(&steps));
    }
    let diff = max_weight_diff(sim, &trainer);
    assert!(diff <= 1e-4, "lag {lag}: weights differ by {diff}");
}

#[test]
fn three_stage_pipeline_matches_one_process() {
    let steps = 12;
    let mut sim = Sim::new(&[1, 1, 1], steps, 2, ActSpec::UNCOMPRESSED);
    sim.run(None);
    assert_one_process(&sim, steps, 0);
}

/// The largest difference between the replicas' weights and the one-process model's.
fn max_weight_diff(sim: &Sim, trainer: &Trainer) -> f32 {
    let full = trainer.stage.params();
    let mut worst = 0.0f32;
    for r in &sim.replicas {
        let params = r.engine.params();
        for (spec, values) in params.specs().iter().zip(params.values()) {
            let want = full.get(&spec.name).expect("same parameter names");
            let diff = values
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            worst = worst.max(diff);
        }
    }
    worst
}

/// Overlapped steps (a weight lag of 1): the pipeline computes what one process computes
/// when each step's gradient is taken one step behind, to 1e-4, and not what it computes
/// without the delay.
#[test]
fn an_overlapped_pipeline_matches_one_process_training_one_step_behind() {
    let steps = 12;
    let mut sim = Sim::with_lag(&[1, 1, 1], steps, 2, ActSpec::UNCOMPRESSED, 1);
    sim.run(None);
    assert_one_process(&sim, steps, 1);
    let (_, plain) = reference(steps);
    let apart = max_weight_diff(&sim, &plain);
    assert!(
        apart > 1e-3,
        "the delay changes the run ({apart}), or this test proves nothing"
    );
}

#[test]
fn training_survives_a_dead_replica() {
    // Driver, two replicas of the middle stage, one validator; the middle replica that gets
    // work first dies early in the run. Flushed and overlapped steps alike.
    for lag in [0, 1] {
        let steps = 5;
        let mut sim = Sim::with_lag(&[1, 2, 1], steps, 2, ActSpec::default(), lag);
        sim.run(Some((3, 1)));
        assert_eq!(
            sim.losses.len(),
            steps as usize,
            "lag {lag}: driver finished every step"
        );
        assert!(sim.losses.iter().all(|l| l.is_finite()));
    }
}

#[test]
fn forged_gradient_is_rejected_without_state_change() {
    let mut sim = Sim::new(&[1, 1], 1, 1, ActSpec::default());
    let stranger = NodeId(rand::random());
    let driver = &mut sim.replicas[0].pipeline;
    let grad = pack(
        &neuroshard_model::Activations {
            batch: 1,
            seq: 2,
            dim: 32,
            data: vec![0.0; 64],
        },
        Scheme::Int4,
    )
    .expect("pack");
    let mb = neuroshard_node::wire::MicroBatchId {
        origin: [9; 32],
        step: 0,
        index: 0,
    };
    let (ack, actions) = driver.on_message(
        stranger,
        Msg::Backward {
            mb,
            grad,
            loss: 1.0,
        },
        Instant::now(),
    );
    assert!(matches!(ack, neuroshard_node::wire::Ack::Rejected(_)));
    assert!(actions.iter().any(|a| matches!(a, Action::Penalize { .. })));
    assert_eq!(driver.queue_depth(), 0);
}

#[test]
fn a_full_queue_answers_busy() {
    let pcfg = PipelineConfig {
        stage: 1,
        layouts: neuroshard_node::layout::Layouts::fixed(&config(), 2).expect("layout"),
        version_every: 1,
        model: config(),
        micro_batches: 1,
        queue_capacity: 1,
        candidates: 3,
        grad_timeout: Duration::from_secs(30),
        retry_after: Duration::from_millis(1),
        steps: 0,
        clock: Clock::new(std::time::Instant::now(), 0),
        activations: "f32".parse().expect("spec"),
        max_rows: 1,
        min_rows: 1,
        seq: 4,
        weight_lag: 0,
    };
    let mut validator = Pipeline::new(pcfg, [1; 32], 0);
    // The micro-batches' driver: their first hop comes from it.
    let driver = NodeId([2; 32]);
    validator
        .peers
        .on_heartbeat(driver, &heartbeat_of(0), Instant::now());
    let forward = |index: u32| Msg::Forward {
        mb: neuroshard_node::wire::MicroBatchId {
            origin: [2; 32],
            step: 0,
            index,
        },
        version: 0,
        stamp: None,
        route: Vec::new(),
        input: neuroshard_node::wire::Payload::Hidden(hidden(0.1)),
        targets: vec![1, 2, 3, 4].into(),
    };
    use neuroshard_node::wire::Ack;
    // The first goes straight to the idle engine, the second waits in the queue, the third
    // finds the queue full.
    let (a, actions) = validator.on_message(driver, forward(0), Instant::now());
    assert_eq!(a, Ack::Accepted);
    assert!(matches!(actions.as_slice(), [Action::Compute(_)]));
    assert_eq!(
        validator.on_message(driver, forward(1), Instant::now()).0,
        Ack::Accepted
    );
    assert_eq!(
        validator.on_message(driver, forward(2), Instant::now()).0,
        Ack::Busy
    );
    assert_eq!(validator.queue_depth(), 2);
    // NaN activations are refused and penalised.
    let mut bad = forward(3);
    if let Msg::Forward {
        input: neuroshard_node::wire::Payload::Hidden(a),
        ..
    } = &mut bad
    {
        let mut bytes = a.bytes().to_vec();
        bytes[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
        let (b, s, d) = a.shape();
        *a = Packed::from_parts(Scheme::F32, b, s, d, bytes).expect("same length");
    }
    let (ack, actions) = validator.on_message(driver, bad, Instant::now());
    assert!(matches!(ack, Ack::Rejected(_)), "{ack:?}");
    assert!(actions.iter().any(|a| matches!(a, Action::Penalize { .. })));
}

fn hidden(x: f32) -> Packed {
    let a = neuroshard_model::Activations {
        batch: 1,
        seq: 4,
        dim: 32,
        data: vec![x; 128],
    };
    pack(&a, Scheme::F32).expect("pack")
}

fn heartbeat_of(stage: u16) -> Heartbeat {
    Heartbeat {
        node: NodeId([0; 32]),
        network: [0; 32],
        stage,
        step: 0,
        queue: 0,
        time_ms: 0,
        every_ms: 2_000,
        leaving: false,
        arch: Default::default(),
    }
}

/// The last stage of a 2-stage network taking `spec`, and a driver it heard from.
fn last_stage(spec: &str) -> (Pipeline, NodeId) {
    let pcfg = PipelineConfig {
        stage: 1,
        layouts: neuroshard_node::layout::Layouts::fixed(&config(), 2).expect("layout"),
        version_every: 1,
        model: config(),
        micro_batches: 1,
        queue_capacity: 4,
        candidates: 3,
        grad_timeout: Duration::from_secs(30),
        retry_after: Duration::from_millis(1),
        steps: 0,
        clock: Clock::new(std::time::Instant::now(), 0),
        activations: spec.parse().expect("spec"),
        max_rows: 2,
        min_rows: 1,
        seq: 4,
        weight_lag: 0,
    };
    let mut p = Pipeline::new(pcfg, [1; 32], 0);
    // The driver of `forward_of`'s micro-batch.
    let driver = NodeId([2; 32]);
    p.peers
        .on_heartbeat(driver, &heartbeat_of(0), Instant::now());
    (p, driver)
}

fn forward_of(hidden: Packed, rows: usize) -> Msg {
    Msg::Forward {
        mb: neuroshard_node::wire::MicroBatchId {
            origin: [2; 32],
            step: 0,
            index: 0,
        },
        version: 0,
        stamp: None,
        route: Vec::new(),
        input: neuroshard_node::wire::Payload::Hidden(hidden),
        targets: vec![1; rows * 4].into(),
    }
}

fn values(rows: usize) -> neuroshard_model::Activations {
    neuroshard_model::Activations {
        batch: rows,
        seq: 4,
        dim: 32,
        data: (0..rows * 128).map(|i| (i as f32 * 0.7).sin()).collect(),
    }
}

/// The receiving stage computes on exactly the values the packed bytes decode to.
#[test]
fn the_receiver_computes_on_the_decoded_values() {
    let (mut p, driver) = last_stage("int4/int8");
    let packed = pack(&values(1), Scheme::Int4).expect("pack");
    let (ack, actions) = p.on_message(driver, forward_of(packed.clone(), 1), Instant::now());
    assert_eq!(ack, neuroshard_node::wire::Ack::Accepted);
    let [Action::Compute(neuroshard_node::Job::Backward { input, .. })] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    let decoded = packed
        .unpack(&neuroshard_node::act_codec::Expect {
            scheme: Scheme::Int4,
            dim: 32,
            max_batch: 1,
            max_seq: 4,
        })
        .expect("valid");
    assert_ne!(decoded, values(1), "int4 is lossy");
    assert_eq!(
        input,
        &neuroshard_model::StageInput::Hidden(decoded),
        "bit for bit"
    );
}

/// Activations in a scheme other than the network's, or more rows than a micro-batch has,
/// are refused and the sender penalised, before anything is queued.
#[test]
fn another_scheme_or_an_oversized_micro_batch_is_refused() {
    let (mut p, driver) = last_stage("int8/int4");
    for (msg, why) in [
        (
            forward_of(pack(&values(1), Scheme::F32).expect("pack"), 1),
            "f32",
        ),
        (
            forward_of(pack(&values(3), Scheme::Int8).expect("pack"), 3),
            "larger than a micro-batch",
        ),
    ] {
        let (ack, actions) = p.on_message(driver, msg, Instant::now());
        let neuroshard_node::wire::Ack::Rejected(reason) = ack else {
            panic!("{ack:?}");
        };
        assert!(reason.contains(why), "{reason}");
        assert!(actions.iter().any(|a| matches!(a, Action::Penalize { .. })));
        assert_eq!(p.queue_depth(), 0);
    }
    let ok = forward_of(pack(&values(2), Scheme::Int8).expect("pack"), 2);
    assert_eq!(
        p.on_message(driver, ok, Instant::now()).0,
        neuroshard_node::wire::Ack::Accepted
    );
}
