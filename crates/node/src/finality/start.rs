//! A network's first epoch waits for its committee.
//!
//! A validator that started the first epoch alone would time its rounds out, each longer than
//! the last, and lag the others once they came: four validators started 2.5 s apart finalized
//! it 5 to 8 s after the third started. So the first epoch waits (at most
//! [`FIRST_EPOCH_WAIT`]) until more than two thirds of the committee's power is heard on the
//! finality topic. Waiting validators say they run every second (`FinalityGossip::Present`),
//! and once more as they start; consensus messages count too. The peer table cannot tell:
//! it holds only neighbouring stages.

use std::time::{Duration, Instant};

use neuroshard_proof::{Canonical, NodeId};

use super::{FinalityGossip, FinalityOut, LedgerFinality};

/// How long a network's first epoch waits, at most, for more than two thirds of the
/// committee's power to run (past it, a node starts alone).
pub(super) const FIRST_EPOCH_WAIT: Duration = Duration::from_secs(120);
/// How often a waiting first epoch looks again.
const FIRST_EPOCH_POLL: Duration = Duration::from_millis(250);
/// How often a validator waiting for the first epoch says it runs.
const PRESENT_EVERY: Duration = Duration::from_secs(1);

impl LedgerFinality {
    /// Marks committee members as running (the unit tests' start, where no one gossips).
    #[cfg(test)]
    pub fn set_live(&mut self, live: impl IntoIterator<Item = NodeId>) {
        self.live = live.into_iter().collect();
    }

    /// Anything a member publishes on the finality topic (its transport signs it) says it runs.
    pub(super) fn heard_from(&mut self, from: NodeId) {
        if self.first_gate.is_some() && self.head.committee.get(&from).is_some() {
            self.live.insert(from);
        }
    }

    /// Whether starting `epoch` must wait for the committee (then it looks again shortly).
    pub(super) fn first_epoch_waits(&mut self, epoch: u64, now: Instant) -> bool {
        let Some(gate) = self.first_gate else {
            return false;
        };
        let member = self.head.committee.get(&self.me).is_some();
        if epoch == 1 && !self.quorum_live() && now < gate {
            self.next_start = Some(now + FIRST_EPOCH_POLL.min(self.cfg.epoch));
            if member && self.present.0.is_none_or(|t| now >= t + PRESENT_EVERY) {
                self.say_present(now);
            }
            return true;
        }
        // Those still waiting hear that this one runs now (its first votes may come only
        // after a propose timeout).
        if member {
            self.say_present(now);
        }
        self.first_gate = None;
        self.live.clear();
        false
    }

    fn say_present(&mut self, now: Instant) {
        self.present = (Some(now), self.present.1.wrapping_add(1));
        let msg = FinalityGossip::Present {
            count: self.present.1,
        };
        self.out
            .push_back(FinalityOut::Publish(msg.to_canonical_bytes()));
    }

    /// Whether more than two thirds of the head committee's power runs (this node included).
    fn quorum_live(&self) -> bool {
        let committee = &self.head.committee;
        let live: u64 = committee
            .validators()
            .iter()
            .filter(|v| v.address.0 == self.me || self.live.contains(&v.address.0))
            .fold(0u64, |t, v| t.saturating_add(v.power));
        u128::from(live) * 3 > u128::from(committee.total_power()) * 2
    }
}
