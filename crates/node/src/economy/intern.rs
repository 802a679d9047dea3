//! One copy of each proof's wire bytes per process.
//!
//! A node keeps the wire bytes of every proof of the network to serve anti-entropy. A real
//! node holds one copy of each anyway; a simulated network of N nodes in one process would
//! hold N copies of the same immutable bytes, so the economies share them (`Arc<[u8]>`).
//! Nothing is decided by this table: a node still receives, decodes and verifies every proof
//! itself, and only bytes equal to the held ones are shared.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use neuroshard_proof::Hash32;

struct Table {
    map: HashMap<Hash32, Weak<[u8]>>,
    /// Dead entries are swept when the map reaches this size.
    sweep_at: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The shared copy of `wire` (a proof whose payload hash is `hash`), made if none is alive.
pub(super) fn intern(hash: Hash32, wire: &[u8]) -> Arc<[u8]> {
    let Ok(mut guard) = TABLE.lock() else {
        return Arc::from(wire);
    };
    let table = guard.get_or_insert_with(|| Table {
        map: HashMap::new(),
        sweep_at: 1024,
    });
    // The hash leaves the signature out: a copy with another signature is other bytes.
    if let Some(held) = table.map.get(&hash).and_then(Weak::upgrade)
        && *held == *wire
    {
        return held;
    }
    let fresh: Arc<[u8]> = Arc::from(wire);
    table.map.insert(hash, Arc::downgrade(&fresh));
    if table.map.len() >= table.sweep_at {
        table.map.retain(|_, w| w.strong_count() > 0);
        table.sweep_at = (2 * table.map.len()).max(1024);
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_are_shared_and_other_bytes_are_not() {
        let hash = [42; 32];
        let a = intern(hash, b"proof");
        let b = intern(hash, b"proof");
        assert!(Arc::ptr_eq(&a, &b));
        // Same payload hash, other signature bytes: kept as they are.
        let c = intern(hash, b"proof, other signature");
        assert_eq!(&*c, b"proof, other signature");
        assert_eq!(&*a, b"proof");
    }
}
