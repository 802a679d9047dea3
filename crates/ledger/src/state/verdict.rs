//! Slashing: a proven equivocation, and an audit verdict (the offender's stake is slashed
//! alike).

use super::*;
use crate::verdict::VerifiedVerdict;

impl LedgerState {
    /// Takes [`SLASH_STAKE_BPS`] of the offender's stake: [`SLASH_REPORTER_BPS`] of it to the
    /// reporter, the rest burned. One slash per (offender, nonce).
    pub fn apply_slash(&mut self, slash: &VerifiedSlash) -> Result<Outcome, LedgerError> {
        let key = (slash.offender, slash.nonce);
        if self.slashes.contains_key(&key) {
            return Ok(Outcome::Duplicate);
        }
        let mut offender = self.account(&slash.offender);
        let slashed = offender.take_slash(bps_of(offender.slashable(), SLASH_STAKE_BPS));
        let to_reporter = bps_of(slashed, SLASH_REPORTER_BPS);
        let burn = slashed - to_reporter;
        let burned = add(self.burned, burn)?;
        let mut reporter = self.account(&slash.reporter);
        reporter.balance = add(reporter.balance, to_reporter)?;
        self.put_account(slash.offender, offender, None);
        self.put_account(slash.reporter, reporter, None);
        self.burned = burned;
        self.slashes.insert(key, slash.evidence_hash);
        self.digest.insert(Set::Slash, &slash.evidence_hash);
        let mut changes = self.changes_with([slash.offender, slash.reporter]);
        let entry = |account, kind, amount, counterparty| Entry {
            account,
            kind,
            amount,
            counterparty,
            reference: slash.evidence_hash,
            timestamp_ms: slash.timestamp_ms,
        };
        changes.entries = vec![
            entry(
                slash.offender,
                EntryKind::Slashed,
                slashed,
                Some(slash.reporter),
            ),
            entry(
                slash.reporter,
                EntryKind::SlashReward,
                to_reporter,
                Some(slash.offender),
            ),
            entry(slash.offender, EntryKind::Burn, burn, None),
        ];
        changes.records.push(Record::Slash {
            slash: *slash,
            slashed,
            to_reporter,
        });
        Ok(Outcome::Applied(changes))
    }

    /// Takes [`VERDICT_SLASH_BPS`] of the minimum stake from the offender's stake (what is
    /// left, if less) and burns it, and mints [`VERDICT_REWARD_BPS`] of the minimum stake to
    /// the beneficiary. One verdict per audited job: the same evidence again, or other
    /// evidence about the same job, is a [`Outcome::Duplicate`]. Any set of verdicts gives the
    /// same accounts and totals in any order (the amount recorded for each verdict against
    /// an offender whose stake runs out depends on the order; the state does not).
    pub fn apply_verdict(&mut self, v: &VerifiedVerdict) -> Result<Outcome, LedgerError> {
        if self.verdicts.contains_key(&v.job) {
            return Ok(Outcome::Duplicate);
        }
        if v.offender == v.beneficiary {
            // `neuroshard_audit::check` never names one node twice; refuse rather than pay
            // an account for its own offence.
            return Err(LedgerError::SelfTransfer);
        }
        let mut offender = self.account(&v.offender);
        let slashed = offender.take_slash(bps_of(self.rules.min_stake, VERDICT_SLASH_BPS));
        let paid = bps_of(self.rules.min_stake, VERDICT_REWARD_BPS);
        let burn = slashed;
        let mut beneficiary = self.account(&v.beneficiary);
        beneficiary.balance = add(beneficiary.balance, paid)?;
        let burned = add(self.burned, burn)?;
        let minted = add(self.minted, paid)?;
        self.put_account(v.offender, offender, None);
        self.put_account(v.beneficiary, beneficiary, None);
        self.burned = burned;
        self.minted = minted;
        self.verdicts.insert(v.job, v.evidence_hash);
        self.digest.insert(Set::Slash, &v.evidence_hash);
        let mut changes = self.changes_with([v.offender, v.beneficiary]);
        let entry = |account, kind, amount, counterparty| Entry {
            account,
            kind,
            amount,
            counterparty,
            reference: v.evidence_hash,
            timestamp_ms: v.timestamp_ms,
        };
        changes.entries = vec![
            entry(v.offender, EntryKind::Slashed, slashed, Some(v.beneficiary)),
            entry(
                v.beneficiary,
                EntryKind::SlashReward,
                paid,
                Some(v.offender),
            ),
            entry(v.offender, EntryKind::Burn, burn, None),
        ];
        changes.records.push(Record::Verdict {
            verdict: *v,
            slashed,
            paid,
        });
        Ok(Outcome::Applied(changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amount::UNITS_PER_NEURO;
    use proptest::prelude::*;

    fn node(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    /// Accounts 1..=n, each with `stake` staked and nothing else.
    fn staked(n: u8, stake: u64) -> LedgerState {
        let mut s = LedgerState::new();
        for i in 1..=n {
            let a = Account {
                stake,
                ..Account::default()
            };
            s.put_account(node(i), a, None);
        }
        s.minted = stake * u64::from(n);
        s
    }

    fn verdict(job: u8, offender: u8, beneficiary: u8, evidence: u8) -> VerifiedVerdict {
        VerifiedVerdict {
            job: [job; 32],
            offender: node(offender),
            beneficiary: node(beneficiary),
            evidence_hash: [evidence; 32],
            timestamp_ms: 5,
        }
    }

    #[test]
    fn a_verdict_slashes_the_offender_and_pays_the_beneficiary() {
        let stake = 100 * UNITS_PER_NEURO;
        let mut s = staked(2, stake);
        let min = s.rules.min_stake;
        let out = s.apply_verdict(&verdict(1, 1, 2, 9)).unwrap();
        assert!(matches!(out, Outcome::Applied(_)));
        let slashed = (min / 2).min(stake);
        assert_eq!(s.account(&node(1)).stake, stake - slashed);
        assert_eq!(s.account(&node(2)).balance, min / 20);
        assert_eq!(s.burned, slashed);
        assert_eq!(s.check_invariants(), Ok(()));
        assert!(s.digest_is_consistent());
        // Once the stake is gone a verdict takes nothing more, and still pays.
        let mut poor = staked(2, min / 3);
        poor.apply_verdict(&verdict(1, 1, 2, 9)).unwrap();
        poor.apply_verdict(&verdict(2, 1, 2, 8)).unwrap();
        assert_eq!(poor.account(&node(1)).stake, 0);
        assert_eq!(poor.burned, min / 3);
        assert_eq!(poor.account(&node(2)).balance, 2 * (min / 20));
        assert_eq!(poor.check_invariants(), Ok(()));
    }

    /// Several auditors convicting one worker: every order gives the same state. (With a
    /// share of what is left, the auditor whose verdict a ledger applied first was paid
    /// more, so ledgers that heard them in different orders split.)
    #[test]
    fn verdicts_against_one_offender_commute_across_beneficiaries() {
        let min = LedgerState::new().rules.min_stake;
        for stake in [0, min / 3, min, 3 * min] {
            let vs = [
                verdict(1, 1, 2, 9),
                verdict(2, 1, 3, 8),
                verdict(3, 1, 4, 7),
            ];
            let mut hashes = Vec::new();
            for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
                let mut s = staked(4, stake);
                for i in order {
                    s.apply_verdict(&vs[i]).unwrap();
                }
                assert_eq!(s.check_invariants(), Ok(()));
                hashes.push(s.state_hash());
            }
            assert!(hashes.windows(2).all(|w| w[0] == w[1]), "stake {stake}");
        }
    }

    #[test]
    fn the_same_job_is_judged_once_whatever_the_evidence() {
        let mut s = staked(3, 1_000);
        s.apply_verdict(&verdict(1, 1, 2, 9)).unwrap();
        let after = s.state_hash();
        // The same evidence again, other evidence about the job, or a counter-verdict.
        for v in [
            verdict(1, 1, 2, 9),
            verdict(1, 1, 3, 8),
            verdict(1, 2, 1, 7),
        ] {
            assert_eq!(s.apply_verdict(&v), Ok(Outcome::Duplicate));
        }
        assert_eq!(s.state_hash(), after);
        assert_eq!(
            s.apply_verdict(&verdict(2, 1, 1, 6)),
            Err(LedgerError::SelfTransfer)
        );
        assert_eq!(s.state_hash(), after);
    }

    #[test]
    fn applied_verdicts_survive_a_restore() {
        let mut s = staked(2, 1_000);
        s.apply_verdict(&verdict(1, 1, 2, 9)).unwrap();
        let restored = LedgerState::restore(Restored {
            rules: s.rules,
            accounts: s.accounts.clone(),
            registrations: BTreeMap::new(),
            claims: BTreeMap::new(),
            proofs: Vec::new(),
            ops: Vec::new(),
            slashes: Vec::new(),
            equivocations: Vec::new(),
            verdicts: s.verdicts.iter().map(|(k, v)| (*k, *v)).collect(),
            audit_fees: Vec::new(),
            keys: Vec::new(),
            minted: s.minted,
            burned: s.burned,
            pot_members: Vec::new(),
            settled: Vec::new(),
        });
        assert_eq!(restored.state_hash(), s.state_hash());
        let mut restored = restored;
        assert_eq!(
            restored.apply_verdict(&verdict(1, 1, 2, 9)),
            Ok(Outcome::Duplicate)
        );
    }

    proptest! {
        /// Any sequence of verdicts, duplicates included, conserves supply; verdicts against
        /// distinct offenders give the same state in any order.
        #[test]
        fn verdicts_conserve_supply_and_commute_across_offenders(
            steps in prop::collection::vec((0u8..6, 1u8..5, 1u8..5, any::<u8>()), 1..30),
            stake in 0u64..u64::MAX / 8,
        ) {
            let mut s = staked(4, stake);
            for (job, off, ben, ev) in &steps {
                let _ = s.apply_verdict(&verdict(*job, *off, *ben, *ev));
                prop_assert_eq!(s.check_invariants(), Ok(()));
            }
            prop_assert!(s.digest_is_consistent());

            // One verdict per offender, applied forwards and backwards.
            let distinct: Vec<VerifiedVerdict> = (1u8..5)
                .map(|i| verdict(10 + i, i, i % 4 + 1, i))
                .collect();
            let (mut a, mut b) = (staked(4, stake), staked(4, stake));
            for v in &distinct {
                a.apply_verdict(v).unwrap();
            }
            for v in distinct.iter().rev() {
                b.apply_verdict(v).unwrap();
            }
            prop_assert_eq!(a.state_hash(), b.state_hash());
        }
    }
}
