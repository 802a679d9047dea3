//! The joiner's half of start-up: which θ₀ records it trusts, and borrowing θ₀ and the AdamW
//! moments from their publishers, one after the other, until one serves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use neuroshard_proof::{Hash32, NodeId, PublicKey, Signed};

use super::{JoinError, Joined, MAX_JOIN_TRIES, MAX_RECORDS, Part, Phase, Request, Startup};
use crate::core::{RECORD_TTL, TransferError};
use crate::sync::ThetaRecord;

/// A θ₀ record claiming to live longer than this many TTLs is a forgery or a broken clock.
const MAX_EXPIRY_TTLS: u64 = 10;

impl Startup {
    /// A blob asked for with [`Request::FetchBlob`].
    pub fn handle_blob(
        &mut self,
        hash: Hash32,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let Phase::Joining { index, part } = self.phase else {
            return;
        };
        let Some(rec) = self.candidates.get(index) else {
            return;
        };
        let round = rec.round;
        let (want, max) = match part {
            Part::Outer => (rec.theta, self.outer_max()),
            Part::Optimizer => (rec.optimizer, self.optimizer_max()),
        };
        if hash != want {
            return;
        }
        let checked = result.map_err(JoinError::from).and_then(|bytes| {
            if bytes.len() > max {
                Err(JoinError::TooLarge {
                    len: bytes.len(),
                    max,
                })
            } else if *blake3::hash(&bytes).as_bytes() != want {
                Err(JoinError::HashMismatch)
            } else {
                Ok(bytes)
            }
        });
        match (checked, part) {
            (Ok(bytes), Part::Outer) => self.requests.push_back(Request::AdoptOuter {
                bytes,
                hash: want,
                round,
            }),
            (Ok(bytes), Part::Optimizer) => {
                self.requests.push_back(Request::AdoptOptimizer { bytes })
            }
            (Err(e), Part::Outer) => self.join_failed(index, e, now),
            (Err(e), Part::Optimizer) => self.optimizer_failed(index, e, now),
        }
    }

    /// The runtime took (or could not take) a fetched part.
    pub fn handle_adopted(&mut self, part: Part, result: Result<(), JoinError>, now: Instant) {
        let Phase::Joining { index, part: want } = self.phase else {
            return;
        };
        let Some(rec) = self.candidates.get(index).cloned() else {
            return;
        };
        if part != want {
            return;
        }
        match (result, part) {
            (Ok(()), Part::Outer) => {
                // θ is replaced from here on: the join stands even without the moments.
                self.joined = Some(Joined {
                    peer: rec.node,
                    round: rec.round,
                    took: Duration::ZERO,
                });
                self.phase = Phase::Joining {
                    index,
                    part: Part::Optimizer,
                };
                self.requests.push_back(Request::FetchBlob {
                    peer: rec.node,
                    hash: rec.optimizer,
                    max: self.optimizer_max(),
                });
            }
            (Ok(()), Part::Optimizer) => self.finish(now),
            (Err(e), Part::Outer) => self.join_failed(index, e, now),
            (Err(e), Part::Optimizer) => self.optimizer_failed(index, e, now),
        }
    }

    /// Keeps the valid θ₀ records of our stage, the state most staked publishers name first
    /// (keys the network's genesis stakes: a newcomer knows no other stake yet), then the
    /// state most publishers name, then the earlier round (a stale θ₀ only costs a catch-up,
    /// a made-up late one the model); a newcomer borrows from the first publisher that
    /// serves it. One key's record of round u64::MAX thus never outranks a state two
    /// replicas publish, and any number of unstaked keys agreeing on a state never outrank
    /// one staked founder's record.
    pub(super) fn on_theta_records(&mut self, values: &[Vec<u8>], now: Instant) {
        let now_ms = self.clock.unix_ms(now);
        let mut valid: Vec<(PublicKey, ThetaRecord)> = values
            .iter()
            .take(MAX_RECORDS)
            .filter_map(|v| valid_theta(v, &self.cfg.network, self.stage, &self.me, now_ms))
            .collect();
        // One record per publisher, its latest round; ties by node id, so the same records
        // give the same choice in any order.
        valid.sort_by(|(_, a), (_, b)| b.round.cmp(&a.round).then(a.node.cmp(&b.node)));
        let mut seen = BTreeSet::new();
        valid.retain(|(_, r)| seen.insert(r.node));
        let staked = self.genesis_stakers();
        // (staked publishers, publishers) per state.
        let mut support: BTreeMap<(u64, Hash32), (usize, usize)> = BTreeMap::new();
        for (_, r) in &valid {
            let e = support.entry((r.round, r.theta)).or_default();
            e.0 += usize::from(staked.contains(&r.node));
            e.1 += 1;
        }
        let backers = |r: &ThetaRecord| {
            support
                .get(&(r.round, r.theta))
                .copied()
                .unwrap_or_default()
        };
        valid.sort_by(|(_, a), (_, b)| {
            backers(b)
                .cmp(&backers(a))
                .then(a.round.cmp(&b.round))
                .then(a.node.cmp(&b.node))
        });
        for (key, _) in &valid {
            self.requests.push_back(Request::LearnKey(*key));
        }
        self.candidates = valid.into_iter().map(|(_, r)| r).collect();
        if self.local.steps == 0
            && self
                .candidates
                .first()
                .is_some_and(|r| r.round > self.local.round)
        {
            self.join_started = Some(now);
            self.try_join(0);
        } else {
            self.finish(now);
        }
    }

    /// The keys the network's genesis stakes (none where it cannot be read).
    fn genesis_stakers(&self) -> BTreeSet<NodeId> {
        crate::network::Network::open(&self.cfg.genesis)
            .map(|n| n.genesis.stakes.iter().map(|(k, _)| k.node_id()).collect())
            .unwrap_or_default()
    }

    pub(super) fn try_join(&mut self, index: usize) {
        let Some(rec) = self.candidates.get(index) else {
            return;
        };
        let (peer, hash) = (rec.node, rec.theta);
        self.phase = Phase::Joining {
            index,
            part: Part::Outer,
        };
        self.requests.push_back(Request::FetchBlob {
            peer,
            hash,
            max: self.outer_max(),
        });
    }

    /// The outer state from candidate `index` failed: the next one with a newer θ₀, or a
    /// fresh start that catches up at the next round.
    pub(super) fn join_failed(&mut self, index: usize, error: JoinError, now: Instant) {
        let peer = self.candidates.get(index).map(|r| r.node);
        let next = index + 1;
        let more = next < MAX_JOIN_TRIES
            && self
                .candidates
                .get(next)
                .is_some_and(|r| r.round > self.local.round);
        let peer = peer.map_or_else(String::new, |p| p.to_string());
        if more {
            self.warn(
                format!("joining from {peer}: {error}; trying the next replica"),
                now,
            );
            self.try_join(next);
        } else {
            self.warn(
                format!(
                    "joining from {peer}: {error}; starting from scratch and catching up at the next round"
                ),
                now,
            );
            self.finish(now);
        }
    }

    /// θ₀ was taken but not the moments: AdamW starts from zero (the outer adoption reset it).
    pub(super) fn optimizer_failed(&mut self, index: usize, error: JoinError, now: Instant) {
        let peer = self
            .candidates
            .get(index)
            .map_or_else(String::new, |r| r.node.to_string());
        self.warn(
            format!("optimizer state from {peer}: {error}; starting AdamW from zero"),
            now,
        );
        self.finish(now);
    }
}

/// A θ₀ record another replica of our stage signed about itself, unexpired and not
/// implausibly long-lived.
fn valid_theta(
    bytes: &[u8],
    network: &Hash32,
    stage: usize,
    me: &NodeId,
    now_ms: u64,
) -> Option<(PublicKey, ThetaRecord)> {
    let signed = Signed::<ThetaRecord>::from_bytes(bytes).ok()?;
    let rec = signed.verify().ok()?;
    let signer = signed.signer();
    let ttl = u64::try_from(RECORD_TTL.as_millis()).unwrap_or(u64::MAX);
    let latest_expiry = now_ms.saturating_add(ttl.saturating_mul(MAX_EXPIRY_TTLS));
    (rec.network == *network
        && usize::from(rec.stage) == stage
        && rec.node == signer.node_id()
        && rec.node != *me
        && rec.expires_ms > now_ms
        && rec.expires_ms <= latest_expiry)
        .then_some((signer, rec))
}
