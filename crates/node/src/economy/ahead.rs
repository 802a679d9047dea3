//! Proofs of rounds past their stage's certified round (`LedgerState::certified_round`): the
//! ledger refuses them *for now*, so the live ledger holds them, verified, until the stage's
//! other provers catch up, then applies them. Whatever order proofs arrive in, a node ends up
//! paying the same ones, as it does for proofs waiting for a registration.
//!
//! Honest replicas of a stage prove the same rounds within moments of each other, so what
//! waits here long is a claim the stage never reached. When the hold is full the proof
//! furthest ahead goes: that is never an honest replica's next round while an attacker's far
//! claims are held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use neuroshard_ledger::LedgerError;
use neuroshard_proof::{Hash32, LayerRange, VerifiedProof};

use super::{Economy, EconomyError, ProofOutcome};

/// Proofs held ahead of their stage, at most.
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

    /// Holds a proof; when full, the one furthest ahead (the highest round) goes, which may be
    /// this one. Whether it is held.
    fn hold(&mut self, verified: &VerifiedProof, wire: &[u8]) -> bool {
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

    /// Takes out the held proofs of `layers` up to round `max`, lowest round first.
    fn due(&mut self, layers: LayerRange, max: u64) -> Vec<(VerifiedProof, Arc<[u8]>)> {
        let stage = (layers.start, layers.end);
        let keys: Vec<Key> = self
            .held
            .range((stage, 0, [0; 32])..=(stage, max, [u8::MAX; 32]))
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                self.hashes.remove(&k.2);
                self.held.remove(&k)
            })
            .collect()
    }
}

impl Economy {
    /// Applies a proof whose prover and receipts stand; one the ledger finds ahead of its
    /// stage is held (see the module docs), and one that applies may release held ones.
    pub(super) fn apply_or_hold(&mut self, verified: &VerifiedProof, wire: &[u8]) -> ProofOutcome {
        match self.apply_verified(verified, wire) {
            Err(EconomyError::Rules(e @ LedgerError::RoundUncertified { .. })) => {
                if self.ahead.hold(verified, wire) {
                    ProofOutcome::Parked(e.to_string())
                } else {
                    ProofOutcome::Rejected(format!("{e}, and further ahead than any held"))
                }
            }
            other => {
                let outcome = Self::outcome_of(verified, other);
                if matches!(outcome, ProofOutcome::Applied { .. }) {
                    self.release_ahead(verified.proof().layers, verified.proof().timestamp_ms);
                }
                outcome
            }
        }
    }

    /// Applies the held proofs of `layers` that its stage's progress now allows, until none
    /// more does (each applied one can allow the next). How many applied.
    pub(super) fn release_ahead(&mut self, layers: LayerRange, at_ms: u64) -> usize {
        let mut applied = 0;
        loop {
            let max = self.ledger.max_claimable_round(layers, at_ms);
            let due = self.ahead.due(layers, max);
            if due.is_empty() {
                return applied;
            }
            let mut any = false;
            for (verified, wire) in due {
                // Within its stage's reach now, it meets the round floor (`floor.rs`).
                match self.judge_floor(&verified) {
                    super::floor::Judged::Pass => {}
                    super::floor::Judged::Behind(_) => continue,
                    super::floor::Judged::Unknown => {
                        self.hold_first(&verified, &wire);
                        continue;
                    }
                }
                match self.apply_verified(&verified, &wire) {
                    Ok(neuroshard_ledger::Outcome::Applied(_)) => {
                        applied += 1;
                        any = true;
                    }
                    // Judged at its own time, a held proof can still be ahead.
                    Err(EconomyError::Rules(LedgerError::RoundUncertified { .. })) => {
                        self.ahead.hold(&verified, &wire);
                    }
                    _ => {}
                }
            }
            if !any {
                return applied;
            }
        }
    }
}
