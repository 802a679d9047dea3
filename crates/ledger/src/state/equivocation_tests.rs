use proptest::prelude::*;
use rand::{SeedableRng, seq::SliceRandom};

use super::super::tests::{DAY, T0, op, slash, verified, world};
use super::*;
use neuroshard_proof::Identity;
use neuroshard_proof::fixtures::{test_identity, uptime_proof};

/// Two different uptime proofs of `cheat` at `nonce` (the second claims a longer uptime, so it
/// would earn more).
fn pair(cheat: &Identity, witness: &Identity, nonce: u64) -> (VerifiedProof, VerifiedProof) {
    let a = uptime_proof(cheat, nonce, T0);
    let mut b = a.clone();
    b.claimed_duration_ms += 5_000;
    (verified(&a, cheat, witness), verified(&b, cheat, witness))
}

/// A ledger where `cheat` earned a few honest rewards and staked them.
fn staked_ledger(cheat: &Identity, witness: &Identity) -> LedgerState {
    let mut s = LedgerState::new();
    for nonce in 0..4 {
        let p = verified(&uptime_proof(cheat, nonce, T0), cheat, witness);
        assert!(matches!(s.apply_proof(&p), Ok(Outcome::Applied(_))));
    }
    let amount = s.account(&cheat.node_id()).balance;
    let stake = op(
        cheat,
        0,
        T0,
        Action::Stake {
            amount,
            unlock_at_ms: T0 + DAY,
        },
    );
    assert!(s.apply_op(stake).is_ok());
    s
}

#[test]
fn an_equivocation_pays_neither_proof_and_slashes_alike_in_either_order() {
    let (cheat, witness) = (test_identity(1), test_identity(2));
    let base = staked_ledger(&cheat, &witness);
    let stake = base.account(&cheat.node_id()).stake;
    let (a, b) = pair(&cheat, &witness, 9);
    let mut ab = base.clone();
    let mut ba = base.clone();
    for (state, first, second) in [(&mut ab, &a, &b), (&mut ba, &b, &a)] {
        assert!(matches!(state.apply_proof(first), Ok(Outcome::Applied(_))));
        assert!(state.account(&cheat.node_id()).balance > 0, "first is paid");
        let Ok(Outcome::Applied(changes)) = state.apply_proof(second) else {
            panic!("the second proof settles the equivocation");
        };
        assert!(
            changes
                .records
                .iter()
                .any(|r| matches!(r, Record::Equivocation { nonce: 9, .. })),
            "{changes:?}"
        );
        assert_eq!(state.check_invariants(), Ok(()));
        assert!(state.digest_is_consistent());
    }
    // Whichever came first, the ledgers are one: nothing paid, half the stake burned.
    assert_eq!(ab.state_hash(), ba.state_hash());
    let cheat_account = ab.account(&cheat.node_id());
    assert_eq!(cheat_account.balance, 0);
    assert_eq!(cheat_account.stake, stake - bps_of(stake, SLASH_STAKE_BPS));
    assert_eq!(ab.minted(), base.minted());
    // Re-delivering either proof changes nothing; a third proof at the nonce is refused.
    let before = ab.state_hash();
    assert_eq!(ab.apply_proof(&a), Ok(Outcome::Duplicate));
    assert_eq!(ab.apply_proof(&b), Ok(Outcome::Duplicate));
    let mut c = uptime_proof(&cheat, 9, T0);
    c.claimed_duration_ms += 9_000;
    assert_eq!(
        ab.apply_proof(&verified(&c, &cheat, &witness)),
        Err(LedgerError::ProofNonceConflict {
            node: cheat.node_id(),
            nonce: 9
        })
    );
    assert_eq!(ab.state_hash(), before);
}

#[test]
fn a_spent_reward_is_taken_back_from_the_stake() {
    let (cheat, witness) = (test_identity(3), test_identity(4));
    let mut s = staked_ledger(&cheat, &witness);
    let (a, b) = pair(&cheat, &witness, 9);
    assert!(s.apply_proof(&a).is_ok());
    let reward = s.account(&cheat.node_id()).balance;
    // The reward leaves the account before the second proof arrives.
    let spend = op(
        &cheat,
        1,
        T0,
        Action::Transfer {
            to: witness.node_id(),
            amount: reward,
        },
    );
    assert!(s.apply_op(spend).is_ok());
    let stake = s.account(&cheat.node_id()).stake;
    assert!(s.apply_proof(&b).is_ok());
    let left = stake - reward;
    assert_eq!(
        s.account(&cheat.node_id()).stake,
        left - bps_of(left, SLASH_STAKE_BPS)
    );
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn a_slash_of_a_settled_equivocation_is_a_duplicate() {
    let (cheat, witness, reporter) = (test_identity(5), test_identity(6), test_identity(7));
    let mut s = staked_ledger(&cheat, &witness);
    let a = uptime_proof(&cheat, 9, T0);
    let mut b = a.clone();
    b.claimed_duration_ms += 5_000;
    assert!(s.apply_proof(&verified(&a, &cheat, &witness)).is_ok());
    assert!(s.apply_proof(&verified(&b, &cheat, &witness)).is_ok());
    let slash = crate::ops::VerifiedSlash {
        offender: cheat.node_id(),
        nonce: 9,
        reporter: reporter.node_id(),
        evidence_hash: super::evidence_hash(
            &a.sign(&cheat).payload_hash(),
            &b.sign(&cheat).payload_hash(),
        ),
        timestamp_ms: T0,
    };
    // A slash at the slot the ledger settled: the stake is not taken twice.
    let before = s.state_hash();
    assert_eq!(s.apply_slash(&slash), Ok(Outcome::Duplicate));
    assert_eq!(s.state_hash(), before);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Honest proofs and equivocating pairs from a few nodes, delivered in any order: every
    /// ledger ends on one state hash, supply is conserved and the digest is consistent.
    #[test]
    fn equivocations_in_any_order_give_one_state(
        proofs in prop::collection::vec((0..3usize, 0..6u64, any::<bool>()), 1..24),
        seed in any::<u64>(),
    ) {
        let ids: Vec<Identity> = (0..3).map(|i| test_identity(20 + i)).collect();
        let witness = test_identity(30);
        let mut msgs = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (who, nonce, twin) in proofs {
            if !seen.insert((who, nonce)) {
                continue;
            }
            let (a, b) = pair(&ids[who], &witness, nonce);
            msgs.push(a);
            if twin {
                msgs.push(b);
            }
        }
        let mut forward = LedgerState::new();
        for p in &msgs {
            prop_assert!(forward.apply_proof(p).is_ok());
            prop_assert_eq!(forward.check_invariants(), Ok(()));
        }
        msgs.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        let mut shuffled = LedgerState::new();
        for p in &msgs {
            prop_assert!(shuffled.apply_proof(p).is_ok());
        }
        prop_assert_eq!(forward.state_hash(), shuffled.state_hash());
        prop_assert!(shuffled.digest_is_consistent());
        prop_assert_eq!(shuffled.check_invariants(), Ok(()));
    }
}

/// Training proofs are paid by (node, stage, round): two different proofs for one round are
/// an equivocation whatever their nonces, settled alike in either order.
#[test]
fn two_training_proofs_for_one_round_pay_neither_in_either_order() {
    use neuroshard_proof::fixtures::training_proof;
    let (cheat, witness) = (test_identity(8), test_identity(9));
    let base = staked_ledger(&cheat, &witness);
    let stake = base.account(&cheat.node_id()).stake;
    let a = training_proof(&cheat, &witness, 2, T0);
    let mut b = a.clone();
    b.nonce += 1;
    b.tokens /= 2;
    let (a, b) = (
        verified(&a, &cheat, &witness),
        verified(&b, &cheat, &witness),
    );
    let mut ab = base.clone();
    let mut ba = base.clone();
    for (state, first, second) in [(&mut ab, &a, &b), (&mut ba, &b, &a)] {
        assert!(matches!(state.apply_proof(first), Ok(Outcome::Applied(_))));
        assert!(matches!(state.apply_proof(second), Ok(Outcome::Applied(_))));
        assert_eq!(state.check_invariants(), Ok(()));
        assert!(state.digest_is_consistent());
    }
    assert_eq!(ab.state_hash(), ba.state_hash());
    let account = ab.account(&cheat.node_id());
    assert_eq!(account.balance, 0);
    assert_eq!(account.stake, stake - bps_of(stake, SLASH_STAKE_BPS));
    assert!(
        ab.pot(a.proof().layers, 2).is_empty(),
        "out of its round's pot"
    );
    // Other rounds of the same node still count.
    let next = verified(&training_proof(&cheat, &witness, 3, T0), &cheat, &witness);
    assert!(matches!(ab.apply_proof(&next), Ok(Outcome::Applied(_))));
    assert_eq!(ab.pot(a.proof().layers, 3).len(), 1);
}

#[test]
fn slash_pays_reporter_and_burns_the_rest() {
    let mut w = world(2, 4);
    let (cheat, reporter) = (&w.ids[0], &w.ids[1]);
    let stake = w.state.account(&cheat.node_id()).balance;
    let s = op(
        cheat,
        0,
        T0,
        Action::Stake {
            amount: stake,
            unlock_at_ms: T0 + DAY,
        },
    );
    assert!(w.state.apply_op(s).is_ok());
    let rep_before = w.state.account(&reporter.node_id()).balance;
    let burned_before = w.state.burned();
    let evidence = slash(cheat, reporter, 77);
    assert!(matches!(
        w.state.apply_slash(&evidence),
        Ok(Outcome::Applied(_))
    ));
    let taken = bps_of(stake, SLASH_STAKE_BPS);
    let paid = bps_of(taken, SLASH_REPORTER_BPS);
    assert_eq!(w.state.account(&cheat.node_id()).stake, stake - taken);
    assert_eq!(
        w.state.account(&reporter.node_id()).balance,
        rep_before + paid
    );
    assert_eq!(w.state.burned(), burned_before + taken - paid);
    assert_eq!(w.state.apply_slash(&evidence), Ok(Outcome::Duplicate));
    assert_eq!(w.state.check_invariants(), Ok(()));
}

/// A cheat signs three proofs for one nonce and shows each ledger a different pair (and a
/// third ledger all three): every ledger ends on one state. Recorded under the pair's hash,
/// the settled slot differed from ledger to ledger and split them for good.
#[test]
fn three_proofs_for_one_slot_shown_in_different_pairs_settle_alike() {
    let (cheat, witness) = (test_identity(11), test_identity(12));
    let base = staked_ledger(&cheat, &witness);
    let p = uptime_proof(&cheat, 9, T0);
    let proofs: Vec<VerifiedProof> = (0..3)
        .map(|i| {
            let mut q = p.clone();
            q.claimed_duration_ms += 1_000 * i;
            verified(&q, &cheat, &witness)
        })
        .collect();
    let mut hashes = Vec::new();
    for seen in [&[0, 1][..], &[1, 2], &[2, 0], &[0, 1, 2], &[2, 1, 0]] {
        let mut state = base.clone();
        for &i in seen {
            let _ = state.apply_proof(&proofs[i]);
        }
        assert_eq!(state.check_invariants(), Ok(()));
        assert!(state.digest_is_consistent());
        hashes.push(state.state_hash());
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
    // The same holds for training proofs, which are paid by round.
    use neuroshard_proof::fixtures::training_proof;
    let t = training_proof(&cheat, &witness, 2, T0);
    let rounds: Vec<VerifiedProof> = (0..3u64)
        .map(|i| {
            let mut q = t.clone();
            q.nonce += i;
            verified(&q, &cheat, &witness)
        })
        .collect();
    let mut hashes = Vec::new();
    for seen in [&[0, 1][..], &[1, 2], &[2, 0]] {
        let mut state = base.clone();
        for &i in seen {
            let _ = state.apply_proof(&rounds[i]);
        }
        hashes.push(state.state_hash());
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
}
