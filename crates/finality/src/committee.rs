//! Who finalizes an epoch, and with what weight: the largest stakes of the previous
//! finalized epoch.
//!
//! Malachite counts more than 2/3 of voting *power*, so power is stake. Two limits: the
//! committee has at most `max_members` (votes are all-to-all, so consensus traffic grows with
//! its square), and powers are scaled so their sum stays below [`MAX_TOTAL_POWER`]: Malachite
//! multiplies power sums by the threshold's denominator with a checked multiplication that
//! panics on overflow, and a stake is a peer-supplied number.

use neuroshard_proof::PublicKey;

use crate::context::{Committee, Validator};

/// Voting power summed over a committee stays at or below this (3 × it fits a `u64`).
pub const MAX_TOTAL_POWER: u64 = 1 << 60;

/// Committee size when the network sets none: 31 tolerates 10 faulty members, and 31² votes
/// of ~180 bytes per step is about 170 kB per node per epoch.
pub const DEFAULT_MAX_MEMBERS: usize = 31;

/// The committee of the next epoch: the `max_members` largest stakes (ties broken by node
/// id, so every node derives the same set), each with power proportional to its stake.
/// Candidates with no stake, and repeated keys (first kept), are left out.
pub fn committee_from_stakes(candidates: &[(PublicKey, u64)], max_members: usize) -> Committee {
    let mut ranked: Vec<(PublicKey, u64)> = Vec::with_capacity(candidates.len());
    for (key, stake) in candidates {
        if *stake > 0 && !ranked.iter().any(|(k, _)| k == key) {
            ranked.push((*key, *stake));
        }
    }
    ranked.sort_by(|(ka, sa), (kb, sb)| sb.cmp(sa).then(ka.node_id().cmp(&kb.node_id())));
    ranked.truncate(max_members);
    let total: u128 = ranked.iter().map(|(_, s)| u128::from(*s)).sum();
    // The smallest unit that brings the sum under the cap; a member keeps at least 1.
    let unit = total.div_ceil(u128::from(MAX_TOTAL_POWER)).max(1);
    let validators = ranked
        .into_iter()
        .map(|(key, stake)| {
            let power = (u128::from(stake) / unit).max(1);
            Validator::new(key, u64::try_from(power).unwrap_or(MAX_TOTAL_POWER))
        })
        .collect();
    Committee::new(validators)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_proof::fixtures::test_identity;

    fn key(i: u8) -> PublicKey {
        test_identity(u64::from(i)).public_key()
    }

    #[test]
    fn the_largest_stakes_sit_and_the_order_of_candidates_does_not_matter() {
        let c: Vec<(PublicKey, u64)> = (1..=6).map(|i| (key(i), u64::from(i) * 10)).collect();
        let a = committee_from_stakes(&c, 4);
        let mut rev = c.clone();
        rev.reverse();
        let b = committee_from_stakes(&rev, 4);
        assert_eq!(a, b);
        assert_eq!(a.validators().len(), 4);
        for i in 3..=6 {
            assert!(a.get(&key(i).node_id()).is_some(), "stake {} sits", i * 10);
        }
        assert!(a.get(&key(1).node_id()).is_none());
        assert_eq!(a.total_power(), 30 + 40 + 50 + 60);
    }

    #[test]
    fn huge_stakes_are_scaled_under_the_cap_and_keep_their_proportions() {
        let c = vec![
            (key(1), u64::MAX),
            (key(2), u64::MAX / 2),
            (key(3), 1),
            (key(4), 0),
        ];
        let com = committee_from_stakes(&c, 31);
        assert!(com.total_power() <= MAX_TOTAL_POWER);
        assert!(com.total_power().checked_mul(3).is_some());
        assert_eq!(com.validators().len(), 3, "no stake, no seat");
        let p = |i: u8| com.get(&key(i).node_id()).unwrap().power;
        assert!(p(1) / p(2) == 2, "{} vs {}", p(1), p(2));
        assert_eq!(p(3), 1, "a tiny stake keeps one unit of power");
    }

    #[test]
    fn a_key_listed_twice_sits_once() {
        let c = vec![(key(1), 10), (key(1), 1_000), (key(2), 5)];
        let com = committee_from_stakes(&c, 31);
        assert_eq!(com.validators().len(), 2);
        assert_eq!(com.total_power(), 15);
    }
}
