//! DiLoCo between the replicas of one stage, as a sans-IO state machine.
//!
//! A round: the first replica whose inner steps reach H prepares its compressed
//! pseudo-gradient, offers it as a blob and gossips a signed [`SyncOffer`]; the other replicas
//! follow as soon as they see it, once they have taken at least H/2 steps of their own. Each replica collects the offers made against the same θ₀
//! until every live replica of its stage has offered or the deadline passes (a late replica is
//! left out, the round never waits forever), fetches the blobs (hash-checked), aggregates them
//! with the robust rule and applies the outer step, then gossips [`SyncDone`] with the hash of
//! its new outer state. Replicas that saw the same offers compute bit-identical states. Where
//! two outcomes differ, the one with more contributors (then the smaller hash) wins and the
//! others fetch it; a replica that is behind (restarted, joined, missed a round) fetches the
//! outer state named by the offers or announcements it sees.
//!
//! Training never stops for a round: the engine keeps stepping, and a new θ₀ is applied as a
//! shift of the replica's parameters, so inner progress made during the round is kept.

mod behind;
#[cfg(test)]
mod behind_tests;
mod follow;
#[cfg(test)]
mod follow_tests;
pub mod msgs;
#[cfg(test)]
mod outcome_tests;
mod outcomes;
pub mod pull;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use neuroshard_proof::{Hash32, NodeId};

use crate::events::{Clock, NodeEvent};

pub use msgs::{OfferCommitError, SyncDone, SyncMsg, SyncOffer, ThetaRecord, theta_key};
pub use pull::{SyncPull, SyncPullAnswer};

/// Contributors, each with the offer (blob) of it that went into an outcome.
pub type Named = Vec<(NodeId, Hash32)>;

/// Round timeouts without finishing a round or taking an inner step after which a replica
/// that is behind follows the largest group of its live co-replicas to a later state, not
/// only a majority (see `Syncer::behind`).
pub const STALLED_TIMEOUTS: u32 = 4;

/// Round timeouts a lead whose deadline came with no co-replica's offer against its θ₀
/// waits on while co-replicas are alive, before it closes the round alone: a replica joins
/// an outcome over one key's offer only once that key demonstrably waited (see
/// `Syncer::join_closed_round`), so an honest lone lead waits, and a key that closes every
/// round at once decides none of them.
pub const LONE_EXTRA_TIMEOUTS: u32 = 2;

/// Round parameters.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Inner steps per round (H); 0 turns DiLoCo off.
    pub every: u64,
    /// How long a replica waits for the other offers once its own is out.
    pub timeout: Duration,
    /// Pause before retrying a failed fetch of a peer's outer state.
    pub retry_after: Duration,
    /// Network id and stage our offers name.
    pub network: Hash32,
    pub stage: u16,
    /// Time of the events it reports.
    pub clock: Clock,
}

/// What the runtime must do.
#[derive(Debug, Clone, PartialEq)]
pub enum SyncAction {
    /// Compute, compress and offer the pseudo-gradient of `round` (engine).
    Prepare {
        round: u64,
    },
    /// Gossip this message (the runtime signs it).
    Publish(SyncMsg),
    /// Ask these live co-replicas for their own signed messages of `round`: their offers
    /// have not arrived by gossip (see [`pull`]).
    Pull {
        round: u64,
        from: Vec<NodeId>,
    },
    /// Fetch these pseudo-gradients (our own is local), then aggregate and apply `round`.
    Aggregate {
        round: u64,
        from: Vec<(NodeId, Option<NodeId>, Hash32)>,
    },
    /// Another replica announced a better outcome of the round we just applied: fetch the
    /// offers of its set we did not use and recompute the round over `set` ourselves, rather
    /// than taking its bytes on trust; `theta` is what it claims the result hashes to.
    Verify {
        round: u64,
        fetch: Vec<(NodeId, NodeId, Hash32)>,
        set: Vec<(NodeId, Hash32)>,
        theta: Hash32,
        announcer: NodeId,
    },
    /// A better outcome of our round names offers we do not hold (the contributor showed us
    /// another one, or none): ask `from`, who relayed it, for its signed offers of `nodes`.
    FetchOffers {
        round: u64,
        from: NodeId,
        nodes: Vec<NodeId>,
    },
    /// Fetch the outer state `hash` of `round` from `peer` and adopt it (we are behind, so we
    /// cannot recompute). `included`: whether our own offer of that round is part of it.
    Adopt {
        round: u64,
        peer: NodeId,
        hash: Hash32,
        included: bool,
    },
    Event(NodeEvent),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Idle,
    Preparing {
        round: u64,
        since: Instant,
    },
    Collecting {
        round: u64,
        since: Instant,
        deadline: Instant,
        mine: Hash32,
        sent: u64,
        dense: u64,
        /// The deadline was moved on once because no co-replica had offered against our θ₀
        /// (see [`LONE_EXTRA_TIMEOUTS`]).
        extended: bool,
    },
    Aggregating {
        round: u64,
        since: Instant,
        expected: usize,
        sent: u64,
        dense: u64,
        /// The offer (blob) of each input, ours included.
        from: BTreeMap<NodeId, Hash32>,
    },
    Adopting {
        round: u64,
        theta: Hash32,
    },
}

/// One replica's view of its stage's rounds.
#[derive(Debug)]
pub struct Syncer {
    cfg: SyncConfig,
    me: NodeId,
    /// Rounds completed: the outer state is the result of round `round`.
    round: u64,
    theta: Hash32,
    /// Who went into our outer state, each with the offer of it that went in.
    contributors: BTreeMap<NodeId, Hash32>,
    phase: Phase,
    /// Inner steps when the current round's θ₀ was taken.
    round_start_step: u64,
    offers: BTreeMap<u64, BTreeMap<NodeId, (NodeId, SyncOffer)>>,
    /// Earlier signed offers of a sender's round that a later one replaced in `offers`: an
    /// outcome may name one of them (see [`SyncDone::blobs`]).
    displaced: BTreeMap<u64, BTreeMap<NodeId, Vec<(NodeId, SyncOffer)>>>,
    /// (round, announcer, outcome) we asked for the offers the outcome names: once per
    /// announcer and round, at most [`ASKS_PER_OUTCOME`] announcers per outcome.
    asked_offers: BTreeSet<(u64, NodeId, Hash32)>,
    dones: BTreeMap<u64, BTreeMap<NodeId, (NodeId, SyncDone)>>,
    /// Outer states heard of outside gossip (the DHT record at start-up).
    hints: BTreeMap<u64, (NodeId, Hash32)>,
    retry_at: Option<Instant>,
    agreed: BTreeSet<(u64, NodeId)>,
    /// Outcomes that our recomputation contradicted.
    refused: BTreeSet<(u64, Hash32)>,
    /// Whether our outer state of `round` is one we aggregated (so we can recompute it).
    aggregated: bool,
    /// Our latest offers, by round: the θ₀ each was computed against and its
    /// pseudo-gradient. An outcome built on offers against another θ₀ is another lineage, not
    /// something a recomputation can judge; kept for the last few rounds, since a replica
    /// already in the next round still weighs outcomes of its last one.
    my_offers: BTreeMap<u64, (Hash32, Hash32)>,
    /// When this replica last finished a round (its own, recomputed or adopted).
    last_progress: Option<Instant>,
    /// Our inner step count when last polled, and since when it has not changed.
    last_step: Option<(u64, Instant)>,
    /// When to pull the offers still missing from the round being collected.
    pull_at: Option<(u64, Instant)>,
    /// The next round, since when a co-replica's offer of it against our θ₀ has been held, and
    /// whether a poll has run since the wait for it ran out (see [`Syncer::follow_wait`]).
    led_at: Option<(u64, Instant, bool)>,
    /// When each sender's latest offer and outcome of a round reached us (see
    /// [`Syncer::closed_on_time`]); entries follow `offers` and `dones`.
    seen: BTreeMap<(NodeId, u64, bool), Instant>,
    /// Our training has ended (a driver took its last step): we start no round and follow
    /// none, since no inner progress comes after it, and a round begun at the end would
    /// leave us on a state our co-replicas may never see.
    training_ended: bool,
    /// Co-replicas the finalized ledger counts as active provers of our stage (registered,
    /// paid lately), whether or not we hear them: catching up needs a majority of them and
    /// the live ones together, so keys that are all a replica hears (it just started, or
    /// peers hide the rest) cannot move it alone.
    active: BTreeSet<NodeId>,
}

/// Rounds of offers (and of outcomes) kept per sender: its latest ones. Replicas are at most
/// a round or two apart, and a replica behind needs only the latest rounds to catch up, so a
/// sender that announces thousands of future rounds holds this many entries, not thousands.
pub const ROUNDS_PER_SENDER: usize = 4;
/// Earlier offers of one round kept per sender (besides its latest): an honest replica
/// re-offers a round only after a restart or a failed attempt.
pub const DISPLACED_PER_SENDER: usize = 3;
/// Announcers of one outcome asked for the offers it names: one that withholds them is not
/// the only chance, and a stage of many replicas announcing it does not cost a fetch each.
pub const ASKS_PER_OUTCOME: usize = 2;
/// Rounds of our own offers remembered (their θ₀ and pseudo-gradient).
const MY_OFFERS_KEPT: usize = 3;

/// Drops `node`'s entries of `by_round` beyond its [`ROUNDS_PER_SENDER`] latest rounds.
pub(crate) fn keep_latest_per_sender<T>(
    by_round: &mut BTreeMap<u64, BTreeMap<NodeId, T>>,
    node: &NodeId,
) {
    let mine: Vec<u64> = by_round
        .iter()
        .filter(|(_, m)| m.contains_key(node))
        .map(|(r, _)| *r)
        .collect();
    let excess = mine.len().saturating_sub(ROUNDS_PER_SENDER);
    for round in mine.into_iter().take(excess) {
        if let Some(m) = by_round.get_mut(&round) {
            m.remove(node);
            if m.is_empty() {
                by_round.remove(&round);
            }
        }
    }
}

impl Syncer {
    /// How many of the `live` co-replicas announced outer state `theta` for `round`.
    pub fn announced(&self, round: u64, theta: Hash32, live: &BTreeSet<NodeId>) -> usize {
        self.dones.get(&round).map_or(0, |d| {
            d.iter()
                .filter(|(n, (_, d))| d.theta == theta && live.contains(n))
                .count()
        })
    }

    /// Offers and outcomes held (what a flooding sender could grow).
    pub fn held(&self) -> usize {
        let offers: usize = self.offers.values().map(BTreeMap::len).sum();
        let dones: usize = self.dones.values().map(BTreeMap::len).sum();
        offers + dones
    }

    pub fn new(cfg: SyncConfig, me: NodeId, round: u64, theta: Hash32, steps: u64) -> Self {
        Self {
            cfg,
            me,
            round,
            theta,
            contributors: BTreeMap::new(),
            phase: Phase::Idle,
            round_start_step: steps,
            offers: BTreeMap::new(),
            displaced: BTreeMap::new(),
            asked_offers: BTreeSet::new(),
            dones: BTreeMap::new(),
            hints: BTreeMap::new(),
            retry_at: None,
            agreed: BTreeSet::new(),
            refused: BTreeSet::new(),
            aggregated: false,
            my_offers: BTreeMap::new(),
            last_progress: None,
            last_step: None,
            pull_at: None,
            led_at: None,
            seen: BTreeMap::new(),
            training_ended: false,
            active: BTreeSet::new(),
        }
    }

    /// The stage's active provers by the finalized ledger (see [`Syncer::behind`]); we are
    /// left out of them.
    pub fn set_active(&mut self, mut active: BTreeSet<NodeId>) {
        active.remove(&self.me);
        self.active = active;
    }

    /// Our training has ended: rounds already under way finish, outcomes of others are still
    /// adopted, but no new round starts here.
    pub fn end_training(&mut self) {
        self.training_ended = true;
    }

    pub fn enabled(&self) -> bool {
        self.cfg.every > 0
    }

    /// Moves to `round` as an adopted outcome would (tests of what waits on a round).
    #[cfg(test)]
    pub(crate) fn jump_to(&mut self, round: u64) {
        self.round = round;
    }

    pub fn round(&self) -> u64 {
        self.round
    }

    pub fn theta(&self) -> Hash32 {
        self.theta
    }

    /// True while a round of ours is between its offer and its outcome.
    pub fn busy(&self) -> bool {
        self.phase != Phase::Idle
    }

    /// A signed offer from a co-replica (network and stage already checked by the caller).
    pub fn on_offer(
        &mut self,
        peer: NodeId,
        node: NodeId,
        offer: SyncOffer,
        now: Instant,
    ) -> Vec<SyncAction> {
        // Offers of the round just finished still matter: they vouch for the contributors of
        // a larger outcome someone may announce. Round 0 is the genesis state, never offered.
        if offer.round < self.round || offer.round == 0 || node == self.me {
            return Vec::new();
        }
        let round = offer.round;
        let blob = offer.blob;
        let held = self.offers.entry(round).or_default();
        if let Some(old) = held.insert(node, (peer, offer))
            && old.1.blob != blob
        {
            let kept = self
                .displaced
                .entry(round)
                .or_default()
                .entry(node)
                .or_default();
            kept.retain(|(_, o)| o.blob != old.1.blob);
            kept.push(old);
            if kept.len() > DISPLACED_PER_SENDER {
                kept.remove(0);
            }
        }
        keep_latest_per_sender(&mut self.offers, &node);
        self.saw(node, round, true, now);
        keep_latest_per_sender(&mut self.displaced, &node);
        // An offer that arrives after a larger outcome naming it was announced (it was late,
        // or held until its sender's registration arrived) lets us recompute that outcome.
        if round == self.round && self.comparing() && self.dones.contains_key(&round) {
            return self.compare_outcomes(now);
        }
        Vec::new()
    }

    /// A signed round outcome from a co-replica.
    pub fn on_done(
        &mut self,
        peer: NodeId,
        node: NodeId,
        done: SyncDone,
        now: Instant,
    ) -> Vec<SyncAction> {
        if done.round < self.round || node == self.me {
            return Vec::new();
        }
        let round = done.round;
        self.dones
            .entry(round)
            .or_default()
            .insert(node, (peer, done));
        keep_latest_per_sender(&mut self.dones, &node);
        self.saw(node, round, false, now);
        if round == self.round && self.comparing() {
            return self.compare_outcomes(now);
        }
        Vec::new()
    }

    /// An outer state named outside gossip (e.g. the stage's DHT record): a vote of `peer`,
    /// its publisher, counted only while `peer` is a live co-replica.
    pub fn on_hint(&mut self, peer: NodeId, round: u64, theta: Hash32) {
        if round > self.round {
            self.hints.insert(round, (peer, theta));
        }
    }

    /// When [`Self::poll`] must run next even if nothing arrives: the offer deadline or the
    /// retry after a failure.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Collecting { deadline, .. } => {
                Some(self.pull_deadline().map_or(*deadline, |p| p.min(*deadline)))
            }
            Phase::Idle => [self.retry_at, self.lead_deadline()]
                .into_iter()
                .flatten()
                .min(),
            _ => None,
        }
    }

    /// Drives the rounds; call after every optimizer step and on a timer. `live` are the
    /// co-replicas of our stage currently alive (ourselves excluded).
    pub fn poll(&mut self, now: Instant, steps: u64, live: &BTreeSet<NodeId>) -> Vec<SyncAction> {
        if !self.enabled() {
            return Vec::new();
        }
        match self.phase.clone() {
            Phase::Idle => {
                if self.retry_at.is_some_and(|t| now < t) {
                    return Vec::new();
                }
                // Stalled: neither a round finished nor an inner step taken for a while (our
                // training ended, or no work reaches us). Steps count so that rounds longer than
                // the stall (a deep pipeline) do not leave a working replica open to the
                // looser rule of `behind` between its rounds.
                let since = *self.last_progress.get_or_insert(now);
                let stepped = match self.last_step {
                    Some((s, t)) if s == steps => t,
                    _ => {
                        self.last_step = Some((steps, now));
                        now
                    }
                };
                let stalled = now.saturating_duration_since(since.max(stepped))
                    >= self.cfg.timeout * STALLED_TIMEOUTS;
                if let Some(adopt) = self.behind(live, stalled) {
                    return vec![adopt];
                }
                let next = self.round.saturating_add(1);
                let led = self
                    .offers
                    .get(&next)
                    .is_some_and(|o| o.values().any(|(_, offer)| offer.base == self.theta));
                let waited = led && self.lead_waited(next, now);
                let done = steps.saturating_sub(self.round_start_step);
                let follow = !self.training_ended && self.should_offer(done, led, waited);
                if let Some(join) = self.join_closed_round(now, waited, follow, live) {
                    return vec![join];
                }
                if follow {
                    self.phase = Phase::Preparing {
                        round: next,
                        since: now,
                    };
                    return vec![SyncAction::Prepare { round: next }];
                }
                Vec::new()
            }
            Phase::Collecting {
                round,
                since,
                deadline,
                mine,
                sent,
                dense,
                extended,
            } => {
                if let Some(pull) = self.poll_pull(now, live) {
                    return vec![pull];
                }
                let awaited = live.iter().any(|n| !self.heard(round, n));
                if now < deadline && awaited {
                    return Vec::new();
                }
                let mut from = vec![(self.me, None, mine)];
                if let Some(offers) = self.offers.get(&round) {
                    from.extend(
                        offers
                            .iter()
                            .filter(|(_, (_, o))| o.base == self.theta)
                            .map(|(n, (p, o))| (*n, Some(*p), o.blob)),
                    );
                }
                let alone = from.len() == 1;
                if alone && awaited && !extended {
                    // Missing offers are still pulled, a quarter of the wait apart.
                    self.pull_at = Some((round, now + self.cfg.timeout / 4));
                    if let Phase::Collecting {
                        deadline, extended, ..
                    } = &mut self.phase
                    {
                        *deadline += self.cfg.timeout * LONE_EXTRA_TIMEOUTS;
                        *extended = true;
                    }
                    return Vec::new();
                }
                self.phase = Phase::Aggregating {
                    round,
                    since,
                    expected: live.len() + 1,
                    sent,
                    dense,
                    from: from.iter().map(|(n, _, h)| (*n, *h)).collect(),
                };
                vec![SyncAction::Aggregate { round, from }]
            }
            Phase::Preparing { .. } | Phase::Aggregating { .. } | Phase::Adopting { .. } => {
                Vec::new()
            }
        }
    }

    /// The engine prepared our pseudo-gradient of `round`, now offered as blob `blob` with
    /// its signed commitment (the job auditors replay).
    pub fn on_prepared(
        &mut self,
        round: u64,
        blob: Hash32,
        sent: u64,
        dense: u64,
        commitment: Option<Box<neuroshard_audit::SignedJob>>,
        now: Instant,
    ) -> Vec<SyncAction> {
        let Phase::Preparing { round: r, since } = self.phase else {
            return Vec::new();
        };
        if r != round {
            return Vec::new();
        }
        self.my_offers.insert(round, (self.theta, blob));
        while self.my_offers.len() > MY_OFFERS_KEPT {
            self.my_offers.pop_first();
        }
        self.pull_at = Some((round, now + self.cfg.timeout / 4));
        self.phase = Phase::Collecting {
            round,
            since,
            deadline: now + self.cfg.timeout,
            mine: blob,
            sent,
            dense,
            extended: false,
        };
        vec![SyncAction::Publish(SyncMsg::Offer(SyncOffer {
            network: self.cfg.network,
            stage: self.cfg.stage,
            round,
            base: self.theta,
            blob,
            bytes: sent,
            dense_bytes: dense,
            commitment,
        }))]
    }

    /// Preparing or aggregating failed (the engine says why); the round is skipped locally and
    /// the replica catches up by adopting the others' outcome.
    pub fn on_failed(&mut self, now: Instant) {
        self.phase = Phase::Idle;
        self.retry_at = Some(now + self.cfg.retry_after);
    }

    /// The engine applied `round` with `contributors`; the outer state hashes to `theta`.
    /// Also returns each contributor with the offer of it that went in (ours included), for
    /// the outcome to name and the others' to countersign.
    pub fn on_applied(
        &mut self,
        round: u64,
        theta: Hash32,
        contributors: Vec<NodeId>,
        steps: u64,
        now: Instant,
    ) -> (Vec<SyncAction>, Vec<(NodeId, Hash32)>) {
        let Phase::Aggregating {
            round: r,
            since,
            expected,
            sent,
            dense,
            ref from,
        } = self.phase
        else {
            return (Vec::new(), Vec::new());
        };
        if r != round {
            return (Vec::new(), Vec::new());
        }
        // The offers fetched for the aggregation, not the latest held: another offer of a
        // contributor may have arrived while the engine worked.
        let named: Vec<(NodeId, Hash32)> = contributors
            .iter()
            .filter_map(|n| from.get(n).map(|h| (*n, *h)))
            .collect();
        let included_self = contributors.contains(&self.me);
        let start = self.round_start_step;
        self.finish_round(round, theta, named.iter().copied().collect(), steps);
        if !included_self {
            // A round we only joined took none of our steps: they still count toward our
            // next offer, or a key that leads every round at once (when everyone else has
            // just started) would have us join its lone outcome round after round.
            self.round_start_step = start;
        }
        self.aggregated = true;
        let mut actions = vec![SyncAction::Event(NodeEvent::Sync {
            stage: self.cfg.stage.into(),
            round,
            theta: hex::encode(theta),
            contributors: contributors.len(),
            expected,
            included_self,
            wall_ms: now.duration_since(since).as_secs_f64() * 1e3,
            sent_bytes: sent,
            dense_bytes: dense,
            time_ms: self.cfg.clock.unix_ms(now),
        })];
        actions.extend(self.compare_outcomes(now));
        (actions, named)
    }

    /// We now hold the outer state `theta` of `round`, fetched from a peer.
    pub fn on_adopted(
        &mut self,
        round: u64,
        theta: Hash32,
        steps: u64,
        reason: &str,
        now: Instant,
    ) -> SyncAction {
        let contributors = self
            .dones
            .get(&round)
            .and_then(|d| d.values().find(|(_, d)| d.theta == theta))
            .map(|(_, d)| d.named().collect())
            .unwrap_or_default();
        self.finish_round(round, theta, contributors, steps);
        self.aggregated = false;
        SyncAction::Event(NodeEvent::Adopted {
            stage: self.cfg.stage.into(),
            round,
            theta: hex::encode(theta),
            reason: reason.to_string(),
            time_ms: self.cfg.clock.unix_ms(now),
        })
    }

    fn finish_round(
        &mut self,
        round: u64,
        theta: Hash32,
        contributors: BTreeMap<NodeId, Hash32>,
        steps: u64,
    ) {
        // A replica that adopts mid-round keeps its step phase: its next round starts when
        // the others' does (it follows their offers), not H steps from now.
        if round > self.round {
            self.round_start_step = steps;
        }
        self.last_progress = None;
        self.round = round;
        self.theta = theta;
        self.contributors = contributors;
        self.phase = Phase::Idle;
        self.retry_at = None;
        self.offers.retain(|r, _| *r >= round);
        self.displaced.retain(|r, _| *r >= round);
        self.asked_offers.retain(|(r, _, _)| *r >= round);
        self.dones.retain(|r, _| *r >= round);
        self.seen.retain(|(_, r, _), _| *r >= round);
        self.hints.retain(|r, _| *r > round);
    }

    /// We recomputed `round` over a larger set after another replica announced `claimed`.
    /// Our result stands either way (every input was a signed offer); a claim it contradicts
    /// is never considered again.
    pub fn on_recomputed(
        &mut self,
        round: u64,
        theta: Hash32,
        claimed: Hash32,
        contributors: Vec<(NodeId, Hash32)>,
        steps: u64,
        now: Instant,
    ) -> Vec<SyncAction> {
        let reason = if theta == claimed {
            "recomputed a larger outcome and reached the announced hash".to_string()
        } else {
            self.refused.insert((round, claimed));
            self.refused.retain(|(r, _)| r.saturating_add(4) > round);
            format!(
                "recomputed a larger outcome; the announced hash {} was wrong",
                hex::encode(claimed)
            )
        };
        self.finish_round(round, theta, contributors.into_iter().collect(), steps);
        self.aggregated = true;
        let mut actions = vec![SyncAction::Event(NodeEvent::Adopted {
            stage: self.cfg.stage.into(),
            round,
            theta: hex::encode(theta),
            reason,
            time_ms: self.cfg.clock.unix_ms(now),
        })];
        actions.extend(self.compare_outcomes(now));
        actions
    }
}
