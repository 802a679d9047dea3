//! The validation loss. After every DiLoCo round (every [`ROUND_STEPS_WITHOUT_SYNC`] steps
//! with DiLoCo off) a driver feeds the same held-out windows of the genesis data through the
//! pipeline's serving path: forward only, on each stage's current θ₀, so every replica would
//! answer alike and training is never blocked. The last stage scores the window's targets; the
//! mean cross-entropy per token becomes a [`NodeEvent::Validation`].
//!
//! The windows never change, so the points of the curve compare. A replica that answers a
//! score that cannot be a loss (negative, not finite, for the wrong positions) is penalised
//! and the window goes to another replica, as any inference step does. A replica that lies
//! with a plausible number moves only this node's curve, never the model or the ledger;
//! catching it needs the replay of issue 15.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::NodeCore;
use super::serve::StreamError;
use crate::events::NodeEvent;
use crate::genesis_source::ROUND_STEPS_WITHOUT_SYNC;

/// Least time between two tries of one round's evaluation after it failed (a stage had no
/// live replica yet). A new round is tried at once: the network made progress.
pub const EVAL_RETRY: Duration = Duration::from_secs(10);

/// A window's inputs and targets (the inputs shifted by one).
pub type Window = (Vec<u32>, Vec<u32>);

/// Evaluation state of a driver.
#[derive(Default)]
pub(super) struct EvalState {
    /// The held-out windows, read once (empty: the dataset has none, evaluation is off).
    pub(super) windows: Option<Vec<Window>>,
    /// The round (or step bucket) evaluated last.
    done: Option<u64>,
    pub(super) running: Option<Running>,
    /// The last failure: the round (or step bucket) and when.
    failed: Option<(u64, Instant)>,
}

pub(super) struct Running {
    key: u64,
    step: u64,
    round: u64,
    streams: BTreeSet<u64>,
    nll: f64,
    tokens: u64,
    started: Instant,
}

impl NodeCore {
    /// What the evaluation is keyed by: θ₀ changes once per round.
    fn eval_key(&self) -> u64 {
        if self.settings.sync.every > 0 {
            self.rounds.syncer.round()
        } else {
            self.pipeline.steps_done() / ROUND_STEPS_WITHOUT_SYNC
        }
    }

    /// Starts an evaluation when one is due: this node drives (stage 0), it has started,
    /// none runs, θ₀ moved since the last one, and this round's last failure is not too recent.
    pub(super) fn poll_evaluation(&mut self, now: Instant) {
        let want = self.settings.eval_windows;
        if want == 0 || self.stage != 0 || !self.started || self.eval.running.is_some() {
            return;
        }
        let key = self.eval_key();
        if self.eval.done == Some(key)
            || self.eval.failed.is_some_and(|(round, t)| {
                round == key && now.saturating_duration_since(t) < EVAL_RETRY
            })
        {
            return;
        }
        if self.eval.windows.is_none() {
            let windows = match self.data.validation(want, self.settings.seq) {
                Ok(w) => w,
                Err(e) => {
                    self.warn(format!("no validation loss: {e}"), now);
                    Vec::new()
                }
            };
            self.eval.windows = Some(windows);
        }
        let windows = self.eval.windows.clone().unwrap_or_default();
        if windows.is_empty() {
            return;
        }
        let mut streams = BTreeSet::new();
        for (inputs, targets) in windows {
            streams.insert(self.open_eval_stream(inputs, targets, now));
        }
        // A stream that ended as it opened (no replica of a stage yet) fails the evaluation;
        // the others end on their own and count for nothing.
        if streams.iter().any(|id| !self.serve_has_stream(*id)) {
            self.eval.failed = Some((key, now));
            return;
        }
        self.eval.running = Some(Running {
            key,
            step: self.pipeline.steps_done(),
            round: self.rounds.syncer.round(),
            streams,
            nll: 0.0,
            tokens: 0,
            started: now,
        });
    }

    /// When the current round's failed evaluation may be tried again (a failure of an earlier
    /// round holds nothing back: every input that moves the round polls the evaluation).
    pub(super) fn eval_retry_at(&self) -> Option<Instant> {
        let (key, at) = self.eval.failed?;
        (self.eval.running.is_none() && key == self.eval_key()).then_some(at + EVAL_RETRY)
    }

    /// One window scored (its summed loss and target count), or why it was not.
    pub(super) fn on_eval_stream_end(
        &mut self,
        stream: u64,
        result: Result<(f64, usize), StreamError>,
        now: Instant,
    ) {
        let Some(r) = self.eval.running.as_mut() else {
            return;
        };
        // Streams of an abandoned evaluation end on their own; they count for nothing.
        if !r.streams.remove(&stream) {
            return;
        }
        match result {
            Ok((nll, tokens)) => {
                r.nll += nll;
                r.tokens = r.tokens.saturating_add(tokens as u64);
            }
            Err(why) => {
                tracing::debug!("validation window not scored: {why}");
                self.eval.failed = Some((r.key, now));
                self.eval.running = None;
                return;
            }
        }
        if !r.streams.is_empty() {
            return;
        }
        let Some(r) = self.eval.running.take() else {
            return;
        };
        self.eval.done = Some(r.key);
        self.eval.failed = None;
        if r.tokens == 0 {
            return;
        }
        let windows = self.eval.windows.as_ref().map_or(0, Vec::len);
        self.events.push_back(NodeEvent::Validation {
            step: r.step,
            round: r.round,
            loss: r.nll / r.tokens as f64,
            tokens: r.tokens,
            windows,
            ms: now.saturating_duration_since(r.started).as_secs_f64() * 1e3,
            time_ms: self.unix_ms(now),
        });
    }
}
