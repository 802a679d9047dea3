//! Catching up: a replica behind its stage (restarted, joined, missed a round) finds the
//! later outer state to fetch from what its co-replicas vouch for: the live ones and the
//! stage's provers its finalized ledger paid lately (`Syncer::set_active`).

use std::collections::{BTreeMap, BTreeSet};

use neuroshard_proof::{Hash32, NodeId};

use super::{Phase, SyncAction, Syncer};

/// Each outer state (round, hash) vouched for, with its voters and the peer to fetch it from.
type Votes = BTreeMap<(u64, Hash32), (BTreeSet<NodeId>, NodeId)>;

impl Syncer {
    /// A later outer state we should fetch: announced outcomes of later rounds, offers made
    /// against a later θ₀, the DHT record; the most widely announced state of the latest
    /// round wins.
    pub(super) fn behind(&mut self, live: &BTreeSet<NodeId>, stalled: bool) -> Option<SyncAction> {
        let mut votes: Votes = BTreeMap::new();
        for (round, dones) in self.dones.range(self.round.saturating_add(1)..) {
            for (node, (peer, d)) in dones {
                let e = votes
                    .entry((*round, d.theta))
                    .or_insert_with(|| (BTreeSet::new(), *peer));
                e.0.insert(*node);
            }
        }
        // Outcomes of our own round that outrank ours (more inputs, then the smaller hash) but
        // that we cannot recompute (built on offers against another θ₀, or on offers we never
        // got): they count like offers against another θ₀ of our round, by a majority.
        let mine = self.my_rank();
        let my_offer = self.my_offers.get(&self.round).copied();
        let mut included: BTreeMap<Hash32, bool> = BTreeMap::new();
        for (node, (peer, d)) in self.dones.get(&self.round).into_iter().flatten() {
            if super::outcomes::rank(d.named().count(), d.theta) > mine
                && !self.refused.contains(&(self.round, d.theta))
            {
                let e = votes
                    .entry((self.round, d.theta))
                    .or_insert_with(|| (BTreeSet::new(), *peer));
                e.0.insert(*node);
                let ours = my_offer.is_some_and(|(_, b)| d.named().any(|x| x == (self.me, b)));
                included.insert(d.theta, ours);
            }
        }
        for (round, offers) in &self.offers {
            for (node, (peer, o)) in offers {
                let Some(base_round) = round.checked_sub(1) else {
                    continue;
                };
                // An offer against another θ₀ of our own round means we diverged; it counts
                // only when most live co-replicas agree on that θ₀.
                if base_round < self.round || (base_round == self.round && o.base == self.theta) {
                    continue;
                }
                let e = votes
                    .entry((base_round, o.base))
                    .or_insert_with(|| (BTreeSet::new(), *peer));
                e.0.insert(*node);
            }
        }
        // A DHT record is its publisher's vote, no more.
        for (round, (peer, theta)) in &self.hints {
            votes
                .entry((*round, *theta))
                .or_insert_with(|| (BTreeSet::new(), *peer))
                .0
                .insert(*peer);
        }
        // Only co-replicas vote: the live ones and those the finalized ledger counts as the
        // stage's active provers (heard or not). A later round needs more than half of them
        // to vouch for one state (offers made against it count: every replica of a stage
        // offers each round), so keys that are fewer than half (a forged SyncDone, offers
        // against a made-up base, a DHT record of round u64::MAX) cannot move it, even where
        // they are all it hears; a different θ₀ of our own round needs the same.
        let electorate: BTreeSet<NodeId> = live.union(&self.active).copied().collect();
        let counted =
            |voters: &BTreeSet<NodeId>| voters.iter().filter(|v| electorate.contains(v)).count();
        let majority = |n: usize| n > 0 && n.saturating_mul(2) > electorate.len();
        let (round, theta) = votes
            .iter()
            .filter(|(_, (voters, _))| majority(counted(voters)))
            .max_by_key(|((r, _), (voters, _))| (*r, counted(voters)))
            .map(|(state, _)| *state)
            .or_else(|| {
                stalled
                    .then(|| self.plurality(&votes, live, &electorate))
                    .flatten()
            })?;
        let peer = votes.get(&(round, theta))?.1;
        self.phase = Phase::Adopting { round, theta };
        // Whether our own offer went into it: only an outcome of our round can hold it.
        let included = round == self.round && included.get(&theta).copied().unwrap_or(false);
        Some(SyncAction::Adopt {
            round,
            peer,
            hash: theta,
            included,
        })
    }

    /// A stalled replica (no round finished and no inner step taken for several round
    /// timeouts: its training ended, or no work reaches it) follows the later state that most
    /// live co-replicas hold as their latest, if they outnumber the co-replicas training on
    /// from its own state (an offer against it and nothing later), which win ties, and every
    /// other later state's group (a tie moves no one); where it has three or more
    /// co-replicas, a state needs two. Live co-replicas that offer nothing count for neither:
    /// an outcome of its round is no such sign, as replicas whose training ended all hold one.
    /// Active provers we do not hear and that vouch for nothing count as staying: we cannot
    /// tell one that died from one kept from us. Without this a replica left behind by a
    /// co-replica that ran on alone would never move again; with it, keys vouching for a
    /// made-up later round move it only when they outnumber every group of active
    /// co-replicas that agree.
    fn plurality(
        &self,
        votes: &Votes,
        live: &BTreeSet<NodeId>,
        electorate: &BTreeSet<NodeId>,
    ) -> Option<(u64, Hash32)> {
        let mut latest: BTreeMap<NodeId, (u64, Hash32)> = BTreeMap::new();
        for (state, (voters, _)) in votes.range((self.round.saturating_add(1), [0; 32])..) {
            for v in voters.iter().filter(|v| electorate.contains(v)) {
                let e = latest.entry(*v).or_insert(*state);
                *e = (*e).max(*state);
            }
        }
        // An offer against our state: that co-replica is training on from it.
        let ours = |v: &NodeId| {
            self.offers
                .get(&self.round.saturating_add(1))
                .and_then(|o| o.get(v))
                .is_some_and(|(_, o)| o.base == self.theta)
        };
        let stay = electorate
            .iter()
            .filter(|v| !latest.contains_key(v) && (ours(v) || !live.contains(v)))
            .count();
        let mut tally: BTreeMap<(u64, Hash32), usize> = BTreeMap::new();
        for state in latest.values() {
            *tally.entry(*state).or_default() += 1;
        }
        let floor = if electorate.len() > 2 { 2 } else { 1 };
        let (&state, &n) = tally.iter().max_by_key(|(_, n)| **n)?;
        // A tie between states moves no one: breaking it by the later round let a single
        // key out-bid an honest co-replica of a stage of three by claiming a later round.
        let tied = tally.values().filter(|m| **m == n).count() > 1;
        (!tied && n > stay && n >= floor).then_some(state)
    }
}
