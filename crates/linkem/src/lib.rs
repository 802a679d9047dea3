//! Link profiles and the per-packet decisions of the link emulator: which packets are lost
//! and when the others arrive. Pure, so the decisions are tested without devices; the
//! devices and threads are in `main.rs`.
//!
//! Bandwidth is not emulated here: `bench/links.sh` shapes each node's uplink with the
//! kernel's token bucket (`tc qdisc … tbf`) on its link device, before packets reach the
//! emulator. This kernel has no `netem`, so delay, jitter and loss are done here.

use std::collections::HashMap;
use std::time::Duration;

/// A link as the bench states it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// Uplink rate in Mbit/s (None: not shaped).
    pub mbit: Option<u32>,
    /// One-way delay added to every packet, and the half-width of its uniform jitter.
    pub delay: Duration,
    pub jitter: Duration,
    /// Probability that a packet is dropped.
    pub loss: f64,
}

pub const PROFILES: [Profile; 4] = [
    Profile {
        name: "loopback",
        mbit: None,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
        loss: 0.0,
    },
    Profile {
        name: "fiber",
        mbit: Some(200),
        delay: Duration::from_millis(10),
        jitter: Duration::ZERO,
        loss: 0.0,
    },
    Profile {
        name: "home",
        mbit: Some(20),
        delay: Duration::from_millis(40),
        jitter: Duration::from_millis(10),
        loss: 0.005,
    },
    Profile {
        name: "bad-home",
        mbit: Some(5),
        delay: Duration::from_millis(80),
        jitter: Duration::ZERO,
        loss: 0.02,
    },
];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinkError {
    #[error("unknown profile {0:?} (loopback, fiber, home, bad-home)")]
    UnknownProfile(String),
}

impl Profile {
    pub fn named(name: &str) -> Result<Profile, LinkError> {
        PROFILES
            .iter()
            .find(|p| p.name == name)
            .copied()
            .ok_or_else(|| LinkError::UnknownProfile(name.to_string()))
    }
}

/// SplitMix64: seeded, so a run's losses and delays can be repeated.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Decides each packet's fate. Packets between the same two nodes keep their order (a later
/// one never overtakes an earlier one, whatever the jitter): real access links queue, they do
/// not reorder, and TCP would read reordering as loss.
#[derive(Debug)]
pub struct Links {
    profile: Profile,
    rng: Rng,
    /// Latest delivery time per (from, to), in ns since the emulator started.
    last: HashMap<(usize, usize), u64>,
}

impl Links {
    pub fn new(profile: Profile, seed: u64) -> Self {
        Self {
            profile,
            rng: Rng::new(seed),
            last: HashMap::new(),
        }
    }

    /// When a packet sent at `now_ns` from `from` to `to` arrives, or None when it is lost.
    pub fn arrival(&mut self, now_ns: u64, from: usize, to: usize) -> Option<u64> {
        let p = &self.profile;
        if p.loss > 0.0 && self.rng.unit() < p.loss {
            return None;
        }
        let jitter = p.jitter.as_nanos() as f64 * (2.0 * self.rng.unit() - 1.0);
        let delay = (p.delay.as_nanos() as f64 + jitter).max(0.0) as u64;
        let last = self.last.entry((from, to)).or_insert(0);
        *last = (*last).max(now_ns.saturating_add(delay));
        Some(*last)
    }
}

/// The node a packet is for: IPv4 destinations `base.0.0.0/24` host `i + 1` are node `i`.
/// Anything else (IPv6, other subnets, garbage) has no node.
pub fn node_of(packet: &[u8], base: [u8; 3], nodes: usize) -> Option<usize> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    let dst = &packet[16..20];
    if dst[..3] != base {
        return None;
    }
    let host = usize::from(dst[3]);
    (1..=nodes).contains(&host).then(|| host - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_the_benchs() {
        let home = Profile::named("home").unwrap();
        assert_eq!(home.mbit, Some(20));
        assert_eq!(home.delay, Duration::from_millis(40));
        assert!(Profile::named("dialup").is_err());
    }

    #[test]
    fn loss_rate_and_delay_range_follow_the_profile() {
        let p = Profile::named("home").unwrap();
        let mut links = Links::new(p, 1);
        let n = 200_000u64;
        let mut lost = 0;
        for i in 0..n {
            // Packets far apart, so ordering never holds one back.
            let now = i * 1_000_000_000;
            match links.arrival(now, 0, 1) {
                None => lost += 1,
                Some(t) => {
                    let d = t - now;
                    assert!((30_000_000..=50_000_000).contains(&d), "{d}");
                }
            }
        }
        let rate = lost as f64 / n as f64;
        assert!((rate - 0.005).abs() < 0.001, "{rate}");
    }

    #[test]
    fn packets_between_two_nodes_keep_their_order() {
        let mut links = Links::new(Profile::named("home").unwrap(), 2);
        let mut last = 0;
        for i in 0..10_000u64 {
            if let Some(t) = links.arrival(i * 1_000, 3, 4) {
                assert!(t >= last);
                last = t;
            }
        }
        // Without jitter and loss, arrival is send time plus the delay.
        let mut fiber = Links::new(Profile::named("fiber").unwrap(), 3);
        assert_eq!(fiber.arrival(5, 0, 1), Some(10_000_005));
    }

    #[test]
    fn only_ipv4_packets_for_a_node_have_one() {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[16..20].copy_from_slice(&[10, 77, 0, 3]);
        assert_eq!(node_of(&p, [10, 77, 0], 4), Some(2));
        p[19] = 0;
        assert_eq!(node_of(&p, [10, 77, 0], 4), None);
        p[19] = 5;
        assert_eq!(node_of(&p, [10, 77, 0], 4), None);
        p[18] = 1;
        p[19] = 1;
        assert_eq!(node_of(&p, [10, 77, 0], 4), None);
        p[0] = 0x60;
        assert_eq!(node_of(&p, [10, 77, 0], 4), None);
        assert_eq!(node_of(&p[..10], [10, 77, 0], 4), None);
    }
}
