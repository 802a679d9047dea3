//! Following a co-replica's round: when to offer into it, and how a replica that had nothing
//! to offer joins it anyway, so that replicas of one stage stay on one line of outer states.
//!
//! Without this a replica that a round closed without (no steps of its own yet when the lead's
//! wait ran out: it started late, or routing sends it fewer micro-batches) later ran that
//! round itself from the old θ₀, alone or with the lead's offer: a second line of outer
//! states. Replicas on different lines never share a round again (an offer only leads a
//! replica whose θ₀ it was made against), and a later state needs more than half of the live
//! co-replicas to move a replica, so three replicas on three lines stayed apart for good
//! (`bench sim --nodes 60 --replicas 4`: three lines in one stage from the first round).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use neuroshard_proof::{Hash32, NodeId};

use super::outcomes::rank;
use super::{LONE_EXTRA_TIMEOUTS, Phase, SyncAction, Syncer};

/// An input of an aggregation: contributor, the peer to fetch its offer from, the offer.
type Input = (NodeId, Option<NodeId>, Hash32);
type Rank = (usize, std::cmp::Reverse<Hash32>);

impl Syncer {
    /// How long a replica with fewer than H/2 steps waits after a co-replica's offer against
    /// its θ₀ before it follows anyway: half the lead's deadline, so that its offer (prepared,
    /// then gossiped) still makes it.
    pub(super) fn follow_wait(&self) -> Duration {
        self.cfg.timeout / 2
    }

    /// Whether an offer of `next` against our θ₀ has been held for [`Self::follow_wait`];
    /// the first poll that sees one starts the wait.
    pub(super) fn lead_waited(&mut self, next: u64, now: Instant) -> bool {
        let since = match self.led_at {
            Some((r, since, _)) if r == next => since,
            _ => {
                self.led_at = Some((next, now, false));
                now
            }
        };
        let waited = now >= since + self.follow_wait();
        if waited && let Some(l) = self.led_at.as_mut() {
            l.2 = true;
        }
        waited
    }

    /// When the wait for a lead runs out, if a poll has not yet seen it run out.
    pub(super) fn lead_deadline(&self) -> Option<Instant> {
        self.led_at
            .filter(|(r, _, woken)| *r == self.round.saturating_add(1) && !woken)
            .map(|(_, since, _)| since + self.follow_wait())
    }

    /// Whether to offer into the next round with `done` inner steps since our θ₀: after H
    /// steps as a lead; as a follower (`led`: a co-replica offered against our θ₀) after
    /// H/2, since robust rules pick among the offers coordinate by coordinate and a Δ of a
    /// replica that just started would drag the median toward zero; and after a quarter
    /// round once the lead has waited [`Self::follow_wait`] (`waited`), so that a replica
    /// half as fast as the lead, or a little slower, still makes the round. Short of that it
    /// joins the round's outcome instead ([`Self::join_closed_round`]), and its steps count
    /// on toward its next offer (`Syncer::on_applied`). An outcome over one key's offer it
    /// joins only once that key waited as long as an honest lone lead does, so a key that
    /// leads every round the moment the last one closed decides none alone while the
    /// others step at a quarter of its pace in that time.
    pub(super) fn should_offer(&self, done: u64, led: bool, waited: bool) -> bool {
        let every = self.cfg.every;
        done >= every
            || (led && done.saturating_mul(2) >= every)
            || (waited && done > 0 && done.saturating_mul(4) >= every)
    }

    /// Records when `node`'s latest offer (`offer`) or outcome of `round` reached us.
    pub(super) fn saw(&mut self, node: NodeId, round: u64, offer: bool, now: Instant) {
        self.seen.insert((node, round, offer), now);
        let held = |s: &Self, r: &u64| {
            if offer {
                s.offers.get(r).is_some_and(|m| m.contains_key(&node))
            } else {
                s.dones.get(r).is_some_and(|m| m.contains_key(&node))
            }
        };
        let stale: Vec<u64> = self
            .seen
            .range((node, 0, false)..=(node, u64::MAX, true))
            .filter(|((_, r, o), _)| *o == offer && !held(self, r))
            .map(|((_, r, _), _)| *r)
            .collect();
        for r in stale {
            self.seen.remove(&(node, r, offer));
        }
    }

    /// Whether `announcer`'s outcome of `round` over `set` reached us `after` (a full round
    /// deadline, or more for an outcome over one offer) after the first of its offers did:
    /// its lead waited for the others, as an honest one does, so the round is over and an
    /// offer of ours now would only start a rival outcome that replicas already in the next
    /// round never weigh. One announced sooner may be a key cutting the round short to
    /// decide it alone: a replica that can offer does.
    fn closed_on_time(
        &self,
        round: u64,
        announcer: NodeId,
        set: &[(NodeId, Hash32)],
        after: Duration,
    ) -> bool {
        let Some(done) = self.seen.get(&(announcer, round, false)) else {
            return false;
        };
        set.iter()
            .filter_map(|(n, _)| self.seen.get(&(*n, round, true)))
            .min()
            .is_some_and(|first| *done >= *first + after)
    }

    /// The next round closed without us: recompute its best announced outcome whose every
    /// input we hold, signed by its contributor and made against our θ₀. Either the outcome
    /// came after a full round deadline ([`Self::closed_on_time`]) and an offer of ours would
    /// be late, or we cannot offer (`can_offer` false: too few steps when the lead's wait ran
    /// out, `waited`). The result is ours (every input a signed offer, nothing taken on trust), on
    /// the line the stage follows, and our inner progress is kept as a shift and goes into
    /// our next offer. An outcome of two or more keys announced early is joined only by
    /// replicas with nothing to offer, and the larger outcome of the replicas that did offer
    /// moves them (a replica that recomputed compares outcomes like any aggregator); one over
    /// a single key's offer only after [`LONE_EXTRA_TIMEOUTS`] deadlines.
    pub(super) fn join_closed_round(
        &mut self,
        now: Instant,
        waited: bool,
        can_offer: bool,
        live: &BTreeSet<NodeId>,
    ) -> Option<SyncAction> {
        let next = self.round.checked_add(1)?;
        if self.my_offers.contains_key(&next) {
            return None;
        }
        let mut best: Option<(Rank, Vec<Input>)> = None;
        for (announcer, (_, d)) in self.dones.get(&next)? {
            if self.refused.contains(&(next, d.theta)) {
                continue;
            }
            let set: Vec<(NodeId, Hash32)> = d.named().collect();
            let timeout = self.cfg.timeout;
            let joinable = if set.len() == 1 {
                // One key's offer: only once its lead waited as an honest lone lead does
                // (`LONE_EXTRA_TIMEOUTS`, less a deadline for the gossip's jitter). Before, a
                // key that led every round the moment the last one closed and announced its
                // lone outcome a deadline later decided every other round alone.
                self.closed_on_time(next, *announcer, &set, timeout * LONE_EXTRA_TIMEOUTS)
            } else {
                (!can_offer && waited) || self.closed_on_time(next, *announcer, &set, timeout)
            };
            if !joinable {
                continue;
            }
            let key = rank(set.len(), d.theta);
            if set.is_empty() || best.as_ref().is_some_and(|(k, _)| *k >= key) {
                continue;
            }
            let inputs: Option<Vec<Input>> = set
                .iter()
                .map(|(n, b)| {
                    let peer = (*n != self.me)
                        .then(|| self.held_offer(next, n, b, Some(self.theta)))
                        .flatten()?;
                    Some((*n, Some(peer), *b))
                })
                .collect();
            if let Some(inputs) = inputs {
                best = Some((key, inputs));
            }
        }
        let (_, from) = best?;
        self.phase = Phase::Aggregating {
            round: next,
            since: now,
            expected: live.len() + 1,
            sent: 0,
            dense: 0,
            from: from.iter().map(|(n, _, h)| (*n, *h)).collect(),
        };
        Some(SyncAction::Aggregate { round: next, from })
    }
}
