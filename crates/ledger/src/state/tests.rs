use proptest::prelude::*;

use super::*;
use crate::amount::UNITS_PER_NEURO;
use crate::ops::{AccountOp, verify_op};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::{Identity, Proof, ProofVerifier, Signed, SignedProof};

pub(super) const T0: u64 = 1_800_000_000_000;
pub(super) const DAY: u64 = 24 * 60 * 60 * 1000;

/// Signs `proof` as `prover` and runs it through a fresh verifier at its own timestamp.
pub(super) fn verified(proof: &Proof, prover: &Identity, neighbour: &Identity) -> VerifiedProof {
    let mut v = ProofVerifier::new();
    v.add_known_node(neighbour.public_key());
    let signed = proof.sign(prover);
    match v.verify(&signed, proof.timestamp_ms) {
        Ok(p) => p,
        Err(e) => panic!("fixture proof must verify: {e}"),
    }
}

pub(super) fn op(id: &Identity, nonce: u64, timestamp_ms: u64, action: Action) -> VerifiedOp {
    let signed = AccountOp {
        network: [0; 32],
        account: id.node_id(),
        nonce,
        timestamp_ms,
        action,
    }
    .sign(id);
    match verify_op(&signed) {
        Ok(o) => o,
        Err(e) => panic!("fixture op must verify: {e}"),
    }
}

/// A slash of `cheat` at `nonce` reported by `reporter` (what consensus double-sign evidence
/// makes), its evidence the hash of two conflicting proofs.
pub(super) fn slash(cheat: &Identity, reporter: &Identity, nonce: u64) -> VerifiedSlash {
    let a = uptime_proof(cheat, nonce, T0);
    let mut b = a.clone();
    b.claimed_duration_ms += 1;
    VerifiedSlash {
        offender: cheat.node_id(),
        nonce,
        reporter: reporter.node_id(),
        evidence_hash: evidence_hash(&a.sign(cheat).payload_hash(), &b.sign(cheat).payload_hash()),
        timestamp_ms: T0,
    }
}

pub(super) struct World {
    pub(super) ids: Vec<Identity>,
    pub(super) neighbour: Identity,
    pub(super) state: LedgerState,
}

/// A ledger where every identity earned `proofs` uptime rewards.
pub(super) fn world(n: u64, proofs: u64) -> World {
    let ids: Vec<Identity> = (0..n).map(|i| test_identity(100 + i)).collect();
    let neighbour = test_identity(99);
    let mut state = LedgerState::new();
    for id in &ids {
        for nonce in 0..proofs {
            let p = verified(&uptime_proof(id, nonce, T0), id, &neighbour);
            assert!(matches!(state.apply_proof(&p), Ok(Outcome::Applied(_))));
        }
    }
    World {
        ids,
        neighbour,
        state,
    }
}

#[test]
fn proof_reward_is_credited_once() {
    let mut w = world(1, 0);
    let id = &w.ids[0];
    let p = verified(&training_proof(id, &w.neighbour, 1, T0), id, &w.neighbour);
    assert!(matches!(w.state.apply_proof(&p), Ok(Outcome::Applied(_))));
    // Counted in its round's pot; paid when a finalized epoch settles it (`pots`).
    assert_eq!(w.state.pot(p.proof().layers, 1).len(), 1);
    let before = w.state.state_hash();
    assert_eq!(w.state.apply_proof(&p), Ok(Outcome::Duplicate));
    assert_eq!(w.state.state_hash(), before);
    // Another proof for the same round, with a fresh nonce and a bigger claim: not paid again
    // (an equivocation: the first reward is taken back, see `equivocation`), and the round
    // pays nothing after.
    let mut other = training_proof(id, &w.neighbour, 1, T0);
    other.nonce = 2;
    other.batches *= 4;
    other.tokens *= 4;
    let conflicting = verified(&other, id, &w.neighbour);
    assert!(matches!(
        w.state.apply_proof(&conflicting),
        Ok(Outcome::Applied(_))
    ));
    assert_eq!(w.state.account(&id.node_id()).balance, 0);
    other.nonce = 3;
    assert_eq!(
        w.state.apply_proof(&verified(&other, id, &w.neighbour)),
        Err(LedgerError::RoundPaid {
            node: id.node_id(),
            round: 1
        })
    );
    let mut uptime = uptime_proof(id, 5, T0);
    let u = verified(&uptime, id, &w.neighbour);
    assert!(matches!(w.state.apply_proof(&u), Ok(Outcome::Applied(_))));
    // A second proof at nonce 5 settles an equivocation (neither paid, see `equivocation`);
    // a third one there is refused.
    uptime.claimed_duration_ms += 1;
    let second = verified(&uptime, id, &w.neighbour);
    assert!(matches!(
        w.state.apply_proof(&second),
        Ok(Outcome::Applied(_))
    ));
    uptime.claimed_duration_ms += 1;
    assert_eq!(
        w.state.apply_proof(&verified(&uptime, id, &w.neighbour)),
        Err(LedgerError::ProofNonceConflict {
            node: id.node_id(),
            nonce: 5
        })
    );
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn transfer_burns_five_percent() {
    let mut w = world(2, 4);
    let (a, b) = (w.ids[0].node_id(), w.ids[1].node_id());
    let before_a = w.state.account(&a).balance;
    let before_b = w.state.account(&b).balance;
    let t = op(
        &w.ids[0],
        0,
        T0,
        Action::Transfer {
            to: b,
            amount: 1_000,
        },
    );
    assert!(matches!(w.state.apply_op(t), Ok(Outcome::Applied(_))));
    assert_eq!(w.state.account(&a).balance, before_a - 1_000);
    assert_eq!(w.state.account(&b).balance, before_b + 950);
    assert_eq!(w.state.burned(), 50);
    assert_eq!(w.state.account(&a).next_nonce, 1);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn transfer_with_bad_signature_is_rejected() {
    let w = world(2, 1);
    let (alice, bob) = (&w.ids[0], &w.ids[1]);
    let good = AccountOp {
        network: [0; 32],
        account: alice.node_id(),
        nonce: 0,
        timestamp_ms: T0,
        action: Action::Transfer {
            to: bob.node_id(),
            amount: 10,
        },
    }
    .sign(alice);
    // Bob re-points the transfer to himself with a bigger amount but keeps Alice's signature.
    let mut forged_op = AccountOp::from_canonical(good.payload_bytes());
    forged_op.action = Action::Transfer {
        to: bob.node_id(),
        amount: 1_000_000,
    };
    let forged = Signed::<AccountOp>::from_parts(
        neuroshard_proof::Canonical::to_canonical_bytes(&forged_op),
        good.signer(),
        good.signature(),
    );
    assert!(matches!(
        verify_op(&forged),
        Err(crate::ops::OpError::Envelope(_))
    ));
    let malleated = Signed::<AccountOp>::from_parts(
        good.payload_bytes().to_vec(),
        good.signer(),
        good.signature().malleate(),
    );
    assert!(verify_op(&malleated).is_err());
    // Signed by Bob but debiting Alice: refused as well.
    let mut stolen = AccountOp::from_canonical(good.payload_bytes());
    stolen.nonce = 0;
    assert!(matches!(
        verify_op(&stolen.sign(bob)),
        Err(crate::ops::OpError::NotSigner { .. })
    ));
}

impl AccountOp {
    fn from_canonical(bytes: &[u8]) -> AccountOp {
        match <AccountOp as neuroshard_proof::Canonical>::from_canonical_bytes(bytes) {
            Ok(op) => op,
            Err(e) => panic!("test op decodes: {e}"),
        }
    }
}

#[test]
fn overdraw_is_rejected_and_changes_nothing() {
    let mut w = world(2, 1);
    let a = w.ids[0].node_id();
    let balance = w.state.account(&a).balance;
    let before = w.state.state_hash();
    let t = op(
        &w.ids[0],
        0,
        T0,
        Action::Transfer {
            to: w.ids[1].node_id(),
            amount: balance + 1,
        },
    );
    assert_eq!(
        w.state.apply_op(t),
        Err(LedgerError::InsufficientBalance {
            needed: balance + 1,
            available: balance
        })
    );
    assert_eq!(w.state.state_hash(), before);
    // The nonce was not consumed: a valid replacement at nonce 0 applies.
    let fix = op(&w.ids[0], 0, T0, Action::Burn { amount: balance });
    assert!(matches!(w.state.apply_op(fix), Ok(Outcome::Applied(_))));
    assert_eq!(w.state.account(&a).balance, 0);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn stake_locks_until_unlock_time() {
    let mut w = world(1, 4);
    let id = &w.ids[0];
    let a = id.node_id();
    assert_eq!(
        w.state.apply_op(op(
            id,
            0,
            T0,
            Action::Stake {
                amount: 10,
                unlock_at_ms: T0 + 1
            }
        )),
        Err(LedgerError::LockTooShort)
    );
    let s = op(
        id,
        0,
        T0,
        Action::Stake {
            amount: 100,
            unlock_at_ms: T0 + DAY,
        },
    );
    assert!(w.state.apply_op(s).is_ok());
    assert_eq!(w.state.account(&a).stake, 100);
    assert!(matches!(
        w.state
            .apply_op(op(id, 1, T0 + DAY - 1, Action::Unstake { amount: 100 })),
        Err(LedgerError::StakeLocked { .. })
    ));
    assert!(matches!(
        w.state
            .apply_op(op(id, 1, T0 + DAY, Action::Unstake { amount: 101 })),
        Err(LedgerError::InsufficientStake { .. })
    ));
    assert!(
        w.state
            .apply_op(op(id, 1, T0 + DAY, Action::Unstake { amount: 100 }))
            .is_ok()
    );
    let after = w.state.account(&a);
    assert_eq!((after.stake, after.unbonding), (0, 100));
    assert_eq!(
        after.unbonding_until_ms,
        T0 + DAY + crate::rules::DEFAULT_UNBONDING_MS
    );
    assert_eq!(w.state.check_invariants(), Ok(()));
    // Withdrawn only once the unbonding delay has passed.
    let balance = after.balance;
    let early = op(
        id,
        2,
        T0 + DAY + crate::rules::DEFAULT_UNBONDING_MS - 1,
        Action::Withdraw,
    );
    assert!(matches!(
        w.state.apply_op(early),
        Err(LedgerError::Unbonding { .. })
    ));
    let due = T0 + DAY + crate::rules::DEFAULT_UNBONDING_MS;
    assert!(w.state.apply_op(op(id, 2, due, Action::Withdraw)).is_ok());
    let done = w.state.account(&a);
    assert_eq!((done.balance, done.unbonding), (balance + 100, 0));
    assert!(matches!(
        w.state.apply_op(op(id, 3, due, Action::Withdraw)),
        Err(LedgerError::NothingUnbonding)
    ));
    assert_eq!(w.state.check_invariants(), Ok(()));
}

/// The attack: misbehave, then unstake at once so that the slash finds no stake when its
/// evidence arrives. Unstaked funds stay slashable while they unbond: the slash takes its
/// share of them, and what is left is withdrawn a day later. (When an unstake returned the
/// stake to the balance at once, the slash took nothing and the balance could be spent.)
#[test]
fn stake_unstaked_after_misbehaving_is_still_slashed() {
    let mut w = world(2, 4);
    let (cheat, reporter) = (&w.ids[0], &w.ids[1]);
    let a = cheat.node_id();
    let s = Action::Stake {
        amount: 100,
        unlock_at_ms: T0 + DAY,
    };
    assert!(w.state.apply_op(op(cheat, 0, T0, s)).is_ok());
    let unstake = op(cheat, 1, T0 + DAY, Action::Unstake { amount: 100 });
    assert!(w.state.apply_op(unstake).is_ok());
    assert_eq!(w.state.account(&a).stake, 0, "no longer stake");
    // The evidence of what it did before arrives after the unstake.
    let evidence = slash(cheat, reporter, 7);
    assert!(matches!(
        w.state.apply_slash(&evidence),
        Ok(Outcome::Applied(_))
    ));
    let after = w.state.account(&a);
    assert!(after.unbonding < 100, "the slash took nothing: {after:?}");
    assert_eq!(w.state.check_invariants(), Ok(()));
    let due = T0 + DAY + crate::rules::DEFAULT_UNBONDING_MS;
    assert!(
        w.state
            .apply_op(op(cheat, 2, due, Action::Withdraw))
            .is_ok()
    );
    assert_eq!(w.state.account(&a).unbonding, 0);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn stake_raises_later_rewards() {
    let mut w = world(1, 0);
    let id = &w.ids[0];
    // Validator-fee proofs reach the per-proof cap (100 NEURO); ten of them fund a
    // 1000 NEURO stake, which must lift later rewards by exactly 10 %.
    for nonce in 0..10 {
        let mut p = uptime_proof(id, nonce, T0);
        p.kind = neuroshard_proof::ProofKind::Verification;
        p.batches = 2_000_000;
        let v = verified(&p, id, &w.neighbour);
        assert!(w.state.apply_proof(&v).is_ok());
    }
    let a = id.node_id();
    assert_eq!(w.state.account(&a).balance, 1_000 * UNITS_PER_NEURO);
    let s = op(
        id,
        0,
        T0,
        Action::Stake {
            amount: 1_000 * UNITS_PER_NEURO,
            unlock_at_ms: T0 + DAY,
        },
    );
    assert!(w.state.apply_op(s).is_ok());
    let p = verified(&uptime_proof(id, 10, T0), id, &w.neighbour);
    let base = crate::reward::base_reward(p.proof());
    assert!(w.state.apply_proof(&p).is_ok());
    assert_eq!(w.state.account(&a).balance, base * 11 / 10);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn early_op_waits_for_its_predecessor() {
    let mut w = world(2, 2);
    let (alice, b) = (&w.ids[0], w.ids[1].node_id());
    let second = op(alice, 1, T0, Action::Transfer { to: b, amount: 20 });
    assert_eq!(w.state.apply_op(second.clone()), Ok(Outcome::Queued));
    assert_eq!(w.state.apply_op(second), Ok(Outcome::Duplicate));
    assert_eq!(w.state.pending_len(), 1);
    let conflicting = op(alice, 1, T0, Action::Transfer { to: b, amount: 21 });
    assert_eq!(
        w.state.apply_op(conflicting),
        Err(LedgerError::Pending(crate::pending::PendingError::Conflict))
    );
    let far = op(alice, 1_000, T0, Action::Burn { amount: 1 });
    assert!(matches!(
        w.state.apply_op(far),
        Err(LedgerError::Pending(
            crate::pending::PendingError::GapTooLarge { .. }
        ))
    ));
    let first = op(alice, 0, T0, Action::Transfer { to: b, amount: 10 });
    match w.state.apply_op(first) {
        Ok(Outcome::Applied(changes)) => assert_eq!(changes.records.len(), 2),
        other => panic!("expected both ops applied, got {other:?}"),
    }
    assert_eq!(w.state.account(&alice.node_id()).next_nonce, 2);
    assert_eq!(w.state.pending_len(), 0);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

#[test]
fn zero_self_and_reused_nonce_ops_are_rejected() {
    let mut w = world(2, 2);
    let (alice, b) = (&w.ids[0], w.ids[1].node_id());
    assert_eq!(
        w.state
            .apply_op(op(alice, 0, T0, Action::Transfer { to: b, amount: 0 })),
        Err(LedgerError::ZeroAmount)
    );
    assert_eq!(
        w.state.apply_op(op(
            alice,
            0,
            T0,
            Action::Transfer {
                to: alice.node_id(),
                amount: 5
            }
        )),
        Err(LedgerError::SelfTransfer)
    );
    assert!(
        w.state
            .apply_op(op(alice, 0, T0, Action::Burn { amount: 5 }))
            .is_ok()
    );
    // A different op signed for an already used nonce is refused, the same one is a no-op.
    assert_eq!(
        w.state
            .apply_op(op(alice, 0, T0, Action::Burn { amount: 6 })),
        Err(LedgerError::OpNonceConflict {
            account: alice.node_id(),
            nonce: 0
        })
    );
    assert_eq!(
        w.state
            .apply_op(op(alice, 0, T0, Action::Burn { amount: 5 })),
        Ok(Outcome::Duplicate)
    );
}

#[test]
fn pending_queue_is_bounded_per_account() {
    let mut w = world(1, 1);
    let id = &w.ids[0];
    for nonce in 1..=crate::pending::MAX_PENDING_PER_ACCOUNT as u64 {
        assert_eq!(
            w.state
                .apply_op(op(id, nonce, T0, Action::Burn { amount: 1 })),
            Ok(Outcome::Queued)
        );
    }
    let one_more = crate::pending::MAX_PENDING_PER_ACCOUNT as u64 + 1;
    assert_eq!(
        w.state
            .apply_op(op(id, one_more, T0, Action::Burn { amount: 1 })),
        Err(LedgerError::Pending(
            crate::pending::PendingError::AccountFull
        ))
    );
    // Filling the gap drains the whole run of waiting ops.
    assert!(
        w.state
            .apply_op(op(id, 0, T0, Action::Burn { amount: 1 }))
            .is_ok()
    );
    assert_eq!(w.state.account(&id.node_id()).next_nonce, one_more);
    assert_eq!(w.state.pending_len(), 0);
    assert_eq!(w.state.check_invariants(), Ok(()));
}

/// One random step of the property tests.
#[derive(Debug, Clone)]
enum Step {
    Proof {
        who: usize,
        training: bool,
    },
    Transfer {
        from: usize,
        to: usize,
        amount: u64,
    },
    Stake {
        who: usize,
        amount: u64,
    },
    Unstake {
        who: usize,
        amount: u64,
        after_ms: u64,
    },
    Withdraw {
        who: usize,
        after_ms: u64,
    },
    Burn {
        who: usize,
        amount: u64,
    },
    Slash {
        cheat: usize,
        reporter: usize,
    },
}

const N: usize = 3;

fn arb_step() -> impl Strategy<Value = Step> {
    let amount = prop_oneof![0u64..1_000, 0u64..50_000_000, Just(u64::MAX)];
    prop_oneof![
        4 => (0..N, any::<bool>()).prop_map(|(who, training)| Step::Proof { who, training }),
        3 => (0..N, 0..N, amount.clone())
            .prop_map(|(from, to, amount)| Step::Transfer { from, to, amount }),
        1 => (0..N, amount.clone()).prop_map(|(who, amount)| Step::Stake { who, amount }),
        1 => (0..N, amount.clone(), 0..2 * DAY)
            .prop_map(|(who, amount, after_ms)| Step::Unstake { who, amount, after_ms }),
        1 => (0..N, 0..2 * DAY).prop_map(|(who, after_ms)| Step::Withdraw { who, after_ms }),
        1 => (0..N, amount).prop_map(|(who, amount)| Step::Burn { who, amount }),
        1 => (0..N, 0..N).prop_map(|(cheat, reporter)| Step::Slash { cheat, reporter }),
    ]
}

/// Drives steps against a state, producing each message (so tests can re-apply it).
struct Driver {
    ids: Vec<Identity>,
    neighbour: Identity,
    proof_nonce: u64,
    clock: u64,
}

enum Msg {
    Proof(Box<VerifiedProof>),
    Op(VerifiedOp),
    Slash(VerifiedSlash),
}

impl Driver {
    fn new() -> Self {
        Driver {
            ids: (0..N as u64).map(|i| test_identity(200 + i)).collect(),
            neighbour: test_identity(299),
            proof_nonce: 0,
            clock: T0,
        }
    }

    fn message(&mut self, state: &LedgerState, step: &Step) -> Option<Msg> {
        self.clock += 60_000;
        self.proof_nonce += 1;
        let next = |i: usize| state.account(&self.ids[i].node_id()).next_nonce;
        Some(match *step {
            Step::Proof { who, training } => {
                let id = &self.ids[who];
                let p = if training {
                    training_proof(id, &self.neighbour, self.proof_nonce, self.clock)
                } else {
                    uptime_proof(id, self.proof_nonce, self.clock)
                };
                Msg::Proof(Box::new(verified(&p, id, &self.neighbour)))
            }
            Step::Transfer { from, to, amount } => {
                let to = self.ids[to].node_id();
                Msg::Op(op(
                    &self.ids[from],
                    next(from),
                    self.clock,
                    Action::Transfer { to, amount },
                ))
            }
            Step::Stake { who, amount } => Msg::Op(op(
                &self.ids[who],
                next(who),
                self.clock,
                Action::Stake {
                    amount,
                    unlock_at_ms: self.clock + DAY,
                },
            )),
            Step::Unstake {
                who,
                amount,
                after_ms,
            } => {
                self.clock += after_ms;
                Msg::Op(op(
                    &self.ids[who],
                    next(who),
                    self.clock,
                    Action::Unstake { amount },
                ))
            }
            Step::Withdraw { who, after_ms } => {
                self.clock += after_ms;
                Msg::Op(op(&self.ids[who], next(who), self.clock, Action::Withdraw))
            }
            Step::Burn { who, amount } => Msg::Op(op(
                &self.ids[who],
                next(who),
                self.clock,
                Action::Burn { amount },
            )),
            Step::Slash { cheat, reporter } => {
                if cheat == reporter {
                    return None;
                }
                Msg::Slash(slash(
                    &self.ids[cheat],
                    &self.ids[reporter],
                    self.proof_nonce,
                ))
            }
        })
    }
}

fn apply(state: &mut LedgerState, msg: &Msg) -> Result<Outcome, LedgerError> {
    match msg {
        Msg::Proof(p) => state.apply_proof(p),
        Msg::Op(o) => state.apply_op(o.clone()),
        Msg::Slash(s) => state.apply_slash(s),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Supply = minted − burned = Σ balances + Σ stakes + Σ unbonding after every step; a refused step
    /// changes nothing; re-applying any message changes nothing.
    #[test]
    fn supply_is_conserved_and_reapply_is_a_no_op(steps in prop::collection::vec(arb_step(), 1..40)) {
        let mut d = Driver::new();
        let mut state = LedgerState::new();
        for step in &steps {
            let Some(msg) = d.message(&state, step) else { continue };
            let before = state.state_hash();
            let verdict = apply(&mut state, &msg);
            if verdict.is_err() {
                prop_assert_eq!(state.state_hash(), before, "refused step changed state");
            }
            prop_assert_eq!(state.check_invariants(), Ok(()));
            prop_assert!(state.digest_is_consistent(), "kept digest differs from a rebuilt one");
            let after = state.state_hash();
            let again = apply(&mut state, &msg);
            prop_assert!(!matches!(again, Ok(Outcome::Applied(_))), "second apply applied: {:?}", again);
            prop_assert_eq!(state.state_hash(), after, "second apply changed state");
            let held: u128 = state
                .accounts()
                .map(|(_, a)| u128::from(a.balance) + u128::from(a.stake) + u128::from(a.unbonding))
                .sum();
            prop_assert_eq!(held, u128::from(state.minted() - state.burned()));
        }
    }

    /// The same proofs in any order give the same state hash (with stakes fixed beforehand).
    #[test]
    fn proof_order_does_not_matter(
        picks in prop::collection::vec((0..N, any::<bool>()), 1..24),
        seed in any::<u64>(),
    ) {
        let mut d = Driver::new();
        let mut base = LedgerState::new();
        // Give node 0 a stake so the multiplier is exercised.
        for nonce in 0..3 {
            let p = uptime_proof(&d.ids[0], 1_000 + nonce, T0);
            prop_assert!(base.apply_proof(&verified(&p, &d.ids[0], &d.neighbour)).is_ok());
        }
        let stake = base.account(&d.ids[0].node_id()).balance;
        let s = op(&d.ids[0], 0, T0, Action::Stake { amount: stake, unlock_at_ms: T0 + DAY });
        prop_assert!(base.apply_op(s).is_ok());

        let msgs: Vec<VerifiedProof> = picks
            .iter()
            .filter_map(|&(who, training)| match d.message(&base, &Step::Proof { who, training }) {
                Some(Msg::Proof(p)) => Some(*p),
                _ => None,
            })
            .collect();
        let mut forward = base.clone();
        for p in &msgs {
            prop_assert!(forward.apply_proof(p).is_ok());
        }
        let mut shuffled: Vec<&VerifiedProof> = msgs.iter().collect();
        use rand::{SeedableRng, seq::SliceRandom};
        shuffled.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        let mut other = base.clone();
        for p in shuffled.iter().rev() {
            prop_assert!(other.apply_proof(p).is_ok());
        }
        prop_assert_eq!(forward.state_hash(), other.state_hash());
    }
}

#[test]
fn signed_proof_wire_roundtrip_through_state() {
    // Guards the fixture path used by the property tests.
    let w = world(1, 0);
    let p = training_proof(&w.ids[0], &w.neighbour, 3, T0);
    let wire = p.sign(&w.ids[0]).to_bytes();
    assert!(SignedProof::from_bytes(&wire).is_ok());
    assert_eq!(UNITS_PER_NEURO, 1_000_000_000);
}

#[test]
fn the_registry_generation_changes_with_stake_and_registrations_only() {
    let id = test_identity(100);
    let neighbour = test_identity(99);
    let rules = crate::Rules::default();
    let genesis =
        crate::LedgerGenesis::new(rules, vec![(id.public_key(), rules.min_stake)]).unwrap();
    let (mut state, _) = LedgerState::from_genesis(&genesis).unwrap();
    let g0 = state.registry_generation();
    // A proof pays a balance: who is registered cannot have changed.
    let p = verified(&uptime_proof(&id, 0, T0), &id, &neighbour);
    assert!(matches!(state.apply_proof(&p), Ok(Outcome::Applied(_))));
    assert_eq!(state.registry_generation(), g0);
    assert!(
        state
            .apply_op(op(&id, 0, T0, Action::Register { stage: 2 }))
            .is_ok()
    );
    let g1 = state.registry_generation();
    assert_ne!(g1, g0, "a registration");
    let stake = op(
        &id,
        1,
        T0,
        Action::Stake {
            amount: 1,
            unlock_at_ms: T0 + DAY,
        },
    );
    assert_eq!(state.apply_op(stake).map(|_| ()), Ok(()));
    assert_ne!(state.registry_generation(), g1, "a stake change");
    // Two ledgers never share a generation, even with the same contents.
    assert_ne!(
        LedgerState::new().registry_generation(),
        LedgerState::new().registry_generation()
    );
}

/// A finality committee needs the stakers' keys: the ledger learns a key from each proof and
/// op it applies (never from one it refuses), and lists stakers whose key it knows.
#[test]
fn keys_are_learned_from_what_applies_and_stakers_with_keys_are_listed() {
    let (a, b, n) = (test_identity(1), test_identity(2), test_identity(3));
    let stake = Rules::default().min_stake;
    let genesis = LedgerGenesis::new(Rules::default(), vec![(a.public_key(), stake)]).unwrap();
    let (mut s, changes) = LedgerState::from_genesis(&genesis).unwrap();
    // A founder's key comes with the genesis.
    assert_eq!(changes.keys, vec![(a.node_id(), a.public_key())]);
    assert_eq!(s.staked_keys(), vec![(a.public_key(), stake)]);
    // The neighbour's key is learned from its first proof.
    let p = verified(&uptime_proof(&n, 0, T0), &n, &a);
    let Ok(Outcome::Applied(changes)) = s.apply_proof(&p) else {
        panic!("the proof applies")
    };
    assert_eq!(changes.keys, vec![(n.node_id(), n.public_key())]);
    assert_eq!(s.key(&n.node_id()), Some(n.public_key()));
    // Learned once: a second proof writes no key.
    let p2 = verified(&uptime_proof(&n, 1, T0 + 1), &n, &a);
    let Ok(Outcome::Applied(changes)) = s.apply_proof(&p2) else {
        panic!("the second proof applies")
    };
    assert!(changes.keys.is_empty());
    // A refused op (b has nothing to burn) teaches nothing.
    assert!(
        s.apply_op(op(&b, 0, T0, Action::Burn { amount: 5 }))
            .is_err()
    );
    assert_eq!(s.key(&b.node_id()), None);
    // An applied op does (b holds no stake, so it is not a candidate).
    let half = s.account(&n.node_id()).balance / 2;
    assert!(half > 0, "the proofs paid n something");
    let to_b = op(
        &n,
        0,
        T0,
        Action::Transfer {
            to: b.node_id(),
            amount: half,
        },
    );
    assert!(matches!(s.apply_op(to_b), Ok(Outcome::Applied(_))));
    let back = op(
        &b,
        0,
        T0,
        Action::Transfer {
            to: n.node_id(),
            amount: 1,
        },
    );
    assert!(matches!(s.apply_op(back), Ok(Outcome::Applied(_))));
    assert_eq!(s.key(&b.node_id()), Some(b.public_key()));
    assert_eq!(s.staked_keys(), vec![(a.public_key(), stake)]);
}

/// The unbonding delay is the network's (its genesis rules), not a constant: a network
/// founded with a minute frees unstaked funds after a minute, on every ledger alike.
#[test]
fn the_unbonding_delay_is_the_geneses() {
    let id = test_identity(150);
    let rules = crate::Rules {
        unbonding_ms: 60_000,
        ..crate::Rules::default()
    };
    let genesis = crate::LedgerGenesis::new(rules, vec![(id.public_key(), 500)]).expect("genesis");
    let (mut state, _) = LedgerState::from_genesis(&genesis).expect("state");
    let unstake = op(&id, 0, T0, Action::Unstake { amount: 500 });
    assert!(state.apply_op(unstake).is_ok());
    assert_eq!(state.account(&id.node_id()).unbonding_until_ms, T0 + 60_000);
    let early = op(&id, 1, T0 + 59_999, Action::Withdraw);
    assert!(matches!(
        state.apply_op(early),
        Err(LedgerError::Unbonding { .. })
    ));
    let due = op(&id, 1, T0 + 60_000, Action::Withdraw);
    assert!(state.apply_op(due).is_ok());
    assert_eq!(state.account(&id.node_id()).balance, 500);
}
