//! Ledger finality (issue 19): the NEURO ledger advances in epochs, each finalized by a
//! stake-weighted committee running Tendermint (Malachite's consensus core), so every node
//! knows *when* a ledger state is final and a joiner can check it from certificates alone.
//!
//! - [`context`]: what consensus is generic over (node ids, epochs, epoch values, votes).
//! - [`committee`]: the committee from the previous finalized epoch's stakes.
//! - [`wire`]: messages and certificates, and the checks of their signatures.
//! - [`machine`]: one node's finality as a sans-IO state machine.
//! - [`wal`]: the write-ahead log a restarted validator replays, so it never signs twice.
//! - [`chain`]: a joiner's check of the finalized history from certificates alone.

pub mod chain;
pub mod committee;
pub mod context;
pub mod machine;
pub mod wal;
pub mod wire;

pub use chain::{CertifiedEpoch, ChainError, ChainHead, verify_chain};
pub use committee::{DEFAULT_MAX_MEMBERS, MAX_TOTAL_POWER, committee_from_stakes};
pub use context::{Committee, EpochValue, FinalityContext, Validator};
pub use machine::{Equivocation, Finality, FinalityError, FinalityEvent, Finalized, Timeouts};
pub use wal::WalEntry;
pub use wire::{
    ConsensusWire, EvidenceError, decode_certificate, encode_certificate, verify_commit,
    verify_equivocation,
};
