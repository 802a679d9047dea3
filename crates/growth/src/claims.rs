//! What nodes announce about themselves, and how much of it the scaler believes.
//!
//! Announcements are peer-supplied numbers. Three rules keep a few lying keys from moving the
//! target:
//! 1. only keys the caller says are registered (stake-backed) count, each once (its smallest
//!    claim, so the result does not depend on the order claims arrived in);
//! 2. each claim is clamped to a per-node cap (no home node has a petabyte of memory);
//! 3. of n counted nodes, the f = ⌊(n − 1)/3⌋ largest claims are dropped — memory and
//!    throughput separately — and only the n − f smallest are used.
//!
//! Why 3 bounds the liars: adding values to a set can only lower each of its order statistics,
//! so the i-th smallest of all claims is at most the i-th smallest honest claim for every
//! i ≤ |honest|. With at most f liars, n − f ≤ |honest|: every value the scaler uses is at
//! most the honest value of the same rank, and any count of "nodes with at least X" it makes
//! is met by that many honest nodes. Liars who announce huge numbers are simply the ones
//! dropped; liars who announce plausible ones can add at most f plausible nodes, which the
//! rule still backs by honest memory (see `tests/scaler_props.rs`). The same argument is why
//! all arithmetic here is on integers: every node must reach the same bits.

use serde::{Deserialize, Serialize};

/// One node's announcement (signed by it in a heartbeat; the scaler sees only the numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The node id (BLAKE3 of its public key).
    pub node: [u8; 32],
    /// Memory it offers for training state, in bytes.
    pub memory_bytes: u64,
    /// Measured training throughput, in FLOP/s (6·N per token, as `bench step` measures it).
    pub flops_per_s: u64,
}

/// Per-node caps applied to every claim before counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimLimits {
    /// Memory counted per node at most (default 512 GiB).
    pub node_memory_cap: u64,
    /// Throughput counted per node at most (default 10^16 FLOP/s, a few of today's GPUs).
    pub node_flops_cap: u64,
}

impl Default for ClaimLimits {
    fn default() -> Self {
        Self {
            node_memory_cap: 512 << 30,
            node_flops_cap: 10_000_000_000_000_000,
        }
    }
}

/// What the network can be trusted to hold and compute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// Registered nodes counted (n).
    pub nodes: u64,
    /// The n − f smallest memory claims, ascending.
    pub memory: Vec<u64>,
    /// Sum of the n − f smallest throughput claims, FLOP/s.
    pub flops_per_s: u128,
}

/// Largest number of liars the counting tolerates among `n` nodes: ⌊(n − 1)/3⌋.
pub fn tolerated(n: u64) -> u64 {
    n.saturating_sub(1) / 3
}

impl Capacity {
    /// Counts `claims` under the rules above; `registered` says which keys may count.
    pub fn count(
        claims: &[Claim],
        registered: impl Fn(&[u8; 32]) -> bool,
        limits: &ClaimLimits,
    ) -> Self {
        let mut kept: Vec<Claim> = claims
            .iter()
            .filter(|c| registered(&c.node))
            .map(|c| Claim {
                node: c.node,
                memory_bytes: c.memory_bytes.min(limits.node_memory_cap),
                flops_per_s: c.flops_per_s.min(limits.node_flops_cap),
            })
            .collect();
        // One claim per node, its smallest: independent of arrival order.
        kept.sort_unstable_by_key(|c| (c.node, c.memory_bytes, c.flops_per_s));
        kept.dedup_by_key(|c| c.node);
        let n = kept.len() as u64;
        let trusted = (n - tolerated(n)) as usize;
        let mut memory: Vec<u64> = kept.iter().map(|c| c.memory_bytes).collect();
        memory.sort_unstable();
        memory.truncate(trusted);
        let mut flops: Vec<u64> = kept.iter().map(|c| c.flops_per_s).collect();
        flops.sort_unstable();
        let flops_per_s = flops[..trusted].iter().map(|&f| u128::from(f)).sum();
        Self {
            nodes: n,
            memory,
            flops_per_s,
        }
    }

    /// Trusted nodes (of the n − f counted) that announce at least `bytes`.
    pub fn nodes_with(&self, bytes: u64) -> u64 {
        (self.memory.len() - self.memory.partition_point(|&m| m < bytes)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: u8, gib: u64) -> Claim {
        Claim {
            node: [id; 32],
            memory_bytes: gib << 30,
            flops_per_s: 1_000_000_000_000,
        }
    }

    #[test]
    fn the_largest_third_unregistered_keys_and_repeats_do_not_count() {
        let mut claims: Vec<Claim> = (0..7).map(|i| claim(i, 16)).collect();
        claims.push(claim(7, 1 << 20)); // a liar: a petabyte, capped then dropped
        claims.push(claim(8, 1 << 20));
        claims.push(claim(200, 1 << 20)); // not registered
        claims.push(claim(3, 8)); // node 3 again, smaller: its smaller claim counts
        let cap = Capacity::count(&claims, |n| n[0] < 100, &ClaimLimits::default());
        assert_eq!(cap.nodes, 9);
        assert_eq!(cap.memory.len(), 9 - 2);
        assert_eq!(cap.memory[0], 8 << 30);
        assert!(cap.memory.iter().all(|&m| m <= 16 << 30));
        assert_eq!(cap.nodes_with(16 << 30), 6);
        assert_eq!(cap.flops_per_s, 7 * 1_000_000_000_000);
        let none = Capacity::count(&[], |_| true, &ClaimLimits::default());
        assert_eq!((none.nodes, none.memory.len(), none.flops_per_s), (0, 0, 0));
    }

    #[test]
    fn tolerated_is_a_third_below() {
        let f: Vec<u64> = (0..8).map(tolerated).collect();
        assert_eq!(f, vec![0, 0, 0, 0, 1, 1, 1, 2]);
    }
}
