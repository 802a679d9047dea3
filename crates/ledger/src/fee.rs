//! Validator fees (verification by recomputation, issue 15): the auditor a job's beacon
//! assigned, and which the job's worker served its evidence, is paid a fixed fee from the
//! emission, once per (auditor, worker, stage, round).
//!
//! The ledger does not check the assignment: a node builds a [`VerifiedAuditFee`] from a
//! claim whose signatures it checked, its finality committee admits it only where the beacon
//! names the auditor and the worker's round was paid (see the node's `core/fees.rs`), and
//! what the ledger then does depends only on these fields.

use neuroshard_audit::{AuditFeeClaim, FeeClaimError};
use neuroshard_proof::{Canonical, Hash32, NodeId};

/// A fee the finality committee admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedAuditFee {
    /// The network the job's commitment names (the committee admits only its own).
    pub network: Hash32,
    pub auditor: NodeId,
    pub worker: NodeId,
    pub stage: u16,
    pub round: u64,
    /// The audited job's key.
    pub job: Hash32,
    /// The finalized epoch whose hash drew the job's challenge (the committee checks the
    /// draw against it).
    pub beacon_epoch: u64,
    /// BLAKE3 of the claim's canonical bytes.
    pub claim_hash: Hash32,
    /// When the worker signed that it served the evidence.
    pub timestamp_ms: u64,
}

impl VerifiedAuditFee {
    /// The fee a claim asks for, once both of the worker's signatures are checked (not the
    /// assignment: that needs the beacon).
    pub fn from_claim(claim: &AuditFeeClaim) -> Result<Self, FeeClaimError> {
        let (c, served) = claim.verify()?;
        Ok(Self {
            network: c.network,
            auditor: served.to,
            worker: c.worker,
            stage: c.stage,
            round: c.round,
            job: c.key().0,
            beacon_epoch: c.beacon_epoch().unwrap_or(u64::MAX),
            claim_hash: *blake3::hash(&claim.to_canonical_bytes()).as_bytes(),
            timestamp_ms: served.timestamp_ms,
        })
    }

    /// What is paid once: the auditor's fee for one replica's round. A worker signs as many
    /// jobs as it likes, so a fee per job would let it mint through a Sybil auditor by
    /// inventing jobs; per round it gains no more than an honest pair.
    pub fn key(&self) -> Hash32 {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/ledger/audit-fee-key/v1");
        h.update(&self.auditor.0);
        h.update(&self.worker.0);
        h.update(&self.stage.to_le_bytes());
        h.update(&self.round.to_le_bytes());
        *h.finalize().as_bytes()
    }
}
