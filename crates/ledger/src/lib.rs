//! The NEURO ledger.
//!
//! - [`amount`]: integer base units (1 NEURO = 10^9 units) and exact text conversion;
//! - [`reward`]: the deterministic reward rule with its named constants;
//! - [`ops`]: signed transfers, stakes, unstakes, burns and slash reports;
//! - [`pending`]: ops that arrived before their predecessor nonce;
//! - [`verdict`]: audit verdicts (fraud proofs settled by replay) as stake moves;
//! - [`fee`]: validator fees for audits;
//! - [`state`]: the pure ledger rules ([`LedgerState`]) and `state_hash()`;
//! - [`store`]: the SQLite adapter ([`Ledger`]), WAL + `synchronous=FULL`.

pub mod amount;
pub mod epoch;
pub mod fee;
pub mod inference;
pub mod ops;
pub mod pending;
pub mod reward;
pub mod rules;
pub mod state;
pub mod store;
pub mod verdict;

pub use amount::{UNITS_PER_NEURO, format_neuro, parse_neuro};
pub use epoch::{EpochApplied, EpochItem, apply_epoch, apply_epoch_admitted, epoch_contents};
pub use fee::VerifiedAuditFee;
pub use inference::{
    INFERENCE_BURN_BPS, Payee, ServeReceipt, Settlement, decode_op, verify_settlement,
};
pub use ops::{
    AccountOp, Action, MIN_STAKE_LOCK_MS, OP_MAX_CLOCK_SKEW_MS, OpError, SignedOp, VerifiedOp,
    VerifiedSlash, check_fresh, verify_op,
};
pub use rules::{GenesisError, LedgerGenesis, Rules};
pub use state::{
    AUDIT_FEE_BPS, Account, Changes, Contribution, Entry, EntryKind, Generation, LedgerError,
    LedgerState, Outcome, Record, RoundSettlement, SETTLE_EPOCHS, Share, StageProgress,
    SupplyMismatch, round_key, round_key_of,
};
pub use store::{
    ApplyError, AuditSummary, ChangeLog, FeeLine, HistoryLine, LEDGER_FILE, Ledger, Message,
    StoreError, VerdictLine, WiredMessage,
};
pub use verdict::VerifiedVerdict;
