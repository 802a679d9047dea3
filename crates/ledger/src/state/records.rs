//! What the ledger holds and what an apply hands the storage adapter: accounts, history
//! lines, applied records and their changes.

use std::collections::BTreeMap;

use neuroshard_proof::{Hash32, NodeId, ProofKind, PublicKey};
use serde::Serialize;

use crate::ops::VerifiedSlash;
use crate::rules::Rules;

/// One account: spendable balance, locked stake, unstaked funds still unbonding (slashable,
/// not stake) and the next op nonce it accepts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Account {
    pub balance: u64,
    pub stake: u64,
    pub unlock_at_ms: u64,
    pub next_nonce: u64,
    /// Unstaked, not withdrawn yet: slashable until `unbonding_until_ms`.
    pub unbonding: u64,
    pub unbonding_until_ms: u64,
}

impl Account {
    /// What a slash can take: the stake and what is unbonding.
    pub fn slashable(&self) -> u64 {
        self.stake.saturating_add(self.unbonding)
    }

    /// Takes `amount` (at most [`Self::slashable`]) from the stake, then from what is
    /// unbonding; what was taken.
    pub fn take_slash(&mut self, amount: u64) -> u64 {
        let from_stake = self.stake.min(amount);
        self.stake -= from_stake;
        let from_unbonding = self.unbonding.min(amount - from_stake);
        self.unbonding -= from_unbonding;
        from_stake + from_unbonding
    }
}

/// What a history line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Reward,
    TransferOut,
    TransferIn,
    Burn,
    Stake,
    Unstake,
    /// Unbonded funds returned to the balance.
    Withdraw,
    Slashed,
    SlashReward,
    InferenceFee,
    InferenceIncome,
    /// A reward taken back: the proof it paid was one of two at one nonce.
    Clawback,
    /// A validator's fee for an audit (minted).
    AuditFee,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Reward => "reward",
            EntryKind::TransferOut => "transfer_out",
            EntryKind::TransferIn => "transfer_in",
            EntryKind::Burn => "burn",
            EntryKind::Stake => "stake",
            EntryKind::Unstake => "unstake",
            EntryKind::Withdraw => "withdraw",
            EntryKind::Slashed => "slashed",
            EntryKind::SlashReward => "slash_reward",
            EntryKind::InferenceFee => "inference_fee",
            EntryKind::InferenceIncome => "inference_income",
            EntryKind::Clawback => "clawback",
            EntryKind::AuditFee => "audit_fee",
        }
    }
}

/// One line of an account's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub account: NodeId,
    pub kind: EntryKind,
    pub amount: u64,
    pub counterparty: Option<NodeId>,
    /// Hash of the proof, op or slash evidence that caused it.
    pub reference: Hash32,
    pub timestamp_ms: u64,
}

/// A message that was applied, as the storage adapter persists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Proof {
        hash: Hash32,
        node: NodeId,
        nonce: u64,
        kind: ProofKind,
        reward: u64,
        timestamp_ms: u64,
        /// Training proofs: the (node, stage, round) they were paid for, hashed.
        round_key: Option<Hash32>,
    },
    /// A training proof joined its round's pot (`state/pots.rs`).
    Contribution {
        layers: neuroshard_proof::LayerRange,
        round: u64,
        node: NodeId,
        contribution: super::Contribution,
    },
    /// A stage's rounds up to `round` are settled: their pots are gone (the shares paid are
    /// in the accounts, the proofs' rewards and the history).
    Settled {
        layers: neuroshard_proof::LayerRange,
        round: u64,
    },
    /// The ledger's genesis: its hash and rules (the stakes are in the account changes).
    Genesis { hash: Hash32, rules: Rules },
    Op {
        account: NodeId,
        nonce: u64,
        hash: Hash32,
        wire: Vec<u8>,
    },
    Slash {
        slash: VerifiedSlash,
        slashed: u64,
        to_reporter: u64,
    },
    Verdict {
        verdict: crate::verdict::VerifiedVerdict,
        slashed: u64,
        paid: u64,
    },
    AuditFee {
        fee: crate::fee::VerifiedAuditFee,
        paid: u64,
    },
    /// Two proofs for one slot: neither paid (`clawed` taken back), `slashed` burned. The slot
    /// is the round key for training proofs, else (offender, nonce of the second proof).
    Equivocation {
        offender: NodeId,
        nonce: u64,
        round_key: Option<Hash32>,
        evidence: Hash32,
        clawed: u64,
        slashed: u64,
        timestamp_ms: u64,
    },
}

/// Everything one or more applies changed: final account values, new records, history lines
/// and the new supply totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub accounts: BTreeMap<NodeId, Account>,
    pub records: Vec<Record>,
    pub entries: Vec<Entry>,
    pub minted: u64,
    pub burned: u64,
    /// Keys of accounts seen for the first time (see `LedgerState::key`).
    pub keys: Vec<(NodeId, PublicKey)>,
}

impl Changes {
    /// Folds `later` into `self` (later account values win), for batched writes. A `later`
    /// that changed nothing (a write that only keeps other records: `Changes::default()`)
    /// leaves the totals alone: its zeros are not the supply.
    pub fn merge(&mut self, later: Changes) {
        if later.is_nothing() {
            return;
        }
        self.accounts.extend(later.accounts);
        self.records.extend(later.records);
        self.entries.extend(later.entries);
        self.keys.extend(later.keys);
        self.minted = later.minted;
        self.burned = later.burned;
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether nothing at all changed (no account, record, history line or key).
    pub fn is_nothing(&self) -> bool {
        self.accounts.is_empty()
            && self.records.is_empty()
            && self.entries.is_empty()
            && self.keys.is_empty()
    }
}

/// The result of an apply that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// State changed; persist these changes.
    Applied(Changes),
    /// Already applied before: nothing changed (re-delivery is harmless).
    Duplicate,
    /// Op arrived ahead of its predecessor and waits in the pending queue.
    Queued,
}
