//! Application scores: penalties lower them (gossipsub adds them to the peer score), time
//! heals them, and at the ban threshold the peer is cut off for a while.
//!
//! Both tables are keyed by peers anyone can mint, so both are bounded: [`Scores`] holds at
//! most [`MAX_SCORED`] scores (the one nearest zero makes room) and [`MAX_BANNED`] bans, which
//! expire after [`BAN_DURATION`] (the oldest makes room). A ban that ends unblocks the peer; one
//! that misbehaves again is banned again after the same penalties.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::Task;

/// Application scores move toward zero by this factor every decay tick.
const SCORE_DECAY: f64 = 0.9;
/// Scores kept at once.
pub(crate) const MAX_SCORED: usize = 8_192;
/// Bans held at once.
pub(crate) const MAX_BANNED: usize = 8_192;
/// How long a ban lasts.
pub(crate) const BAN_DURATION: Duration = Duration::from_secs(3_600);

/// What a penalty did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Penalized {
    /// The peer's score is now this.
    Scored(f64),
    /// The score reached the threshold: block the peer.
    Banned(f64),
    /// Already banned (or ourselves): nothing to do.
    Ignored,
}

/// Scores and bans, bounded; pure bookkeeping that [`Task`] applies to the swarm.
#[derive(Debug, Default)]
pub(crate) struct Scores {
    scores: HashMap<PeerId, f64>,
    banned: HashMap<PeerId, Instant>,
    /// Bans in the order they were made (each with its time, to skip a stale entry).
    ban_order: VecDeque<(Instant, PeerId)>,
}

impl Scores {
    pub fn is_banned(&self, peer: &PeerId) -> bool {
        self.banned.contains_key(peer)
    }

    #[cfg(test)]
    pub fn held(&self) -> (usize, usize) {
        (self.scores.len(), self.banned.len())
    }

    /// Lowers `peer`'s score by `amount`; at or below `threshold` it is banned. Returns also
    /// the peers whose bans ended to make room (unblock them).
    pub fn penalize(
        &mut self,
        peer: PeerId,
        amount: f64,
        threshold: f64,
        now: Instant,
    ) -> (Penalized, Vec<PeerId>) {
        if self.banned.contains_key(&peer) {
            return (Penalized::Ignored, Vec::new());
        }
        if !self.scores.contains_key(&peer) && self.scores.len() >= MAX_SCORED {
            // The score nearest zero is the one time would have healed first.
            if let Some(mild) = self
                .scores
                .iter()
                .min_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .map(|(p, _)| *p)
            {
                self.scores.remove(&mild);
            }
        }
        let score = self.scores.entry(peer).or_insert(0.0);
        *score -= amount.abs();
        let score = *score;
        if score > threshold {
            return (Penalized::Scored(score), Vec::new());
        }
        let mut ended = Vec::new();
        while self.banned.len() >= MAX_BANNED {
            match self.ban_order.pop_front() {
                Some((at, old)) if self.banned.get(&old) == Some(&at) => {
                    self.banned.remove(&old);
                    self.scores.remove(&old);
                    ended.push(old);
                }
                Some(_) => {}
                None => break,
            }
        }
        self.banned.insert(peer, now);
        self.ban_order.push_back((now, peer));
        (Penalized::Banned(score), ended)
    }

    /// Moves every score toward zero (dropping the healed ones) and ends bans older than
    /// [`BAN_DURATION`]. Returns (peer, score) pairs to hand to gossipsub and the peers to
    /// unblock.
    pub fn decay(&mut self, now: Instant) -> (Vec<(PeerId, f64)>, Vec<PeerId>) {
        let mut ended = Vec::new();
        while let Some(&(at, peer)) = self.ban_order.front() {
            if now.saturating_duration_since(at) < BAN_DURATION {
                break;
            }
            self.ban_order.pop_front();
            if self.banned.get(&peer) == Some(&at) {
                self.banned.remove(&peer);
                self.scores.remove(&peer);
                ended.push(peer);
            }
        }
        let banned = &self.banned;
        let mut updates = Vec::new();
        self.scores.retain(|peer, score| {
            if banned.contains_key(peer) {
                return true;
            }
            *score *= SCORE_DECAY;
            let keep = score.abs() >= 0.1;
            updates.push((*peer, if keep { *score } else { 0.0 }));
            keep
        });
        for peer in &ended {
            updates.push((*peer, 0.0));
        }
        (updates, ended)
    }
}

impl Task {
    pub(super) fn penalize(&mut self, peer: PeerId, amount: f64, reason: &str) {
        if peer == self.local() {
            return;
        }
        let threshold = self.config.ban_threshold;
        let (outcome, ended) = self
            .scores
            .penalize(peer, amount, threshold, Instant::now());
        self.unban(&ended);
        let gossip = &mut self.swarm.behaviour_mut().gossip;
        match outcome {
            Penalized::Ignored => {}
            Penalized::Scored(score) => {
                tracing::warn!(%peer, score, reason, "peer penalized");
                gossip.set_application_score(&peer, score);
            }
            Penalized::Banned(score) => {
                tracing::warn!(%peer, score, reason, "peer blocked");
                gossip.set_application_score(&peer, score);
                let b = self.swarm.behaviour_mut();
                b.block.block_peer(peer);
                b.gossip.blacklist_peer(&peer);
                b.kad.remove_peer(&peer);
                let _ = self.swarm.disconnect_peer_id(peer);
            }
        }
    }

    pub(super) fn decay_scores(&mut self) {
        let (updates, ended) = self.scores.decay(Instant::now());
        let gossip = &mut self.swarm.behaviour_mut().gossip;
        for (peer, score) in updates {
            gossip.set_application_score(&peer, score);
        }
        self.unban(&ended);
    }

    fn unban(&mut self, peers: &[PeerId]) {
        let b = self.swarm.behaviour_mut();
        for peer in peers {
            tracing::info!(%peer, "ban ended");
            b.block.unblock_peer(*peer);
            b.gossip.remove_blacklisted_peer(peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLD: f64 = -100.0;

    #[test]
    fn a_crowd_of_penalised_keys_holds_bounded_scores_and_bans() {
        let mut s = Scores::default();
        let now = Instant::now();
        let first = PeerId::random();
        // The first peer is banned; then more fresh keys than both caps, each banned too.
        assert!(matches!(
            s.penalize(first, 200.0, THRESHOLD, now).0,
            Penalized::Banned(_)
        ));
        let mut ended = Vec::new();
        for _ in 0..MAX_BANNED + 10 {
            let (outcome, e) = s.penalize(PeerId::random(), 200.0, THRESHOLD, now);
            assert!(matches!(outcome, Penalized::Banned(_)));
            ended.extend(e);
        }
        let (scored, banned) = s.held();
        assert!(
            scored <= MAX_SCORED && banned <= MAX_BANNED,
            "{scored} {banned}"
        );
        // The oldest bans made room, the first one first.
        assert_eq!(ended.first(), Some(&first));
        assert!(!s.is_banned(&first));
        // Mild penalties of fresh keys never grow the scores past their cap either.
        for _ in 0..MAX_SCORED + 10 {
            s.penalize(PeerId::random(), 1.0, THRESHOLD, now);
        }
        assert!(s.held().0 <= MAX_SCORED);
    }

    #[test]
    fn a_ban_ends_after_its_duration_and_a_repeat_offender_is_banned_again() {
        let mut s = Scores::default();
        let now = Instant::now();
        let peer = PeerId::random();
        for _ in 0..4 {
            assert!(matches!(
                s.penalize(peer, 20.0, THRESHOLD, now).0,
                Penalized::Scored(_)
            ));
        }
        assert!(matches!(
            s.penalize(peer, 20.0, THRESHOLD, now).0,
            Penalized::Banned(_)
        ));
        assert_eq!(s.penalize(peer, 20.0, THRESHOLD, now).0, Penalized::Ignored);
        let (_, ended) = s.decay(now + BAN_DURATION / 2);
        assert!(ended.is_empty() && s.is_banned(&peer));
        let (updates, ended) = s.decay(now + BAN_DURATION);
        assert_eq!(ended, vec![peer]);
        assert!(updates.contains(&(peer, 0.0)), "its score is reset");
        assert!(!s.is_banned(&peer));
        // Back at zero: the same five penalties ban it again.
        let later = now + BAN_DURATION;
        let outcomes: Vec<_> = (0..5)
            .map(|_| s.penalize(peer, 20.0, THRESHOLD, later).0)
            .collect();
        assert!(matches!(outcomes[4], Penalized::Banned(_)), "{outcomes:?}");
    }
}
