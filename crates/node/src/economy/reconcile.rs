//! Range-based set reconciliation of ledger items (proof and op hashes), with the maintained
//! `negentropy` crate: the initiator sends fingerprints of ranges of its sorted ids, the
//! responder answers with its own for the ranges that differ, splitting them until the ids
//! themselves are listed. Messages grow with the number of differences (times the log of the
//! set's size), not with the number of provers or accounts, and there is no size cliff: a
//! frame limit spreads a large difference over several round trips.
//!
//! Fingerprints are negentropy's (SHA-256 over the sum of the ids modulo 2^256 and their
//! count). The ids are BLAKE3 hashes of signed items, so two different sets with one
//! fingerprint need a k-sum collision over signed, valid items. The per-prover XOR digest
//! this replaces could be matched with a few dozen proofs of one's own.
//!
//! The responder is stateless; the initiator keeps one [`Session`] per peer.

use std::collections::{HashSet, VecDeque};

use negentropy::{Id, Negentropy, NegentropyStorageBase, NegentropyStorageVector};
use neuroshard_proof::Hash32;

/// Largest reconciliation message either side sends (negentropy's frame limit; it keeps
/// about 200 bytes of room below it).
pub const MAX_NEG_FRAME: usize = 60 * 1024;
/// Largest reconciliation message accepted on the wire.
pub const MAX_NEG_BYTES: usize = 64 * 1024;
/// Round trips one session may take before it is dropped (a responder that never converges
/// cannot keep us busy; the next anti-entropy period starts afresh).
pub const MAX_SESSION_ROUNDS: u32 = 64;
/// Ids asked for in one request.
pub const MAX_WANT: usize = 1024;
/// Ids a session remembers it still wants (the rest come in a later session).
pub const MAX_WANT_QUEUED: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("set reconciliation: {0}")]
    Protocol(String),
    #[error("reconciliation message of {0} bytes exceeds {MAX_NEG_BYTES}")]
    TooLarge(usize),
}

fn protocol(e: negentropy::Error) -> ReconcileError {
    ReconcileError::Protocol(e.to_string())
}

/// A sealed, sorted snapshot of the ids a node holds.
#[derive(Debug, Clone)]
pub struct SyncSet(NegentropyStorageVector);

impl SyncSet {
    pub fn new(ids: impl IntoIterator<Item = Hash32>) -> Self {
        Self::with_first(ids, [])
    }

    /// A set whose `first` ids sort before all of `rest`. Negentropy works through the
    /// ranges in order, so a session that runs out of round trips (a large difference) has
    /// still settled `first`: ledgers put the ops there, which the proofs need applied before
    /// them. With one order by hash, a joiner missing more than a session covers kept
    /// re-fetching low proofs that waited for registrations whose ops sorted past what any
    /// session reached, and never caught up.
    pub fn with_first(
        first: impl IntoIterator<Item = Hash32>,
        rest: impl IntoIterator<Item = Hash32>,
    ) -> Self {
        let mut storage = NegentropyStorageVector::new();
        // The item's "time" is only its class: ranges split by class, then id, alike on both
        // sides.
        let classed = first
            .into_iter()
            .map(|id| (0, id))
            .chain(rest.into_iter().map(|id| (1, id)));
        for (class, id) in classed {
            storage
                .insert(class, Id::from_byte_array(id))
                .expect("a fresh storage is unsealed");
        }
        storage.seal().expect("sealed once");
        Self(storage)
    }

    pub fn len(&self) -> usize {
        self.0.size().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The responder's side: our answer to a peer's reconciliation message.
pub fn answer(set: &SyncSet, message: &[u8]) -> Result<Vec<u8>, ReconcileError> {
    if message.len() > MAX_NEG_BYTES {
        return Err(ReconcileError::TooLarge(message.len()));
    }
    let mut neg = Negentropy::borrowed(&set.0, MAX_NEG_FRAME as u64).map_err(protocol)?;
    neg.reconcile(message).map_err(protocol)
}

/// The initiator's side of one reconciliation with one peer.
#[derive(Debug)]
pub struct Session {
    neg: Negentropy<'static, NegentropyStorageVector>,
    /// Ids the peer holds and we lack, not yet asked for.
    want: VecDeque<Hash32>,
    queued: HashSet<Hash32>,
    rounds: u32,
    /// The ranges agree (or the peer stopped answering them): only wants are left.
    settled: bool,
}

impl Session {
    /// Starts a session over `set`; returns it and the first message.
    pub fn start(set: SyncSet) -> Result<(Self, Vec<u8>), ReconcileError> {
        let mut neg = Negentropy::owned(set.0, MAX_NEG_FRAME as u64).map_err(protocol)?;
        let first = neg.initiate().map_err(protocol)?;
        let session = Self {
            neg,
            want: VecDeque::new(),
            queued: HashSet::new(),
            rounds: 0,
            settled: false,
        };
        Ok((session, first))
    }

    /// Reads the peer's answer: the ids it holds that we lack join the wanted ones. Returns
    /// the next message, `None` once the ranges agree. Counts a round trip.
    pub fn on_answer(&mut self, message: &[u8]) -> Result<Option<Vec<u8>>, ReconcileError> {
        self.rounds = self.rounds.saturating_add(1);
        if message.len() > MAX_NEG_BYTES {
            self.settled = true;
            return Err(ReconcileError::TooLarge(message.len()));
        }
        let mut have = Vec::new();
        let mut need = Vec::new();
        let next = self.neg.reconcile_with_ids(message, &mut have, &mut need);
        // The crate lists them in hash-set order, which differs from run to run; the node's
        // behaviour must not (the simulator replays a seed bit for bit).
        need.sort_unstable();
        for id in need {
            let id = id.to_bytes();
            if self.want.len() < MAX_WANT_QUEUED && self.queued.insert(id) {
                self.want.push_back(id);
            }
        }
        match next {
            Ok(Some(next)) if self.rounds < MAX_SESSION_ROUNDS => Ok(Some(next)),
            Ok(_) => {
                self.settled = true;
                Ok(None)
            }
            Err(e) => {
                self.settled = true;
                Err(protocol(e))
            }
        }
    }

    /// Up to [`MAX_WANT`] wanted ids for the next request, skipping those `held` says arrived
    /// meanwhile.
    pub fn take_wants(&mut self, held: impl Fn(&Hash32) -> bool) -> Vec<Hash32> {
        let mut out = Vec::new();
        while out.len() < MAX_WANT {
            let Some(id) = self.want.pop_front() else {
                break;
            };
            if !held(&id) {
                out.push(id);
            }
        }
        out
    }

    /// True once nothing is left to ask: the ranges agree and every wanted id was asked for,
    /// or the session used its rounds.
    pub fn finished(&self) -> bool {
        (self.settled && self.want.is_empty()) || self.rounds >= MAX_SESSION_ROUNDS
    }

    pub fn rounds(&self) -> u32 {
        self.rounds
    }
}

#[cfg(test)]
mod tests;
