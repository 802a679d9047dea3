//! The round floor on the live ledger: a claim of a round long gone is refused here too, not
//! only in the finalized state (`LedgerState::check_round_floor`).
//!
//! A live ledger cannot judge a claim's age from its own contents, since which of a key's
//! claims it saw first depends on arrival order. So it takes each key's first paid round of a
//! stage from the finalized state, which every node reaches alike, and fixes for good: a claim
//! more than `round_lead` before it is refused, on every node. A key whose first claim of a
//! stage is not final yet has its claims held here; the highest is handed to finality, which
//! judges it against the stage, and once an epoch pays one the rest are judged by it. An
//! honest replica's first proof of a stage is paid one epoch later than before; two keys that
//! join a stage late are paid, live as finalized, for at most `round_lead` rounds before their
//! first.
//!
//! Until this node has finalized an epoch (or replayed one at start-up), the live ledger judges
//! no floor: a network whose finality never ran (more than a third of its first committee
//! offline) pays as it did before the floor, and economies without finality (tests, tools)
//! never judge one. Once it has, a key without a final claim is paid live only once one is,
//! which a halt of finality delays; what an epoch finalizes the live ledger then applies.

use std::collections::BTreeMap;
use std::sync::Arc;

use neuroshard_ledger::{EpochItem, LedgerError, LedgerState};
use neuroshard_proof::{NodeId, ProofKind, VerifiedProof};

use super::{Economy, ProofOutcome};
use crate::finality::ItemWire;

/// Claims held for one key and stage whose first claim is not final: the highest rounds.
pub const HELD_PER_KEY: usize = 16;
/// Claims held for keys whose first claim is not final, at most.
pub const MAX_FIRST_HELD: usize = 1024;

/// (prover, stage layers).
type KeyStage = (NodeId, (u32, u32));
/// One key's held claims of a stage, by round.
type Claims = BTreeMap<u64, (VerifiedProof, Arc<[u8]>)>;

#[derive(Debug, Default)]
pub(super) struct Floor {
    /// Each key's first paid round of each stage in the finalized state; `None` until the
    /// node has finalized state.
    firsts: Option<BTreeMap<KeyStage, u64>>,
    held: BTreeMap<KeyStage, Claims>,
    count: usize,
}

/// What the floor says of a claim.
pub(super) enum Judged {
    /// Apply it (no floor yet, no lead, not a training proof, or at or above the floor).
    Pass,
    Behind(LedgerError),
    /// Its key's first claim of the stage is not final: hold it.
    Unknown,
}

fn key_stage(v: &VerifiedProof) -> KeyStage {
    let p = v.proof();
    (p.node_id, (p.layers.start, p.layers.end))
}

impl Floor {
    pub(super) fn held(&self) -> usize {
        self.count
    }

    /// Whether the proof `hash` is held (at most [`MAX_FIRST_HELD`] to look through).
    pub(super) fn contains(&self, hash: &neuroshard_proof::Hash32) -> bool {
        self.held
            .values()
            .flat_map(|g| g.values())
            .any(|(v, _)| v.hash() == *hash)
    }

    fn judge(&self, v: &VerifiedProof, lead: u64) -> Judged {
        let p = v.proof();
        let Some(firsts) = &self.firsts else {
            return Judged::Pass;
        };
        if lead == 0 || p.kind != ProofKind::Training {
            return Judged::Pass;
        }
        match firsts.get(&key_stage(v)) {
            Some(first) => {
                let floor = first.saturating_sub(lead);
                if p.round < floor {
                    Judged::Behind(LedgerError::RoundBehind {
                        round: p.round,
                        floor,
                    })
                } else {
                    Judged::Pass
                }
            }
            None => Judged::Unknown,
        }
    }

    /// Holds a claim; whether it is now the highest held for its key and stage (the one to
    /// hand to finality). The lowest rounds go first when a key or the whole hold is full.
    fn hold(&mut self, v: &VerifiedProof, wire: &[u8]) -> bool {
        let ks = key_stage(v);
        let round = v.proof().round;
        let group = self.held.entry(ks).or_default();
        if group.insert(round, (v.clone(), Arc::from(wire))).is_none() {
            self.count += 1;
        }
        while group.len() > HELD_PER_KEY {
            group.pop_first();
            self.count -= 1;
        }
        let highest = group.last_key_value().is_some_and(|(r, _)| *r == round);
        while self.count > MAX_FIRST_HELD {
            let fullest = self
                .held
                .iter()
                .max_by_key(|(k, g)| (g.len(), *k))
                .map(|(k, _)| *k);
            let Some(k) = fullest else { break };
            if let Some(g) = self.held.get_mut(&k) {
                g.pop_first();
                self.count -= 1;
                if g.is_empty() {
                    self.held.remove(&k);
                }
            }
        }
        highest && self.held.get(&ks).is_some_and(|g| g.contains_key(&round))
    }
}

impl Economy {
    /// Applies a claim whose prover and receipts stand, by the round floor first (see the
    /// module docs), then by the stage's progress ([`Economy::apply_or_hold`]).
    pub(super) fn apply_claim(&mut self, verified: &VerifiedProof, wire: &[u8]) -> ProofOutcome {
        let p = verified.proof();
        match self.judge_floor(verified) {
            Judged::Pass => self.apply_or_hold(verified, wire),
            Judged::Behind(e) => ProofOutcome::Rejected(e.to_string()),
            Judged::Unknown
                if p.round > self.ledger.max_claimable_round(p.layers, p.timestamp_ms) =>
            {
                // Past its stage too: it waits for the stage first (and then comes back here).
                self.apply_or_hold(verified, wire)
            }
            Judged::Unknown => {
                self.hold_first(verified, wire);
                ProofOutcome::Parked(
                    "waits for its prover's first claim of the stage to be final".into(),
                )
            }
        }
    }

    /// What the floor says of a claim.
    pub(super) fn judge_floor(&self, verified: &VerifiedProof) -> Judged {
        self.floor.judge(verified, self.ledger.rules().round_lead)
    }

    /// Holds a claim whose key's first claim of the stage is not final. The highest held is
    /// handed to finality, unless the stage is already more than the lead past it (finality
    /// would refuse it as a first claim): so a key sending claims of every past round in
    /// rising order hands finality at most about twice the lead of them, not every one.
    pub(super) fn hold_first(&mut self, verified: &VerifiedProof, wire: &[u8]) {
        let p = verified.proof();
        let lead = self.ledger.rules().round_lead;
        let floor = self
            .ledger
            .certified_round(p.layers, p.timestamp_ms)
            .map_or(0, |c| c.saturating_sub(lead));
        if self.floor.hold(verified, wire) && p.round >= floor {
            self.epoch_feed.push(
                EpochItem::Proof(verified.clone()),
                ItemWire::Proof(wire.to_vec()),
            );
        }
    }

    /// Takes every key's first paid round from a newly finalized state and judges the claims
    /// held for keys whose first claim it made final. How many applied.
    pub fn on_finalized(&mut self, state: &LedgerState) -> usize {
        let firsts: BTreeMap<KeyStage, u64> = state
            .first_paid_rounds()
            .map(|(id, layers, first)| ((id, (layers.start, layers.end)), first))
            .collect();
        let due: Vec<KeyStage> = self
            .floor
            .held
            .keys()
            .filter(|k| firsts.contains_key(k))
            .copied()
            .collect();
        self.floor.firsts = Some(firsts);
        let mut applied = 0;
        for k in due {
            let Some(group) = self.floor.held.remove(&k) else {
                continue;
            };
            self.floor.count -= group.len();
            for (verified, wire) in group.into_values() {
                if matches!(
                    self.apply_claim(&verified, &wire),
                    ProofOutcome::Applied { .. }
                ) {
                    applied += 1;
                }
            }
        }
        applied
    }
}
