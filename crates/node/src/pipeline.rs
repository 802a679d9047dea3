//! The micro-batched pipeline of one stage replica, as a sans-IO state machine.
//!
//! Inputs: messages from other replicas, finished compute jobs, send results, peer deaths,
//! batches (driver) and clock ticks. Outputs: [`Action`]s the runtime carries out. Compute
//! happens elsewhere (one job at a time, in the order this machine dispatches them), so the
//! machine decides every ordering that matters for exactness: backward work before forward
//! work, which optimizer step each micro-batch counts toward and at which weights it is
//! computed (see `schedule.rs`), and a stage's optimizer step as soon as its micro-batches are
//! done, before anything else touches its weights.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_model::{Activations, Batch, ModelConfig, StageInput, Tokens, Upstream};
use neuroshard_proof::{Hash32, NodeId, Signed};

use crate::act_codec::{self, ActSpec, Expect, Scheme};
use crate::core::TransferError;
use crate::events::{Clock, NodeEvent};
use crate::layout::{Layout, Layouts};
use crate::peers::PeerTable;
use crate::records::Role;
use crate::router;
use crate::wire::{Ack, DriverStamp, Handoff, MicroBatchId, Msg, Payload, TargetWindow, Targets};
use norms::{Admitted, NormWindow};
pub use refusal::Refusal;

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub stage: usize,
    /// The stage orders of every architecture version this node knows (see `layout.rs`).
    pub layouts: Layouts,
    /// Driver: steps between the points where it may start a newer version (a DiLoCo round,
    /// so no round of its pipeline mixes versions).
    pub version_every: u64,
    pub model: ModelConfig,
    /// Backward passes a replica accumulates per optimizer step (= micro-batches per step).
    pub micro_batches: usize,
    /// Forward work items a replica queues before it answers Busy (back-pressure).
    pub queue_capacity: usize,
    /// Replicas of the next stage considered per send.
    pub candidates: usize,
    /// Budget per downstream stage: a sent micro-batch whose gradient has not come back
    /// within this times the stages after this one is sent elsewhere (see `grad_wait`).
    pub grad_timeout: Duration,
    /// Pause before retrying when every candidate was busy or none is alive.
    pub retry_after: Duration,
    /// Driver: optimizer steps to run (0: until stopped).
    pub steps: u64,
    /// Time of the events it reports.
    pub clock: Clock,
    /// How activations and gradients travel, and the most rows a peer may send in one
    /// micro-batch (rows per driver step / micro-batches, rounded up).
    pub activations: ActSpec,
    pub max_rows: usize,
    /// The fewest rows an honest micro-batch has (rows per driver step / micro-batches,
    /// rounded down) and its length: the shapes a peer's micro-batch must have.
    pub min_rows: usize,
    pub seq: usize,
    /// Optimizer steps between the weights a micro-batch is computed at and those its
    /// gradient is applied to: 0 (drivers flush between steps; one replica per stage equals
    /// one process) or 1 (the next step's micro-batches enter while the last step drains,
    /// PipeDream-2BW; see `schedule.rs`).
    pub weight_lag: u64,
}

/// Work for the compute engine. `weights` is the optimizer step whose weights the job runs
/// at: the engine's current ones or, with a weight lag of 1, those before its last step.
#[derive(Debug, Clone, PartialEq)]
pub enum Job {
    /// Output of this stage's layers (not the last stage).
    Forward {
        mb: MicroBatchId,
        input: StageInput,
        weights: u64,
        /// The genesis window of each row of token input (empty for hidden states): what the
        /// first stage's commitment names with its tokens.
        genesis: Vec<TargetWindow>,
    },
    /// Vector–Jacobian product; the parameter gradients stay in the engine, accumulated.
    Backward {
        mb: MicroBatchId,
        input: StageInput,
        upstream: Upstream,
        weights: u64,
        genesis: Vec<TargetWindow>,
    },
    /// Apply the accumulated gradients with AdamW and clear them.
    Step { step: u64 },
}

/// A finished job.
#[derive(Debug, Clone, PartialEq)]
pub enum JobDone {
    Forward {
        mb: MicroBatchId,
        output: Activations,
    },
    Backward {
        mb: MicroBatchId,
        input_grad: Option<Activations>,
        loss: Option<f32>,
    },
    Step {
        step: u64,
        lr: f64,
        grad_norm: f64,
        model_hash: Hash32,
    },
    Failed {
        mb: Option<MicroBatchId>,
        error: String,
    },
}

/// What the runtime must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a request; report the outcome with [`Pipeline::on_send_result`].
    Send {
        to: NodeId,
        msg: Msg,
    },
    Compute(Job),
    /// Driver: load the batch of `step` and hand it to [`Pipeline::on_batch`].
    NeedBatch {
        step: u64,
    },
    Penalize {
        peer: NodeId,
        reason: String,
    },
    Event(NodeEvent),
}

/// What a micro-batch carries besides its tensors: its id, the version its driver started
/// it under, the driver's stamp and the hand-offs that brought it here.
type Provenance = (
    MicroBatchId,
    u32,
    Option<Signed<DriverStamp>>,
    Vec<Signed<Handoff>>,
);

#[derive(Debug, Clone)]
struct Stashed {
    /// The architecture version it runs under: where its output goes.
    version: u32,
    /// Its driver's signature of it and its version, passed on with our output (None on
    /// the driver, whose node signs as it sends).
    stamp: Option<Signed<DriverStamp>>,
    /// The hand-offs that brought it here, passed on with our output (empty on the driver).
    route: Vec<Signed<Handoff>>,
    input: StageInput,
    targets: Targets,
    /// Who sent the input and gets our input gradient (None on the driver).
    upstream: Option<NodeId>,
    /// Loss reported with the gradient, passed upstream.
    loss: Option<f32>,
    /// The gradient of our output, once it came back (its backward pass is then queued).
    grad: Option<Activations>,
    since: Instant,
}

#[derive(Debug, Clone)]
enum SendState {
    /// Request on the wire, no answer yet.
    Sending,
    /// Accepted downstream; waiting for the gradient.
    Accepted,
    /// Waiting to retry.
    Waiting(Instant),
}

#[derive(Debug, Clone)]
struct Outstanding {
    msg: Msg,
    to: Option<NodeId>,
    state: SendState,
    sent_at: Instant,
    tried: BTreeSet<NodeId>,
    /// Set while recovering from a failure: (previous replica, reason, noticed at).
    failover: Option<(NodeId, String, Instant)>,
    /// Whether "no live replica" was already reported for it.
    warned: bool,
}

/// One stage replica's pipeline state.
#[derive(Debug)]
pub struct Pipeline {
    cfg: PipelineConfig,
    node: [u8; 32],
    /// Norms of the activations and output gradients peers sent us (see `norms.rs`).
    forward_norms: NormWindow,
    backward_norms: NormWindow,
    pub peers: PeerTable,
    stash: BTreeMap<MicroBatchId, Stashed>,
    outstanding: BTreeMap<MicroBatchId, Outstanding>,
    /// Every replica each recent micro-batch was sent to, and when it was last sent: a
    /// gradient from one that timed out before the micro-batch was re-sent is a slow answer,
    /// not a forged one.
    sent_to: BTreeMap<MicroBatchId, (BTreeSet<NodeId>, Instant)>,
    /// Micro-batches whose backward pass waits for the engine (their gradient came back).
    backward_jobs: VecDeque<MicroBatchId>,
    /// Admitted micro-batches waiting for their first job (forward, or forward and backward
    /// on the last stage).
    forward_jobs: VecDeque<MicroBatchId>,
    /// The optimizer step to run next, once its micro-batches are all done.
    step_job: Option<u64>,
    busy: bool,
    /// The micro-batch of the job the engine is running, if any.
    running: Option<MicroBatchId>,
    /// Which step each micro-batch in progress counts toward (see `schedule.rs`).
    slots: schedule::Slots,
    /// Recent input gradients by (micro-batch, who asked): a repeated request from the same
    /// sender gets the answer again instead of a second, double-counted backward pass.
    answered: VecDeque<repeat::Answered>,
    steps_done: u64,
    /// Driver: the next step whose batch it asks for.
    next_batch: u64,
    /// Driver: the steps in progress, their losses so far and their tokens.
    driver_steps: BTreeMap<u64, (Vec<f32>, u64)>,
    finished: bool,
    /// Smoothed compute time of one job, the router's service-time estimate.
    service: Duration,
    job_started: Option<Instant>,
    /// Driver: the version its new steps run under (it only ever moves up).
    driving: u32,
    /// Leaving the stage (a mover, see `core/migrate.rs`): finish what is in progress, take
    /// nothing new.
    draining: bool,
}

impl Pipeline {
    /// `steps_done` is nonzero when the replica resumes from a checkpoint.
    pub fn new(cfg: PipelineConfig, node: [u8; 32], steps_done: u64) -> Self {
        Self {
            cfg,
            node,
            forward_norms: NormWindow::new("activation"),
            backward_norms: NormWindow::new("gradient"),
            peers: PeerTable::default(),
            stash: BTreeMap::new(),
            outstanding: BTreeMap::new(),
            sent_to: BTreeMap::new(),
            backward_jobs: VecDeque::new(),
            forward_jobs: VecDeque::new(),
            step_job: None,
            busy: false,
            running: None,
            slots: schedule::Slots::new(steps_done),
            answered: VecDeque::new(),
            steps_done,
            next_batch: steps_done,
            driver_steps: BTreeMap::new(),
            finished: false,
            service: Duration::from_millis(20),
            job_started: None,
            driving: 0,
            draining: false,
        }
    }

    /// The stage's place never changes as the network grows: new stages go between the
    /// first and the last.
    pub fn role(&self) -> Role {
        let l = self.cfg.layouts.newest();
        Role::from_ends(l.is_first(self.cfg.stage), l.is_last(self.cfg.stage))
    }

    fn is_first(&self) -> bool {
        self.cfg.layouts.newest().is_first(self.cfg.stage)
    }

    fn is_last(&self) -> bool {
        self.cfg.layouts.newest().is_last(self.cfg.stage)
    }

    pub fn layouts(&self) -> &Layouts {
        &self.cfg.layouts
    }

    /// A version the network agreed on; whether it was new here.
    pub fn learn_layout(&mut self, layout: Layout) -> bool {
        self.cfg.layouts.insert(layout)
    }

    /// Driver: the version its steps run under now.
    pub fn driving(&self) -> u32 {
        self.driving
    }

    /// Driver: the version step `step` runs under. At a round boundary it moves to the newest
    /// version whose new stages each have a live replica (the driver hears those; the stages
    /// it already trains through are in use); a version whose new stage nobody holds yet
    /// waits, and training goes on at the old one meanwhile.
    fn version_for(&mut self, step: u64) -> u32 {
        if !step.is_multiple_of(self.cfg.version_every.max(1)) {
            return self.driving;
        }
        let me = self.cfg.stage;
        let Some(current) = self.cfg.layouts.get(self.driving) else {
            return self.driving;
        };
        let live = |s: usize| self.peers.in_stage(s).any(|(_, p)| p.routable);
        let ready = self
            .cfg
            .layouts
            .newest_first()
            .take_while(|l| l.version() > self.driving)
            .find(|l| {
                l.contains(me)
                    && l.order()
                        .iter()
                        .filter(|s| !current.contains(**s))
                        .all(|&s| live(s))
            })
            .map(Layout::version);
        if let Some(v) = ready {
            self.driving = v;
        }
        self.driving
    }

    /// The stage that may send `msg` to us: the one before ours in the forward's version, or
    /// the one after ours in the version of the micro-batch we sent. A gradient for a
    /// micro-batch no longer here (answered elsewhere first) names the stage after ours in the
    /// newest version that has one: the pipeline declines it without penalty.
    pub fn sender_stage(&self, msg: &Msg) -> Option<usize> {
        let me = self.cfg.stage;
        match msg {
            Msg::Forward { version, .. } => self.cfg.layouts.get(*version)?.prev(me),
            Msg::Backward { mb, .. } => match self.stash.get(mb) {
                Some(s) => self.cfg.layouts.get(s.version)?.next(me),
                None => self.cfg.layouts.newest_first().find_map(|l| l.next(me)),
            },
        }
    }

    /// How long a gradient may take to come back: its forward crosses every later stage and
    /// the gradient every one back, so a fixed wait would time out the early stages of a deep
    /// pipeline on every step and resend (cascading duplicate work through all later stages).
    fn grad_wait(&self) -> Duration {
        let downstream = self.cfg.layouts.newest().after(self.cfg.stage).max(1);
        self.cfg
            .grad_timeout
            .saturating_mul(u32::try_from(downstream).unwrap_or(u32::MAX))
    }

    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Stops taking work: the driver asks for no new batch and later stages answer new
    /// forwards Busy (their senders route them elsewhere, unpenalised), while every
    /// micro-batch in progress finishes.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Nothing in progress here: no micro-batch stashed, queued, running or waiting for a
    /// gradient, and no optimizer step due. (A step whose micro-batches stopped coming is
    /// left unstepped.)
    pub fn idle(&self) -> bool {
        self.stash.is_empty()
            && self.outstanding.is_empty()
            && self.forward_jobs.is_empty()
            && self.backward_jobs.is_empty()
            && self.step_job.is_none()
            && !self.busy
    }

    /// Work waiting here, reported in heartbeats.
    pub fn queue_depth(&self) -> usize {
        self.backward_jobs.len() + self.forward_jobs.len() + usize::from(self.busy)
    }

    /// Driver: ask for the first batch (and, with a weight lag, the next).
    pub fn start(&mut self) -> Vec<Action> {
        self.ask_batches()
    }

    /// Driver: the batch of `step` arrived at `now`, with the genesis window of each row;
    /// split it and start the forward passes.
    pub fn on_batch(
        &mut self,
        step: u64,
        batch: Batch,
        windows: Vec<TargetWindow>,
        now: Instant,
    ) -> Vec<Action> {
        if self.draining {
            // Asked for before the drain began: its step is not started.
            return Vec::new();
        }
        let parts = batch.split_rows(self.cfg.micro_batches);
        let tokens = (batch.batch * batch.seq) as u64;
        let before = self.driving;
        let version = self.version_for(step);
        let mut actions = Vec::new();
        if version != before
            && let Some(l) = self.cfg.layouts.get(version)
        {
            let stages = l
                .order()
                .iter()
                .filter_map(|&s| {
                    let id = u16::try_from(s).ok()?;
                    let spec = l.spec(s)?;
                    Some((id, (spec.end_layer - spec.first_layer) as u64))
                })
                .collect();
            actions.push(Action::Event(NodeEvent::Driving {
                step,
                version,
                stages,
                time_ms: self.cfg.clock.unix_ms(now),
            }));
        }
        self.driver_steps.insert(step, (Vec::new(), tokens));
        let mut row = 0;
        for (i, part) in parts.into_iter().enumerate() {
            let rows = row..row + part.batch;
            row += part.batch;
            let mb = MicroBatchId {
                origin: self.node,
                step,
                index: i as u32,
            };
            let input = StageInput::Tokens(Tokens {
                batch: part.batch,
                seq: part.seq,
                ids: part.inputs,
            });
            let targets =
                Targets::new(part.targets, windows.get(rows).unwrap_or_default().to_vec());
            self.admit((mb, version, None, Vec::new()), input, targets, None, now);
        }
        actions.extend(self.dispatch(now));
        actions.extend(self.ask_batches());
        actions
    }

    /// A request from another replica; returns the answer and what to do next.
    pub fn on_message(&mut self, from: NodeId, msg: Msg, now: Instant) -> (Ack, Vec<Action>) {
        let (kind, mb) = (msg.kind(), msg.mb());
        let mut answer = Vec::new();
        let result = match msg {
            Msg::Forward {
                mb,
                version,
                stamp,
                route,
                input,
                targets,
            } => self.accept_forward(
                from,
                (mb, version, stamp, route),
                input,
                targets,
                now,
                &mut answer,
            ),
            Msg::Backward { mb, grad, loss } => {
                self.accept_backward(from, (mb, grad, loss), now, &mut answer)
            }
        };
        match result {
            Ok(Ack::Accepted) => {
                answer.extend(self.dispatch(now));
                (Ack::Accepted, answer)
            }
            Ok(other) => (other, Vec::new()),
            Err(refusal) => {
                let reason = refusal.to_string();
                let mut actions = vec![
                    Action::Penalize {
                        peer: from,
                        reason: reason.clone(),
                    },
                    Action::Event(NodeEvent::Dropped {
                        what: Some(format!("{kind} message")),
                        peer: Some(from.to_string()),
                        stage: Some(self.cfg.stage),
                        round: None,
                        reason: reason.clone(),
                        time_ms: self.cfg.clock.unix_ms(now),
                    }),
                ];
                // The replica we wait on answered with a gradient we refused: no other answer
                // comes from it, so the micro-batch goes elsewhere now, not after the wait.
                if kind == "backward"
                    && self
                        .outstanding
                        .get(&mb)
                        .is_some_and(|o| o.to == Some(from))
                {
                    self.release(&from);
                    actions.extend(self.fail_over(mb, from, reason.clone(), now));
                }
                (Ack::Rejected(reason), actions)
            }
        }
    }

    fn accept_forward(
        &mut self,
        from: NodeId,
        (mb, version, stamp, route): Provenance,
        input: Payload,
        targets: Targets,
        now: Instant,
        answer: &mut Vec<Action>,
    ) -> Result<Ack, Refusal> {
        if self.is_first() {
            return Err(Refusal::ForwardToFirstStage(mb.short()));
        }
        let Some(layout) = self.cfg.layouts.get(version) else {
            // Not final here yet (our ledger may lag the driver's): the sender tries again.
            return Ok(Ack::Busy);
        };
        if !layout.contains(self.cfg.stage) {
            return Err(Refusal::NotInVersion {
                stage: self.cfg.stage,
                version,
            });
        }
        // Drivers run the first stage themselves, so a micro-batch's first hop comes from its
        // driver and no one else: another replica of the first stage holding the driver's
        // stamp was handed it by a receiver, to get its own activations trained in.
        if layout
            .prev(self.cfg.stage)
            .is_some_and(|p| layout.is_first(p))
            && from.0 != mb.origin
        {
            return Err(Refusal::NotFromTheDriver(mb.short()));
        }
        let Payload::Hidden(packed) = input else {
            return Err(Refusal::TokensToLaterStage(self.cfg.stage));
        };
        let mut acts = packed.unpack(&self.expect(self.cfg.activations.forward))?;
        acts.validate(&self.cfg.model)?;
        // Smaller micro-batches than the network's would make a driver's steps (and the
        // stages' work for it, which each is paid for alike) as cheap as it likes.
        if acts.seq != self.cfg.seq || acts.batch < self.cfg.min_rows {
            return Err(Refusal::MicroBatchShape {
                batch: acts.batch,
                seq: acts.seq,
                min_rows: self.cfg.min_rows,
                max_rows: self.cfg.max_rows,
                expected_seq: self.cfg.seq,
            });
        }
        if self.is_last() && targets.ids.len() != acts.batch * acts.seq {
            return Err(Refusal::TargetCount {
                targets: targets.ids.len(),
                batch: acts.batch,
                seq: acts.seq,
            });
        }
        if let Some(&bad) = targets
            .ids
            .iter()
            .find(|&&t| t as usize >= self.cfg.model.vocab)
        {
            return Err(Refusal::TargetOutsideVocabulary(bad));
        }
        let judged = self.forward_norms.judge(from, &acts.data)?;
        let admitted = judged.apply(&mut acts.data);
        self.note_clipped(admitted, from, now, answer);
        if let Some(ack) = self.repeated_forward(from, mb, &acts, &targets, answer) {
            return Ok(ack);
        }
        if self.draining || self.forward_jobs.len() >= self.cfg.queue_capacity {
            return Ok(Ack::Busy);
        }
        // Only a micro-batch taken counts towards the norms of the next ones.
        self.forward_norms.remember(from, &judged);
        self.admit(
            (mb, version, stamp, route),
            StageInput::Hidden(acts),
            targets,
            Some(from),
            now,
        );
        Ok(Ack::Accepted)
    }

    /// Reports a peer's tensor scaled down to the norm bound.
    fn note_clipped(
        &self,
        admitted: Admitted,
        from: NodeId,
        now: Instant,
        answer: &mut Vec<Action>,
    ) {
        if let Admitted::Clipped { norm, bound } = admitted {
            answer.push(Action::Event(NodeEvent::Warning {
                stage: Some(self.cfg.stage),
                message: format!(
                    "scaled a tensor from {from} down from norm {norm:.3e} to {bound:.3e} ({}× the median of other senders' recent ones)",
                    norms::CLIP
                ),
                time_ms: self.cfg.clock.unix_ms(now),
            }));
        }
    }

    /// Stashes a micro-batch's input (the backward pass recomputes from it) and queues its
    /// first job: the forward pass, or forward and backward at once on the last stage.
    fn admit(
        &mut self,
        (mb, version, stamp, route): Provenance,
        input: StageInput,
        targets: Targets,
        upstream: Option<NodeId>,
        now: Instant,
    ) {
        self.stash.insert(
            mb,
            Stashed {
                version,
                stamp,
                route,
                input,
                targets,
                upstream,
                loss: None,
                grad: None,
                since: now,
            },
        );
        self.forward_jobs.push_back(mb);
    }

    fn accept_backward(
        &mut self,
        from: NodeId,
        (mb, grad, loss): (MicroBatchId, act_codec::Packed, f32),
        now: Instant,
        answer: &mut Vec<Action>,
    ) -> Result<Ack, Refusal> {
        if self.is_last() {
            return Err(Refusal::GradientToLastStage);
        }
        let sent_earlier = self
            .sent_to
            .get(&mb)
            .is_some_and(|(to, _)| to.contains(&from));
        let Some(out) = self.outstanding.get(&mb) else {
            if sent_earlier {
                // Re-sent after a timeout and answered elsewhere first: slow, not dishonest.
                return Ok(Ack::Rejected(format!(
                    "micro-batch {} was already answered",
                    mb.short()
                )));
            }
            return Err(Refusal::NeverSent(mb.short()));
        };
        // A replica it was sent to before a failover may still answer first; its gradient is
        // as good as the new one's.
        if out.to != Some(from) && !sent_earlier {
            return Err(Refusal::NotSentThere(mb.short()));
        }
        let waiting_on = out.to;
        let mut grad = grad.unpack(&self.expect(self.cfg.activations.backward))?;
        grad.validate(&self.cfg.model)?;
        if !loss.is_finite() {
            return Err(Refusal::NonFiniteLoss(loss));
        }
        let stashed = self
            .stash
            .get_mut(&mb)
            .ok_or_else(|| Refusal::NotStashed(mb.short()))?;
        let (b, s) = match &stashed.input {
            StageInput::Tokens(t) => (t.batch, t.seq),
            StageInput::Hidden(a) => (a.batch, a.seq),
        };
        if (grad.batch, grad.seq) != (b, s) {
            return Err(Refusal::GradientShape {
                got_batch: grad.batch,
                got_seq: grad.seq,
                batch: b,
                seq: s,
            });
        }
        let admitted = self.backward_norms.admit(from, &mut grad.data)?;
        stashed.loss = Some(loss);
        stashed.grad = Some(grad);
        self.outstanding.remove(&mb);
        // The replica it waited on (a timed-out one was released when it timed out).
        if let Some(to) = waiting_on {
            self.release(&to);
        }
        self.backward_jobs.push_back(mb);
        self.note_clipped(admitted, from, now, answer);
        Ok(Ack::Accepted)
    }

    /// The hash of the tensor a message carries, as its receiver unpacks it: what the
    /// sender's job commitment names as its output. Token ids (a driver's input) are no job's
    /// output: None.
    pub fn payload_hash(&self, msg: &Msg) -> Result<Option<Hash32>, Refusal> {
        let acts = match msg {
            Msg::Forward {
                input: Payload::Hidden(p),
                ..
            } => p.unpack(&self.expect(self.cfg.activations.forward))?,
            Msg::Forward { .. } => return Ok(None),
            Msg::Backward { grad, .. } => {
                grad.unpack(&self.expect(self.cfg.activations.backward))?
            }
        };
        Ok(Some(acts.hash()))
    }

    /// What a peer's packed tensor in `scheme` must fit: one micro-batch of this network.
    fn expect(&self, scheme: Scheme) -> Expect {
        Expect {
            scheme,
            dim: self.cfg.model.d_model,
            max_batch: self.cfg.max_rows,
            max_seq: self.cfg.model.max_seq,
        }
    }

    /// The engine finished a job.
    pub fn on_job_done(&mut self, done: JobDone, now: Instant) -> Vec<Action> {
        self.busy = false;
        self.running = None;
        let step_ran = matches!(done, JobDone::Step { .. });
        if let Some(t) = self.job_started.take() {
            self.service = (self.service * 3 + now.saturating_duration_since(t)) / 4;
        }
        let mut actions = Vec::new();
        match done {
            JobDone::Forward { mb, output } => {
                // The receiver computes on the unpacked values; what cannot be packed (out of
                // range) is a failed job.
                let output = match act_codec::pack(&output, self.cfg.activations.forward) {
                    Ok(p) => p,
                    Err(e) => {
                        let error = format!("packing the output: {e}");
                        return self.on_job_done(
                            JobDone::Failed {
                                mb: Some(mb),
                                error,
                            },
                            now,
                        );
                    }
                };
                if let Some(st) = self.stash.get(&mb) {
                    let msg = Msg::Forward {
                        mb,
                        version: st.version,
                        stamp: st.stamp.clone(),
                        route: st.route.clone(),
                        input: Payload::Hidden(output),
                        targets: st.targets.clone(),
                    };
                    let out = Outstanding {
                        msg,
                        to: None,
                        state: SendState::Waiting(now),
                        sent_at: now,
                        tried: BTreeSet::new(),
                        failover: None,
                        warned: false,
                    };
                    self.outstanding.insert(mb, out);
                    actions.extend(self.route(mb, now));
                } else {
                    // Forgotten while it ran: no backward will come for it.
                    self.slots.unassign(&mb);
                }
            }
            JobDone::Backward {
                mb,
                input_grad,
                loss,
            } => {
                let stashed = self.stash.remove(&mb);
                let loss = loss.or(stashed.as_ref().and_then(|s| s.loss));
                if let (Some(st), Some(grad)) = (&stashed, input_grad)
                    && let Some(up) = st.upstream
                {
                    // Unpackable: nothing goes back and the sender's timeout routes it again.
                    match act_codec::pack(&grad, self.cfg.activations.backward) {
                        Ok(grad) => {
                            self.keep_answer(repeat::Answered {
                                mb,
                                to: up,
                                grad: grad.clone(),
                                loss: loss.unwrap_or(f32::NAN),
                            });
                            actions.push(Action::Send {
                                to: up,
                                msg: Msg::Backward {
                                    mb,
                                    grad,
                                    loss: loss.unwrap_or(f32::NAN),
                                },
                            })
                        }
                        Err(e) => {
                            actions.push(self.warning(now, format!("packing a gradient: {e}")))
                        }
                    }
                }
                if let (Some((losses, _)), Some(l)) = (self.driver_steps.get_mut(&mb.step), loss)
                    && mb.origin == self.node
                {
                    losses.push(l);
                }
                self.complete(&mb);
            }
            JobDone::Step {
                step,
                lr,
                grad_norm,
                model_hash,
            } => {
                self.steps_done = step.saturating_add(1);
                let (loss, tokens) = match self.driver_steps.remove(&step) {
                    Some((losses, tokens)) if !losses.is_empty() => (
                        Some(losses.iter().sum::<f32>() / losses.len() as f32),
                        tokens,
                    ),
                    Some((_, tokens)) => (None, tokens),
                    None => (None, 0),
                };
                // Steps are taken in order, so nothing older can still report.
                self.driver_steps.retain(|s, _| *s > step);
                actions.push(Action::Event(NodeEvent::Step {
                    stage: self.cfg.stage,
                    step: self.steps_done,
                    loss,
                    tokens,
                    lr,
                    grad_norm,
                    model_hash: hex::encode(model_hash),
                    busy_ms: None,
                    time_ms: self.cfg.clock.unix_ms(now),
                }));
                if self.is_first()
                    && !self.finished
                    && self.cfg.steps != 0
                    && self.steps_done >= self.cfg.steps
                {
                    self.finished = true;
                    actions.push(Action::Event(NodeEvent::Finished {
                        steps: self.steps_done,
                        reason: None,
                        time_ms: self.cfg.clock.unix_ms(now),
                    }));
                }
            }
            JobDone::Failed { mb, error } => {
                // Bad work is dropped; the sender's timeout routes it again elsewhere. The
                // driver's own micro-batches have no sender: one that fails is given up and
                // counted toward the step (it adds no gradient), or the step, and training,
                // would wait for it forever.
                if let Some(mb) = mb {
                    let own = self.is_first()
                        && mb.origin == self.node
                        && self.stash.remove(&mb).is_some();
                    if own {
                        self.complete(&mb);
                    } else {
                        self.stash.remove(&mb);
                        self.slots.unassign(&mb);
                    }
                }
                actions.push(self.warning(now, format!("compute failed: {error}")));
            }
        }
        if step_ran {
            self.step_if_done();
        }
        actions.extend(self.dispatch(now));
        if step_ran {
            actions.extend(self.ask_batches());
        }
        actions
    }
}

#[cfg(test)]
mod norm_tests;
pub mod norms;
mod refusal;
mod repeat;
mod routing;
mod schedule;
mod stop;
#[cfg(test)]
mod tests;
