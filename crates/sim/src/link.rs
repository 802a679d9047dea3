//! The seeded link model: latency with jitter, bandwidth per link, loss and partitions.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How every link behaves (the same profile for all links of a run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    /// One-way latency: `base` plus a uniform draw in `[0, jitter]`.
    pub base: Duration,
    pub jitter: Duration,
    /// Bytes per second a link carries (serialisation delay = size / bandwidth).
    pub bandwidth: u64,
    /// Probability that a packet of a message is lost; the transport (TCP/QUIC) retransmits,
    /// so loss shows as one retransmission timeout of extra delay.
    pub loss: f64,
    pub retransmit: Duration,
}

impl LinkModel {
    /// A LAN-like default: 1–3 ms, 1 Gbit/s, no loss.
    pub fn lan() -> Self {
        Self {
            base: Duration::from_millis(1),
            jitter: Duration::from_millis(2),
            bandwidth: 125_000_000,
            loss: 0.0,
            retransmit: Duration::from_millis(200),
        }
    }

    /// A home connection: 40 ± 10 ms, 20 Mbit/s, 0.5% loss.
    pub fn home() -> Self {
        Self {
            base: Duration::from_millis(30),
            jitter: Duration::from_millis(20),
            bandwidth: 2_500_000,
            loss: 0.005,
            retransmit: Duration::from_millis(200),
        }
    }

    /// Delay of a message of `bytes` on one link.
    pub fn delay(&self, bytes: usize, rng: &mut ChaCha8Rng) -> Duration {
        let jitter = if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(rng.random_range(0..=self.jitter.as_nanos() as u64))
        };
        let wire = Duration::from_secs_f64(bytes as f64 / self.bandwidth.max(1) as f64);
        let lost = self.loss > 0.0 && rng.random_bool(self.loss.min(1.0));
        self.base
            + jitter
            + wire
            + if lost {
                self.retransmit
            } else {
                Duration::ZERO
            }
    }
}

/// Which nodes can reach each other: nodes in different groups cannot.
#[derive(Debug, Clone, Default)]
pub struct Partitions {
    group: BTreeMap<usize, u32>,
}

impl Partitions {
    /// Puts `nodes` in a group of their own, cut off from everyone else.
    pub fn isolate(&mut self, nodes: &[usize], group: u32) {
        for n in nodes {
            self.group.insert(*n, group);
        }
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        self.group.clear();
    }

    pub fn reachable(&self, a: usize, b: usize) -> bool {
        self.group.get(&a).copied().unwrap_or(0) == self.group.get(&b).copied().unwrap_or(0)
    }
}
