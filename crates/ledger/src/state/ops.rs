//! Account ops: transfer, stake, unstake, burn, inference payments, registration and
//! capacity announcements, applied in per-account nonce order.

use super::*;

impl LedgerState {
    /// Applies an account op in nonce order, parking it if its predecessor is missing, then
    /// applies any parked successors that became ready.
    pub fn apply_op(&mut self, op: VerifiedOp) -> Result<Outcome, LedgerError> {
        if op.op().network != self.rules.network {
            return Err(LedgerError::OtherNetwork {
                got: op.op().network,
                ours: self.rules.network,
            });
        }
        let (account_id, nonce) = (op.op().account, op.op().nonce);
        let next = self.account(&account_id).next_nonce;
        if nonce < next {
            return match self.op_hashes.get(&(account_id, nonce)) {
                Some(h) if *h == op.hash() => Ok(Outcome::Duplicate),
                _ => Err(LedgerError::OpNonceConflict {
                    account: account_id,
                    nonce,
                }),
            };
        }
        if nonce > next {
            return match self.pending.park(next, op)? {
                Parked::Queued => Ok(Outcome::Queued),
                Parked::AlreadyQueued => Ok(Outcome::Duplicate),
            };
        }
        let mut changes = self.apply_op_now(&op)?;
        // The gap filled: apply successors that were waiting. A waiting op that is now invalid
        // (e.g. it overdraws) is dropped; its nonce stays free for a replacement.
        let mut next = add(nonce, 1)?;
        while let Some(waiting) = self.pending.take(account_id, next) {
            match self.apply_op_now(&waiting) {
                Ok(more) => changes.merge(more),
                Err(_) => break,
            }
            next = add(next, 1)?;
        }
        self.pending.discard_below(account_id, next);
        Ok(Outcome::Applied(changes))
    }

    fn apply_op_now(&mut self, verified: &VerifiedOp) -> Result<Changes, LedgerError> {
        let op = verified.op();
        let hash = verified.hash();
        // Checked before anything changes (an account's nonce never reaches it in practice).
        let next_nonce = add(op.nonce, 1)?;
        let mut from = self.account(&op.account);
        let mut touched = vec![op.account];
        let mut entries = Vec::new();
        let entry = |account, kind, amount, counterparty| Entry {
            account,
            kind,
            amount,
            counterparty,
            reference: hash,
            timestamp_ms: op.timestamp_ms,
        };
        let mut burned = self.burned;
        let mut registers = None;
        let mut announces = None;
        match op.action {
            Action::Transfer { to, amount } => {
                if amount == 0 {
                    return Err(LedgerError::ZeroAmount);
                }
                if to == op.account {
                    return Err(LedgerError::SelfTransfer);
                }
                from.balance = debit(from.balance, amount, true)?;
                let burn = bps_of(amount, TRANSFER_BURN_BPS);
                let mut recipient = self.account(&to);
                recipient.balance = add(recipient.balance, amount - burn)?;
                burned = add(burned, burn)?;
                self.put_account(to, recipient, None);
                touched.push(to);
                entries.push(entry(op.account, EntryKind::TransferOut, amount, Some(to)));
                entries.push(entry(
                    to,
                    EntryKind::TransferIn,
                    amount - burn,
                    Some(op.account),
                ));
                entries.push(entry(op.account, EntryKind::Burn, burn, None));
            }
            Action::Stake {
                amount,
                unlock_at_ms,
            } => {
                if amount == 0 {
                    return Err(LedgerError::ZeroAmount);
                }
                if unlock_at_ms < op.timestamp_ms.saturating_add(MIN_STAKE_LOCK_MS) {
                    return Err(LedgerError::LockTooShort);
                }
                from.balance = debit(from.balance, amount, true)?;
                from.stake = add(from.stake, amount)?;
                from.unlock_at_ms = from.unlock_at_ms.max(unlock_at_ms);
                entries.push(entry(op.account, EntryKind::Stake, amount, None));
            }
            Action::Unstake { amount } => {
                if amount == 0 {
                    return Err(LedgerError::ZeroAmount);
                }
                if op.timestamp_ms < from.unlock_at_ms {
                    return Err(LedgerError::StakeLocked {
                        unlock_at_ms: from.unlock_at_ms,
                        timestamp_ms: op.timestamp_ms,
                    });
                }
                // Out of the stake at once (it no longer registers the account), but slashable
                // until the unbonding delay has passed: misbehaviour just before an unstake is
                // still paid for when its evidence arrives.
                from.stake = debit(from.stake, amount, false)?;
                from.unbonding = add(from.unbonding, amount)?;
                from.unbonding_until_ms = from
                    .unbonding_until_ms
                    .max(op.timestamp_ms.saturating_add(self.rules.unbonding_ms));
                entries.push(entry(op.account, EntryKind::Unstake, amount, None));
            }
            Action::Withdraw => {
                if from.unbonding == 0 {
                    return Err(LedgerError::NothingUnbonding);
                }
                if op.timestamp_ms < from.unbonding_until_ms {
                    return Err(LedgerError::Unbonding {
                        until_ms: from.unbonding_until_ms,
                        timestamp_ms: op.timestamp_ms,
                    });
                }
                let amount = from.unbonding;
                from.balance = add(from.balance, amount)?;
                from.unbonding = 0;
                entries.push(entry(op.account, EntryKind::Withdraw, amount, None));
            }
            Action::Burn { amount } => {
                if amount == 0 {
                    return Err(LedgerError::ZeroAmount);
                }
                from.balance = debit(from.balance, amount, true)?;
                burned = add(burned, amount)?;
                entries.push(entry(op.account, EntryKind::Burn, amount, None));
            }
            Action::PayInference {
                per_stage, stages, ..
            } => {
                // Only a settlement carries payees; a bare payment has none to pay.
                let payees = verified.payees();
                if payees.is_empty() {
                    return Err(LedgerError::Unsettled);
                }
                if per_stage == 0 || stages == 0 {
                    return Err(LedgerError::ZeroAmount);
                }
                // Refuse before touching any account, so a refused settlement changes nothing.
                if let Some(p) = payees
                    .iter()
                    .find(|p| !self.is_registered(&p.server, p.stage))
                {
                    return Err(LedgerError::NotRegistered {
                        node: p.server,
                        stage: p.stage,
                    });
                }
                let (cost, paid) = crate::inference::stage_split(per_stage);
                let count = u64::try_from(payees.len()).map_err(|_| LedgerError::Overflow)?;
                let total = cost.checked_mul(count).ok_or(LedgerError::Overflow)?;
                from.balance = debit(from.balance, total, true)?;
                entries.push(entry(op.account, EntryKind::InferenceFee, total, None));
                // One server may hold several stages, and may be the caller: credit each
                // account once, and only after every addition succeeded.
                let mut credited: BTreeMap<NodeId, u64> = BTreeMap::new();
                for payee in payees {
                    let sum = credited.entry(payee.server).or_default();
                    *sum = add(*sum, paid)?;
                    entries.push(entry(
                        payee.server,
                        EntryKind::InferenceIncome,
                        paid,
                        Some(op.account),
                    ));
                }
                let mut updates = Vec::with_capacity(credited.len());
                for (server, amount) in credited {
                    if server == op.account {
                        from.balance = add(from.balance, amount)?;
                    } else {
                        let mut account = self.account(&server);
                        account.balance = add(account.balance, amount)?;
                        updates.push((server, account));
                    }
                }
                for (server, account) in updates {
                    touched.push(server);
                    self.put_account(server, account, None);
                }
                burned = add(burned, total - paid * count)?;
                entries.push(entry(
                    op.account,
                    EntryKind::Burn,
                    total - paid * count,
                    None,
                ));
            }
            Action::Register { stage } => {
                if from.stake < self.rules.min_stake {
                    return Err(LedgerError::StakeTooLow {
                        needed: self.rules.min_stake,
                        available: from.stake,
                    });
                }
                registers = Some(stage);
            }
            Action::Announce {
                memory_bytes,
                flops_per_s,
            } => {
                // Only staked accounts: a key without stake could otherwise grow every
                // ledger's table of claims for the price of a signature.
                if from.stake < self.rules.min_stake {
                    return Err(LedgerError::StakeTooLow {
                        needed: self.rules.min_stake,
                        available: from.stake,
                    });
                }
                announces = Some((memory_bytes, flops_per_s));
            }
        }
        if let Some(claim) = announces {
            self.claims.insert(op.account, claim);
        }
        from.next_nonce = next_nonce;
        self.put_account(op.account, from, registers);
        self.burned = burned;
        self.op_hashes.insert((op.account, op.nonce), hash);
        self.digest.insert(Set::Op, &hash);
        let mut changes = self.changes_with(touched);
        changes.records.push(Record::Op {
            account: op.account,
            nonce: op.nonce,
            hash,
            wire: verified.wire_bytes().to_vec(),
        });
        changes.entries = entries;
        self.learn_key(verified.signer(), &mut changes);
        Ok(changes)
    }
}
