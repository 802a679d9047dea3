//! Verifiable data assignment: which training window a node uses in a round.
//!
//! `assign` is a pure function of (manifest root, node id, round seed) plus the public
//! window layout that follows from the manifest and `seq_len`. The node chooses none of
//! these, and any peer holding the manifest recomputes the same answer.
//!
//! Draw: `d = BLAKE3("neuroshard/genesis/assign/v1" ‖ root ‖ node_id ‖ round_seed as u64 LE)`,
//! the first 16 bytes read as a little-endian u128 `x`, window `g = ⌊x · W / 2^128⌋` over all
//! `W` training windows (so every window, hence every token, is equally likely; a 128-bit
//! multiply-shift has bias below W/2^128). `g` is then located in the per-shard prefix sums.

use serde::{Deserialize, Serialize};

/// Domain-separation prefix of the assignment hash.
pub const ASSIGN_DOMAIN: &[u8] = b"neuroshard/genesis/assign/v1";

/// A node's training position for one round: shard index within the train split and a
/// window index within that shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assignment {
    pub shard: usize,
    pub window: u64,
}

/// Number of non-overlapping windows of `seq_len + 1` tokens (stride `seq_len`, so the
/// target of one window's last input is the next window's first input) in `tokens` tokens.
pub fn windows_in(tokens: u64, seq_len: usize) -> u64 {
    if seq_len == 0 || tokens <= seq_len as u64 {
        0
    } else {
        (tokens - 1) / seq_len as u64
    }
}

/// Picks the window for `node_id` in round `round_seed`. `windows_per_shard[i]` is the
/// window count of train shard `i` (see [`windows_in`]). `None` when there are no windows.
pub fn assign(
    root: &[u8; 32],
    node_id: &[u8; 32],
    round_seed: u64,
    windows_per_shard: &[u64],
) -> Option<Assignment> {
    let total: u64 = windows_per_shard.iter().sum();
    if total == 0 {
        return None;
    }
    let mut h = blake3::Hasher::new();
    h.update(ASSIGN_DOMAIN);
    h.update(root);
    h.update(node_id);
    h.update(&round_seed.to_le_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest.as_bytes()[..16]);
    let x = u128::from_le_bytes(first);
    // Multiply-shift: floor(x * total / 2^128), computed in 256-bit via two 128-bit halves.
    let g = mul_shift(x, total);
    let mut rest = g;
    for (shard, &n) in windows_per_shard.iter().enumerate() {
        if rest < n {
            return Some(Assignment {
                shard,
                window: rest,
            });
        }
        rest -= n;
    }
    None
}

/// `floor(x * m / 2^128)` without overflow.
fn mul_shift(x: u128, m: u64) -> u64 {
    let m = u128::from(m);
    let lo = (x & u128::from(u64::MAX)) * m;
    let hi = (x >> 64) * m;
    ((hi + (lo >> 64)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn window_counts() {
        assert_eq!(windows_in(0, 8), 0);
        assert_eq!(windows_in(8, 8), 0);
        assert_eq!(windows_in(9, 8), 1);
        assert_eq!(windows_in(17, 8), 2);
        assert_eq!(windows_in(100, 0), 0);
    }

    #[test]
    fn mul_shift_is_exact_at_the_edges() {
        assert_eq!(mul_shift(0, 10), 0);
        assert_eq!(mul_shift(u128::MAX, 10), 9);
        assert_eq!(mul_shift(1u128 << 127, 10), 5);
        assert_eq!(mul_shift(u128::MAX, u64::MAX), u64::MAX - 1);
    }

    #[test]
    fn deterministic_and_sensitive_to_every_input() {
        let layout = vec![1000u64; 50];
        let a = assign(&[1; 32], &[2; 32], 3, &layout).unwrap();
        assert_eq!(a, assign(&[1; 32], &[2; 32], 3, &layout).unwrap());
        // Over a few rounds the draws must change with each input.
        let draws = |root: u8, node: u8| {
            (0..8)
                .map(|r| assign(&[root; 32], &[node; 32], r, &layout).unwrap())
                .collect::<Vec<_>>()
        };
        assert_ne!(draws(1, 2), draws(9, 2));
        assert_ne!(draws(1, 2), draws(1, 9));
        assert!(assign(&[1; 32], &[2; 32], 3, &[0, 0]).is_none());
        assert!(assign(&[1; 32], &[2; 32], 3, &[]).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The property: over 10,000 draws (distinct nodes and rounds) no shard is
        /// picked more than twice the mean. Layouts are what the builder writes: `full`
        /// shards of equal size and one partial last shard.
        #[test]
        fn no_shard_gets_more_than_twice_the_mean(
            root in any::<[u8; 32]>(),
            full in 2usize..64,
            per_shard in 1u64..5000,
            last_frac in 0.0f64..1.0,
        ) {
            let mut layout = vec![per_shard; full];
            let last = (per_shard as f64 * last_frac) as u64;
            if last > 0 {
                layout.push(last);
            }
            let mut counts = vec![0u64; layout.len()];
            let draws = 10_000u64;
            for d in 0..draws {
                let mut node = [0u8; 32];
                node[..8].copy_from_slice(&d.to_le_bytes());
                let a = assign(&root, &node, d / 100, &layout).unwrap();
                prop_assert!(a.window < layout[a.shard]);
                counts[a.shard] += 1;
            }
            let mean = draws as f64 / layout.len() as f64;
            let max = *counts.iter().max().unwrap() as f64;
            prop_assert!(max <= 2.0 * mean, "max {} > 2 × mean {}", max, mean);
            // And each shard's share is close to its share of windows (6 sigma).
            let total: u64 = layout.iter().sum();
            for (i, &c) in counts.iter().enumerate() {
                let p = layout[i] as f64 / total as f64;
                let sd = (draws as f64 * p * (1.0 - p)).sqrt();
                prop_assert!((c as f64 - draws as f64 * p).abs() <= 6.0 * sd + 1.0,
                    "shard {} drew {} expected {}", i, c, draws as f64 * p);
            }
        }
    }
}
