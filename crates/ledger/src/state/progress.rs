//! How far each stage has got: the rounds a training proof may claim.
//!
//! A round is paid once per (node, stage, round), but nothing else tied a claimed round to
//! the stage's real progress: two staked keys of one stage could receipt each other's proofs
//! for every round up to the founding's time bound (`Rules::min_round_ms`, four a second by
//! default) and be paid for all of them at once. Now a proof may claim at most
//! `Rules::round_lead` rounds past the stage's *certified round*: the highest round that at
//! least half of the stage's recently active provers (paid in the last [`ACTIVE_EPOCHS`]
//! finalized epochs) have been paid for. Keys that are fewer
//! than half of a stage's active provers cannot move it, so they are paid for the rounds the
//! stage really reached, as an honest replica is, and no more.
//!
//! Derived from the paid proofs (their layers and round) and the epochs ended, and so not part
//! of the state hash. Only a finalized state judges by it (`LedgerState::check_round_rules`,
//! which epochs apply); a finalized state is rebuilt by replaying its epochs, and a live
//! ledger judges claims by its node's finalized progress (`node/src/economy/floor.rs`).

use std::collections::BTreeMap;

use neuroshard_proof::{LayerRange, NodeId, Proof, ProofKind, VerifiedProof};

use super::{LedgerError, LedgerState, round_key};

/// A prover counts toward its stage's certified round while it was paid in the last this many
/// epochs of the finalized state (10 minutes at the default 10-s epochs): replicas that left,
/// moved to another stage or stopped stop holding the stage back once that many epochs have
/// passed, whatever the stage does meanwhile. Counted in finalized epochs, not signed times:
/// epochs go on without any proof of the stage (a clock taken from the stage's own paid proofs
/// stops with them, and its survivors' proofs then wait for good), and no prover can move them
/// by dating its proofs. A state that never ends an epoch (a live ledger, tests) counts every
/// prover.
pub const ACTIVE_EPOCHS: u64 = 60;

/// One prover's paid rounds of a stage: the first one paid (never lowered: the round floor
/// is measured from it, and a floor that followed the lowest paid round would walk down
/// `round_lead` rounds an epoch), the highest, and the epoch it was last paid in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Latest {
    first: u64,
    round: u64,
    epoch: u64,
}

/// Per stage (named by its layers, as round keys name it), each prover's first and latest
/// paid rounds: what a live ledger copies from the finalized state to judge claims by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageProgress {
    stages: BTreeMap<(u32, u32), BTreeMap<NodeId, Latest>>,
    /// Epochs ended (a finalized state's epoch).
    epoch: u64,
}

pub(super) fn stage_key(layers: LayerRange) -> (u32, u32) {
    (layers.start, layers.end)
}

impl StageProgress {
    /// Counts a paid training proof.
    pub(super) fn note(&mut self, proof: &Proof) {
        let e = self
            .stages
            .entry(stage_key(proof.layers))
            .or_default()
            .entry(proof.node_id)
            .or_insert(Latest {
                first: proof.round,
                round: proof.round,
                epoch: self.epoch,
            });
        e.round = e.round.max(proof.round);
        e.epoch = self.epoch;
    }

    /// Epochs ended (of a finalized state; 0 for a live one).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Ends an epoch of a finalized state.
    pub(super) fn end_epoch(&mut self) {
        self.epoch = self.epoch.saturating_add(1);
    }

    fn is_active(&self, l: &Latest) -> bool {
        self.within(l, ACTIVE_EPOCHS)
    }

    fn within(&self, l: &Latest, epochs: u64) -> bool {
        l.epoch.saturating_add(epochs) >= self.epoch
    }

    /// The provers of `layers` paid in the last `epochs` epochs (every prover the stage ever
    /// paid, in a state that never ends an epoch).
    pub fn active_within(
        &self,
        layers: LayerRange,
        epochs: u64,
    ) -> impl Iterator<Item = NodeId> + '_ {
        self.stages
            .get(&stage_key(layers))
            .into_iter()
            .flatten()
            .filter(move |(_, l)| self.within(l, epochs))
            .map(|(n, _)| *n)
    }

    /// The round of `node`'s first paid proof of `layers`.
    pub fn first(&self, node: &NodeId, layers: LayerRange) -> Option<u64> {
        Some(self.stages.get(&stage_key(layers))?.get(node)?.first)
    }

    /// The highest round that at least half of the provers of `layers` active now (paid in
    /// the last [`ACTIVE_EPOCHS`] epochs) have been paid for; when none is active, the highest
    /// any was paid for; `None` for a stage no one was paid in. With
    /// an odd count that is a majority, with an even one half: the median, rounded up, so that
    /// of two replicas the one ahead is not held back by one that stopped.
    pub fn certified(&self, layers: LayerRange) -> Option<u64> {
        let provers = self.stages.get(&stage_key(layers))?;
        let mut rounds: Vec<u64> = provers
            .values()
            .filter(|l| self.is_active(l))
            .map(|l| l.round)
            .collect();
        // A stage no one was paid in for that long (its replicas stopped, or are all held
        // back) starts again from where it got, not from round 0: else its next claims, far
        // past the lead, would wait for good.
        if rounds.is_empty() {
            return provers.values().map(|l| l.round).max();
        }
        rounds.sort_unstable_by(|a, b| b.cmp(a));
        let last = rounds.len().checked_sub(1)?;
        rounds.get(last / 2).copied()
    }
}

impl StageProgress {
    /// The round rules for a training claim under `lead` (none without one): at most `lead`
    /// rounds past its stage's certified round, and not long gone, that is a key's first claim
    /// of a stage at most `lead` behind the certified round and each later one at most `lead`
    /// before that first one. Without the floor, two keys registering in a stage that ran a
    /// million rounds could receipt each other's claims of every one.
    pub fn check(&self, proof: &Proof, lead: u64) -> Result<(), LedgerError> {
        if lead == 0 || proof.kind != ProofKind::Training {
            return Ok(());
        }
        let certified = self.certified(proof.layers);
        if proof.round > certified.unwrap_or(0).saturating_add(lead) {
            return Err(LedgerError::RoundUncertified {
                round: proof.round,
                certified,
                lead,
            });
        }
        let floor = match self.first(&proof.node_id, proof.layers) {
            Some(first) => first.saturating_sub(lead),
            None => certified.map_or(0, |c| c.saturating_sub(lead)),
        };
        if proof.round < floor {
            return Err(LedgerError::RoundBehind {
                round: proof.round,
                floor,
            });
        }
        Ok(())
    }
}

impl LedgerState {
    /// Each stage's progress (what the round rules are judged by).
    pub fn progress(&self) -> &StageProgress {
        &self.progress
    }

    /// The certified round of the stage holding `layers` (see the module docs).
    pub fn certified_round(&self, layers: LayerRange) -> Option<u64> {
        self.progress.certified(layers)
    }

    /// The round of `node`'s first paid proof of `layers` (in the finalized state, where an
    /// epoch pays a key's claims lowest first, the lowest of its first epoch).
    pub fn first_paid_round(&self, node: &NodeId, layers: LayerRange) -> Option<u64> {
        self.progress.first(node, layers)
    }

    /// The round rules ([`StageProgress::check`]) for `proof`, as an epoch applies them: in
    /// one order on every node (a live ledger judges them by its node's finalized state,
    /// since which proofs reached it first depends on arrival order). A proof of a round
    /// already paid or void is left to `apply_proof`, which settles it as a duplicate or an
    /// equivocation.
    pub fn check_round_rules(&self, proof: &VerifiedProof) -> Result<(), LedgerError> {
        let p = proof.proof();
        if self.has_proof(&proof.hash())
            || (p.kind == ProofKind::Training && self.round_claimed(&round_key(p)))
        {
            return Ok(());
        }
        self.progress.check(p, self.rules.round_lead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::ACTIVE_EPOCHS;
    use crate::state::{LedgerError, Outcome};
    use neuroshard_proof::fixtures::{test_identity, training_proof};

    const STAGE: LayerRange = LayerRange { start: 0, end: 4 };
    /// The layers the fixtures' training proofs claim.
    const FIXTURES: LayerRange = LayerRange { start: 4, end: 8 };

    fn noted(p: &mut StageProgress, who: u64, round: u64) {
        let id = test_identity(who);
        let mut proof = training_proof(&id, &id, round, 0);
        proof.layers = STAGE;
        p.note(&proof);
    }

    #[test]
    fn the_certified_round_is_what_half_the_active_provers_reached() {
        let mut p = StageProgress::default();
        assert_eq!(p.certified(STAGE), None);
        noted(&mut p, 1, 10);
        assert_eq!(p.certified(STAGE), Some(10), "a lone prover");
        noted(&mut p, 2, 12);
        assert_eq!(p.certified(STAGE), Some(12), "of two, the one ahead");
        noted(&mut p, 3, 11);
        assert_eq!(p.certified(STAGE), Some(11), "of three, the median");
        // Two provers far ahead among five: three are not, so they decide.
        noted(&mut p, 4, 1_000);
        noted(&mut p, 5, 2_000);
        assert_eq!(p.certified(STAGE), Some(12));
        // Another stage is another count.
        let other = LayerRange { start: 4, end: 8 };
        assert_eq!(p.certified(other), None);
    }

    #[test]
    fn provers_that_stopped_stop_counting_and_a_prover_never_goes_back() {
        let mut p = StageProgress::default();
        noted(&mut p, 1, 5);
        noted(&mut p, 2, 5);
        noted(&mut p, 3, 40);
        for _ in 0..ACTIVE_EPOCHS {
            p.end_epoch();
        }
        assert_eq!(p.certified(STAGE), Some(5));
        noted(&mut p, 3, 41);
        p.end_epoch();
        assert_eq!(p.certified(STAGE), Some(41), "1 and 2 left");
        noted(&mut p, 3, 7);
        assert_eq!(p.certified(STAGE), Some(41), "a lower round later");
    }

    #[test]
    fn the_active_provers_are_those_paid_in_the_window() {
        let mut p = StageProgress::default();
        noted(&mut p, 1, 5);
        noted(&mut p, 2, 5);
        let all: Vec<NodeId> = p.active_within(STAGE, 0).collect();
        assert_eq!(
            all.len(),
            2,
            "a state that never ended an epoch counts everyone"
        );
        for _ in 0..12 {
            p.end_epoch();
        }
        noted(&mut p, 3, 6);
        p.end_epoch();
        assert_eq!(p.active_within(STAGE, 13).count(), 3);
        let active: Vec<NodeId> = p.active_within(STAGE, 12).collect();
        assert_eq!(active, vec![test_identity(3).node_id()]);
        assert_eq!(p.active_within(FIXTURES, 100).count(), 0, "another stage");
    }

    /// Two of a stage's three replicas stop (they moved, or left): the survivor's rounds past
    /// the lead wait only until the two stop counting, epochs later, even though no proof of
    /// the stage is paid meanwhile; then the survivor's held rounds climb, an epoch at a time.
    #[test]
    fn a_stage_most_of_whose_provers_stopped_pays_its_survivor_again() {
        let (mut state, ids) = stage_at_ten();
        let survivor = &ids[0];
        let claims: Vec<_> = (11..=60)
            .map(|r| crate::EpochItem::Proof(proof(survivor, &ids[1], r, 3_000)))
            .collect();
        let out = crate::apply_epoch(&mut state, claims.clone());
        assert_eq!(out.applied, 8, "rounds 11 to 18");
        for _ in 0..ACTIVE_EPOCHS {
            crate::apply_epoch(&mut state, Vec::new());
        }
        let out = crate::apply_epoch(&mut state, claims);
        assert_eq!(
            out.applied, 50,
            "the rest, climbing the lead a proof at a time"
        );
        assert!(out.refused.is_empty());
        assert_eq!(state.certified_round(FIXTURES), Some(60));
    }

    /// A ledger with a round lead of 8 where three replicas proved rounds 1 to 10 of stage
    /// 4..8 (the fixtures' layers); the ids: three honest, then two Sybils.
    fn stage_at_ten() -> (LedgerState, Vec<neuroshard_proof::Identity>) {
        let rules = crate::Rules {
            round_lead: 8,
            ..crate::Rules::default()
        };
        let genesis = crate::LedgerGenesis::new(rules, Vec::new()).expect("genesis");
        let (mut state, _) = LedgerState::from_genesis(&genesis).expect("state");
        let ids: Vec<_> = (0..5).map(|i| test_identity(200 + i)).collect();
        for round in 1..=10 {
            for id in &ids[..3] {
                let p = proof(id, &ids[4], round, 1_000);
                assert!(state.apply_proof(&p).is_ok(), "honest round {round}");
            }
        }
        (state, ids)
    }

    /// `id`'s training proof of `round`, receipted by `witness`, run through a verifier.
    fn proof(
        id: &neuroshard_proof::Identity,
        witness: &neuroshard_proof::Identity,
        round: u64,
        at_ms: u64,
    ) -> neuroshard_proof::VerifiedProof {
        let mut p = training_proof(id, witness, round, at_ms);
        p.nonce = round;
        super::super::tests::verified(&p, id, witness)
    }

    /// What an epoch does with one claim: the round rules, then the ledger.
    fn claim(
        state: &mut LedgerState,
        p: &neuroshard_proof::VerifiedProof,
    ) -> Result<Outcome, LedgerError> {
        state.check_round_rules(p)?;
        state.apply_proof(p)
    }

    /// Two staked keys of a stage receipting each other's proofs were paid for every round
    /// the founding's time bound allowed; now for no round more than the lead past what the
    /// three honest replicas reached, and what they do pay for counts toward nothing.
    #[test]
    fn two_keys_cannot_claim_rounds_their_stage_did_not_reach() {
        let (mut state, ids) = stage_at_ten();
        let (s1, s2) = (&ids[3], &ids[4]);
        let far = proof(s1, s2, 500, 2_000);
        match claim(&mut state, &far) {
            Err(LedgerError::RoundUncertified {
                round: 500,
                certified: Some(10),
                lead: 8,
            }) => {}
            other => panic!("round 500 was {other:?}"),
        }
        assert_eq!(state.account(&s1.node_id()).balance, 0);
        let near = proof(s1, s2, 18, 2_000);
        assert!(matches!(claim(&mut state, &near), Ok(Outcome::Applied(_))));
        // The Sybils are two of five: their rounds do not move the certified round.
        let next = proof(s2, s1, 18, 2_000);
        assert!(matches!(claim(&mut state, &next), Ok(Outcome::Applied(_))));
        assert_eq!(state.certified_round(FIXTURES), Some(10));
        let beyond = proof(s1, s2, 19, 2_000);
        assert!(matches!(
            claim(&mut state, &beyond),
            Err(LedgerError::RoundUncertified { .. })
        ));
        // The honest replicas go on, and the Sybils' bound with them.
        for id in &ids[..2] {
            let p = proof(id, s1, 11, 3_000);
            assert!(claim(&mut state, &p).is_ok());
        }
        assert!(claim(&mut state, &beyond).is_ok());
    }

    /// In an epoch, proofs apply in the order of their ids, not of their rounds: a round the
    /// epoch's other proofs certify is paid whatever sorts first, and the Sybils' far round is
    /// not, the same on every node.
    #[test]
    fn an_epoch_pays_the_rounds_its_own_proofs_certify_and_no_further() {
        let (base, ids) = stage_at_ten();
        let mut items = Vec::new();
        for round in 11..=40 {
            for id in &ids[..3] {
                let p = proof(id, &ids[4], round, 5_000);
                items.push(crate::EpochItem::Proof(p));
            }
        }
        let (s1, s2) = (&ids[3], &ids[4]);
        let far = proof(s1, s2, 100, 5_000);
        items.push(crate::EpochItem::Proof(far.clone()));
        let mut state = base.clone();
        let out = crate::apply_epoch(&mut state, items.clone());
        assert_eq!(out.applied, 90, "every honest round is paid");
        assert_eq!(out.refused.len(), 1);
        assert_eq!(out.refused[0].0, far.hash());
        assert_eq!(state.certified_round(FIXTURES), Some(40));
        items.reverse();
        let mut again = base;
        assert_eq!(crate::apply_epoch(&mut again, items).state, out.state);
    }

    /// Two keys registering in a stage at round 10 claim its rounds 1 to 10, which it ran
    /// before them: the finalized state's floor refuses a first claim more than the lead
    /// behind the stage, and any later one more than the lead before the key's first.
    #[test]
    fn a_newcomer_cannot_claim_the_rounds_its_stage_ran_before_it_came() {
        let (mut state, ids) = stage_at_ten();
        let (s1, s2) = (&ids[3], &ids[4]);
        let floor =
            |state: &LedgerState, round| state.check_round_rules(&proof(s1, s2, round, 2_000));
        assert_eq!(
            floor(&state, 1),
            Err(LedgerError::RoundBehind { round: 1, floor: 2 })
        );
        assert_eq!(floor(&state, 2), Ok(()));
        assert!(state.apply_proof(&proof(s1, s2, 9, 2_000)).is_ok());
        assert_eq!(state.first_paid_round(&s1.node_id(), FIXTURES), Some(9));
        assert_eq!(floor(&state, 1), Ok(()), "the lead before its first claim");
        // Paid for round 1, its floor stays the lead before round 9: it cannot walk down.
        assert!(state.apply_proof(&proof(s1, s2, 1, 2_000)).is_ok());
        assert_eq!(state.first_paid_round(&s1.node_id(), FIXTURES), Some(9));
        assert_eq!(
            floor(&state, 0),
            Err(LedgerError::RoundBehind { round: 0, floor: 1 })
        );
        // An epoch applies a key's claims lowest round first, so its first claim is the one
        // judged against the stage: of rounds 1 to 10, only 1 is too far behind.
        let mut items: Vec<_> = (1..=10)
            .map(|r| crate::EpochItem::Proof(proof(s2, s1, r, 2_000)))
            .collect();
        items.reverse();
        let (base, _) = stage_at_ten();
        let mut epoch = base.clone();
        let out = crate::apply_epoch(&mut epoch, items);
        assert_eq!(out.applied, 9, "rounds 2 to 10");
        assert_eq!(out.refused.len(), 1);
        // With no lead set, nothing is judged.
        let rules = crate::Rules::default();
        let genesis = crate::LedgerGenesis::new(rules, Vec::new()).expect("genesis");
        let (open, _) = LedgerState::from_genesis(&genesis).expect("state");
        assert_eq!(open.check_round_rules(&proof(s1, s2, 0, 2_000)), Ok(()));
    }
}
