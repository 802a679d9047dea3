//! Validator fees: minted to the auditor once per (auditor, worker, stage, round).

use super::*;
use crate::fee::VerifiedAuditFee;

impl LedgerState {
    /// What one validator fee pays: [`AUDIT_FEE_BPS`] of the round reward.
    pub fn audit_fee(&self) -> u64 {
        bps_of(self.rules.round_reward, AUDIT_FEE_BPS)
    }

    /// How many validator fees were paid.
    pub fn audit_fee_count(&self) -> usize {
        self.audit_fees.len()
    }

    /// Whether `fee`'s (auditor, worker, stage, round) was paid.
    pub fn has_audit_fee(&self, fee: &VerifiedAuditFee) -> bool {
        self.audit_fees.contains_key(&fee.key())
    }

    /// Mints [`Self::audit_fee`] to the auditor. Another claim for the same auditor, worker,
    /// stage and round is a [`Outcome::Duplicate`]; a fee for auditing oneself is refused.
    pub fn apply_audit_fee(&mut self, fee: &VerifiedAuditFee) -> Result<Outcome, LedgerError> {
        let key = fee.key();
        if self.audit_fees.contains_key(&key) {
            return Ok(Outcome::Duplicate);
        }
        if fee.auditor == fee.worker {
            return Err(LedgerError::SelfTransfer);
        }
        let paid = self.audit_fee();
        let mut auditor = self.account(&fee.auditor);
        auditor.balance = add(auditor.balance, paid)?;
        let minted = add(self.minted, paid)?;
        self.put_account(fee.auditor, auditor, None);
        self.minted = minted;
        self.audit_fees.insert(key, fee.claim_hash);
        self.digest.insert(Set::Fee, &key);
        let mut changes = self.changes_with([fee.auditor]);
        changes.entries = vec![Entry {
            account: fee.auditor,
            kind: EntryKind::AuditFee,
            amount: paid,
            counterparty: Some(fee.worker),
            reference: fee.claim_hash,
            timestamp_ms: fee.timestamp_ms,
        }];
        changes.records.push(Record::AuditFee { fee: *fee, paid });
        Ok(Outcome::Applied(changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    fn fee(auditor: u8, worker: u8, round: u64, claim: u8) -> VerifiedAuditFee {
        VerifiedAuditFee {
            network: [0; 32],
            auditor: node(auditor),
            worker: node(worker),
            stage: 1,
            round,
            job: [claim; 32],
            beacon_epoch: 3,
            claim_hash: [claim; 32],
            timestamp_ms: 7,
        }
    }

    #[test]
    fn a_fee_is_minted_once_per_auditor_worker_and_round() {
        let mut s = LedgerState::new();
        let before = s.state_hash();
        let amount = s.audit_fee();
        assert!(amount > 0);
        assert!(matches!(
            s.apply_audit_fee(&fee(1, 2, 3, 9)),
            Ok(Outcome::Applied(_))
        ));
        assert_eq!(s.account(&node(1)).balance, amount);
        assert_eq!(s.minted(), amount);
        assert_ne!(s.state_hash(), before);
        let after = s.state_hash();
        // Another job of the same round, or the same claim again, pays nothing.
        assert_eq!(s.apply_audit_fee(&fee(1, 2, 3, 8)), Ok(Outcome::Duplicate));
        assert_eq!(s.apply_audit_fee(&fee(1, 2, 3, 9)), Ok(Outcome::Duplicate));
        assert_eq!(s.state_hash(), after);
        // Another round, worker or auditor is another fee.
        for f in [fee(1, 2, 4, 9), fee(1, 3, 3, 9), fee(4, 2, 3, 9)] {
            assert!(matches!(s.apply_audit_fee(&f), Ok(Outcome::Applied(_))));
        }
        assert_eq!(s.account(&node(1)).balance, 3 * amount);
        // Auditing oneself pays nothing.
        assert_eq!(
            s.apply_audit_fee(&fee(5, 5, 3, 9)),
            Err(LedgerError::SelfTransfer)
        );
        assert_eq!(s.check_invariants(), Ok(()));
        assert!(s.digest_is_consistent());
    }

    #[test]
    fn paid_fees_survive_a_restore() {
        let mut s = LedgerState::new();
        s.apply_audit_fee(&fee(1, 2, 3, 9)).unwrap();
        let mut restored = LedgerState::restore(Restored {
            rules: s.rules,
            accounts: s.accounts.clone(),
            registrations: BTreeMap::new(),
            claims: BTreeMap::new(),
            proofs: Vec::new(),
            ops: Vec::new(),
            slashes: Vec::new(),
            equivocations: Vec::new(),
            verdicts: Vec::new(),
            audit_fees: s.audit_fees.iter().map(|(k, v)| (*k, *v)).collect(),
            keys: Vec::new(),
            minted: s.minted,
            burned: s.burned,
            pot_members: Vec::new(),
            settled: Vec::new(),
        });
        assert_eq!(restored.state_hash(), s.state_hash());
        assert_eq!(
            restored.apply_audit_fee(&fee(1, 2, 3, 8)),
            Ok(Outcome::Duplicate)
        );
    }

    proptest! {
        /// Any sequence of fees conserves supply, and any order of one set of fees gives the
        /// same state.
        #[test]
        fn fees_conserve_supply_and_commute(
            steps in prop::collection::vec((1u8..4, 1u8..4, 0u64..3, any::<u8>()), 1..24),
        ) {
            let fees: Vec<VerifiedAuditFee> =
                steps.iter().map(|(a, w, r, c)| fee(*a, *w, *r, *c)).collect();
            let (mut a, mut b) = (LedgerState::new(), LedgerState::new());
            for f in &fees {
                let _ = a.apply_audit_fee(f);
                prop_assert_eq!(a.check_invariants(), Ok(()));
            }
            for f in fees.iter().rev() {
                let _ = b.apply_audit_fee(f);
            }
            prop_assert!(a.digest_is_consistent());
            prop_assert_eq!(a.state_hash(), b.state_hash());
        }
    }
}
