//! Signatures already found valid, remembered by BLAKE3 of key, message digest and
//! signature together.
//!
//! Checking the same signature again gives the same answer, and a network hands the same
//! signed bytes to many checks: a proof's receipts are checked by every node, and a simulated
//! network of N nodes would check each heartbeat N times in one process. Only successes are
//! remembered, and the key covers the signature, so a different signature over the same
//! message is checked afresh; a forged one never matches a remembered entry.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// Signatures remembered (the oldest is forgotten beyond this; ~20 MiB at most).
const CAPACITY: usize = 1 << 18;

struct Seen {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

pub(crate) fn key(public: &[u8; 33], prehash: &[u8; 32], sig: &[u8; 64]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(public);
    h.update(prehash);
    h.update(sig);
    *h.finalize().as_bytes()
}

pub(crate) fn contains(key: &[u8; 32]) -> bool {
    SEEN.lock()
        .map(|g| g.as_ref().is_some_and(|s| s.set.contains(key)))
        .unwrap_or(false)
}

pub(crate) fn insert(key: [u8; 32]) {
    let Ok(mut guard) = SEEN.lock() else {
        return;
    };
    let seen = guard.get_or_insert_with(|| Seen {
        set: HashSet::new(),
        order: VecDeque::new(),
    });
    if seen.set.insert(key) {
        seen.order.push_back(key);
        if seen.order.len() > CAPACITY
            && let Some(old) = seen.order.pop_front()
        {
            seen.set.remove(&old);
        }
    }
}

/// Forgets every remembered signature: a benchmark that measures signature checks in a
/// process that already checked the same bytes (a simulation) starts from nothing.
pub fn forget_all() {
    if let Ok(mut guard) = SEEN.lock() {
        *guard = None;
    }
}
