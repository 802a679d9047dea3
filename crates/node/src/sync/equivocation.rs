//! Offer equivocation: two different signed offers of one round, against one θ₀, from one
//! replica. Counting
//! the latest would let a Sybil show one offer to some co-replicas and another to the rest,
//! so that replicas aggregating at different moments count different offers, disagree, and
//! fail to recompute each other's outcome. Instead the sender is left out of that round on
//! every replica that has seen both offers (gossip forwards each to every subscriber), and
//! counts as heard, so no one waits for it until the deadline.

use std::time::Instant;

use neuroshard_proof::NodeId;

use super::{SyncAction, SyncOffer, Syncer};
use crate::events::NodeEvent;

impl Syncer {
    /// Whether `offer` from `node` is to be dropped: its sender already equivocated in that
    /// round, or this offer differs from the one it sent before (it then equivocates: its
    /// earlier offer goes too, and the returned event says so).
    pub(super) fn equivocates(
        &mut self,
        node: NodeId,
        offer: &SyncOffer,
        now: Instant,
    ) -> Option<Vec<SyncAction>> {
        let round = offer.round;
        if self.equivocators.contains(&(round, node)) {
            return Some(Vec::new());
        }
        let earlier = self.offers.get(&round).and_then(|o| o.get(&node))?;
        // Against another θ₀ it is a new offer, not a second one: an honest replica that
        // adopted a state after offering offers again against it.
        if earlier.1.blob == offer.blob || earlier.1.base != offer.base {
            return None;
        }
        if let Some(o) = self.offers.get_mut(&round) {
            o.remove(&node);
        }
        let applied = round == self.round && self.phase == super::Phase::Idle;
        self.equivocators.insert((round, node));
        // A sender equivocating in many future rounds holds a few entries, as its offers do.
        let mine: Vec<(u64, NodeId)> = self
            .equivocators
            .iter()
            .filter(|(_, n)| *n == node)
            .copied()
            .collect();
        let excess = mine.len().saturating_sub(super::ROUNDS_PER_SENDER);
        for key in mine.into_iter().take(excess) {
            self.equivocators.remove(&key);
        }
        let mut actions = vec![SyncAction::Event(NodeEvent::Dropped {
            what: Some("offer".into()),
            peer: Some(node.to_string()),
            stage: Some(self.cfg.stage.into()),
            round: Some(round),
            reason: "two different offers of one round: its sender is left out of it".into(),
            time_ms: self.cfg.clock.unix_ms(now),
        })];
        // Found after we applied the round: our outcome may count it.
        if applied {
            actions.extend(self.compare_outcomes(now));
        }
        Some(actions)
    }

    /// Our outcome of `round` counted a replica found to equivocate in it, and no co-replica
    /// announced one without it: recompute ours over our other contributors (their offers are
    /// at hand), as every honest replica in that position does, so they meet again.
    pub(super) fn recompute_without_equivocators(&mut self, round: u64) -> SyncAction {
        let set: Vec<NodeId> = self
            .contributors
            .iter()
            .filter(|n| !self.equivocators.contains(&(round, **n)))
            .copied()
            .collect();
        self.phase = super::Phase::Adopting {
            round,
            theta: self.theta,
        };
        SyncAction::Verify {
            round,
            fetch: Vec::new(),
            set,
            theta: self.theta,
            announcer: self.me,
        }
    }

    /// Whether `node` has nothing more to say in `round`: its offer is here, or it equivocated.
    pub(super) fn heard(&self, round: u64, node: &NodeId) -> bool {
        self.offers
            .get(&round)
            .is_some_and(|o| o.contains_key(node))
            || self.equivocators.contains(&(round, *node))
    }
}
