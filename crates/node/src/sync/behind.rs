//! Catching up: a replica behind its stage (restarted, joined, missed a round) finds the
//! later outer state to fetch from what its live co-replicas vouch for.

use std::collections::{BTreeMap, BTreeSet};

use neuroshard_proof::{Hash32, NodeId};

use super::{Phase, SyncAction, Syncer};

impl Syncer {
    /// A later outer state we should fetch: announced outcomes of later rounds, offers made
    /// against a later θ₀, the DHT record; the most widely announced state of the latest
    /// round wins.
    pub(super) fn behind(&mut self, live: &BTreeSet<NodeId>, stalled: bool) -> Option<SyncAction> {
        let mut votes: BTreeMap<(u64, Hash32), (BTreeSet<NodeId>, NodeId)> = BTreeMap::new();
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
        // Only live co-replicas vote. A later round needs two of them to vouch for the same
        // state (one where we have a single co-replica), so one key (a forged SyncDone, an
        // offer against a made-up base, a DHT record of round u64::MAX) cannot move a stage
        // that has two other replicas; a different θ₀ of our own round needs a majority.
        // Not two thirds: a large stage often splits into groups of a few contributors per
        // round, and a replica left behind must still be able to rejoin one. A replica that
        // finished no round for several round timeouts (it gets no work, its co-replicas
        // disagree) takes one live voucher: it would otherwise never move again, and what it
        // offers against a state no one else holds is never aggregated by the others.
        let counted =
            |voters: &BTreeSet<NodeId>| voters.iter().filter(|v| live.contains(v)).count();
        let vouch = if stalled { 1 } else { live.len().min(2) };
        let ((round, theta), (_, peer)) = votes
            .into_iter()
            .filter(|((r, _), (voters, _))| {
                let n = counted(voters);
                if *r > self.round {
                    n > 0 && n >= vouch
                } else {
                    n.saturating_mul(2) > live.len()
                }
            })
            .max_by_key(|((r, _), (voters, _))| (*r, counted(voters)))?;
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
}
