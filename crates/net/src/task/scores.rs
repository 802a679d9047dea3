//! Application scores: penalties lower them (gossipsub adds them to the peer score), time
//! heals them, and at the ban threshold the peer is cut off.

use libp2p::PeerId;

use super::Task;

/// Application scores move toward zero by this factor every decay tick.
const SCORE_DECAY: f64 = 0.9;

impl Task {
    pub(super) fn penalize(&mut self, peer: PeerId, amount: f64, reason: &str) {
        if peer == self.local() || self.banned.contains(&peer) {
            return;
        }
        let score = self.app_scores.entry(peer).or_insert(0.0);
        *score -= amount.abs();
        let score = *score;
        tracing::warn!(%peer, score, reason, "peer penalized");
        let gossip = &mut self.swarm.behaviour_mut().gossip;
        gossip.set_application_score(&peer, score);
        if score <= self.config.ban_threshold {
            tracing::warn!(%peer, score, "peer blocked");
            self.banned.insert(peer);
            let b = self.swarm.behaviour_mut();
            b.block.block_peer(peer);
            b.gossip.blacklist_peer(&peer);
            b.kad.remove_peer(&peer);
            let _ = self.swarm.disconnect_peer_id(peer);
        }
    }

    pub(super) fn decay_scores(&mut self) {
        let banned = &self.banned;
        let gossip = &mut self.swarm.behaviour_mut().gossip;
        self.app_scores.retain(|peer, score| {
            if banned.contains(peer) {
                return true;
            }
            *score *= SCORE_DECAY;
            let keep = score.abs() >= 0.1;
            gossip.set_application_score(peer, if keep { *score } else { 0.0 });
            keep
        });
    }
}
