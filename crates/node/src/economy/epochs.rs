//! The economy's side of ledger finality: every item the live ledger applies is handed on to
//! be finalized in an epoch, and the rules the ledger itself does not hold (which stage a
//! proof may claim, whose receipts vouch for it) judge an epoch's items the same way they
//! judge gossip, against the state the epoch is applied to.

use std::collections::{BTreeMap, VecDeque};

use crate::recent::RecentSet;
use std::sync::Arc;

use neuroshard_ledger::{EpochItem, LedgerState, VerifiedVerdict};
use neuroshard_proof::Hash32;
use neuroshard_proof::verify::MAX_CLOCK_SKEW_MS;

use super::{Economy, Standing};
use crate::finality::ItemWire;

/// Audit verdicts remembered exactly as this node reached them (a validator votes for an
/// epoch's verdict only if its own replay reached the same).
pub const SETTLED_VERDICTS: usize = 4096;

/// Items applied and not yet handed to finality, and the verdicts this node settled.
#[derive(Debug, Default)]
pub(super) struct EpochFeed {
    applied: VecDeque<(EpochItem, ItemWire)>,
    settled: BTreeMap<Hash32, VerifiedVerdict>,
    settled_order: VecDeque<Hash32>,
    /// Jobs whose worker served this node, as a juror, evidence on which the job replays:
    /// a verdict that it did not is refused (see `core/jury.rs`).
    cleared: RecentSet<Hash32, SETTLED_VERDICTS>,
    /// When this node, as a juror, found each worker guilty (unix ms): past
    /// `JURY_FINDING_TTL_MS` it no longer proposes or votes for the verdict.
    found_at: BTreeMap<Hash32, u64>,
}

/// How long a juror's finding counts: a verdict that more than a third of the committee does
/// not back (a worker that served some jurors and not others) would otherwise be proposed by
/// the rest at every epoch, and each such proposal costs a consensus round.
pub const JURY_FINDING_TTL_MS: u64 = 10 * 60 * 1000;

impl EpochFeed {
    pub(super) fn push(&mut self, item: EpochItem, wire: ItemWire) {
        self.applied.push_back((item, wire));
    }

    pub(super) fn settled(&mut self, v: VerifiedVerdict) {
        if self.settled.insert(v.job, v).is_none() {
            self.settled_order.push_back(v.job);
        }
        while self.settled_order.len() > SETTLED_VERDICTS {
            if let Some(old) = self.settled_order.pop_front() {
                self.settled.remove(&old);
                self.found_at.remove(&old);
            }
        }
    }
}

/// What ledger finality keeps in the database.
#[derive(Debug, Clone)]
pub enum FinalityWrite {
    /// A finalized epoch (a `finality::ChainLink`'s bytes): its log entries go.
    Epoch { epoch: u64, link: Arc<Vec<u8>> },
    /// A consensus write-ahead log entry of the epoch in progress.
    Wal { epoch: u64, entry: Vec<u8> },
}

impl super::LedgerWrite {
    /// A write that only keeps finality's record.
    pub fn finality(write: FinalityWrite) -> Self {
        Self {
            finality: Some(write),
            ..Self::of(neuroshard_ledger::Changes::default())
        }
    }
}

/// Where a node's ledger finality resumes from.
#[derive(Debug, Clone, Default)]
pub struct FinalityStart {
    pub genesis: LedgerState,
    /// Finalized epochs (`finality::ChainLink` bytes), in order.
    pub epochs: Vec<Vec<u8>>,
    pub wal: Vec<(u64, Vec<u8>)>,
}

/// Whether an item may enter an epoch, as this node judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Yes,
    No(String),
    /// This node cannot tell yet (a verdict it has not reached by its own replay).
    NotYet,
}

impl Economy {
    /// Where finality resumes from (once: the core takes it when it starts).
    pub fn take_finality_start(&mut self) -> Option<super::FinalityStart> {
        self.finality_start.take()
    }

    /// Queues a finality record for the store.
    pub fn keep_finality(&mut self, write: super::FinalityWrite) {
        self.writes.push_back(super::LedgerWrite::finality(write));
    }

    /// The next item the live ledger applied, for finality.
    pub fn poll_epoch_item(&mut self) -> Option<(EpochItem, ItemWire)> {
        self.epoch_feed.applied.pop_front()
    }

    /// A juror's finding that a worker did not serve a demanded job's evidence, or served
    /// evidence on which the job does not replay: this node proposes and votes for the
    /// verdict, which the live ledger applies only once an epoch finalizes it (one juror's
    /// view is not the network's).
    pub fn jury_found(&mut self, verdict: VerifiedVerdict, now_ms: u64) {
        self.epoch_feed
            .found_at
            .entry(verdict.job)
            .or_insert(now_ms);
        self.epoch_feed.settled(verdict);
        self.epoch_feed
            .push(EpochItem::Verdict(verdict), ItemWire::Verdict(verdict));
    }

    /// A juror got evidence of `job` on which it replays: a verdict that the worker did not
    /// serve it is refused here.
    pub fn jury_cleared(&mut self, job: Hash32) {
        self.epoch_feed.cleared.insert(job);
    }

    /// Every proof and op the live ledger holds, as epoch items (a restarted node's items
    /// that no finalized epoch holds yet wait again).
    pub fn held_items(&self) -> Vec<ItemWire> {
        let proofs = self.wires.values().map(|w| ItemWire::Proof(w.to_vec()));
        let ops = self.op_wires.values().map(|w| ItemWire::Op(w.clone()));
        proofs.chain(ops).collect()
    }

    /// Whether `item` may be applied onto `state` (an epoch's state, as the items before it
    /// left it), by the rules gossip is judged by: a proof of this network's stages whose
    /// prover and enough receipt signers are registered in `state`; an op or proof not
    /// signed for a time ahead of `now_ms`; a verdict only as this node reached it. (The
    /// round rules are the ledger's own: `apply_epoch_admitted` judges them.)
    pub fn admit(&self, state: &LedgerState, item: &EpochItem, now_ms: u64) -> Admit {
        if item.timestamp_ms() > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Admit::No(format!(
                "signed for {}, ahead of {now_ms}",
                item.timestamp_ms()
            ));
        }
        match item {
            EpochItem::Proof(p) => {
                let stage = match self.check_claim(p.proof()) {
                    Ok(stage) => stage,
                    Err(e) => return Admit::No(e.to_string()),
                };
                match self.standing_in(state, p.proof(), stage) {
                    Standing::Ready => Admit::Yes,
                    Standing::Wait(_) => Admit::No("waits for a registration".into()),
                    Standing::Refuse(reason) => Admit::No(reason),
                }
            }
            // The ledger refuses an op of another network itself.
            EpochItem::Op(_) | EpochItem::Slash(_) => Admit::Yes,
            EpochItem::AuditFee(f) => self.admit_fee(state, f),
            EpochItem::Verdict(v) => {
                match self.epoch_feed.settled.get(&v.job) {
                    Some(mine)
                        if mine == v
                            && self.epoch_feed.found_at.get(&v.job).is_some_and(|&t| {
                                now_ms > t.saturating_add(JURY_FINDING_TTL_MS)
                            }) =>
                    {
                        Admit::No("this node's finding as a juror has expired".into())
                    }
                    Some(mine) if mine == v => Admit::Yes,
                    Some(_) => Admit::No("this node's replay reached another verdict".into()),
                    None if self.epoch_feed.cleared.contains(&v.job) => {
                        Admit::No("the worker served this node the job's evidence".into())
                    }
                    None => Admit::NotYet,
                }
            }
        }
    }
}
