//! The round rules on the live ledger, judged by the finalized state's progress.
//!
//! A training proof may claim at most `round_lead` rounds past its stage's certified round,
//! and none long gone: not more than `round_lead` before its key's first paid round of the
//! stage (`StageProgress::check`). Finality applies both in one order on every node.
//! A live ledger cannot judge them from its own progress: which proofs reached it first
//! depends on arrival order, and a node that heard two keys' claims before any other
//! replica's proof of the stage would let them lift the stage for it alone. So it judges every
//! claim by the progress of the latest state this node finalized, which every node reaches
//! alike, and holds what that state does not allow yet:
//! - a claim past the stage ([`super::ahead`]) waits; one within [`FEED_AHEAD`] rounds is
//!   handed to finality, so the stage's progress is never held back by the live ledger;
//! - a claim of a key with no paid round of the stage yet waits here (its 16 highest), and
//!   the highest within reach of the stage is handed to finality, which judges it as a first
//!   claim; once an epoch pays one, the rest are judged by it;
//! - a claim more than `round_lead` before its key's first paid round is refused.
//!
//! Every finalized epoch re-judges what waits, and the proofs it finalized are applied to the
//! live ledger. Until this node has finalized an epoch (or replayed one at start-up) the live
//! ledger judges no round rule: a network whose finality never ran (more than a third of its
//! first committee offline) pays as before these rules, and economies without finality
//! (tests, tools) never judge them.

use std::collections::BTreeMap;
use std::sync::Arc;

use neuroshard_ledger::{EpochItem, LedgerError, StageProgress};
use neuroshard_proof::{LayerRange, NodeId, ProofKind, VerifiedProof};

use super::{Economy, ProofOutcome};
use crate::finality::ItemWire;

/// Epochs a stage's prover counts among the co-replicas a replica catching up needs a majority
/// of (`Syncer::set_active`) after the finalized state last paid it: two minutes at the
/// default 10-s epochs, many rounds of an honest replica. Shorter than the certified round's
/// `ACTIVE_EPOCHS` (ten minutes) because a replica that died holds the others' catch-ups back
/// that long; a partitioned or restarted replica's finalized state stands still meanwhile,
/// so its stage's provers stay in its count while it hears only others.
pub const ELECTORATE_EPOCHS: u64 = 12;
/// Claims held for one key and stage whose first claim is not final: the highest rounds.
pub const HELD_PER_KEY: usize = 16;
/// Claims held for keys whose first claim is not final, at most.
pub const MAX_FIRST_HELD: usize = 1024;
/// Rounds past the finalized certified round a held claim may be to be handed to finality:
/// an epoch then moves a stage up to this far, whatever the lead.
pub const FEED_AHEAD: u64 = 64;

/// (prover, stage layers).
type KeyStage = (NodeId, (u32, u32));
/// One key's held claims of a stage, by round.
type Claims = BTreeMap<u64, (VerifiedProof, Arc<[u8]>)>;

#[derive(Debug, Default)]
pub(super) struct Floor {
    /// The latest finalized state's progress; `None` until this node finalized an epoch.
    finalized: Option<StageProgress>,
    held: BTreeMap<KeyStage, Claims>,
    count: usize,
}

/// What the round rules say of a claim, by the finalized progress.
pub(super) enum Judged {
    /// Apply it.
    Pass,
    Behind(LedgerError),
    /// Past its stage: hold it (`ahead.rs`).
    Ahead,
    /// Its key has no final claim of the stage: hold it here.
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

    /// The certified round of `v`'s stage in the finalized state, as judged for `v`.
    fn certified(&self, v: &VerifiedProof) -> Option<u64> {
        let p = v.proof();
        self.finalized.as_ref()?.certified(p.layers)
    }

    fn judge(&self, v: &VerifiedProof, lead: u64) -> Judged {
        let p = v.proof();
        let Some(progress) = &self.finalized else {
            return Judged::Pass;
        };
        if lead == 0 || p.kind != ProofKind::Training {
            return Judged::Pass;
        }
        // A key's first claim is judged against the stage only by finality: the certified
        // round it is judged by here moves with this node's finalized epoch, and nodes at
        // different epochs would refuse different claims. So it waits for a final first one.
        let first = progress.first(&p.node_id, p.layers);
        match progress.check(p, lead) {
            Err(LedgerError::RoundUncertified { .. }) => Judged::Ahead,
            _ if first.is_none() => Judged::Unknown,
            Err(e) => Judged::Behind(e),
            Ok(()) => Judged::Pass,
        }
    }

    /// Holds a claim; whether it is now the highest held for its key and stage. The lowest
    /// rounds go first when a key or the whole hold is full.
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
    /// Applies a claim whose prover and receipts stand, or holds or refuses it by the round
    /// rules (see the module docs).
    ///
    /// A held claim judged again after an epoch is handed to finality again where it is now
    /// within reach (finality takes an item it holds once): so a stage whose certified round
    /// was held back climbs again, up to [`FEED_AHEAD`] rounds an epoch.
    pub(super) fn apply_claim(&mut self, verified: &VerifiedProof, wire: &[u8]) -> ProofOutcome {
        let lead = self.ledger.rules().round_lead;
        match self.floor.judge(verified, lead) {
            Judged::Pass => Self::outcome_of(verified, self.apply_verified(verified, wire)),
            Judged::Behind(e) => ProofOutcome::Rejected(e.to_string()),
            Judged::Ahead => {
                let p = verified.proof();
                let reach = self
                    .floor
                    .certified(verified)
                    .unwrap_or(0)
                    .saturating_add(FEED_AHEAD);
                let held = self.ahead.hold(verified, wire);
                if held && p.round <= reach {
                    self.feed(verified, wire);
                }
                if held {
                    ProofOutcome::Parked("its stage has not reached its round yet".into())
                } else {
                    ProofOutcome::Rejected(
                        "its stage has not reached its round, and it is further ahead than \
                         any held"
                            .into(),
                    )
                }
            }
            Judged::Unknown => {
                let floor = self
                    .floor
                    .certified(verified)
                    .map_or(0, |c| c.saturating_sub(lead));
                if self.floor.hold(verified, wire) && verified.proof().round >= floor {
                    self.feed(verified, wire);
                }
                ProofOutcome::Parked(
                    "waits for its prover's first claim of the stage to be final".into(),
                )
            }
        }
    }

    /// Hands a held claim to finality, which judges it in one order on every node.
    fn feed(&mut self, verified: &VerifiedProof, wire: &[u8]) {
        self.epoch_feed.push(
            EpochItem::Proof(verified.clone()),
            ItemWire::Proof(wire.to_vec()),
        );
    }

    /// The provers of `layers` the latest finalized state paid in its last
    /// [`ELECTORATE_EPOCHS`] epochs: every node agrees on them, and no peer can hide them from
    /// us by being all we hear. Empty until this node finalized an epoch.
    pub fn active_provers(&self, layers: LayerRange) -> impl Iterator<Item = NodeId> + '_ {
        self.floor
            .finalized
            .iter()
            .flat_map(move |p| p.active_within(layers, ELECTORATE_EPOCHS))
    }

    /// Takes the progress of a newly finalized state and judges again every claim held. How
    /// many applied.
    pub fn on_finalized(&mut self, state: &neuroshard_ledger::LedgerState) -> usize {
        self.floor.finalized = Some(state.progress().clone());
        let mut waiting: Vec<(VerifiedProof, Arc<[u8]>)> = std::mem::take(&mut self.floor.held)
            .into_values()
            .flat_map(BTreeMap::into_values)
            .collect();
        self.floor.count = 0;
        waiting.extend(self.ahead.take_all());
        let mut applied = 0;
        for (verified, wire) in waiting {
            if matches!(
                self.apply_claim(&verified, &wire),
                ProofOutcome::Applied { .. }
            ) {
                applied += 1;
            }
        }
        applied
    }
}
