//! Who is alive and which stage they serve, from signed heartbeats and connection events.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use neuroshard_proof::NodeId;

use crate::records::Heartbeat;

/// Heartbeat period; a peer silent for `MISSED_BEATS` periods leaves routing.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
pub const MISSED_BEATS: u32 = 3;

#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub stage: usize,
    pub step: u64,
    /// Queue depth the peer last reported.
    pub queue: u32,
    pub last_seen: Instant,
    /// Smoothed time from sending it a request to its acknowledgement.
    pub latency: Option<Duration>,
    /// Our requests to it whose answer (gradient) has not come back.
    pub in_flight: u32,
    /// Whether micro-batches may be routed to it (the core clears it for a peer that is not
    /// registered for its stage: its gradients would not be taken).
    pub routable: bool,
}

/// The live peers of the network as this node sees them.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: BTreeMap<NodeId, PeerInfo>,
}

impl PeerTable {
    /// Records a verified heartbeat; a deathrattle removes the peer. Returns true when the
    /// peer is new to the table.
    pub fn on_heartbeat(&mut self, peer: NodeId, hb: &Heartbeat, now: Instant) -> bool {
        if hb.leaving {
            self.peers.remove(&peer);
            return false;
        }
        let stage = hb.stage as usize;
        match self.peers.get_mut(&peer) {
            Some(p) => {
                p.stage = stage;
                p.step = hb.step;
                p.queue = hb.queue;
                p.last_seen = now;
                false
            }
            None => {
                self.peers.insert(
                    peer,
                    PeerInfo {
                        stage,
                        step: hb.step,
                        queue: hb.queue,
                        last_seen: now,
                        latency: None,
                        in_flight: 0,
                        routable: true,
                    },
                );
                true
            }
        }
    }

    /// Adds a peer known from the DHT before its first heartbeat reaches us.
    pub fn on_discovered(&mut self, peer: NodeId, stage: usize, now: Instant) {
        self.peers.entry(peer).or_insert(PeerInfo {
            stage,
            step: 0,
            queue: 0,
            last_seen: now,
            latency: None,
            in_flight: 0,
            routable: true,
        });
    }

    pub fn remove(&mut self, peer: &NodeId) -> bool {
        self.peers.remove(peer).is_some()
    }

    /// Drops peers silent for too long and returns them.
    pub fn expire(&mut self, now: Instant) -> Vec<NodeId> {
        let limit = HEARTBEAT_EVERY * MISSED_BEATS;
        let dead: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last_seen) > limit)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            self.peers.remove(id);
        }
        dead
    }

    /// When the first live peer expires unless it is heard from.
    pub fn next_expiry(&self) -> Option<Instant> {
        let limit = HEARTBEAT_EVERY * MISSED_BEATS;
        self.peers.values().map(|p| p.last_seen + limit).min()
    }

    pub fn get(&self, peer: &NodeId) -> Option<&PeerInfo> {
        self.peers.get(peer)
    }

    pub fn get_mut(&mut self, peer: &NodeId) -> Option<&mut PeerInfo> {
        self.peers.get_mut(peer)
    }

    pub fn in_stage(&self, stage: usize) -> impl Iterator<Item = (&NodeId, &PeerInfo)> {
        self.peers.iter().filter(move |(_, p)| p.stage == stage)
    }

    /// Live replicas per stage (not counting this node).
    pub fn replica_counts(&self, stages: usize) -> Vec<usize> {
        let mut counts = vec![0; stages];
        for p in self.peers.values() {
            if let Some(c) = counts.get_mut(p.stage) {
                *c += 1;
            }
        }
        counts
    }

    /// Every live peer, whatever its stage.
    pub fn live_peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    pub fn observe_latency(&mut self, peer: &NodeId, sample: Duration) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.latency = Some(match p.latency {
                // EWMA with weight 1/4 on the new sample.
                Some(old) => (old * 3 + sample) / 4,
                None => sample,
            });
        }
    }
}

/// Picks the stage a joining node should serve: the one with the fewest live replicas among
/// those whose memory need fits the budget; ties go to the earlier stage.
pub fn choose_stage(replicas: &[usize], need_bytes: &[u64], budget: u64) -> Option<usize> {
    replicas
        .iter()
        .zip(need_bytes)
        .enumerate()
        .filter(|(_, (_, need))| **need <= budget)
        .min_by_key(|(i, (count, _))| (**count, *i))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_proof::NodeId;

    fn hb(stage: u16, leaving: bool) -> Heartbeat {
        Heartbeat {
            node: NodeId([0; 32]),
            network: [0; 32],
            stage,
            step: 1,
            queue: 0,
            time_ms: 0,
            leaving,
        }
    }

    #[test]
    fn silent_peers_expire_after_three_beats() {
        let mut t = PeerTable::default();
        let p = NodeId(rand::random());
        let t0 = Instant::now();
        assert!(t.on_heartbeat(p, &hb(1, false), t0));
        assert!(t.expire(t0 + HEARTBEAT_EVERY * 3).is_empty());
        assert_eq!(
            t.expire(t0 + HEARTBEAT_EVERY * 3 + Duration::from_millis(1)),
            vec![p]
        );
        assert!(t.is_empty());
    }

    #[test]
    fn deathrattle_removes_at_once() {
        let mut t = PeerTable::default();
        let p = NodeId(rand::random());
        let now = Instant::now();
        t.on_heartbeat(p, &hb(0, false), now);
        t.on_heartbeat(p, &hb(0, true), now);
        assert!(t.get(&p).is_none());
    }

    #[test]
    fn stage_choice_prefers_fewest_replicas_that_fit() {
        assert_eq!(choose_stage(&[0, 0], &[10, 10], 100), Some(0));
        assert_eq!(choose_stage(&[1, 0], &[10, 10], 100), Some(1));
        assert_eq!(choose_stage(&[2, 1, 1], &[10, 10, 10], 100), Some(1));
        assert_eq!(choose_stage(&[0, 3], &[500, 10], 100), Some(1));
        assert_eq!(choose_stage(&[0, 0], &[500, 500], 100), None);
    }
}
