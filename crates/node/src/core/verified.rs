//! Envelopes whose signature was already checked, by BLAKE3 of the whole wire form.
//!
//! Checking the same bytes again gives the same answer, and gossip hands the same bytes to
//! every node: a simulated network of N nodes would otherwise check each heartbeat N times.
//! Only successes are remembered, keyed by the hash of payload, signer and signature together,
//! so a different signature over the same payload is checked afresh.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use neuroshard_proof::Hash32;

/// Envelopes remembered (FIFO beyond this).
const CAPACITY: usize = 1 << 16;

struct Seen {
    set: HashSet<Hash32>,
    order: VecDeque<Hash32>,
}

static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

pub(super) fn key(wire: &[u8]) -> Hash32 {
    *blake3::hash(wire).as_bytes()
}

pub(super) fn contains(key: &Hash32) -> bool {
    SEEN.lock()
        .map(|g| g.as_ref().is_some_and(|s| s.set.contains(key)))
        .unwrap_or(false)
}

pub(super) fn insert(key: Hash32) {
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
