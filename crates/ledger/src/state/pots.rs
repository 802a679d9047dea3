//! Round pots: a training round mints a fixed emission, split among its contributors.
//!
//! A training proof does not pay its prover when it applies; it joins the pot of its
//! (stage, round). A finalized state settles a pot [`SETTLE_EPOCHS`] epochs after the pot
//! opened, once the stage has reached that round (its certified round): the network's
//! `round_reward` split equally among the round's contributors (each share with its role
//! bonuses), and from then on the stage's rounds up to that one are closed. So a round mints the same whatever number of keys
//! claim it: a Sybil's extra key takes a share from the others instead of minting more, and
//! claiming more earns nothing more. A claim of a closed round is recorded and never paid.
//!
//! Only contributors vouched for by the round's other contributors are paid: a share needs
//! gradient receipts from at least f + 1 distinct other contributors of the round, where
//! f = ⌊(n − 1)/3⌋ of its n contributors (the Byzantine keys a round of n tolerates), so f
//! colluding keys cannot vouch a claim into the split on their own, and a receipt from a key
//! that did not claim the round (it did not take part, or its claim came too late) vouches
//! for nothing.
//!
//! In a network of several stages the split follows delivered work: work tallies
//! ([`neuroshard_proof::ReceiptKind::Activations`]) signed by nodes of other stages that took
//! the contributor's pipeline outputs of the round, each tally counting the distinct jobs its
//! signer countersigned. Tallies of the same jobs (one output sent to several receivers)
//! count them once, as far as their job sketches tell ([`neuroshard_proof::distinct_jobs`]).
//! Each vouched contributor weighs its delivered jobs capped at the
//! round's lower median (so a colluding receiver's inflated tally earns no more than an equal
//! share); where that median is 0 (a network of one stage, where no job leaves a stage) they
//! weigh alike. So a staked key that offers a pseudo-gradient of its choosing (the others'
//! mean, zeros) without serving the pipeline is vouched for by its co-replicas, who aggregate
//! its offer, but paid nothing: no one took a job of it; one that serves a tenth of the
//! median's jobs is paid a tenth of a share. A tally counts only from a key registered for a
//! stage the contributor never registered for and that is not a contributor of the round, so
//! a co-replica Sybil signs none that count.
//!
//! Which contributors a pot has depends on which proofs arrived before it settled, so only a
//! finalized state decides it (its epochs apply in one order on every node). A live ledger
//! never settles on its own: it pays exactly the shares finality settled
//! ([`LedgerState::follow_settlements`]), so every node pays the same keys the same amounts,
//! and a ledger without finality pays no training at all.

use std::collections::VecDeque;

use neuroshard_proof::{LayerRange, Roles, WorkTally};

use super::progress::stage_key;
use super::*;

/// Epochs a pot stays open after its first proof was finalized (30 s at the default 10-s
/// epochs): the round's other replicas prove it within seconds of each other, and finality
/// takes an epoch or two to hold their proofs.
pub const SETTLE_EPOCHS: u64 = 3;
/// Settlements a finalized state keeps per stage for live ledgers to follow: a node's live
/// ledger follows after every finalized epoch, so it needs only the last few.
pub const SETTLEMENTS_KEPT: usize = 256;

/// A stage, named by its layers (as round keys and stage progress name it).
type StageKey = (u32, u32);

fn layers_of(stage: StageKey) -> LayerRange {
    LayerRange {
        start: stage.0,
        end: stage.1,
    }
}

/// One contributor of a round: its proof, what the share's bonus depends on, and who
/// receipted its pseudo-gradient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contribution {
    pub proof: Hash32,
    pub roles: Roles,
    pub nonce: u64,
    pub timestamp_ms: u64,
    /// The distinct signers of its gradient receipts, by id (the prover never among them).
    pub vouchers: Vec<NodeId>,
    /// Its work tallies: each signer (by id, never the prover) with the jobs it took.
    pub work: Vec<(NodeId, WorkTally)>,
}

impl Contribution {
    /// `proof`'s contribution (its hash is `hash`).
    pub fn of(proof: &Proof, hash: Hash32) -> Self {
        let mut vouchers: Vec<NodeId> = proof
            .receipts
            .iter()
            .filter(|r| r.kind == neuroshard_proof::ReceiptKind::Gradients)
            .map(|r| r.signer.node_id())
            .filter(|id| *id != proof.node_id)
            .collect();
        vouchers.sort_unstable();
        vouchers.dedup();
        let mut work: Vec<(NodeId, WorkTally)> = proof
            .receipts
            .iter()
            .filter(|r| r.kind == neuroshard_proof::ReceiptKind::Activations)
            .filter_map(|r| Some((r.signer.node_id(), WorkTally::from_hash(&r.hash)?)))
            .filter(|(id, _)| *id != proof.node_id)
            .collect();
        work.sort_unstable();
        work.dedup_by_key(|(id, _)| *id);
        Self {
            proof: hash,
            roles: proof.roles,
            nonce: proof.nonce,
            timestamp_ms: proof.timestamp_ms,
            vouchers,
            work,
        }
    }
}

/// An open round: its contributors, and the finalized epoch its first one was applied in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pot {
    pub(crate) opened: u64,
    pub(crate) members: BTreeMap<NodeId, Contribution>,
}

/// One contributor's share of a settled round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub node: NodeId,
    pub contribution: Contribution,
    pub amount: u64,
}

/// A round of a stage settled by a finalized state: who was paid what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundSettlement {
    pub layers: LayerRange,
    pub round: u64,
    /// By node id.
    pub shares: Vec<Share>,
    /// Contributors not paid: too few of the round's other contributors vouched for them.
    pub unvouched: Vec<NodeId>,
    /// Vouched contributors not paid: no delivered job, where the round's median has some.
    pub idle: Vec<NodeId>,
}

/// Open pots, each stage's last settled round, and (in a finalized state) the settlements
/// live ledgers follow.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pots {
    pub(crate) open: BTreeMap<(StageKey, u64), Pot>,
    /// Per stage, the highest settled round: every round up to it is closed.
    pub(crate) settled: BTreeMap<StageKey, u64>,
    /// Per stage, its latest settlements (finalized states only).
    log: BTreeMap<StageKey, VecDeque<RoundSettlement>>,
}

impl Pots {
    /// Whether `round` of the stage is closed.
    pub(crate) fn closed(&self, layers: LayerRange, round: u64) -> bool {
        self.settled
            .get(&stage_key(layers))
            .is_some_and(|&s| round <= s)
    }
}

/// Whether `node`'s contribution is vouched for by at least f + 1 distinct other
/// contributors of its round, f = ⌊(n − 1)/3⌋ of the round's n contributors.
fn vouched_for(node: &NodeId, c: &Contribution, members: &BTreeMap<NodeId, Contribution>) -> bool {
    let f = members.len().saturating_sub(1) / 3;
    let others = c
        .vouchers
        .iter()
        .filter(|v| *v != node && members.contains_key(v))
        .count();
    others > f
}

impl LedgerState {
    /// The jobs of `node`'s contribution that count: the distinct jobs of its work tallies
    /// whose signer is registered for a stage `node` never registered for and did not
    /// contribute to the round itself (`members`, which holds `node` too).
    fn delivered_jobs(
        &self,
        node: &NodeId,
        c: &Contribution,
        members: &BTreeMap<NodeId, Contribution>,
    ) -> u64 {
        let own = self.registrations.get(node);
        let tallies: Vec<WorkTally> = c
            .work
            .iter()
            .filter(|(signer, _)| !members.contains_key(signer))
            .filter(|(signer, _)| {
                self.registrations.get(signer).is_some_and(|stages| {
                    stages
                        .iter()
                        .any(|s| own.is_none_or(|own| !own.contains(s)))
                })
            })
            .map(|(_, tally)| *tally)
            .collect();
        // Receivers that took the same jobs (one output sent to several) count them once.
        neuroshard_proof::distinct_jobs(&tallies)
    }
}

/// Each contributor's weight in the split from its delivered `jobs`: the jobs, capped at the
/// round's lower median (so tallies a colluding receiver inflates earn no more than an equal
/// share); 1 each where that median is 0 (no job leaves a stage of a one-stage network).
fn work_weights(jobs: &[u64]) -> Vec<u64> {
    let mut sorted = jobs.to_vec();
    sorted.sort_unstable();
    let median = sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0);
    if median == 0 {
        return vec![1; jobs.len()];
    }
    jobs.iter().map(|j| (*j).min(median)).collect()
}

/// The element a stage's settled round adds to the digest.
fn settled_element(stage: StageKey, round: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..4].copy_from_slice(&stage.0.to_le_bytes());
    out[4..8].copy_from_slice(&stage.1.to_le_bytes());
    out[8..16].copy_from_slice(&round.to_le_bytes());
    out
}

impl LedgerState {
    /// Adds a training proof's prover to its round's pot (the proof was checked and not paid);
    /// the record for the store.
    pub(super) fn contribute(&mut self, proof: &Proof, hash: Hash32) -> Record {
        let opened = self.progress.epoch();
        let contribution = Contribution::of(proof, hash);
        self.pots
            .open
            .entry((stage_key(proof.layers), proof.round))
            .or_insert_with(|| Pot {
                opened,
                members: BTreeMap::new(),
            })
            .members
            .insert(proof.node_id, contribution.clone());
        Record::Contribution {
            layers: proof.layers,
            round: proof.round,
            node: proof.node_id,
            contribution,
        }
    }

    /// Takes `node` out of its round's pot (its proof was one of two for the round).
    pub(super) fn withdraw(&mut self, node: &NodeId, layers: LayerRange, round: u64) {
        let key = (stage_key(layers), round);
        if let Some(pot) = self.pots.open.get_mut(&key) {
            pot.members.remove(node);
            if pot.members.is_empty() {
                self.pots.open.remove(&key);
            }
        }
    }

    /// The contributors of an open round, by node id.
    pub fn pot(&self, layers: LayerRange, round: u64) -> Vec<(NodeId, Contribution)> {
        self.pots
            .open
            .get(&(stage_key(layers), round))
            .map(|p| p.members.iter().map(|(n, c)| (*n, c.clone())).collect())
            .unwrap_or_default()
    }

    /// The latest settlements of every stage (a finalized state's; at most
    /// [`SETTLEMENTS_KEPT`] a stage), each stage's in round order.
    pub fn settlements(&self) -> impl Iterator<Item = &RoundSettlement> {
        self.pots.log.values().flatten()
    }

    /// Open rounds that `node` contributed to: its claims waiting for their settlement.
    pub fn pending_claims(&self, node: &NodeId) -> usize {
        self.pots
            .open
            .values()
            .filter(|p| p.members.contains_key(node))
            .count()
    }

    /// What the claim with this round key was paid (0 until its round settles, and for ever
    /// if it settled without it); `None` for a round key not claimed.
    pub fn round_paid(&self, key: &Hash32) -> Option<u64> {
        self.paid_rounds.get(key).map(|(_, paid)| *paid)
    }

    /// The highest settled round of the stage holding `layers`.
    pub fn settled_round(&self, layers: LayerRange) -> Option<u64> {
        self.pots.settled.get(&stage_key(layers)).copied()
    }

    /// The settlement of `round` of `stage` with these contributors: `round_reward` split
    /// among those vouched for by enough of the others, in proportion to their delivered jobs
    /// capped at the round's median (equally where no one delivered any; the remainder of the
    /// division is not minted), each share with its role bonuses; the rest listed unpaid.
    fn settlement(
        &self,
        stage: StageKey,
        round: u64,
        members: BTreeMap<NodeId, Contribution>,
    ) -> RoundSettlement {
        let (vouched, unvouched): (Vec<_>, Vec<_>) = members
            .iter()
            .partition(|(node, c)| vouched_for(node, c, &members));
        let jobs: Vec<u64> = vouched
            .iter()
            .map(|(node, c)| self.delivered_jobs(node, c, &members))
            .collect();
        let weights = work_weights(&jobs);
        let total: u128 = weights.iter().map(|w| u128::from(*w)).sum();
        let (worked, idle): (Vec<_>, Vec<_>) =
            vouched.into_iter().zip(weights).partition(|(_, w)| *w > 0);
        let share = |w: u64| {
            let s = u128::from(self.rules.round_reward) * u128::from(w) / total.max(1);
            u64::try_from(s).unwrap_or(u64::MAX)
        };
        RoundSettlement {
            layers: layers_of(stage),
            round,
            shares: worked
                .into_iter()
                .map(|((node, c), w)| Share {
                    node: *node,
                    contribution: c.clone(),
                    amount: reward::with_role_bonus(share(w), c.roles),
                })
                .collect(),
            unvouched: unvouched.into_iter().map(|(node, _)| *node).collect(),
            idle: idle.into_iter().map(|((node, _), _)| *node).collect(),
        }
    }

    /// At the end of a finalized epoch: settles every stage's rounds up to the highest one
    /// whose pot has been open [`SETTLE_EPOCHS`] epochs and that the stage has reached (its
    /// certified round: what at least half of its active provers claimed), lowest round first.
    /// Without the second condition two keys claiming a round ahead of their stage would close
    /// every round before it when it settled, and the honest replicas, proving those rounds
    /// later, would be paid for none. Returns the settlements (also kept for live ledgers).
    pub(super) fn settle_due(&mut self) -> Vec<RoundSettlement> {
        let epoch = self.progress.epoch();
        let mut through: BTreeMap<StageKey, u64> = BTreeMap::new();
        for ((stage, round), pot) in &self.pots.open {
            let reached = self
                .progress
                .certified(layers_of(*stage))
                .is_some_and(|c| *round <= c);
            if reached && pot.opened.saturating_add(SETTLE_EPOCHS) <= epoch {
                let t = through.entry(*stage).or_insert(*round);
                *t = (*t).max(*round);
            }
        }
        let mut out = Vec::new();
        for (stage, last) in through {
            let due: Vec<(StageKey, u64)> = self
                .pots
                .open
                .range((stage, 0)..=(stage, last))
                .map(|(k, _)| *k)
                .collect();
            for key in due {
                let Some(pot) = self.pots.open.remove(&key) else {
                    continue;
                };
                let settlement = self.settlement(stage, key.1, pot.members);
                // The state is a finalized one: its changes are not persisted (epochs are).
                if self.pay_settlement(&settlement).is_ok() {
                    let log = self.pots.log.entry(stage).or_default();
                    log.push_back(settlement.clone());
                    while log.len() > SETTLEMENTS_KEPT {
                        log.pop_front();
                    }
                    out.push(settlement);
                }
            }
        }
        out
    }

    /// Pays a settlement's shares and closes its stage's rounds up to it; the changes for the
    /// store. A share whose round this ledger holds as void (it saw the prover's second proof
    /// for it) is not paid: that equivocation takes back what it paid anyway.
    fn pay_settlement(&mut self, s: &RoundSettlement) -> Result<Changes, LedgerError> {
        let stage = stage_key(s.layers);
        let mut touched = Vec::new();
        let mut records = Vec::new();
        let mut entries = Vec::new();
        let mut minted = self.minted;
        let mut paid = Vec::new();
        for share in &s.shares {
            let key = round_key_of(&share.node, s.layers, s.round);
            if self.void_rounds.contains_key(&key) {
                continue;
            }
            minted = add(minted, share.amount)?;
            let mut account = self.account(&share.node);
            account.balance = add(account.balance, share.amount)?;
            paid.push((share, key, account));
        }
        self.minted = minted;
        for (share, key, account) in paid {
            self.put_account(share.node, account, None);
            let c = &share.contribution;
            if self
                .paid_rounds
                .insert(key, (c.proof, share.amount))
                .is_none()
            {
                // Finality paid a proof this ledger does not hold yet: it is final, so it
                // counts as held (it will arrive as a duplicate).
                self.digest.insert(Set::Round, &key);
                self.proof_hashes.insert(c.proof);
            }
            touched.push(share.node);
            records.push(Record::Proof {
                hash: c.proof,
                node: share.node,
                nonce: c.nonce,
                kind: ProofKind::Training,
                reward: share.amount,
                timestamp_ms: c.timestamp_ms,
                round_key: Some(key),
            });
            entries.push(Entry {
                account: share.node,
                kind: EntryKind::Reward,
                amount: share.amount,
                counterparty: None,
                reference: c.proof,
                timestamp_ms: c.timestamp_ms,
            });
        }
        let old = self.pots.settled.insert(stage, s.round);
        if let Some(old) = old {
            self.digest
                .remove(Set::Settled, &settled_element(stage, old));
        }
        self.digest
            .insert(Set::Settled, &settled_element(stage, s.round));
        // Every round of the stage up to this one is closed.
        let closed: Vec<(StageKey, u64)> = self
            .pots
            .open
            .range((stage, 0)..=(stage, s.round))
            .map(|(k, _)| *k)
            .collect();
        for k in closed {
            self.pots.open.remove(&k);
        }
        let mut changes = self.changes_with(touched);
        changes.records = records;
        changes.records.push(Record::Settled {
            layers: s.layers,
            round: s.round,
        });
        changes.entries = entries;
        Ok(changes)
    }

    /// A live ledger pays a settlement finality made; `None` if it paid it (or a later round
    /// of the stage) before. The changes for the store.
    pub fn apply_settlement(
        &mut self,
        s: &RoundSettlement,
    ) -> Result<Option<Changes>, LedgerError> {
        if self.pots.closed(s.layers, s.round) {
            return Ok(None);
        }
        self.pay_settlement(s).map(Some)
    }

    /// A live ledger pays what `finalized` settled that it did not pay yet, of the latest
    /// settlements the finalized state keeps ([`SETTLEMENTS_KEPT`] a stage). The changes
    /// for the store.
    pub fn follow_settlements(
        &mut self,
        finalized: &LedgerState,
    ) -> Result<Vec<Changes>, LedgerError> {
        let mut out = Vec::new();
        for s in finalized.pots.log.values().flatten() {
            out.extend(self.apply_settlement(s)?);
        }
        Ok(out)
    }

    /// Every open pot's contributors (the store's rows), for tests.
    #[cfg(test)]
    pub(crate) fn open_pots(&self) -> usize {
        self.pots.open.len()
    }
}

impl Pots {
    /// Rebuilds the live ledger's pots from the store's rows.
    pub(crate) fn restore(
        members: Vec<(LayerRange, u64, NodeId, Contribution)>,
        settled: Vec<(LayerRange, u64)>,
    ) -> Self {
        let mut pots = Pots::default();
        for (layers, round) in settled {
            pots.settled.insert(stage_key(layers), round);
        }
        for (layers, round, node, c) in members {
            if pots.closed(layers, round) {
                continue;
            }
            pots.open
                .entry((stage_key(layers), round))
                .or_default()
                .members
                .insert(node, c);
        }
        pots
    }

    /// Digest elements of the settled rounds.
    pub(crate) fn settled_elements(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        self.settled.iter().map(|(s, r)| settled_element(*s, *r))
    }
}

#[cfg(test)]
#[path = "pots_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "pots_work_tests.rs"]
mod work_tests;
