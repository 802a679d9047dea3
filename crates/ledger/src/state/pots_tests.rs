use proptest::prelude::*;

use super::*;
use crate::EpochItem;
use crate::state::tests::verified;
use neuroshard_proof::fixtures::{test_identity, training_proof};
use neuroshard_proof::{Identity, VerifiedProof};

pub(super) const REWARD: u64 = 1_000_000_000;

pub(super) fn fresh() -> LedgerState {
    let genesis = crate::LedgerGenesis::new(crate::Rules::default(), Vec::new()).expect("genesis");
    LedgerState::from_genesis(&genesis).expect("state").0
}

pub(super) fn ids(n: u64) -> Vec<Identity> {
    (0..n).map(|i| test_identity(300 + i)).collect()
}

/// `id`'s training proof of `round` (its nonce), its pseudo-gradient receipted by `witness`.
fn claim(id: &Identity, witness: &Identity, round: u64) -> VerifiedProof {
    claim_by(id, &[witness], round)
}

/// `id`'s training proof of `round`, its pseudo-gradient receipted by each of `witnesses`.
pub(super) fn claim_by(id: &Identity, witnesses: &[&Identity], round: u64) -> VerifiedProof {
    let mut p = training_proof(id, witnesses[0], round, 1_000);
    p.nonce = round;
    p.receipts = witnesses
        .iter()
        .map(|w| {
            neuroshard_proof::Receipt::sign(
                w,
                p.network,
                p.node_id,
                round,
                neuroshard_proof::ReceiptKind::Gradients,
                p.pseudo_gradient_hash,
            )
        })
        .collect();
    let mut v = neuroshard_proof::ProofVerifier::new();
    for w in witnesses {
        v.add_known_node(w.public_key());
    }
    v.verify(&p.sign(id), p.timestamp_ms)
        .expect("fixture proof verifies")
}

/// Applies one finalized epoch holding `proofs`; what it settled.
pub(super) fn epoch(state: &mut LedgerState, proofs: &[VerifiedProof]) -> Vec<RoundSettlement> {
    let items = proofs.iter().cloned().map(EpochItem::Proof).collect();
    let out = crate::apply_epoch(state, items);
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    out.settled
}

/// Ends epochs until something settles; what did.
pub(super) fn settle(state: &mut LedgerState) -> Vec<RoundSettlement> {
    for _ in 0..=SETTLE_EPOCHS {
        let s = epoch(state, &[]);
        if !s.is_empty() {
            return s;
        }
    }
    Vec::new()
}

pub(super) fn balance(state: &LedgerState, id: &Identity) -> u64 {
    state.account(&id.node_id()).balance
}

/// The attack: Sybil keys claim a round beside its honest replicas. Paid per key, each
/// Sybil minted a full reward; split, the round mints the same whatever the number of keys.
#[test]
fn a_round_mints_its_reward_once_however_many_keys_claim_it() {
    let all = ids(5);
    let honest = &all[..2];
    let mut clean = fresh();
    epoch(
        &mut clean,
        &[
            claim(&honest[0], &honest[1], 1),
            claim(&honest[1], &honest[0], 1),
        ],
    );
    assert_eq!(
        clean.minted(),
        0,
        "nothing is paid before the round settles"
    );
    settle(&mut clean);
    assert_eq!(clean.minted(), REWARD);
    assert_eq!(balance(&clean, &honest[0]), REWARD / 2);

    let mut attacked = fresh();
    // Each vouched for by two of the others: a round of five tolerates one Byzantine key,
    // so a share needs two vouchers among the round's contributors.
    let claims: Vec<_> = all
        .iter()
        .enumerate()
        .map(|(i, id)| claim_by(id, &[&all[(i + 1) % 5], &all[(i + 2) % 5]], 1))
        .collect();
    epoch(&mut attacked, &claims);
    let settled = settle(&mut attacked);
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].shares.len(), 5);
    assert_eq!(
        attacked.minted(),
        REWARD,
        "five keys mint one round's reward"
    );
    assert_eq!(balance(&attacked, &honest[0]), REWARD / 5);
    attacked.check_invariants().expect("supply");
}

#[test]
fn a_round_settles_after_its_pot_was_open_the_settling_epochs() {
    let all = ids(2);
    let mut state = fresh();
    epoch(&mut state, &[claim(&all[0], &all[1], 1)]);
    assert_eq!(
        state
            .pot(claim(&all[0], &all[1], 1).proof().layers, 1)
            .len(),
        1
    );
    // The pot opened in epoch 0; a co-replica's proof finalized two epochs later still joins
    // it, and the round settles at the end of that epoch.
    assert!(epoch(&mut state, &[]).is_empty());
    let settled = epoch(&mut state, &[claim(&all[1], &all[0], 1)]);
    assert_eq!(
        settled.len(),
        1,
        "settled at the end of the third epoch since it opened"
    );
    assert_eq!(settled[0].shares.len(), 2);
    assert_eq!(balance(&state, &all[0]), REWARD / 2);
    assert_eq!(balance(&state, &all[1]), REWARD / 2);
    assert_eq!(state.open_pots(), 0);
}

/// A claim of a settled round would take a share of a reward already split, or mint past
/// it: it is recorded (so every live ledger holds the same, whether it came before or after
/// the settlement) and never paid, and it does not reopen the round.
#[test]
fn a_claim_of_a_settled_round_is_never_paid() {
    let all = ids(3);
    let mut state = fresh();
    epoch(
        &mut state,
        &[claim(&all[0], &all[1], 5), claim(&all[1], &all[0], 5)],
    );
    settle(&mut state);
    for round in [5, 3] {
        let late = claim(&all[2], &all[0], round);
        assert!(matches!(state.apply_proof(&late), Ok(Outcome::Applied(_))));
        assert_eq!(state.round_paid(&round_key(late.proof())), Some(0));
        assert!(
            state.pot(late.proof().layers, round).is_empty(),
            "not reopened"
        );
    }
    for _ in 0..=SETTLE_EPOCHS {
        epoch(&mut state, &[]);
    }
    assert_eq!(balance(&state, &all[2]), 0);
    assert_eq!(state.minted(), REWARD);
    // The next round is open.
    let next = claim(&all[2], &all[0], 6);
    assert!(matches!(state.apply_proof(&next), Ok(Outcome::Applied(_))));
    assert_eq!(state.pot(next.proof().layers, 6).len(), 1);
}

/// The attack: two keys claim a round ahead of their stage, vouching for each other, hoping
/// its settlement closes the rounds before it, which the honest replicas have not proved yet.
/// A round settles only once the stage reached it (its certified round: what half of its
/// active provers claimed), so the honest replicas' rounds are paid as they come, and the
/// keys' round only when the stage gets there (then split with the honest replicas, who
/// vouch only for each other).
#[test]
fn keys_claiming_ahead_of_their_stage_close_no_honest_round() {
    let all = ids(5);
    let (honest, sybils) = (&all[..3], &all[3..]);
    let round_of = |r: u64| -> Vec<VerifiedProof> {
        (0..3)
            .map(|i| claim_by(&honest[i], &[&honest[(i + 1) % 3], &honest[(i + 2) % 3]], r))
            .collect()
    };
    let mut state = fresh();
    let mut first = round_of(1);
    first.push(claim(&sybils[0], &sybils[1], 4));
    first.push(claim(&sybils[1], &sybils[0], 4));
    epoch(&mut state, &first);
    for r in 2..=4 {
        let settled = epoch(&mut state, &round_of(r));
        assert!(settled.iter().all(|s| s.round < 4 || r == 4), "{settled:?}");
    }
    for _ in 0..=SETTLE_EPOCHS {
        epoch(&mut state, &[]);
    }
    // Honest rounds 1 to 4 all paid: a third each; the keys' claims of round 4 unvouched.
    assert_eq!(balance(&state, &honest[0]), 4 * (REWARD / 3));
    assert_eq!(balance(&state, &sybils[0]), 0);
    assert_eq!(state.settled_round(first[0].proof().layers), Some(4));
}

/// Rounds settle lowest first, and a pot of a lower round opened later settles with the
/// higher one due (its window closes with the stage's).
#[test]
fn a_stage_settles_every_round_up_to_the_highest_due() {
    let all = ids(2);
    let mut state = fresh();
    epoch(
        &mut state,
        &[claim(&all[0], &all[1], 7), claim(&all[1], &all[0], 7)],
    );
    epoch(
        &mut state,
        &[claim(&all[1], &all[0], 4), claim(&all[0], &all[1], 4)],
    );
    let settled = settle(&mut state);
    let rounds: Vec<u64> = settled.iter().map(|s| s.round).collect();
    assert_eq!(rounds, vec![4, 7]);
    assert_eq!(state.settled_round(settled[0].layers), Some(7));
    assert_eq!(state.minted(), 2 * REWARD);
}

/// A contributor that signed two proofs for its round is paid for neither; the others split
/// the whole reward.
#[test]
fn an_equivocating_contributor_leaves_its_pot() {
    let all = ids(3);
    let mut state = fresh();
    let first = claim(&all[2], &all[0], 1);
    let mut second = training_proof(&all[2], &all[0], 1, 2_000);
    second.nonce = 2;
    let second = verified(&second, &all[2], &all[0]);
    epoch(
        &mut state,
        &[
            claim(&all[0], &all[1], 1),
            claim(&all[1], &all[0], 1),
            first,
            second,
        ],
    );
    let settled = settle(&mut state);
    assert_eq!(settled[0].shares.len(), 2);
    assert_eq!(balance(&state, &all[0]), REWARD / 2);
    assert_eq!(balance(&state, &all[2]), 0);
    state.check_invariants().expect("supply");
    assert!(state.digest_is_consistent());
}

/// The attack: keys that took no part in a round claim it, vouching for each other. A
/// share needs gradient receipts from f + 1 of the round's other contributors (f = 1 of
/// five), so two such keys get nothing and the three honest replicas split the round; a
/// receipt from a registered key that did not claim the round vouches for nothing either.
#[test]
fn claims_vouched_for_by_too_few_of_the_rounds_contributors_are_not_paid() {
    let all = ids(6);
    let (honest, sybils, outsider) = (&all[..3], &all[3..5], &all[5]);
    let mut state = fresh();
    let mut claims: Vec<_> = (0..3)
        .map(|i| claim_by(&honest[i], &[&honest[(i + 1) % 3], &honest[(i + 2) % 3]], 1))
        .collect();
    claims.push(claim(&sybils[0], &sybils[1], 1));
    claims.push(claim(&sybils[1], &sybils[0], 1));
    epoch(&mut state, &claims);
    let settled = settle(&mut state);
    let paid: Vec<NodeId> = settled[0].shares.iter().map(|s| s.node).collect();
    let mut expected: Vec<NodeId> = honest.iter().map(Identity::node_id).collect();
    expected.sort();
    assert_eq!(paid, expected, "the Sybils vouched only for each other");
    assert_eq!(balance(&state, &sybils[0]), 0);
    assert_eq!(balance(&state, &honest[0]), REWARD / 3);

    // Two replicas, one vouched for by a key that did not claim the round.
    let mut state = fresh();
    epoch(
        &mut state,
        &[claim(&all[0], &all[1], 2), claim(&all[1], outsider, 2)],
    );
    let settled = settle(&mut state);
    assert_eq!(settled[0].shares.len(), 1);
    assert_eq!(balance(&state, &all[0]), REWARD);
    assert_eq!(balance(&state, &all[1]), 0);
}

/// A second proof for a round already settled takes its share back (and slashes), on the
/// finalized state as on a live one that followed it.
#[test]
fn an_equivocation_after_its_round_settled_takes_the_share_back() {
    let all = ids(2);
    let mut state = fresh();
    epoch(
        &mut state,
        &[claim(&all[0], &all[1], 1), claim(&all[1], &all[0], 1)],
    );
    settle(&mut state);
    assert_eq!(balance(&state, &all[0]), REWARD / 2);
    let mut second = training_proof(&all[0], &all[1], 1, 2_000);
    second.nonce = 2;
    let second = verified(&second, &all[0], &all[1]);
    assert!(matches!(
        state.apply_proof(&second),
        Ok(Outcome::Applied(_))
    ));
    assert_eq!(balance(&state, &all[0]), 0);
    assert_eq!(state.minted(), REWARD / 2);
    state.check_invariants().expect("supply");
}

/// A live ledger pays exactly the shares finality settled: a proof it applied that no
/// finalized epoch held earns nothing, and two live ledgers that saw the same proofs in
/// other orders end on one state.
#[test]
fn live_ledgers_pay_what_finality_settled_whatever_they_saw_first() {
    let all = ids(3);
    let finalized_claims = [claim(&all[0], &all[1], 1), claim(&all[1], &all[0], 1)];
    let extra = claim(&all[2], &all[0], 1);
    let mut finalized = fresh();
    epoch(&mut finalized, &finalized_claims);
    settle(&mut finalized);

    let mut a = fresh();
    let mut b = fresh();
    for p in finalized_claims.iter().chain([&extra]) {
        a.apply_proof(p).expect("a");
    }
    for p in [&extra].into_iter().chain(finalized_claims.iter().rev()) {
        b.apply_proof(p).expect("b");
    }
    assert_eq!(a.minted(), 0, "a live ledger settles nothing itself");
    let paid = a.follow_settlements(&finalized).expect("follow");
    assert_eq!(paid.len(), 1);
    b.follow_settlements(&finalized).expect("follow");
    assert_eq!(a.state_hash(), b.state_hash());
    for id in &all {
        assert_eq!(balance(&a, id), balance(&finalized, id));
    }
    assert_eq!(balance(&a, &all[2]), 0, "unfinalized, unpaid");
    // Following again pays nothing twice.
    assert!(a.follow_settlements(&finalized).expect("again").is_empty());
    assert_eq!(a.minted(), REWARD);
    assert!(a.digest_is_consistent());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Claims of several rounds by several keys, finalized over several epochs: the round
    /// rewards minted never exceed one reward per round claimed, every ledger that follows
    /// the finalized state ends on one state, and supply is conserved.
    #[test]
    fn settlement_is_order_independent_and_mints_one_reward_per_round(
        claims in proptest::collection::vec((0u64..4, 1u64..6, 0usize..3), 1..24),
        seed in any::<u64>(),
    ) {
        let keys = ids(4);
        let proofs: Vec<(usize, VerifiedProof)> = claims
            .iter()
            .map(|&(k, round, at)| {
                let witness = &keys[((k + 1) % 4) as usize];
                (at, claim(&keys[k as usize], witness, round))
            })
            .collect();
        let mut finalized = fresh();
        for at in 0..3 {
            let these: Vec<_> = proofs
                .iter()
                .filter(|(e, _)| *e == at)
                .map(|(_, p)| p.clone())
                .collect();
            let items = these.into_iter().map(EpochItem::Proof).collect();
            crate::apply_epoch(&mut finalized, items);
        }
        for _ in 0..=SETTLE_EPOCHS {
            crate::apply_epoch(&mut finalized, Vec::new());
        }
        let rounds: BTreeSet<u64> = claims.iter().map(|c| c.1).collect();
        prop_assert!(finalized.minted() <= REWARD * rounds.len() as u64);
        prop_assert!(finalized.check_invariants().is_ok());

        let mut live: Vec<LedgerState> = Vec::new();
        for turn in 0..2u64 {
            let mut order: Vec<&VerifiedProof> = proofs.iter().map(|(_, p)| p).collect();
            let mut x = seed.wrapping_add(turn);
            for i in (1..order.len()).rev() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(i, (x >> 33) as usize % (i + 1));
            }
            let mut state = fresh();
            for p in order {
                let _ = state.apply_proof(p);
            }
            state.follow_settlements(&finalized).expect("follow");
            prop_assert!(state.check_invariants().is_ok());
            prop_assert!(state.digest_is_consistent());
            live.push(state);
        }
        prop_assert_eq!(live[0].state_hash(), live[1].state_hash());
        for id in &keys {
            prop_assert_eq!(balance(&live[0], id), balance(&finalized, id));
        }
    }
}
