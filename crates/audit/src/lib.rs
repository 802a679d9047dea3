//! Verification by recomputation (issue 15), the pure part.
//!
//! A stage's worker signs a [`JobCommitment`] for every job it runs (hashes of its inputs,
//! outputs and weights, and the [`DeterminismClass`] its bits belong to); the neighbour that
//! receives the output countersigns the hash it received ([`Countersign`]). A replica's
//! offer of a round is a job too ([`JobKind::Offer`]): its pseudo-gradient of the weights it
//! names against θ₀, with its AdamW state and the chain of its round's jobs
//! ([`round_state_hash`]), so a replay re-encodes it like any job. After a round is final, [`sample`] names, from that round's hash, which
//! jobs are audited and by whom; an auditor that replays a job and gets other bits files a
//! [`FraudProof`], which any node settles with [`check`] by replaying the one job itself.
//!
//! Nothing here reads a clock, a file or the network, or draws randomness other than from a
//! given seed: the node feeds it messages, the model crate supplies the [`Replayer`].

mod class;
mod commit;
mod fee;
mod fraud;
mod provenance;
mod sample;
mod tensor;

pub use class::{DeterminismClass, IsaLevel, Tolerance};
pub use commit::{
    BEACON_LAG, CommitError, Countersign, JobCommitment, JobKey, JobKind, MicroBatchRef,
    OfferClaims, SignedJob, countersign, offer_micro_batch, round_state_hash, verify_countersigned,
    verify_job,
};
pub use fee::{AuditFeeClaim, FeeClaimError, Served, SignedServed};
pub use fraud::{
    Accusation, AuditContext, Charge, CrossClass, EvidenceError, FraudProof, Replayed, Replayer,
    Verdict, check, check_before_replay, check_equivocation, check_provenance_charge,
};
pub use provenance::{GenesisText, GenesisTokens, ProvenanceError, WindowRef, check_provenance};
pub use sample::{AuditRate, Challenge, ChallengeSeed, auditor_for, is_challenged, sample};
pub use tensor::{
    EvidenceLimits, JobInputs, LimitError, MAX_TENSOR_VALUES, NO_HASH, StageData, StreamHasher,
    Tensor, TokenIds, UpstreamData, grads_hash, tensor_hash, tokens_hash,
};
