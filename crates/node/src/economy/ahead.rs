//! Claims of rounds past their stage's certified round in the finalized state (see
//! `floor.rs`): held, verified, until an epoch moves the stage far enough, then applied. When
//! the hold is full the claim furthest ahead goes: that is never an honest replica's next
//! round while an attacker's far claims are held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use neuroshard_proof::{Hash32, VerifiedProof};

/// Claims held ahead of their stage, at most.
pub const MAX_AHEAD: usize = 1024;

/// (stage layers, round, proof hash).
type Key = ((u32, u32), u64, Hash32);

#[derive(Debug, Default)]
pub(super) struct Ahead {
    held: BTreeMap<Key, (VerifiedProof, Arc<[u8]>)>,
    hashes: BTreeSet<Hash32>,
}

fn key_of(v: &VerifiedProof) -> Key {
    let p = v.proof();
    ((p.layers.start, p.layers.end), p.round, v.hash())
}

impl Ahead {
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    pub(super) fn contains(&self, hash: &Hash32) -> bool {
        self.hashes.contains(hash)
    }

    /// Holds a claim; when full, the one furthest ahead (the highest round) goes, which may be
    /// this one. Whether it is held.
    pub(super) fn hold(&mut self, verified: &VerifiedProof, wire: &[u8]) -> bool {
        let key = key_of(verified);
        self.held.insert(key, (verified.clone(), Arc::from(wire)));
        self.hashes.insert(key.2);
        while self.held.len() > MAX_AHEAD {
            let furthest = self.held.keys().max_by_key(|k| (k.1, k.0, k.2)).copied();
            if let Some(k) = furthest {
                self.held.remove(&k);
                self.hashes.remove(&k.2);
            }
        }
        self.hashes.contains(&key.2)
    }

    /// Takes out every held claim, lowest round first within a stage (to be judged again).
    pub(super) fn take_all(&mut self) -> Vec<(VerifiedProof, Arc<[u8]>)> {
        self.hashes.clear();
        std::mem::take(&mut self.held).into_values().collect()
    }
}
