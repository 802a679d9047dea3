//! Equivocation: two different proofs signed by one node for one slot (one nonce, or one
//! (stage, round) for training proofs, which are paid by round). Its outcome must not
//! depend on which proof a ledger saw first, or ledgers that received them in different
//! orders would split: neither proof is paid (the reward already credited for the first is
//! taken back), both are kept as evidence, and [`SLASH_STAKE_BPS`] of the offender's stake is
//! burned. Nobody is paid for reporting it: every node that sees both proofs settles it alike,
//! and a reporter's reward would go to whichever report arrived first.

use super::*;

/// Order-independent hash of two proofs: the same pair in either order is one piece of
/// evidence (the hash a [`crate::ops::SlashReport`] of the pair gets too).
pub fn evidence_hash(a: &Hash32, b: &Hash32) -> Hash32 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    let mut hasher = blake3::Hasher::new();
    hasher.update(lo);
    hasher.update(hi);
    *hasher.finalize().as_bytes()
}

/// What a proof is paid for, once: a (node, nonce), or a training proof's round key.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    Nonce((NodeId, u64)),
    Round(Hash32),
}

impl Slot {
    /// The id a settled equivocation is recorded under: a function of the slot alone, not of
    /// which two proofs a ledger saw. A cheat that signs three or more proofs for one slot and
    /// shows each node a different pair leaves every ledger with the same state (each keeps
    /// the pair it saw as its evidence; further proofs for a void slot are refused).
    fn void_id(&self) -> Hash32 {
        let mut hasher = blake3::Hasher::new();
        match self {
            Slot::Nonce((node, nonce)) => {
                hasher.update(b"neuroshard/void-slot/nonce/v1");
                hasher.update(&node.0);
                hasher.update(&nonce.to_le_bytes());
            }
            Slot::Round(key) => {
                hasher.update(b"neuroshard/void-slot/round/v1");
                hasher.update(key);
            }
        }
        *hasher.finalize().as_bytes()
    }
}

impl LedgerState {
    /// `verified` is a second proof for `slot`, whose proof `first` was paid `first_reward`.
    pub(super) fn settle_equivocation(
        &mut self,
        verified: &VerifiedProof,
        first: Hash32,
        first_reward: u64,
        slot: Slot,
    ) -> Result<Outcome, LedgerError> {
        let proof = verified.proof();
        let (node, nonce, hash) = (proof.node_id, proof.nonce, verified.hash());
        let evidence = slot.void_id();
        let mut account = self.account(&node);
        // The first reward comes back from the balance, then (if it was spent) from the stake;
        // what cannot be recovered stays issued.
        let from_balance = account.balance.min(first_reward);
        account.balance -= from_balance;
        let from_stake = account.take_slash(first_reward - from_balance);
        let clawed = from_balance + from_stake;
        let slashed = account.take_slash(bps_of(account.slashable(), SLASH_STAKE_BPS));
        let minted = self
            .minted
            .checked_sub(clawed)
            .ok_or(LedgerError::Overflow)?;
        let burned = add(self.burned, slashed)?;
        self.put_account(node, account, None);
        self.minted = minted;
        self.burned = burned;
        let round_key = match slot {
            Slot::Nonce(key) => {
                self.proof_nonces.remove(&key);
                self.digest.remove(Set::Proof, &first);
                self.slashes.insert(key, evidence);
                None
            }
            Slot::Round(key) => {
                // Not in its round's pot any more: a void round is paid to no one.
                self.withdraw(&node, proof.layers, proof.round);
                self.paid_rounds.remove(&key);
                self.digest.remove(Set::Round, &key);
                self.void_rounds.insert(key, evidence);
                Some(key)
            }
        };
        self.proof_hashes.insert(hash);
        self.digest.insert(Set::Slash, &evidence);
        let mut changes = self.changes_with([node]);
        changes.records.push(Record::Proof {
            hash,
            node,
            nonce,
            kind: proof.kind,
            reward: 0,
            timestamp_ms: proof.timestamp_ms,
            round_key: None,
        });
        changes.records.push(Record::Equivocation {
            offender: node,
            nonce,
            round_key,
            evidence,
            clawed,
            slashed,
            timestamp_ms: proof.timestamp_ms,
        });
        let entry = |kind, amount| Entry {
            account: node,
            kind,
            amount,
            counterparty: None,
            reference: evidence,
            timestamp_ms: proof.timestamp_ms,
        };
        changes.entries = vec![
            entry(EntryKind::Clawback, clawed),
            entry(EntryKind::Slashed, slashed),
            entry(EntryKind::Burn, slashed),
        ];
        Ok(Outcome::Applied(changes))
    }
}

#[cfg(test)]
#[path = "equivocation_tests.rs"]
mod tests;
