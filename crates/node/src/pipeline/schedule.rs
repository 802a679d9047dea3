//! Which optimizer step each micro-batch counts toward, at which weights it is computed, and
//! what the engine runs next.
//!
//! A replica at `v` optimizer steps has *slots* for the steps it may still fill: step `v`
//! and, with a weight lag of 1, step `v + 1`. A micro-batch takes the earliest slot with room
//! (`micro_batches` places each) when its first job is handed to the engine, and is computed,
//! forward and backward, at the weights before step `slot − lag`. Step `v` runs as soon as
//! its slot's micro-batches are all done, before any other job.
//!
//! - Lag 0: only slot `v` takes work, at the current weights. A forward pass never runs before
//!   the step it counts toward, so a driver flushes between steps (GPipe) and one replica
//!   per stage equals one process exactly.
//! - Lag 1 (PipeDream-2BW): slot `v + 1` takes the next step's micro-batches while step `v`'s
//!   drain, at the current weights; after step `v` those are the weights before the last
//!   step, which the engine keeps. Every step's gradient is thus taken one step behind the
//!   weights it updates, the same for every step and every stage, so one replica per stage
//!   equals one process training with that delay (`Trainer::weight_lag`), and no replica
//!   waits for a round trip through the pipeline while it has work.
//!
//! In both, a step counts exactly `micro_batches` micro-batches and each backward pass runs
//! at its own forward pass's weights (the exactness rule of the learning-quality issue).
//! Backward passes of slot `v + 1` wait for step `v`, so the engine's one gradient
//! accumulator only ever holds the current step's.

use std::collections::BTreeMap;

use neuroshard_model::Upstream;

use super::*;

/// The open steps' places.
#[derive(Debug, Default)]
pub(super) struct Slots {
    /// The optimizer steps done when the replica started: no older weights exist here.
    base: u64,
    /// Micro-batches in progress (first job handed to the engine, backward not yet done):
    /// the step each counts toward.
    of: BTreeMap<MicroBatchId, u64>,
    /// Per open step: micro-batches assigned to it and done (backward finished, or given up
    /// by the driver that made them).
    places: BTreeMap<u64, Places>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Places {
    assigned: usize,
    done: usize,
}

impl Slots {
    pub(super) fn new(base: u64) -> Self {
        Self {
            base,
            ..Default::default()
        }
    }

    /// Whether `mb` is in progress here (its weights are in use).
    pub(super) fn holds(&self, mb: &MicroBatchId) -> bool {
        self.of.contains_key(mb)
    }

    pub(super) fn slot(&self, mb: &MicroBatchId) -> Option<u64> {
        self.of.get(mb).copied()
    }

    /// The step whose weights a micro-batch of step `slot` is computed at.
    fn weights(&self, slot: u64, lag: u64) -> u64 {
        slot.saturating_sub(lag).max(self.base)
    }

    /// The earliest of steps `from..=to` with room for another micro-batch.
    fn open(&self, from: u64, to: u64, per_step: usize) -> Option<u64> {
        (from..=to).find(|k| self.places.get(k).map_or(0, |p| p.assigned) < per_step)
    }

    fn assign(&mut self, mb: MicroBatchId, slot: u64) {
        self.of.insert(mb, slot);
        self.places.entry(slot).or_default().assigned += 1;
    }

    /// `mb` will not be done here (dropped, failed, forgotten): its place is free again.
    pub(super) fn unassign(&mut self, mb: &MicroBatchId) {
        if let Some(slot) = self.of.remove(mb)
            && let Some(p) = self.places.get_mut(&slot)
        {
            p.assigned = p.assigned.saturating_sub(1);
        }
    }

    /// `mb` is done toward its step.
    fn done(&mut self, mb: &MicroBatchId) {
        if let Some(slot) = self.of.remove(mb) {
            self.places.entry(slot).or_default().done += 1;
        }
    }

    fn complete(&self, step: u64, per_step: usize) -> bool {
        self.places.get(&step).is_some_and(|p| p.done >= per_step)
    }

    /// Step `step` was handed to the engine: its places close.
    fn close(&mut self, step: u64) {
        self.places.remove(&step);
    }

    /// In-progress micro-batches whose input is gone (forgotten): their places are freed.
    pub(super) fn keep_only(&mut self, stash: &BTreeMap<MicroBatchId, Stashed>) {
        let gone: Vec<MicroBatchId> = self
            .of
            .keys()
            .filter(|mb| !stash.contains_key(mb))
            .copied()
            .collect();
        for mb in gone {
            self.unassign(&mb);
        }
    }
}

impl Pipeline {
    /// Hands the engine its next job when it is idle: the optimizer step first, then backward
    /// work of the current step (it frees stashed inputs), then forward work while an open
    /// step has room for it. The service time routing ranks replicas by is measured from
    /// `now`, never from the wall clock (the simulator's instants are virtual).
    pub(super) fn dispatch(&mut self, now: Instant) -> Vec<Action> {
        if self.busy {
            return Vec::new();
        }
        let job = match self.step_job.take() {
            Some(step) => {
                self.slots.close(step);
                Some(Job::Step { step })
            }
            None => self.next_backward().or_else(|| self.next_forward()),
        };
        let Some(job) = job else {
            return Vec::new();
        };
        self.running = match &job {
            Job::Forward { mb, .. } | Job::Backward { mb, .. } => Some(*mb),
            Job::Step { .. } => None,
        };
        self.busy = true;
        self.job_started = Some(now);
        vec![Action::Compute(job)]
    }

    /// The oldest backward pass of the current step whose gradient came back.
    fn next_backward(&mut self) -> Option<Job> {
        let current = self.steps_done;
        let stash = &self.stash;
        self.backward_jobs
            .retain(|mb| stash.get(mb).is_some_and(|st| st.grad.is_some()));
        let at = self
            .backward_jobs
            .iter()
            .position(|mb| self.slots.slot(mb) == Some(current))?;
        let mb = self.backward_jobs.remove(at)?;
        let weights = self.slots.weights(current, self.cfg.weight_lag);
        let st = self.stash.get_mut(&mb)?;
        let grad = st.grad.take()?;
        Some(Job::Backward {
            mb,
            input: st.input.clone(),
            upstream: Upstream::Grad(grad),
            weights,
            genesis: st.targets.windows.clone(),
        })
    }

    /// The oldest admitted micro-batch, in the earliest open step with room. The last stage
    /// runs forward and backward in one job, so its micro-batches join the current step only.
    fn next_forward(&mut self) -> Option<Job> {
        let (from, lag) = (self.steps_done, self.cfg.weight_lag);
        let to = if self.is_last() { from } else { from + lag };
        let slot = self.slots.open(from, to, self.cfg.micro_batches)?;
        let mb = loop {
            let mb = self.forward_jobs.pop_front()?;
            if self.stash.contains_key(&mb) {
                break mb;
            }
        };
        self.slots.assign(mb, slot);
        let weights = self.slots.weights(slot, lag);
        let st = self.stash.get(&mb)?;
        let input = st.input.clone();
        let genesis = st.targets.windows.clone();
        Some(if self.is_last() {
            Job::Backward {
                mb,
                input,
                upstream: Upstream::Targets(st.targets.ids.clone()),
                weights,
                genesis,
            }
        } else {
            Job::Forward {
                mb,
                input,
                weights,
                genesis,
            }
        })
    }

    /// One more micro-batch done toward its step.
    pub(super) fn complete(&mut self, mb: &MicroBatchId) {
        self.slots.done(mb);
        self.step_if_done();
    }

    /// Queues the current step once its micro-batches are all done.
    pub(super) fn step_if_done(&mut self) {
        let current = self.steps_done;
        if self.step_job.is_none() && self.slots.complete(current, self.cfg.micro_batches) {
            self.step_job = Some(current);
        }
    }

    /// Driver: asks for the batches of the steps it may start now: the current one and, with
    /// a weight lag, the next (never past its last step).
    pub(super) fn ask_batches(&mut self) -> Vec<Action> {
        if !self.is_first() || self.finished || self.draining {
            return Vec::new();
        }
        let mut actions = Vec::new();
        let last = self.cfg.steps.checked_sub(1).unwrap_or(u64::MAX);
        while self.next_batch <= self.steps_done.saturating_add(self.cfg.weight_lag)
            && self.next_batch <= last
        {
            actions.push(Action::NeedBatch {
                step: self.next_batch,
            });
            self.next_batch += 1;
        }
        actions
    }
}
