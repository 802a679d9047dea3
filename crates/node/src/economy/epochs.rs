//! The economy's side of ledger finality: every item the live ledger applies is handed on to
//! be finalized in an epoch, and the rules the ledger itself does not hold (which stage a
//! proof may claim, whose receipts vouch for it) judge an epoch's items the same way they
//! judge gossip, against the state the epoch is applied to.

use std::collections::{BTreeMap, VecDeque};
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
}

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
            changes: neuroshard_ledger::Changes::default(),
            proof_wire: None,
            report: None,
            weights: None,
            finality: Some(write),
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
    /// signed for a time ahead of `now_ms`; a verdict only as this node reached it.
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
            EpochItem::Verdict(v) => match self.epoch_feed.settled.get(&v.job) {
                Some(mine) if mine == v => Admit::Yes,
                Some(_) => Admit::No("this node's replay reached another verdict".into()),
                None => Admit::NotYet,
            },
        }
    }
}
