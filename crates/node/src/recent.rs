//! A set that remembers only its latest `CAP` keys: what a node keeps about peer-named
//! items (jobs decided, reports seen, demands judged) so that a flood of fresh keys costs a
//! bounded amount of memory and pushes out the oldest first.

use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Clone)]
pub struct RecentSet<K, const CAP: usize> {
    set: BTreeSet<K>,
    order: VecDeque<K>,
}

impl<K, const CAP: usize> Default for RecentSet<K, CAP> {
    fn default() -> Self {
        Self {
            set: BTreeSet::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Ord + Copy, const CAP: usize> RecentSet<K, CAP> {
    /// Adds `key`; false if it was held already. Past `CAP` keys the oldest goes.
    pub fn insert(&mut self, key: K) -> bool {
        if !self.set.insert(key) {
            return false;
        }
        self.order.push_back(key);
        while self.order.len() > CAP {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }

    pub fn contains(&self, key: &K) -> bool {
        self.set.contains(key)
    }

    /// Forgets `key`; false if it was not held.
    pub fn remove(&mut self, key: &K) -> bool {
        if !self.set.remove(key) {
            return false;
        }
        self.order.retain(|k| k != key);
        true
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_keys_keeps_the_latest_cap_and_forgets_the_oldest() {
        let mut s = RecentSet::<u32, 3>::default();
        assert!(s.insert(1) && !s.insert(1));
        for k in 2..=10 {
            assert!(s.insert(k));
        }
        assert_eq!(s.len(), 3);
        assert!(!s.contains(&7) && s.contains(&8) && s.contains(&10));
        assert!(s.remove(&9) && !s.remove(&9));
        assert!(s.insert(11) && s.insert(12));
        assert_eq!(s.len(), 3);
        assert!(!s.contains(&8) && s.contains(&10));
    }
}
