//! Micro-batches that arrive twice: a sender that failed over or lost its answer asks again,
//! and the replica must neither compute nor count the same gradient twice for it.

use neuroshard_model::{Activations, StageInput};
use neuroshard_proof::NodeId;

use super::*;

/// A backward pass's answer, kept for a sender that asks again (its copy was lost).
#[derive(Debug, Clone)]
pub(super) struct Answered {
    pub(super) mb: MicroBatchId,
    pub(super) to: NodeId,
    pub(super) grad: act_codec::Packed,
    pub(super) loss: f32,
}

impl Pipeline {
    /// A micro-batch this replica already holds or answered (its sender failed over or lost
    /// the answer) is computed once per sender, so a lost answer never adds its gradient
    /// twice: the same sender gets the kept answer again; a new sender (its upstream failed
    /// over) takes a queued job over while it has not run, is declined while the weights are
    /// in use on another sender's input (it retries), and is computed for afresh once that
    /// one was answered — counted twice, like a backup worker, because its input differs and
    /// refusing it would stall a stage with one replica here. `None`: compute it as new.
    pub(super) fn repeated_forward(
        &mut self,
        from: NodeId,
        mb: MicroBatchId,
        acts: &Activations,
        targets: &Targets,
        answer: &mut Vec<Action>,
    ) -> Option<Ack> {
        if let Some(kept) = self.answered.iter().find(|a| a.mb == mb && a.to == from) {
            answer.push(Action::Send {
                to: from,
                msg: Msg::Backward {
                    mb,
                    grad: kept.grad.clone(),
                    loss: kept.loss,
                },
            });
            return Some(Ack::Accepted);
        }
        let used = self.slots.holds(&mb) || self.in_progress(&mb);
        let stashed = self.stash.get_mut(&mb)?;
        if stashed.upstream == Some(from) {
            return Some(Ack::Accepted);
        }
        if used {
            return Some(Ack::Rejected(format!(
                "micro-batch {} is being computed for another sender",
                mb.short()
            )));
        }
        // Still queued: the new sender's input replaces the old one (jobs are built from the
        // stash when they run).
        stashed.input = StageInput::Hidden(acts.clone());
        stashed.targets = targets.clone();
        stashed.upstream = Some(from);
        Some(Ack::Accepted)
    }

    /// Whether the engine is running `mb`'s job now.
    fn in_progress(&self, mb: &MicroBatchId) -> bool {
        self.busy && self.running == Some(*mb)
    }

    /// Keeps a sent answer for a repeated request, the last `2 · micro_batches` of them (at
    /// least 4): enough for the micro-batches a failing-over sender can still have in flight.
    pub(super) fn keep_answer(&mut self, answer: Answered) {
        let cap = (2 * self.cfg.micro_batches).max(4);
        while self.answered.len() >= cap {
            self.answered.pop_front();
        }
        self.answered.push_back(answer);
    }
}
