//! Per-key rate limits: a token bucket for each (node, kind) — a gossip author and topic, or a
//! requesting peer and protocol — so one key cannot make a node take more than `burst`
//! messages at once and `per_sec` after. The table is bounded: past `max_entries`, buckets
//! that refilled are forgotten first (they hold nothing), then the fullest one.

use std::collections::HashMap;
use std::time::Instant;

use neuroshard_proof::NodeId;

/// Most (key, kind) buckets kept.
pub(crate) const MAX_BUCKETS: usize = 8192;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

pub(crate) struct RateLimit {
    per_sec: f64,
    burst: f64,
    max_entries: usize,
    buckets: HashMap<(NodeId, String), Bucket>,
}

impl RateLimit {
    pub(crate) fn new(per_sec: f64, burst: u32, max_entries: usize) -> Self {
        Self {
            per_sec: if per_sec.is_finite() {
                per_sec.max(0.0)
            } else {
                0.0
            },
            burst: f64::from(burst.max(1)),
            max_entries: max_entries.max(1),
            buckets: HashMap::new(),
        }
    }

    /// Whether `author` may have one more message of kind `topic` taken at `now`.
    pub(crate) fn allow(&mut self, author: &NodeId, topic: &str, now: Instant) -> bool {
        let key = (*author, topic.to_string());
        if !self.buckets.contains_key(&key) && self.buckets.len() >= self.max_entries {
            self.make_room(now);
        }
        let (per_sec, burst) = (self.per_sec, self.burst);
        let b = self.buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        (b.tokens + elapsed * self.per_sec).min(self.burst)
    }

    fn make_room(&mut self, now: Instant) {
        let burst = self.burst;
        let full: Vec<(NodeId, String)> = self
            .buckets
            .iter()
            .filter(|(_, b)| self.level(b, now) >= burst)
            .map(|(k, _)| k.clone())
            .collect();
        if full.is_empty() {
            let fullest = self
                .buckets
                .iter()
                .max_by(|a, b| self.level(a.1, now).total_cmp(&self.level(b.1, now)))
                .map(|(k, _)| k.clone());
            if let Some(k) = fullest {
                self.buckets.remove(&k);
            }
        } else {
            for k in full {
                self.buckets.remove(&k);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn id(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    #[test]
    fn a_burst_then_the_rate_per_author_and_topic() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(2.0, 5, 100);
        let allowed = (0..50).filter(|_| r.allow(&id(1), "a", t0)).count();
        assert_eq!(allowed, 5);
        // Another topic and another author have their own buckets.
        assert!(r.allow(&id(1), "b", t0));
        assert!(r.allow(&id(2), "a", t0));
        // Two per second come back.
        let t1 = t0 + Duration::from_secs(3);
        let allowed = (0..50).filter(|_| r.allow(&id(1), "a", t1)).count();
        assert_eq!(allowed, 5, "3 s × 2/s refills 6, capped at the burst of 5");
        let t2 = t1 + Duration::from_millis(500);
        assert_eq!((0..50).filter(|_| r.allow(&id(1), "a", t2)).count(), 1);
    }

    #[test]
    fn many_authors_hold_a_bounded_table_and_drained_buckets_stay() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(1.0, 3, 16);
        // The flooder drains its bucket.
        while r.allow(&id(0), "a", t0) {}
        // A crowd of fresh keys passes through the table without growing it.
        for i in 1..=200u8 {
            assert!(r.allow(&id(i), "a", t0));
            assert!(r.len() <= 16);
        }
        // Fresh buckets hold more tokens than the drained one: the flooder is still limited.
        assert!(
            !r.allow(&id(0), "a", t0),
            "a flooder escaped by churning keys"
        );
    }
}
