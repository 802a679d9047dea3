//! Who is alive and which stage they serve, from signed heartbeats and connection events.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use neuroshard_proof::NodeId;

use crate::records::Heartbeat;

/// Heartbeat period of a small stage; a peer silent for `MISSED_BEATS` of its periods leaves
/// routing.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
pub const MISSED_BEATS: u32 = 3;
/// Heartbeats a stage publishes per `HEARTBEAT_EVERY`, whatever its size: each heartbeat is
/// heard by three stages' replicas, so a fixed period costs n² deliveries per second.
pub const STAGE_BEATS: usize = 8;
/// The longest period: liveness must still be learnt within a few minutes.
pub const MAX_HEARTBEAT_EVERY: Duration = Duration::from_secs(30);

/// Heartbeat period of a replica in a stage of `replicas` registered replicas.
pub fn heartbeat_every(replicas: usize) -> Duration {
    let periods = replicas.div_ceil(STAGE_BEATS).max(1);
    HEARTBEAT_EVERY
        .saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX))
        .min(MAX_HEARTBEAT_EVERY)
}

/// The period a heartbeat claims, as held: a peer cannot stay in routing longer than
/// `MISSED_BEATS × MAX_HEARTBEAT_EVERY` after its last beat, whatever it claims.
fn claimed_period(every_ms: u32) -> Duration {
    Duration::from_millis(u64::from(every_ms)).clamp(HEARTBEAT_EVERY, MAX_HEARTBEAT_EVERY)
}

#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub stage: usize,
    pub step: u64,
    /// Queue depth the peer last reported.
    pub queue: u32,
    pub last_seen: Instant,
    /// The heartbeat period it announced (clamped); it expires after `MISSED_BEATS` of them.
    pub beat_every: Duration,
    /// Smoothed time from sending it a request to its acknowledgement.
    pub latency: Option<Duration>,
    /// Our requests to it whose answer (gradient) has not come back.
    pub in_flight: u32,
    /// Whether micro-batches may be routed to it (the core clears it for a peer that is not
    /// registered for its stage: its gradients would not be taken).
    pub routable: bool,
}

impl PeerInfo {
    /// When it counts as gone unless heard from again.
    fn deadline(&self) -> Instant {
        self.last_seen + self.beat_every.saturating_mul(MISSED_BEATS)
    }
}

/// The live peers of the network as this node sees them.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: BTreeMap<NodeId, PeerInfo>,
    /// Bumped when a peer joins, leaves or changes stage (not on a mere heartbeat).
    membership: u64,
    /// Every peer by the instant it expires unless heard from: the next expiry is the
    /// first, where a scan of the table on every timer poll cost O(peers).
    deadlines: BTreeSet<(Instant, NodeId)>,
}

impl PeerTable {
    /// Records a verified heartbeat; a deathrattle removes the peer. Returns true when the
    /// peer is new to the table.
    pub fn on_heartbeat(&mut self, peer: NodeId, hb: &Heartbeat, now: Instant) -> bool {
        if hb.leaving {
            self.remove(&peer);
            return false;
        }
        let stage = hb.stage as usize;
        let fresh = match self.peers.get_mut(&peer) {
            Some(p) => {
                if p.stage != stage {
                    self.membership = self.membership.wrapping_add(1);
                }
                self.deadlines.remove(&(p.deadline(), peer));
                p.stage = stage;
                p.step = hb.step;
                p.queue = hb.queue;
                p.last_seen = now;
                p.beat_every = claimed_period(hb.every_ms);
                false
            }
            None => {
                self.membership = self.membership.wrapping_add(1);
                self.peers.insert(
                    peer,
                    PeerInfo {
                        stage,
                        step: hb.step,
                        queue: hb.queue,
                        last_seen: now,
                        beat_every: claimed_period(hb.every_ms),
                        latency: None,
                        in_flight: 0,
                        routable: true,
                    },
                );
                true
            }
        };
        if let Some(p) = self.peers.get(&peer) {
            self.deadlines.insert((p.deadline(), peer));
        }
        fresh
    }

    /// Adds a peer known from the DHT before its first heartbeat reaches us.
    pub fn on_discovered(&mut self, peer: NodeId, stage: usize, now: Instant) {
        if self.peers.contains_key(&peer) {
            return;
        }
        self.membership = self.membership.wrapping_add(1);
        let p = PeerInfo {
            stage,
            step: 0,
            queue: 0,
            last_seen: now,
            beat_every: HEARTBEAT_EVERY,
            latency: None,
            in_flight: 0,
            routable: true,
        };
        self.deadlines.insert((p.deadline(), peer));
        self.peers.insert(peer, p);
    }

    pub fn remove(&mut self, peer: &NodeId) -> bool {
        let Some(p) = self.peers.remove(peer) else {
            return false;
        };
        self.deadlines.remove(&(p.deadline(), *peer));
        self.membership = self.membership.wrapping_add(1);
        true
    }

    /// Changes whenever a peer joins, leaves or changes stage: what a cache of stage
    /// members is keyed by.
    pub fn membership(&self) -> u64 {
        self.membership
    }

    /// Drops peers silent for too long and returns them.
    pub fn expire(&mut self, now: Instant) -> Vec<NodeId> {
        // Silent for longer than the limit: its deadline is strictly before now.
        let mut dead: Vec<NodeId> = self
            .deadlines
            .iter()
            .take_while(|(deadline, _)| *deadline < now)
            .map(|(_, id)| *id)
            .collect();
        dead.sort_unstable();
        for id in &dead {
            self.remove(id);
        }
        dead
    }

    /// When the first live peer expires unless it is heard from.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
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

    /// Peers in the table that are not routed to (not registered for their stage).
    pub fn unroutable(&self) -> usize {
        self.peers.values().filter(|p| !p.routable).count()
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
            every_ms: 2_000,
            leaving,
            arch: Default::default(),
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
    fn large_stages_beat_less_often_within_bounds() {
        assert_eq!(heartbeat_every(0), HEARTBEAT_EVERY);
        assert_eq!(heartbeat_every(STAGE_BEATS), HEARTBEAT_EVERY);
        assert_eq!(heartbeat_every(STAGE_BEATS + 1), HEARTBEAT_EVERY * 2);
        assert_eq!(heartbeat_every(usize::MAX), MAX_HEARTBEAT_EVERY);
        // What a stage publishes per base period stays at STAGE_BEATS up to the cap.
        for replicas in 1..=120usize {
            let per_period = replicas as f64 * HEARTBEAT_EVERY.as_secs_f64()
                / heartbeat_every(replicas).as_secs_f64();
            assert!(per_period <= STAGE_BEATS as f64, "{replicas}: {per_period}");
        }
    }

    #[test]
    fn a_peer_expires_after_three_of_its_own_periods_and_no_later_than_the_cap() {
        let mut t = PeerTable::default();
        let t0 = Instant::now();
        let slow = NodeId([1; 32]);
        let liar = NodeId([2; 32]);
        let eager = NodeId([3; 32]);
        t.on_heartbeat(
            slow,
            &Heartbeat {
                every_ms: 10_000,
                ..hb(1, false)
            },
            t0,
        );
        // Claiming a period of 50 days, to stay routable long after it died.
        t.on_heartbeat(
            liar,
            &Heartbeat {
                every_ms: u32::MAX,
                ..hb(1, false)
            },
            t0,
        );
        t.on_heartbeat(
            eager,
            &Heartbeat {
                every_ms: 0,
                ..hb(1, false)
            },
            t0,
        );
        // A period under the base one is held as the base one.
        assert_eq!(t.expire(t0 + HEARTBEAT_EVERY * 3), Vec::<NodeId>::new());
        let mut gone = t.expire(t0 + HEARTBEAT_EVERY * 3 + Duration::from_millis(1));
        assert_eq!(gone, vec![eager]);
        // A large stage's replica beating every 10 s is alive at 29 s.
        assert!(t.expire(t0 + Duration::from_secs(29)).is_empty());
        gone = t.expire(t0 + Duration::from_secs(31));
        assert_eq!(gone, vec![slow]);
        assert_eq!(
            t.next_expiry(),
            Some(t0 + MAX_HEARTBEAT_EVERY * MISSED_BEATS)
        );
        gone = t.expire(t0 + MAX_HEARTBEAT_EVERY * MISSED_BEATS + Duration::from_millis(1));
        assert_eq!(gone, vec![liar]);
    }

    #[test]
    fn membership_changes_with_joins_leaves_and_stages_only() {
        let mut t = PeerTable::default();
        let (p, q) = (NodeId([1; 32]), NodeId([2; 32]));
        let t0 = Instant::now();
        let mut seen = vec![t.membership()];
        t.on_heartbeat(p, &hb(1, false), t0);
        seen.push(t.membership());
        t.on_heartbeat(p, &hb(1, false), t0 + HEARTBEAT_EVERY);
        assert_eq!(
            t.membership(),
            seen[1],
            "a plain heartbeat changes no membership"
        );
        t.on_heartbeat(p, &hb(2, false), t0 + HEARTBEAT_EVERY);
        seen.push(t.membership());
        t.on_discovered(q, 1, t0);
        seen.push(t.membership());
        t.on_discovered(q, 1, t0);
        assert_eq!(t.membership(), seen[3]);
        t.on_heartbeat(q, &hb(1, true), t0);
        seen.push(t.membership());
        t.expire(t0 + Duration::from_secs(3600));
        seen.push(t.membership());
        let mut distinct = seen.clone();
        distinct.dedup();
        assert_eq!(distinct, seen, "every change is a new membership: {seen:?}");
    }

    /// The deadline index agrees with a scan of the table through any mix of heartbeats,
    /// discoveries, removals and expiries.
    #[test]
    fn the_expiry_index_matches_a_scan() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut t = PeerTable::default();
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..5_000 {
            now += Duration::from_millis(rng.random_range(0..900));
            let peer = NodeId([rng.random_range(0..24u8); 32]);
            match rng.random_range(0..10) {
                0..=5 => {
                    let every_ms = rng.random_range(0..40_000);
                    let beat = Heartbeat {
                        every_ms,
                        ..hb(rng.random_range(0..3), rng.random_range(0..20) == 0)
                    };
                    t.on_heartbeat(peer, &beat, now);
                }
                6 => t.on_discovered(peer, 1, now),
                7 => {
                    t.remove(&peer);
                }
                _ => {
                    let mut due: Vec<NodeId> = t
                        .peers
                        .iter()
                        .filter(|(_, p)| {
                            now.saturating_duration_since(p.last_seen) > p.beat_every * MISSED_BEATS
                        })
                        .map(|(id, _)| *id)
                        .collect();
                    due.sort_unstable();
                    assert_eq!(t.expire(now), due);
                }
            }
            let scanned = t.peers.values().map(PeerInfo::deadline).min();
            assert_eq!(t.next_expiry(), scanned);
            assert_eq!(t.deadlines.len(), t.peers.len());
        }
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
