//! The economy's side of validator fees (issue 15): which fee claims an epoch may hold, and
//! the live ledger's share of the fees epochs finalized.
//!
//! A claim carries the worker's two signatures (its job commitment, and its statement that it
//! served the job's evidence to the auditor); what a validator checks here, against the
//! epoch's state and the finalized epochs' hashes every validator holds alike: the job is of
//! this network, challenged under the beacon its commitment names, assigned to the auditor
//! the claim pays, and the worker was paid for that round (a worker can sign any number of
//! made-up jobs, but not make the ledger pay it for a round).

use std::collections::BTreeMap;

use neuroshard_audit::{ChallengeSeed, JobKey, auditor_for, is_challenged};
use neuroshard_ledger::{LedgerState, Outcome, VerifiedAuditFee, round_key_of};
use neuroshard_proof::Hash32;

use super::epochs::Admit;
use super::{Economy, EconomyError, LedgerWrite};

/// Finalized epochs whose hashes are kept for judging fees (as many as a node keeps for its
/// audits).
pub const FEE_BEACONS: usize = 4096;

/// Why a validator's fee may not (yet) enter an epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeeRefused {
    #[error("a fee of another network")]
    OtherNetwork,
    #[error("the job's beacon epoch {0} is not final here yet")]
    BeaconNotFinal(u64),
    #[error("the job's beacon epoch {0} is no longer held here")]
    BeaconGone(u64),
    #[error("the job is not challenged")]
    NotChallenged,
    #[error("the beacon assigned the job to another auditor")]
    OtherAuditor,
    #[error("no stage {0}")]
    NoStage(u16),
    #[error("the worker's round was not paid (yet)")]
    RoundNotPaid,
}

impl FeeRefused {
    /// Whether a later finalized epoch may admit it: its beacon, or the worker's training
    /// proof, may still come.
    pub fn may_change(&self) -> bool {
        matches!(self, Self::BeaconNotFinal(_) | Self::RoundNotPaid)
    }
}

/// Recent finalized epochs' hashes.
#[derive(Debug, Default)]
pub(super) struct FeeBeacons {
    by_epoch: BTreeMap<u64, Hash32>,
}

impl Economy {
    /// Epoch `epoch` was finalized with hash `hash` (its beacon).
    pub fn note_beacon(&mut self, epoch: u64, hash: Hash32) {
        let b = &mut self.fee_beacons.by_epoch;
        b.insert(epoch, hash);
        while b.len() > FEE_BEACONS {
            b.pop_first();
        }
    }

    /// Whether `fee` may enter an epoch applied onto `state` (see the module's doc).
    pub(super) fn admit_fee(&self, state: &LedgerState, fee: &VerifiedAuditFee) -> Admit {
        match self.judge_fee(state, fee) {
            Ok(()) => Admit::Yes,
            Err(e) => Admit::No(e.to_string()),
        }
    }

    /// [`Self::admit_fee`] with the reason.
    pub fn judge_fee(&self, state: &LedgerState, fee: &VerifiedAuditFee) -> Result<(), FeeRefused> {
        if fee.network != self.cfg.network {
            return Err(FeeRefused::OtherNetwork);
        }
        let Some(beacon) = self.fee_beacons.by_epoch.get(&fee.beacon_epoch) else {
            let last = self
                .fee_beacons
                .by_epoch
                .last_key_value()
                .map_or(0, |(e, _)| *e);
            return Err(if fee.beacon_epoch > last {
                FeeRefused::BeaconNotFinal(fee.beacon_epoch)
            } else {
                FeeRefused::BeaconGone(fee.beacon_epoch)
            });
        };
        let seed = ChallengeSeed::from_beacon(self.cfg.network, fee.stage, fee.round, *beacon);
        let key = JobKey(fee.job);
        if !is_challenged(&seed, &key, self.cfg.audit_rate) {
            return Err(FeeRefused::NotChallenged);
        }
        let validators: Vec<_> = state.ever_registered(fee.stage).collect();
        if auditor_for(&seed, &key, fee.worker, &validators) != Some(fee.auditor) {
            return Err(FeeRefused::OtherAuditor);
        }
        let Some((layers, _)) = self.cfg.layout.get(usize::from(fee.stage)) else {
            return Err(FeeRefused::NoStage(fee.stage));
        };
        if !state.round_claimed(&round_key_of(&fee.worker, *layers, fee.round)) {
            return Err(FeeRefused::RoundNotPaid);
        }
        Ok(())
    }

    /// Applies a validator fee a finalized epoch holds to the live ledger (fees are applied
    /// only from finalized epochs: one committee member's view is not the network's).
    /// False: paid already.
    pub fn apply_audit_fee(&mut self, fee: &VerifiedAuditFee) -> Result<bool, EconomyError> {
        match self.ledger.apply_audit_fee(fee)? {
            Outcome::Applied(changes) => {
                self.writes.push_back(LedgerWrite::of(changes));
                Ok(true)
            }
            Outcome::Duplicate | Outcome::Queued => Ok(false),
        }
    }
}
