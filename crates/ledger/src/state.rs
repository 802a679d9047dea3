//! The ledger rules as a pure state machine: verified messages in, state changes out.
//!
//! [`LedgerState`] holds every account and the sets of applied proofs, ops and slashes in
//! memory. Each `apply_*` either refuses (state untouched) or mutates the state and returns
//! the [`Changes`] that the storage adapter must persist. It reads no clock and no disk.
//!
//! Agreement: a proof's reward depends only on the proof and the prover's stake, and applying
//! a proof never changes any stake, so proofs commute with each other: the same set of proofs
//! gives the same balances and [`LedgerState::state_hash`] in any order. Account ops apply in
//! per-account nonce order (early arrivals wait in [`PendingOps`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use neuroshard_growth::NetworkGrowth;
use neuroshard_proof::{Hash32, NodeId, Proof, ProofKind, PublicKey, VerifiedProof};

use crate::amount::bps_of;
use crate::ops::{Action, MIN_STAKE_LOCK_MS, VerifiedOp, VerifiedSlash};
use crate::pending::{Parked, PendingError, PendingOps};
use crate::reward;
use crate::rules::{LedgerGenesis, Rules};
use digest::Set;

mod digest;
mod equivocation;
mod fee;
mod growth;
mod ops;
mod pots;
mod progress;
mod records;
mod restore;
mod round_key;
mod verdict;

use equivocation::Slot;
pub use equivocation::evidence_hash;
pub use pots::{Contribution, RoundSettlement, SETTLE_EPOCHS, SETTLEMENTS_KEPT, Share};
pub use progress::{ACTIVE_EPOCHS, StageProgress};
pub use records::{Account, Changes, Entry, EntryKind, Outcome, Record};
pub(crate) use restore::{Restored, RestoredProof};
pub use round_key::{round_key, round_key_of};

/// Share of every transfer that is burned (5 %).
pub const TRANSFER_BURN_BPS: u64 = 500;
/// Share of the offender's stake a proven fraud takes (50 %).
pub const SLASH_STAKE_BPS: u64 = 5_000;
/// Share of the slashed amount paid to the reporter (10 %); the rest is burned.
pub const SLASH_REPORTER_BPS: u64 = 1_000;
/// What one audit verdict takes from its offender's stake (at most what is left), as a share
/// of the network's minimum stake (50 %): a fixed amount, so that verdicts against one
/// offender commute whatever order ledgers receive them in.
pub const VERDICT_SLASH_BPS: u64 = 5_000;
/// What one audit verdict pays its beneficiary, newly minted, as a share of the minimum
/// stake (5 %: a tenth of the slash, so convicting oneself through a Sybil auditor loses
/// money). Minted rather than taken from the slash: a reward that depends on what is left of
/// the offender's stake would depend on the order verdicts arrive in.
pub const VERDICT_REWARD_BPS: u64 = 500;
/// A validator's fee for auditing one replica's round, newly minted, as a share of the
/// network's round reward (5 %). An audit replays one job (about 1/(2·H·m) of the round's
/// compute at H inner steps of m micro-batches) and fetches one stage's weights: the fee pays
/// for that with room to spare, and a Sybil auditor of its own worker gains a twentieth of
/// what the worker's round earns.
pub const AUDIT_FEE_BPS: u64 = 500;

/// The supply invariant broken: what was minted less what was burned is not what the
/// accounts hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("minted {minted} - burned {burned} = {supply} but accounts hold {held}")]
pub struct SupplyMismatch {
    pub minted: u64,
    pub burned: u64,
    pub supply: i128,
    pub held: u128,
}

/// Why a message was refused; the state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("insufficient balance: needs {needed}, has {available}")]
    InsufficientBalance { needed: u64, available: u64 },
    #[error("insufficient stake: needs {needed}, has {available}")]
    InsufficientStake { needed: u64, available: u64 },
    #[error("stake is locked until {unlock_at_ms} (op time {timestamp_ms})")]
    StakeLocked {
        unlock_at_ms: u64,
        timestamp_ms: u64,
    },
    #[error("stake lock must last at least {MIN_STAKE_LOCK_MS} ms")]
    LockTooShort,
    #[error("nothing is unbonding")]
    NothingUnbonding,
    #[error("unstaked funds unbond until {until_ms} (op time {timestamp_ms})")]
    Unbonding { until_ms: u64, timestamp_ms: u64 },
    #[error("amount must be positive")]
    ZeroAmount,
    #[error("transfer to self")]
    SelfTransfer,
    #[error("node {node} already has a different proof at nonce {nonce} (equivocation)")]
    ProofNonceConflict { node: NodeId, nonce: u64 },
    #[error("account {account} already applied a different op at nonce {nonce}")]
    OpNonceConflict { account: NodeId, nonce: u64 },
    #[error("op cannot wait: {0}")]
    Pending(#[from] PendingError),
    #[error("amount overflow")]
    Overflow,
    #[error("an inference payment applies only inside its entry node's settlement")]
    Unsettled,
    #[error("node {node} is paid for stage {stage} but is not registered there")]
    NotRegistered { node: NodeId, stage: u16 },
    #[error("names network {got}, this ledger's is {ours}", got = hex::encode(got), ours = hex::encode(ours))]
    OtherNetwork { got: Hash32, ours: Hash32 },
    #[error("round {round} cannot have happened by {timestamp_ms} (at most round {max})")]
    RoundTooEarly {
        round: u64,
        timestamp_ms: u64,
        max: u64,
    },
    #[error(
        "round {round} is more than {lead} past its stage's certified round {certified:?}: \
         half of the stage's active provers have not reached it"
    )]
    RoundUncertified {
        round: u64,
        certified: Option<u64>,
        lead: u64,
    },
    #[error("round {round} is long gone: a claim now must be of round {floor} or later")]
    RoundBehind { round: u64, floor: u64 },
    #[error("node {node} was already paid for round {round} of this stage")]
    RoundPaid { node: NodeId, round: u64 },
    #[error("registering needs a stake of {needed}, the account has {available}")]
    StakeTooLow { needed: u64, available: u64 },
    #[error("not admitted: {0}")]
    NotAdmitted(String),
}

/// The whole ledger in memory.
#[derive(Debug, Clone, Default)]
pub struct LedgerState {
    rules: Rules,
    accounts: BTreeMap<NodeId, Account>,
    /// Stages each account ever registered for (only ever grows, so a receipt or proof that
    /// was valid stays valid whatever arrives later).
    registrations: BTreeMap<NodeId, BTreeSet<u16>>,
    /// Claimed (node, stage, round) keys of training proofs, with the proof and what its
    /// round's settlement paid it (0 until then).
    paid_rounds: HashMap<Hash32, (Hash32, u64)>,
    /// Round keys void by an equivocation (two proofs for one round) → evidence hash.
    void_rounds: HashMap<Hash32, Hash32>,
    /// Paid proofs that are not paid by round: (node, nonce) → (proof hash, reward paid).
    proof_nonces: HashMap<(NodeId, u64), (Hash32, u64)>,
    proof_hashes: HashSet<Hash32>,
    op_hashes: HashMap<(NodeId, u64), Hash32>,
    slashes: HashMap<(NodeId, u64), Hash32>,
    /// Applied audit verdicts: job key → evidence hash.
    verdicts: HashMap<Hash32, Hash32>,
    /// Paid validator fees: (auditor, worker, stage, round) key → claim hash.
    audit_fees: HashMap<Hash32, Hash32>,
    minted: u64,
    burned: u64,
    pending: PendingOps,
    /// The accounts and the sets above but `proof_hashes` of paid proofs, kept as they
    /// change, so that [`Self::state_hash`] costs the same whatever the ledger holds.
    digest: digest::Digest,
    /// Changes whenever who [`Self::is_registered`] may have changed.
    registry: Generation,
    /// The public key of every account that signed a proof or an op applied here (its node id
    /// derives from it, so each id has one): what a finality committee is made of. Not in
    /// the state hash: it follows from the ids of what was applied.
    keys: BTreeMap<NodeId, PublicKey>,
    /// Each account's latest capacity announcement (memory bytes, FLOP/s): what the scaler
    /// reads. Not hashed on its own: it follows from the applied ops.
    claims: BTreeMap<NodeId, (u64, u64)>,
    /// The network's architecture, for a network that grows (see `state/growth.rs`).
    growth: Option<NetworkGrowth>,
    /// Each stage's provers' latest paid rounds: what bounds the round a proof may claim.
    /// Not hashed on its own: it follows from the paid proofs.
    progress: progress::StageProgress,
    /// Training rounds open for claims, and each stage's settled rounds (`state/pots.rs`).
    pots: pots::Pots,
}

/// A number no other ledger state in this process has had: drawn afresh at every change, so
/// a cache keyed by it can never mistake one state (or one ledger) for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

impl Generation {
    fn next() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Default for Generation {
    fn default() -> Self {
        Self::next()
    }
}

fn add(a: u64, b: u64) -> Result<u64, LedgerError> {
    a.checked_add(b).ok_or(LedgerError::Overflow)
}

impl LedgerState {
    pub fn new() -> Self {
        Self::default()
    }

    /// A ledger that starts from `genesis`: its rules, and its stakes minted and locked until
    /// a day after the founding. Also returns the changes a store persists.
    pub fn from_genesis(genesis: &LedgerGenesis) -> Result<(Self, Changes), LedgerError> {
        let mut s = Self {
            rules: genesis.rules,
            growth: genesis.growth.clone(),
            ..Self::default()
        };
        let unlock_at_ms = genesis.rules.founded_ms.saturating_add(MIN_STAKE_LOCK_MS);
        for (key, stake) in &genesis.stakes {
            s.minted = add(s.minted, *stake)?;
            s.keys.insert(key.node_id(), *key);
            s.put_account(
                key.node_id(),
                Account {
                    stake: *stake,
                    unlock_at_ms,
                    ..Account::default()
                },
                None,
            );
        }
        let mut changes = s.changes_with(genesis.stakes.iter().map(|(k, _)| k.node_id()));
        changes.keys = genesis
            .stakes
            .iter()
            .map(|(k, _)| (k.node_id(), *k))
            .collect();
        changes.records.push(Record::Genesis {
            hash: genesis.hash(),
            rules: genesis.rules,
        });
        Ok((s, changes))
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Whether a slash of `offender` at `nonce` was applied (one per offender and nonce).
    pub fn has_slash(&self, offender: &NodeId, nonce: u64) -> bool {
        self.slashes.contains_key(&(*offender, nonce))
    }

    /// Whether an audit verdict about `job` was applied (one verdict per job).
    pub fn has_verdict(&self, job: &Hash32) -> bool {
        self.verdicts.contains_key(job)
    }

    /// True if `node` registered for `stage` and still holds the minimum stake.
    pub fn is_registered(&self, node: &NodeId, stage: u16) -> bool {
        self.registrations
            .get(node)
            .is_some_and(|s| s.contains(&stage))
            && self.account(node).stake >= self.rules.min_stake
    }

    /// Changes whenever the answer of [`Self::is_registered`] may have changed for anyone
    /// (a registration, a stake change): what callers key a cache of registered peers by.
    pub fn registry_generation(&self) -> Generation {
        self.registry
    }

    /// True if `node` ever registered for `stage` (what receipts and proofs are judged by:
    /// it never changes back, so their verdict does not depend on arrival order).
    pub fn was_registered(&self, node: &NodeId, stage: u16) -> bool {
        self.registrations
            .get(node)
            .is_some_and(|s| s.contains(&stage))
    }

    /// Accounts that ever registered for `stage`, whatever their stake now: who audits whom is
    /// drawn among them, so a slash (which may take a stake below the minimum) cannot change
    /// the assignment, and with it the verdict, of evidence still on its way.
    pub fn ever_registered(&self, stage: u16) -> impl Iterator<Item = NodeId> + '_ {
        self.registrations
            .iter()
            .filter(move |(_, stages)| stages.contains(&stage))
            .map(|(id, _)| *id)
    }

    /// Accounts registered for `stage` that still hold the minimum stake.
    pub fn registered(&self, stage: u16) -> impl Iterator<Item = NodeId> + '_ {
        self.registrations
            .iter()
            .filter(move |(id, stages)| {
                stages.contains(&stage) && self.account(id).stake >= self.rules.min_stake
            })
            .map(|(id, _)| *id)
    }

    pub fn account(&self, id: &NodeId) -> Account {
        self.accounts.get(id).copied().unwrap_or_default()
    }

    pub fn accounts(&self) -> impl Iterator<Item = (&NodeId, &Account)> {
        self.accounts.iter()
    }

    pub fn minted(&self) -> u64 {
        self.minted
    }

    pub fn burned(&self) -> u64 {
        self.burned
    }

    /// The key of `id`, once it signed something this ledger applied.
    pub fn key(&self, id: &NodeId) -> Option<PublicKey> {
        self.keys.get(id).copied()
    }

    /// Accounts holding stake whose key is known, with their stake: the candidates for a
    /// finality committee (`neuroshard_finality::committee_from_stakes`). A staker whose key
    /// is not known yet (a genesis stake that never signed anything) is not listed.
    pub fn staked_keys(&self) -> Vec<(PublicKey, u64)> {
        self.accounts
            .iter()
            .filter(|(_, a)| a.stake > 0)
            .filter_map(|(id, a)| self.keys.get(id).map(|k| (*k, a.stake)))
            .collect()
    }

    /// Records `id`'s key if it is new, into `changes` for the store.
    fn learn_key(&mut self, key: PublicKey, changes: &mut Changes) {
        let id = key.node_id();
        if let std::collections::btree_map::Entry::Vacant(e) = self.keys.entry(id) {
            e.insert(key);
            changes.keys.push((id, key));
        }
    }

    pub fn proof_count(&self) -> usize {
        self.proof_hashes.len()
    }

    pub fn has_proof(&self, hash: &Hash32) -> bool {
        self.proof_hashes.contains(hash)
    }

    /// Whether a training proof for this round key was paid, or the round is void by an
    /// equivocation: either way, another proof for it would be an equivocation.
    pub fn round_claimed(&self, key: &Hash32) -> bool {
        self.paid_rounds.contains_key(key) || self.void_rounds.contains_key(key)
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Credits the reward for a verified proof. Idempotent by proof hash.
    ///
    /// A training proof is counted once per (node, stage, round), whatever it claims, and only
    /// for a round that can have happened by its timestamp; it joins its round's pot, which a
    /// finalized epoch settles (`state/pots.rs`), unless that round is settled already (then
    /// it is recorded and never paid). A second proof for
    /// a claimed round is an equivocation. It is keyed by its round, not its nonce, so nodes
    /// that saw two proofs for one round in either order hold the same balances and state hash.
    pub fn apply_proof(&mut self, verified: &VerifiedProof) -> Result<Outcome, LedgerError> {
        let proof = verified.proof();
        let hash = verified.hash();
        if self.proof_hashes.contains(&hash) {
            return Ok(Outcome::Duplicate);
        }
        if proof.network != self.rules.network {
            return Err(LedgerError::OtherNetwork {
                got: proof.network,
                ours: self.rules.network,
            });
        }
        let mut account = self.account(&proof.node_id);
        let round_key = (proof.kind == ProofKind::Training).then(|| round_key(proof));
        let amount = match round_key {
            Some(key) => {
                let max = self.rules.max_round_at(proof.timestamp_ms);
                if proof.round > max {
                    return Err(LedgerError::RoundTooEarly {
                        round: proof.round,
                        timestamp_ms: proof.timestamp_ms,
                        max,
                    });
                }
                // Two proofs for one round is an equivocation: settled once, then void.
                if self.void_rounds.contains_key(&key) {
                    return Err(LedgerError::RoundPaid {
                        node: proof.node_id,
                        round: proof.round,
                    });
                }
                if let Some(&(first, first_reward)) = self.paid_rounds.get(&key) {
                    return self.settle_equivocation(
                        verified,
                        first,
                        first_reward,
                        Slot::Round(key),
                    );
                }
                // Paid when its round settles; nothing if it settled already.
                0
            }
            None => {
                let nonce_key = (proof.node_id, proof.nonce);
                // An equivocation at this nonce is settled: any further proof there is void.
                if self.slashes.contains_key(&nonce_key) {
                    return Err(LedgerError::ProofNonceConflict {
                        node: proof.node_id,
                        nonce: proof.nonce,
                    });
                }
                if let Some(&(first, first_reward)) = self.proof_nonces.get(&nonce_key) {
                    return self.settle_equivocation(
                        verified,
                        first,
                        first_reward,
                        Slot::Nonce(nonce_key),
                    );
                }
                self.reward_for(proof)
            }
        };
        account.balance = add(account.balance, amount)?;
        let minted = add(self.minted, amount)?;

        self.put_account(proof.node_id, account, None);
        self.minted = minted;
        self.proof_hashes.insert(hash);
        let mut contribution = None;
        match round_key {
            Some(key) => {
                self.paid_rounds.insert(key, (hash, amount));
                self.digest.insert(Set::Round, &key);
                self.progress.note(proof);
                // A claim of a settled round is recorded and never paid: refusing it would make
                // a live ledger's state depend on whether the claim came before or after it
                // paid the round's settlement.
                if !self.pots.closed(proof.layers, proof.round) {
                    contribution = Some(self.contribute(proof, hash));
                }
            }
            None => {
                self.proof_nonces
                    .insert((proof.node_id, proof.nonce), (hash, amount));
                self.digest.insert(Set::Proof, &hash);
            }
        }
        let mut changes = self.changes_with([proof.node_id]);
        changes.records.push(Record::Proof {
            hash,
            node: proof.node_id,
            nonce: proof.nonce,
            kind: proof.kind,
            reward: amount,
            timestamp_ms: proof.timestamp_ms,
            round_key,
        });
        // Training pays at its round's settlement: no history line now.
        changes.records.extend(contribution);
        if round_key.is_none() {
            changes.entries.push(Entry {
                account: proof.node_id,
                kind: EntryKind::Reward,
                amount,
                counterparty: None,
                reference: hash,
                timestamp_ms: proof.timestamp_ms,
            });
        }
        self.learn_key(proof.public_key, &mut changes);
        Ok(Outcome::Applied(changes))
    }

    /// What `proof` earns under this ledger's rules: for training, the most a round pays one
    /// contributor (the whole round reward, plus role bonuses: what a lone contributor gets;
    /// `n` contributors split it); the per-kind rate times the prover's stake multiplier for
    /// the other kinds.
    pub fn reward_for(&self, proof: &Proof) -> u64 {
        match proof.kind {
            ProofKind::Training => reward::round_reward(proof, self.rules.round_reward),
            _ => reward::reward(proof, self.account(&proof.node_id).stake),
        }
    }

    /// Sets an account (and adds `register` to its stages), keeping the digest in step.
    fn put_account(&mut self, id: NodeId, account: Account, register: Option<u16>) {
        let stake_changed = self
            .accounts
            .get(&id)
            .is_none_or(|old| old.stake != account.stake);
        if stake_changed || register.is_some() {
            self.registry = Generation::next();
        }
        let stages = self.registrations.get(&id);
        if let Some(old) = self.accounts.get(&id) {
            self.digest
                .remove_account(&id, old, stages.into_iter().flatten());
        }
        if let Some(stage) = register {
            self.registrations.entry(id).or_default().insert(stage);
        }
        let stages = self.registrations.get(&id);
        self.digest
            .add_account(&id, &account, stages.into_iter().flatten());
        self.accounts.insert(id, account);
    }

    /// The digest rebuilt from every account and set (a restored ledger; tests).
    fn rebuilt_digest(&self) -> digest::Digest {
        let mut d = digest::Digest::default();
        for (id, a) in &self.accounts {
            d.add_account(id, a, self.registrations.get(id).into_iter().flatten());
        }
        for (h, _) in self.proof_nonces.values() {
            d.insert(Set::Proof, h);
        }
        for k in self.paid_rounds.keys() {
            d.insert(Set::Round, k);
        }
        for h in self.op_hashes.values() {
            d.insert(Set::Op, h);
        }
        for h in self
            .slashes
            .values()
            .chain(self.verdicts.values())
            .chain(self.void_rounds.values())
        {
            d.insert(Set::Slash, h);
        }
        for k in self.audit_fees.keys() {
            d.insert(Set::Fee, k);
        }
        for e in self.pots.settled_elements() {
            d.insert(Set::Settled, &e);
        }
        d
    }

    fn changes_with(&self, touched: impl IntoIterator<Item = NodeId>) -> Changes {
        Changes {
            accounts: touched
                .into_iter()
                .map(|id| (id, self.account(&id)))
                .collect(),
            records: Vec::new(),
            entries: Vec::new(),
            minted: self.minted,
            burned: self.burned,
            keys: Vec::new(),
        }
    }

    /// BLAKE3 over the totals, the rules, the size of each set and the digest of every
    /// account and every applied proof, op and slash evidence. Training proofs count by their
    /// round key: which of two proofs for one round was paid depends on arrival order, that
    /// the round was paid does not. Costs the same whatever the ledger holds.
    pub fn state_hash(&self) -> Hash32 {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/ledger-state/v3");
        h.update(&self.rules.to_bytes());
        h.update(&self.minted.to_le_bytes());
        h.update(&self.burned.to_le_bytes());
        for n in [
            self.accounts.len(),
            self.proof_nonces.len(),
            self.paid_rounds.len(),
            self.op_hashes.len(),
            // Verdicts and void rounds count with slashes, so a ledger without any keeps its
            // hash.
            self.slashes.len() + self.verdicts.len() + self.void_rounds.len(),
        ] {
            h.update(&(n as u64).to_le_bytes());
        }
        // Fees count only once there are any, so a ledger without any keeps its hash.
        if !self.audit_fees.is_empty() {
            let n = self.audit_fees.len();
            h.update(&(n as u64).to_le_bytes());
        }
        h.update(&self.digest.bytes());
        // Only once an evaluation is due, so ledgers that never end an epoch (the live ones)
        // and networks that do not grow keep their hash.
        if let Some(g) = self
            .growth
            .as_ref()
            .filter(|g| g.evaluated > 0 || g.pending.is_some())
        {
            h.update(b"growth");
            h.update(&g.to_bytes());
        }
        *h.finalize().as_bytes()
    }

    /// Whether the incrementally kept digest equals one rebuilt from scratch (tests).
    #[cfg(test)]
    pub(crate) fn digest_is_consistent(&self) -> bool {
        self.digest == self.rebuilt_digest()
    }

    /// Supply conservation: minted − burned = Σ balances + Σ stakes + Σ unbonding.
    pub fn check_invariants(&self) -> Result<(), SupplyMismatch> {
        let held: u128 = self
            .accounts
            .values()
            .map(|a| u128::from(a.balance) + u128::from(a.stake) + u128::from(a.unbonding))
            .sum();
        let supply = i128::from(self.minted) - i128::from(self.burned);
        if i128::try_from(held).ok() != Some(supply) {
            return Err(SupplyMismatch {
                minted: self.minted,
                burned: self.burned,
                supply,
                held,
            });
        }
        Ok(())
    }
}

/// `have - amount`, or the matching "insufficient" error.
fn debit(have: u64, amount: u64, balance: bool) -> Result<u64, LedgerError> {
    have.checked_sub(amount).ok_or(if balance {
        LedgerError::InsufficientBalance {
            needed: amount,
            available: have,
        }
    } else {
        LedgerError::InsufficientStake {
            needed: amount,
            available: have,
        }
    })
}

#[cfg(test)]
mod tests;
