//! The node's own proofs: one per DiLoCo round it contributed to, backed by gradient receipts
//! of its registered co-replicas and the work tallies of other stages' nodes that took its
//! jobs (`economy/work.rs`), and its own registration for the stage it serves.

use neuroshard_ledger::{AccountOp, Action, round_key_of, verify_op};

use crate::settings::CapacityClaim;
use neuroshard_proof::plausibility::{
    MAX_CLAIMED_DURATION_MS, MAX_TOKENS_PER_BATCH, MIN_CLAIMED_DURATION_MS,
};
use neuroshard_proof::proof::{MAX_RECEIPTS, MAX_SHARDS, MAX_WORK_RECEIPTS};
use neuroshard_proof::{HardwareClass, Hash32, NodeId, Proof, ProofKind, Receipt, ReceiptKind};

use super::{
    Economy, EconomyError, MAX_EARLY_RECEIPTS, RECEIPTS_PER_ROUND, ROUND_MEMORY, ReceiptRefused,
    WorkSummary,
};

/// One of our rounds: our pseudo-gradient's hash, what we did, and the receipts for it.
#[derive(Debug, Clone)]
pub(super) struct RoundInfo {
    pub round: u64,
    pub hash: Hash32,
    pub receipts: Vec<Receipt>,
    /// What we did in it (None: we offered nothing to claim, or it was claimed).
    pub work: Option<WorkSummary>,
}

/// (tokens, batches, claimed ms) of `work` that pass the static plausibility limits of
/// `hardware`. Duration is what was measured, so when the counts exceed what it allows they
/// are lowered (under-claiming) instead of inflating the time. The reward does not depend on
/// them; they are the round's record.
fn claim(work: &WorkSummary, hardware: HardwareClass) -> (u64, u64, u64) {
    let measured = work.duration_ms.max(1);
    let duration = measured.clamp(MIN_CLAIMED_DURATION_MS, MAX_CLAIMED_DURATION_MS);
    let scale = |v: u64| {
        if measured <= duration {
            return v;
        }
        let scaled = u128::from(v) * u128::from(duration) / u128::from(measured);
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    };
    let per_duration = |per_sec: u64| {
        let v = u128::from(per_sec) * u128::from(duration) / 1000;
        u64::try_from(v).unwrap_or(u64::MAX)
    };
    let limits = hardware.limits();
    let layers = u64::from(work.layers.len()).max(1);
    let mut tokens = scale(work.tokens).min(per_duration(limits.max_layer_tokens_per_sec) / layers);
    let batches = scale(work.batches)
        .min(per_duration(limits.max_batches_per_sec))
        .min(tokens);
    tokens = tokens.min(batches.saturating_mul(MAX_TOKENS_PER_BATCH));
    (tokens, batches, duration)
}

/// Adds a receipt unless its signer is already there. When the list is full, a receipt of a
/// signer `registered` for the stage takes the place of one whose signer is not: anyone can
/// sign a receipt for our (public) pseudo-gradient hash, and only registered ones back a proof.
fn push_receipt(
    receipts: &mut Vec<Receipt>,
    receipt: Receipt,
    registered: impl Fn(&Receipt) -> bool,
) -> bool {
    if receipts.iter().any(|r| r.signer == receipt.signer) {
        return false;
    }
    if receipts.len() < RECEIPTS_PER_ROUND {
        receipts.push(receipt);
        return true;
    }
    if !registered(&receipt) {
        return false;
    }
    match receipts.iter_mut().find(|r| !registered(r)) {
        Some(slot) => {
            *slot = receipt;
            true
        }
        None => false,
    }
}

impl Economy {
    /// A receipt by this node: "I fetched and aggregated `prover`'s pseudo-gradient `hash`".
    pub fn receipt_for(&self, prover: NodeId, round: u64, hash: Hash32) -> Receipt {
        Receipt::sign(
            &self.identity,
            self.cfg.network,
            prover,
            round,
            ReceiptKind::Gradients,
            hash,
        )
    }

    /// `receipt` is its signer's signature of a receipt for our work of `round`.
    pub(super) fn check_signed_for_me(
        &self,
        round: u64,
        receipt: &Receipt,
    ) -> Result<(), ReceiptRefused> {
        receipt
            .signer
            .verify(
                &receipt.signed_bytes(self.cfg.network, self.node_id(), round),
                &receipt.signature,
            )
            .map_err(ReceiptRefused::Signature)
    }

    /// Keeps a co-replica's receipt for our pseudo-gradient of `round`. `Ok(false)`: valid but
    /// not needed (duplicate signer, round full or forgotten, early buffer full).
    pub fn on_receipt(&mut self, round: u64, receipt: Receipt) -> Result<bool, EconomyError> {
        if receipt.kind != ReceiptKind::Gradients {
            return Err(ReceiptRefused::WrongKind(receipt.kind).into());
        }
        if receipt.signer == self.identity.public_key() {
            return Err(ReceiptRefused::SelfSigned.into());
        }
        self.check_signed_for_me(round, &receipt)?;
        let stage = self.round_stage(round);
        let ledger = &self.ledger;
        let registered =
            |r: &Receipt| stage.is_some_and(|s| ledger.was_registered(&r.signer.node_id(), s));
        if let Some(info) = self.rounds.iter_mut().find(|r| r.round == round) {
            if receipt.hash != info.hash {
                return Err(ReceiptRefused::HashMismatch { round }.into());
            }
            return Ok(push_receipt(&mut info.receipts, receipt, registered));
        }
        let newest = self.rounds.back().map(|r| r.round);
        let is_future = newest.is_none_or(|n| round > n);
        let dup = self
            .early
            .iter()
            .any(|(r, e)| *r == round && e.signer == receipt.signer);
        if !is_future || dup {
            return Ok(false);
        }
        if self.early.len() >= MAX_EARLY_RECEIPTS {
            // The nearest rounds come first: receipts for a round far ahead (which anyone can
            // sign) make room rather than shut the buffer for good.
            let furthest = self
                .early
                .iter()
                .enumerate()
                .max_by_key(|(_, (r, _))| *r)
                .map(|(i, (r, _))| (i, *r));
            match furthest {
                Some((i, r)) if r > round => {
                    self.early.swap_remove(i);
                }
                _ => return Ok(false),
            }
        }
        self.early.push((round, receipt));
        Ok(true)
    }

    /// Remembers one round's work and pseudo-gradient hash, for receipts and its proof.
    pub fn record_round(&mut self, work: WorkSummary) {
        let (round, hash) = (work.round, work.pseudo_gradient_hash);
        let claimable = work.batches > 0 && work.tokens > 0;
        let at = self.rounds.partition_point(|r| r.round < round);
        let fresh = RoundInfo {
            round,
            hash,
            receipts: Vec::new(),
            work: claimable.then_some(work),
        };
        match self.rounds.get_mut(at) {
            Some(info) if info.round == round => {
                if info.hash != hash {
                    *info = fresh;
                }
            }
            _ => self.rounds.insert(at, fresh),
        }
        while self.rounds.len() > ROUND_MEMORY {
            self.rounds.pop_front();
        }
        let stage = self.round_stage(round);
        let Some(info) = self.rounds.iter_mut().find(|r| r.round == round) else {
            return;
        };
        let ledger = &self.ledger;
        let registered =
            |r: &Receipt| stage.is_some_and(|s| ledger.was_registered(&r.signer.node_id(), s));
        for (_, receipt) in self.early.iter().filter(|(r, _)| *r == round) {
            if receipt.hash == hash {
                push_receipt(&mut info.receipts, *receipt, registered);
            }
        }
        self.early.retain(|(r, _)| *r > round);
    }

    /// The stage whose work we recorded for `round` (None once it was claimed).
    fn round_stage(&self, round: u64) -> Option<u16> {
        let work = self
            .rounds
            .iter()
            .find(|r| r.round == round)?
            .work
            .as_ref()?;
        self.stage_of(work.layers, work.roles)
    }

    /// Builds, signs and applies the proof of our oldest round that has work and enough
    /// receipts of co-replicas registered for its stage. Returns the wire bytes to gossip.
    pub fn poll_proof(&mut self, now_ms: u64) -> Option<Result<Vec<u8>, EconomyError>> {
        let me = self.node_id();
        let (at, stage) = self.rounds.iter().enumerate().find_map(|(at, r)| {
            let work = r.work.as_ref()?;
            let stage = self.stage_of(work.layers, work.roles)?;
            // A round our ledger already holds a proof of (ours from before a restart) is
            // never proved again: a second proof for one round is an equivocation, slashed.
            if self
                .ledger
                .round_claimed(&round_key_of(&me, work.layers, work.round))
            {
                return None;
            }
            let registered = r
                .receipts
                .iter()
                .filter(|x| self.ledger.was_registered(&x.signer.node_id(), stage))
                .count();
            (self.ledger.was_registered(&me, stage) && registered >= self.cfg.min_receipts)
                .then_some((at, stage))
        })?;
        let info = self.rounds.get_mut(at)?;
        let work = info.work.take()?;
        let mut receipts: Vec<Receipt> = info
            .receipts
            .iter()
            .filter(|x| self.ledger.was_registered(&x.signer.node_id(), stage))
            .take(MAX_RECEIPTS - MAX_WORK_RECEIPTS)
            .copied()
            .collect();
        // Work tallies count only from keys registered for another stage (the ledger judges
        // that when the round settles, by when a signer's registration has arrived), and a
        // signer appears once in a proof.
        let ledger = &self.ledger;
        let vouchers: Vec<_> = receipts.iter().map(|r| r.signer).collect();
        receipts.extend(self.tallies.take(work.round, |t| {
            !ledger.was_registered(&t.signer.node_id(), stage) && !vouchers.contains(&t.signer)
        }));
        let (tokens, batches, claimed_duration_ms) = claim(&work, self.hardware);
        let nonce = self
            .last_nonce
            .map_or(0, |n| n.saturating_add(1))
            .max(now_ms);
        let mut shards = work.shards.clone();
        shards.truncate(MAX_SHARDS);
        let proof = Proof {
            network: self.cfg.network,
            node_id: me,
            public_key: self.identity.public_key(),
            kind: ProofKind::Training,
            round: work.round,
            timestamp_ms: now_ms,
            nonce,
            layers: work.layers,
            roles: work.roles,
            hardware: self.hardware,
            tokens,
            batches,
            shards,
            input_activation_hash: [0; 32],
            output_activation_hash: [0; 32],
            model_hash_before: work.model_hash_before,
            model_hash_after: work.model_hash_after,
            pseudo_gradient_hash: work.pseudo_gradient_hash,
            loss_micros: work.loss_micros,
            claimed_duration_ms,
            receipts,
        };
        let signed = proof.sign(&self.identity);
        let wire = signed.to_bytes();
        let verified = match self.verifier.check_content(&signed, now_ms) {
            Ok(v) => v,
            Err(e) => return Some(Err(e.into())),
        };
        // A round past what the stage's other provers have been paid for, or a first claim of
        // the stage not final yet, waits here as it does elsewhere; it is still gossiped.
        if let super::ProofOutcome::Rejected(reason) = self.apply_claim(&verified, &wire) {
            return Some(Err(EconomyError::OwnRound(reason)));
        }
        self.last_nonce = Some(nonce);
        Some(Ok(wire))
    }

    /// Registers this node for `stage` when it is not registered there and holds the stake
    /// to be. Returns the signed op to gossip; it is applied here at once.
    pub fn register(&mut self, stage: u16, now_ms: u64) -> Option<Result<Vec<u8>, EconomyError>> {
        let me = self.node_id();
        if self.ledger.is_registered(&me, stage)
            || self.ledger.account(&me).stake < self.ledger.rules().min_stake
        {
            return None;
        }
        Some(self.sign_own_op(Action::Register { stage }, now_ms))
    }

    /// Signs `action` on this node's account at its next nonce and applies it here. Returns
    /// the signed op to gossip.
    fn sign_own_op(&mut self, action: Action, now_ms: u64) -> Result<Vec<u8>, EconomyError> {
        let me = self.node_id();
        let op = AccountOp {
            network: self.cfg.network,
            account: me,
            nonce: self.ledger.account(&me).next_nonce,
            timestamp_ms: now_ms,
            action,
        };
        let signed = op.sign(&self.identity);
        let wire = signed.to_bytes();
        verify_op(&signed)
            .map_err(EconomyError::from)
            .and_then(|v| self.apply_op(v).map(|_| wire))
    }

    /// Announces `capacity` once this node is registered for some stage and its ledger does
    /// not hold that announcement already. Returns the signed op to gossip; applied here.
    pub fn announce(
        &mut self,
        capacity: CapacityClaim,
        now_ms: u64,
    ) -> Option<Result<Vec<u8>, EconomyError>> {
        let me = self.node_id();
        let claim = (capacity.memory_bytes, capacity.flops_per_s);
        if capacity.memory_bytes == 0
            || capacity.flops_per_s == 0
            || !self.ledger.has_registered(&me)
            || self.ledger.account(&me).stake < self.ledger.rules().min_stake
            || self.ledger.claim(&me) == Some(claim)
        {
            return None;
        }
        let action = Action::Announce {
            memory_bytes: capacity.memory_bytes,
            flops_per_s: capacity.flops_per_s,
        };
        Some(self.sign_own_op(action, now_ms))
    }
}
