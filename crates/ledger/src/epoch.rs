//! Epochs of the ledger (ledger finality, issue 19): the items an epoch holds, applied in one
//! canonical order onto the last finalized state, so that every node that holds the same
//! items reaches the same state, and the hash of the epoch's contents, which the finality
//! committee signs beside that state.
//!
//! Live ledgers apply items as they arrive, and where two items conflict (a second proof
//! for a round, an op at a nonce taken) arrival order decides. Within an epoch the order is
//! fixed instead: by kind (ops, then proofs, then slashes, then verdicts, then validator
//! fees: stake changes first, so every proof of the epoch is paid on the same stakes), then
//! by id. An item the rules refuse is left out of the state, the same way on every node, and
//! listed.

use neuroshard_growth::Evaluated;
use neuroshard_proof::{Hash32, VerifiedProof};

use crate::fee::VerifiedAuditFee;
use crate::ops::{VerifiedOp, VerifiedSlash};
use crate::state::{LedgerError, LedgerState, Outcome};
use crate::verdict::VerifiedVerdict;

/// One item an epoch can hold.
#[derive(Debug, Clone)]
pub enum EpochItem {
    Op(VerifiedOp),
    Proof(VerifiedProof),
    Slash(VerifiedSlash),
    Verdict(VerifiedVerdict),
    /// A validator's fee (paid from the emission; applied last, after every stake change).
    AuditFee(VerifiedAuditFee),
}

impl EpochItem {
    /// Its rank in the canonical order, then its id.
    fn key(&self) -> (u8, Hash32) {
        match self {
            Self::Op(o) => (0, o.hash()),
            Self::Proof(p) => (1, p.hash()),
            Self::Slash(s) => (2, slash_id(s)),
            Self::Verdict(v) => (3, verdict_id(v)),
            Self::AuditFee(f) => (4, fee_id(f)),
        }
    }

    /// The id the epoch's contents name it by: a proof's or op's signed payload hash; for a
    /// slash or a verdict, a hash of every field the ledger reads.
    pub fn id(&self) -> Hash32 {
        self.key().1
    }

    /// The round a training proof claims (0 for anything else): what orders proofs in an
    /// epoch.
    fn round(&self) -> u64 {
        match self {
            Self::Proof(p) if p.proof().kind == neuroshard_proof::ProofKind::Training => {
                p.proof().round
            }
            _ => 0,
        }
    }

    /// The signed time that places it in an epoch's window.
    pub fn timestamp_ms(&self) -> u64 {
        match self {
            Self::Op(o) => o.op().timestamp_ms,
            Self::Proof(p) => p.proof().timestamp_ms,
            Self::Slash(s) => s.timestamp_ms,
            Self::Verdict(v) => v.timestamp_ms,
            Self::AuditFee(f) => f.timestamp_ms,
        }
    }
}

/// A slash's id covers every field the ledger reads: the contents hash must name one
/// outcome (the same evidence with another reporter pays someone else).
fn slash_id(s: &VerifiedSlash) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger/epoch-slash/v1");
    h.update(&s.evidence_hash);
    h.update(&s.offender.0);
    h.update(&s.nonce.to_le_bytes());
    h.update(&s.reporter.0);
    h.update(&s.timestamp_ms.to_le_bytes());
    *h.finalize().as_bytes()
}

/// A verdict's id covers its parties, not only its job (see [`slash_id`]).
fn verdict_id(v: &VerifiedVerdict) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger/epoch-verdict/v1");
    h.update(&v.job);
    h.update(&v.offender.0);
    h.update(&v.beneficiary.0);
    h.update(&v.evidence_hash);
    h.update(&v.timestamp_ms.to_le_bytes());
    *h.finalize().as_bytes()
}

/// A fee's id covers every field the ledger reads (see [`slash_id`]).
fn fee_id(f: &VerifiedAuditFee) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger/epoch-audit-fee/v1");
    h.update(&f.network);
    h.update(&f.auditor.0);
    h.update(&f.worker.0);
    h.update(&f.stage.to_le_bytes());
    h.update(&f.round.to_le_bytes());
    h.update(&f.job);
    h.update(&f.beacon_epoch.to_le_bytes());
    h.update(&f.claim_hash);
    h.update(&f.timestamp_ms.to_le_bytes());
    *h.finalize().as_bytes()
}

/// What applying an epoch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochApplied {
    /// BLAKE3 over the items' (kind, id) in canonical order: what the epoch's value names.
    pub contents: Hash32,
    /// The state hash after the epoch.
    pub state: Hash32,
    /// Items applied (or duplicates of what an earlier epoch applied), by id.
    pub applied: usize,
    /// Items the rules refused, with the reason: left out, identically on every node.
    pub refused: Vec<(Hash32, LedgerError)>,
    /// What the growth rule decided at the epoch's end (`None`: the network does not grow).
    pub growth: Option<Evaluated>,
    /// The training rounds the epoch's end settled (`LedgerState::follow_settlements`).
    pub settled: Vec<crate::state::RoundSettlement>,
}

/// Applies `items` (any order; a repeated item counts once) onto `state` in the canonical
/// order. `state` is the last finalized state, or a copy of it when computing a proposal.
pub fn apply_epoch(state: &mut LedgerState, items: Vec<EpochItem>) -> EpochApplied {
    apply_epoch_admitted(state, items, |_, _| Ok(()))
}

/// The contents hash of `items` (any order; a repeated item counts once): what
/// [`apply_epoch`] reports, without applying anything.
pub fn epoch_contents(items: &[EpochItem]) -> Hash32 {
    let mut keys: Vec<(u8, Hash32)> = items.iter().map(EpochItem::key).collect();
    keys.sort();
    keys.dedup();
    contents_of(&keys)
}

fn contents_of(keys: &[(u8, Hash32)]) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger/epoch-contents/v1");
    h.update(&(keys.len() as u64).to_le_bytes());
    for (kind, id) in keys {
        h.update(&[*kind]);
        h.update(id);
    }
    *h.finalize().as_bytes()
}

/// [`apply_epoch`] with the caller's admission rule run before each item, on the state as
/// the items before it left it: rules the ledger does not hold (which stage a proof may
/// claim, whose receipts vouch for it) refuse an item the same way on every node.
pub fn apply_epoch_admitted(
    state: &mut LedgerState,
    mut items: Vec<EpochItem>,
    mut admit: impl FnMut(&LedgerState, &EpochItem) -> Result<(), String>,
) -> EpochApplied {
    items.sort_by_key(EpochItem::key);
    items.dedup_by_key(|i| i.key());
    let keys: Vec<(u8, Hash32)> = items.iter().map(EpochItem::key).collect();
    // Within a kind, lower rounds first (a stable sort keeps the id order among equals): a
    // prover's first paid round of a stage is then the lowest it claims in the epoch, which
    // the round floor is judged from (`StageProgress::check`).
    items.sort_by_key(|i| (i.key().0, i.round()));
    let mut applied = 0;
    let mut refused = Vec::new();
    // Proofs of rounds past their stage's certified round wait for the rest of the epoch:
    // the proofs that certify a round can sort after it, and the epoch pays them all. Each
    // pass goes through the waiting ones in the canonical order again, until one applies none.
    let mut ahead: Vec<EpochItem> = Vec::new();
    for item in items {
        match apply_one(state, &item, &mut admit) {
            Ok(true) => applied += 1,
            Ok(false) => {}
            Err(LedgerError::RoundUncertified { .. }) => ahead.push(item),
            Err(e) => refused.push((item.key().1, e)),
        }
    }
    loop {
        let before = ahead.len();
        let mut still = Vec::new();
        let mut last = Vec::new();
        for item in ahead {
            match apply_one(state, &item, &mut admit) {
                Ok(true) => applied += 1,
                Ok(false) => {}
                Err(e @ LedgerError::RoundUncertified { .. }) => {
                    last.push((item.key().1, e));
                    still.push(item);
                }
                Err(e) => refused.push((item.key().1, e)),
            }
        }
        if still.is_empty() || still.len() == before {
            refused.extend(last);
            break;
        }
        ahead = still;
    }
    // After every item: the rule reads the joins and announcements the epoch brought.
    let (growth, settled) = state.end_epoch();
    EpochApplied {
        contents: contents_of(&keys),
        state: state.state_hash(),
        applied,
        refused,
        growth,
        settled,
    }
}

/// Applies one item (admission first): whether it applied (false: an op queued behind its
/// predecessor), or what refused it.
fn apply_one(
    state: &mut LedgerState,
    item: &EpochItem,
    admit: &mut impl FnMut(&LedgerState, &EpochItem) -> Result<(), String>,
) -> Result<bool, LedgerError> {
    admit(state, item).map_err(LedgerError::NotAdmitted)?;
    let outcome = match item {
        EpochItem::Op(o) => state.apply_op(o.clone()),
        EpochItem::Proof(p) => {
            state.check_round_rules(p)?;
            state.apply_proof(p)
        }
        EpochItem::Slash(s) => state.apply_slash(s),
        EpochItem::Verdict(v) => state.apply_verdict(v),
        EpochItem::AuditFee(f) => state.apply_audit_fee(f),
    }?;
    // An op ahead of its predecessor waits in the pending queue, which is part of the state
    // every node reaches alike: counted as applied when it does.
    Ok(!matches!(outcome, Outcome::Queued))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod growth_tests;
