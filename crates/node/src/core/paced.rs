//! An outbox that sends what it holds in batches, at most one batch per interval: what an
//! auditor gossips network-wide per audit (demands, fee claims) would otherwise run over the
//! topic's gossip rate, and the auditor would be banned.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct PacedOutbox<T> {
    queue: VecDeque<T>,
    last_sent: Option<Instant>,
}

impl<T> Default for PacedOutbox<T> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            last_sent: None,
        }
    }
}

impl<T> PacedOutbox<T> {
    /// Queues `item` unless `cap` items wait already (then it is dropped).
    pub(super) fn push(&mut self, item: T, cap: usize) {
        if self.queue.len() < cap {
            self.queue.push_back(item);
        }
    }

    /// The next batch of at most `max` items, if one is due at `now` (none went out in the
    /// last `every`).
    pub(super) fn take(&mut self, now: Instant, every: Duration, max: usize) -> Option<Vec<T>> {
        if self.queue.is_empty() || self.last_sent.is_some_and(|t| now < t + every) {
            return None;
        }
        self.last_sent = Some(now);
        let n = self.queue.len().min(max);
        Some(self.queue.drain(..n).collect())
    }

    /// When the next batch is due (`now` if it is already): None while nothing waits.
    pub(super) fn due(&self, now: Instant, every: Duration) -> Option<Instant> {
        (!self.queue.is_empty()).then(|| self.last_sent.map_or(now, |t| t + every))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_go_out_at_most_once_per_interval_and_the_queue_is_capped() {
        let (t0, every) = (Instant::now(), Duration::from_secs(1));
        let mut o = PacedOutbox::default();
        assert_eq!(o.due(t0, every), None);
        for i in 0..5 {
            o.push(i, 4);
        }
        assert_eq!(o.due(t0, every), Some(t0));
        assert_eq!(o.take(t0, every, 3), Some(vec![0, 1, 2]));
        assert_eq!(o.take(t0 + every / 2, every, 3), None);
        assert_eq!(o.due(t0, every), Some(t0 + every));
        assert_eq!(o.take(t0 + every, every, 3), Some(vec![3]));
        assert_eq!(o.due(t0 + every, every), None);
    }
}
