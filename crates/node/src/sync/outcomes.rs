//! Weighing announced outcomes of a replica's current round against its own: the better one
//! (more inputs, then the smaller hash) wins, recomputed from exactly the offers it names.

use std::time::Instant;

use neuroshard_proof::{Hash32, NodeId};

use super::{ASKS_PER_OUTCOME, Named, NodeEvent, Phase, SyncAction, Syncer};

/// How outcomes rank: more inputs first, then the smaller hash.
pub(super) fn rank(inputs: usize, theta: Hash32) -> (usize, std::cmp::Reverse<Hash32>) {
    (inputs, std::cmp::Reverse(theta))
}

impl Syncer {
    /// Our own outcome's [`rank`].
    pub(super) fn my_rank(&self) -> (usize, std::cmp::Reverse<Hash32>) {
        rank(self.contributors.len(), self.theta)
    }

    /// Whether outcomes of our current round can still be weighed: we are idle, or we have
    /// started the next round from our own outcome of it (a better outcome makes that moot).
    pub(super) fn comparing(&self) -> bool {
        matches!(
            self.phase,
            Phase::Idle | Phase::Preparing { .. } | Phase::Collecting { .. }
        )
    }

    /// The peer that brought `node`'s signed offer of `round` with pseudo-gradient `blob`,
    /// made against `base` (any base when we offered none this round), if we hold it.
    pub(super) fn held_offer(
        &self,
        round: u64,
        node: &NodeId,
        blob: &Hash32,
        base: Option<Hash32>,
    ) -> Option<NodeId> {
        let latest = self.offers.get(&round).and_then(|o| o.get(node));
        let earlier = self.displaced.get(&round).and_then(|d| d.get(node));
        latest
            .into_iter()
            .chain(earlier.into_iter().flatten())
            .find(|(_, o)| o.blob == *blob && base.is_none_or(|b| o.base == b))
            .map(|(p, _)| *p)
    }

    /// After our own outcome of the current round: the best announced outcome wins. Only
    /// outcomes whose every named offer we hold signed by its contributor can win, so no one
    /// can invent contributors to outrank the others. Where a better outcome names offers we
    /// lack (a contributor showed us another one, or gossip lost it), its announcer is asked
    /// for them once: otherwise a replica that signs two offers of a round, one to each half
    /// of the stage, would split it for good.
    pub(super) fn compare_outcomes(&mut self, now: Instant) -> Vec<SyncAction> {
        let round = self.round;
        let Some(dones) = self.dones.get(&round) else {
            return Vec::new();
        };
        // Already in the next round: only an outcome with more inputs than ours is worth
        // abandoning it for (one that only wins the tie on its hash is left to catching up).
        let running = self.phase != Phase::Idle;
        let mut actions = Vec::new();
        // (inputs, θ₀, announcer, its named offers) of the best outcome so far.
        let mut best: Option<(usize, Hash32, NodeId, Named)> = None;
        // (announcer, the peer it came from, the contributors to ask for, its outcome)
        let mut asks: Vec<(NodeId, NodeId, Vec<NodeId>, Hash32)> = Vec::new();
        let base = self.my_offers.get(&round).map(|(b, _)| *b);
        let mine = self.my_offers.get(&round).map(|(_, o)| *o);
        // A contributor counts if we hold its named offer of this round against our own
        // base: an honest replica on another θ₀ would otherwise fail our recomputation and be
        // punished for a divergence, not a lie.
        let known = |n: &NodeId, blob: &Hash32| {
            self.contributors.get(n) == Some(blob)
                || if *n == self.me {
                    mine == Some(*blob)
                } else {
                    self.held_offer(round, n, blob, base).is_some()
                }
        };
        let mut agreed = Vec::new();
        for (node, (peer, d)) in dones {
            if d.theta == self.theta {
                if !self.agreed.contains(&(round, *node)) {
                    agreed.push(*node);
                    actions.push(SyncAction::Event(NodeEvent::Agreed {
                        stage: self.cfg.stage.into(),
                        round,
                        peer: node.to_string(),
                        time_ms: self.cfg.clock.unix_ms(now),
                    }));
                }
                continue;
            }
            // We took this round's state from a peer ourselves: nothing to recompute from, and
            // one announcer's word is no certificate (it could name real offers beside a θ₀
            // of its own making). A majority of live co-replicas announcing it moves us
            // (`behind`), so neither its offers nor a recomputation are of use.
            if !self.aggregated || self.refused.contains(&(round, d.theta)) {
                continue;
            }
            let set: Vec<(NodeId, Hash32)> = d.named().collect();
            let key = rank(set.len(), d.theta);
            let beats_mine = if running {
                set.len() > self.contributors.len()
            } else {
                key > self.my_rank()
            };
            let beats_best = best
                .as_ref()
                .is_none_or(|(bn, bt, _, _)| key > rank(*bn, *bt));
            if !beats_mine || !beats_best {
                continue;
            }
            let unknown: Vec<NodeId> = set
                .iter()
                .filter(|(n, b)| !known(n, b))
                .map(|(n, _)| *n)
                .collect();
            if unknown.is_empty() {
                best = Some((set.len(), d.theta, *peer, set));
            } else if !unknown.contains(&self.me) {
                let asked = |a: &(u64, NodeId, Hash32)| a.0 == round && a.1 == *node;
                let same = |a: &(u64, NodeId, Hash32)| a.0 == round && a.2 == d.theta;
                let for_outcome = self.asked_offers.iter().filter(|a| same(a)).count()
                    + asks.iter().filter(|a| same(&(round, a.0, a.3))).count();
                if !self.asked_offers.iter().any(asked) && for_outcome < ASKS_PER_OUTCOME {
                    asks.push((*node, *peer, unknown, d.theta));
                }
            }
        }
        for node in agreed {
            self.agreed.insert((round, node));
        }
        self.agreed.retain(|(r, _)| r.saturating_add(4) > round);
        for (node, from, nodes, theta) in asks {
            self.asked_offers.insert((round, node, theta));
            actions.push(SyncAction::FetchOffers { round, from, nodes });
        }
        if let Some((_, theta, announcer, set)) = best {
            self.phase = Phase::Adopting { round, theta };
            // Every offer of the set that did not go into our state, from whoever brought
            // it to us (its contributor, or the announcer that relayed it).
            let fetch = set
                .iter()
                .filter(|(n, b)| *n != self.me && self.contributors.get(n) != Some(b))
                .filter_map(|(n, b)| Some((*n, self.held_offer(round, n, b, base)?, *b)))
                .collect();
            actions.push(SyncAction::Verify {
                round,
                fetch,
                set,
                theta,
                announcer,
            });
        }
        actions
    }
}
