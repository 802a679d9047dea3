//! The SQLite adapter keeps exactly what the rules decided, across reopen.

mod common;

use common::{T0, op, verified};
use neuroshard_ledger::{Action, ApplyError, EpochItem, Ledger, LedgerError, Message, Outcome};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::{Identity, Proof};

fn wire(proof: &Proof, prover: &Identity) -> Vec<u8> {
    proof.sign(prover).to_bytes()
}

#[test]
fn reopen_restores_state_hash_history_and_dedup() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, b, n) = (test_identity(1), test_identity(2), test_identity(3));
    let p1 = verified(&training_proof(&a, &n, 1, T0), &a, &n);
    let p2 = verified(&uptime_proof(&b, 1, T0), &b, &n);
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        assert!(matches!(ledger.apply_proof(&p1)?, Outcome::Applied(_)));
        assert!(matches!(ledger.apply_proof(&p2)?, Outcome::Applied(_)));
        // A training proof pays when its round settles (`state/pots.rs`): this funds `a`.
        let funds = verified(&uptime_proof(&a, 5, T0), &a, &n);
        assert!(matches!(ledger.apply_proof(&funds)?, Outcome::Applied(_)));
        let t = op(
            &a,
            0,
            T0,
            Action::Transfer {
                to: b.node_id(),
                amount: 1_000,
            },
        );
        assert!(matches!(ledger.apply_op(t)?, Outcome::Applied(_)));
        let over = op(&a, 1, T0, Action::Burn { amount: u64::MAX });
        assert!(matches!(
            ledger.apply_op(over),
            Err(ApplyError::Rejected(
                LedgerError::InsufficientBalance { .. }
            ))
        ));
        hash = ledger.state_hash();
    }
    let mut ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.apply_proof(&p1)?, Outcome::Duplicate);
    assert_eq!(ledger.state_hash(), hash);
    assert!(ledger.stored_proof(&p1.hash())?);
    let history = ledger.history(&a.node_id(), 10)?;
    let kinds: Vec<&str> = history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds, ["burn", "transfer_out", "reward"]);
    assert_eq!(ledger.stored_ops(&a.node_id())?.len(), 1);
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    Ok(())
}

#[test]
fn batch_commits_once_with_a_verdict_per_message() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, b, n) = (test_identity(4), test_identity(5), test_identity(6));
    let p = verified(&uptime_proof(&a, 1, T0), &a, &n);
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        let verdicts = ledger.apply_batch([
            Message::Proof(Box::new(p.clone())),
            Message::Proof(Box::new(p.clone())),
            Message::Op(op(
                &a,
                0,
                T0,
                Action::Transfer {
                    to: b.node_id(),
                    amount: 100,
                },
            )),
            Message::Op(op(&a, 1, T0, Action::Burn { amount: u64::MAX })),
        ])?;
        assert!(matches!(verdicts[0], Ok(Outcome::Applied(_))));
        assert_eq!(verdicts[1], Ok(Outcome::Duplicate));
        assert!(matches!(verdicts[2], Ok(Outcome::Applied(_))));
        assert!(verdicts[3].is_err());
        hash = ledger.state_hash();
    }
    let ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.state().account(&b.node_id()).balance, 95);
    Ok(())
}

#[test]
fn proof_wire_is_stored_with_the_proof_and_served_after_reopen()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, b, n) = (test_identity(7), test_identity(8), test_identity(9));
    let pa = training_proof(&a, &n, 1, T0);
    let pb = uptime_proof(&b, 1, T0);
    let (va, vb) = (verified(&pa, &a, &n), verified(&pb, &b, &n));
    {
        let mut ledger = Ledger::open(&path)?;
        assert!(matches!(
            ledger.apply_proof_wire(&va, &wire(&pa, &a))?,
            Outcome::Applied(_)
        ));
        // Applied without its wire: counted but not servable until it arrives again.
        assert!(matches!(ledger.apply_proof(&vb)?, Outcome::Applied(_)));
        assert_eq!(ledger.proof_wire(&vb.hash())?, None);
    }
    let mut ledger = Ledger::open(&path)?;
    let mut expected = vec![va.hash(), vb.hash()];
    expected.sort_unstable();
    assert_eq!(ledger.proof_hashes()?, expected);
    assert_eq!(ledger.proof_wire(&va.hash())?, Some(wire(&pa, &a)));
    let hash = ledger.state_hash();
    assert_eq!(
        ledger.apply_proof_wire(&vb, &wire(&pb, &b))?,
        Outcome::Duplicate
    );
    assert_eq!(ledger.proof_wire(&vb.hash())?, Some(wire(&pb, &b)));
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.proof_wire(&[0; 32])?, None);
    Ok(())
}

#[test]
fn wire_of_another_proof_or_garbage_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let (a, n) = (test_identity(10), test_identity(11));
    let p1 = uptime_proof(&a, 1, T0);
    let p2 = uptime_proof(&a, 2, T0);
    let v1 = verified(&p1, &a, &n);
    let mut ledger = Ledger::open_in_memory()?;
    let hash = ledger.state_hash();
    for bad in [wire(&p2, &a), b"garbage".to_vec(), Vec::new()] {
        assert!(matches!(
            ledger.apply_proof_wire(&v1, &bad),
            Err(ApplyError::WireMismatch)
        ));
    }
    assert_eq!(ledger.state_hash(), hash);
    assert!(!ledger.stored_proof(&v1.hash())?);
    Ok(())
}

#[test]
fn failed_wire_write_rolls_back_the_proof() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, n) = (test_identity(12), test_identity(13));
    let p = uptime_proof(&a, 1, T0);
    let v = verified(&p, &a, &n);
    let hash = Ledger::open(&path)?.state_hash();
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.execute_batch(
            "CREATE TRIGGER no_wire BEFORE INSERT ON proof_wire
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )?;
    }
    let mut ledger = Ledger::open(&path)?;
    assert!(matches!(
        ledger.apply_proof_wire(&v, &wire(&p, &a)),
        Err(ApplyError::Store(_))
    ));
    // The reward and the proof record went with the wire: one transaction.
    assert_eq!(ledger.state_hash(), hash);
    assert!(!ledger.stored_proof(&v.hash())?);
    drop(ledger);
    assert_eq!(Ledger::open(&path)?.state_hash(), hash);
    Ok(())
}

#[test]
fn database_without_the_wire_table_is_upgraded_on_open() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, n) = (test_identity(14), test_identity(15));
    let (p1, p2) = (uptime_proof(&a, 1, T0), uptime_proof(&a, 2, T0));
    {
        let mut ledger = Ledger::open(&path)?;
        ledger.apply_proof(&verified(&p1, &a, &n))?;
    }
    rusqlite::Connection::open(&path)?.execute_batch("DROP TABLE proof_wire;")?;
    let mut ledger = Ledger::open(&path)?;
    let v2 = verified(&p2, &a, &n);
    assert!(matches!(
        ledger.apply_proof_wire(&v2, &wire(&p2, &a))?,
        Outcome::Applied(_)
    ));
    assert_eq!(ledger.proof_wire(&v2.hash())?, Some(wire(&p2, &a)));
    assert_eq!(ledger.proof_hashes()?.len(), 2);
    Ok(())
}

#[test]
fn last_proof_nonce_ranks_nonces_as_unsigned() -> Result<(), Box<dyn std::error::Error>> {
    let (a, b, n) = (test_identity(16), test_identity(17), test_identity(18));
    let mut ledger = Ledger::open_in_memory()?;
    assert_eq!(ledger.last_proof_nonce(&a.node_id())?, None);
    for nonce in [5, 1 << 40, 7] {
        ledger.apply_proof(&verified(&uptime_proof(&a, nonce, T0), &a, &n))?;
    }
    assert_eq!(ledger.last_proof_nonce(&a.node_id())?, Some(1 << 40));
    for nonce in [3, u64::MAX - 1, 1 << 63, 9] {
        ledger.apply_proof(&verified(&uptime_proof(&b, nonce, T0), &b, &n))?;
    }
    assert_eq!(ledger.last_proof_nonce(&b.node_id())?, Some(u64::MAX - 1));
    Ok(())
}

#[test]
fn an_audit_verdict_is_stored_and_judged_once_across_a_reopen()
-> Result<(), Box<dyn std::error::Error>> {
    use neuroshard_ledger::VerifiedVerdict;
    use neuroshard_ledger::ops::MIN_STAKE_LOCK_MS;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, b, n) = (test_identity(1), test_identity(2), test_identity(3));
    let verdict = VerifiedVerdict {
        job: [7; 32],
        offender: a.node_id(),
        beneficiary: b.node_id(),
        evidence_hash: [8; 32],
        timestamp_ms: T0,
    };
    let min = neuroshard_ledger::Rules::default().min_stake;
    let slashed = (min / 2).min(1_000);
    let paid = min / 20;
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        ledger.apply_proof(&verified(&uptime_proof(&a, 1, T0), &a, &n))?;
        let stake = op(
            &a,
            0,
            T0,
            Action::Stake {
                amount: 1_000,
                unlock_at_ms: T0 + MIN_STAKE_LOCK_MS,
            },
        );
        assert!(matches!(ledger.apply_op(stake)?, Outcome::Applied(_)));
        assert!(matches!(
            ledger.apply_verdict(&verdict)?,
            Outcome::Applied(_)
        ));
        // A fixed part of the minimum stake (here more than the 1,000 staked: all of it) is
        // burned, and a fixed reward minted to the beneficiary.
        assert_eq!(ledger.state().account(&a.node_id()).stake, 1_000 - slashed);
        assert_eq!(ledger.state().account(&b.node_id()).balance, paid);
        hash = ledger.state_hash();
    }
    let mut ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.apply_verdict(&verdict)?, Outcome::Duplicate);
    let kinds: Vec<String> = ledger
        .history(&b.node_id(), 10)?
        .into_iter()
        .map(|h| h.kind)
        .collect();
    assert_eq!(kinds, ["slash_reward"]);
    let v = ledger.verdicts(10)?;
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].offender, hex::encode(a.node_id().0));
    assert_eq!((v[0].slashed, v[0].paid), (slashed, paid));
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    Ok(())
}

#[test]
fn a_wired_batch_stores_what_one_by_one_writes_store_in_one_transaction()
-> Result<(), Box<dyn std::error::Error>> {
    use neuroshard_ledger::WiredMessage;
    let dir = tempfile::tempdir()?;
    let (a, b, n) = (test_identity(21), test_identity(22), test_identity(23));
    let proofs: Vec<(Proof, &Identity)> = vec![
        (training_proof(&a, &n, 1, T0), &a),
        (uptime_proof(&a, 9, T0), &a),
        (uptime_proof(&b, 1, T0), &b),
        (uptime_proof(&b, 2, T0 + 10), &b),
    ];
    let verified_all: Vec<_> = proofs.iter().map(|(p, k)| verified(p, k, &n)).collect();
    let wires: Vec<Vec<u8>> = proofs.iter().map(|(p, k)| wire(p, k)).collect();
    let transfer = op(
        &a,
        0,
        T0,
        Action::Transfer {
            to: b.node_id(),
            amount: 1_000,
        },
    );
    let one_by_one = {
        let mut l = Ledger::open(&dir.path().join("one.db"))?;
        for (v, w) in verified_all.iter().zip(&wires) {
            l.apply_proof_wire(v, w)?;
        }
        l.apply_op(transfer.clone())?;
        l.state_hash()
    };
    let path = dir.path().join("batch.db");
    {
        let mut l = Ledger::open(&path)?;
        let mut batch: Vec<WiredMessage> = verified_all
            .iter()
            .zip(&wires)
            .map(|(v, w)| WiredMessage::Proof(v, w))
            .collect();
        // A wire that is not its proof's, and a duplicate: refused or counted alone.
        batch.insert(1, WiredMessage::Proof(&verified_all[0], &wires[2]));
        batch.push(WiredMessage::Proof(&verified_all[1], &wires[1]));
        batch.push(WiredMessage::Op(&transfer));
        let verdicts = l.apply_wired_batch(batch)?;
        assert!(matches!(verdicts[1], Err(ApplyError::WireMismatch)));
        assert!(matches!(verdicts[5], Ok(Outcome::Duplicate)));
        assert!(matches!(verdicts[6], Ok(Outcome::Applied(_))));
        assert_eq!(l.state_hash(), one_by_one);
    }
    let l = Ledger::open(&path)?;
    assert_eq!(l.state_hash(), one_by_one, "everything reached the disk");
    for (v, w) in verified_all.iter().zip(&wires) {
        assert_eq!(l.proof_wire(&v.hash())?.as_ref(), Some(w));
    }
    Ok(())
}

/// A settled equivocation survives a reopen: both proofs are kept and servable (so peers
/// that saw one of them learn of the other), the nonce stays void, the history says why.
#[test]
fn a_settled_equivocation_survives_reopen() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (cheat, n) = (test_identity(40), test_identity(41));
    let first = uptime_proof(&cheat, 3, T0);
    let mut second = first.clone();
    second.claimed_duration_ms += 5_000;
    let (v1, v2) = (verified(&first, &cheat, &n), verified(&second, &cheat, &n));
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        assert!(matches!(
            ledger.apply_proof_wire(&v1, &wire(&first, &cheat))?,
            Outcome::Applied(_)
        ));
        assert!(matches!(
            ledger.apply_proof_wire(&v2, &wire(&second, &cheat))?,
            Outcome::Applied(_)
        ));
        assert_eq!(ledger.state().account(&cheat.node_id()).balance, 0);
        hash = ledger.state_hash();
    }
    let mut ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    assert_eq!(ledger.proof_wire(&v2.hash())?, Some(wire(&second, &cheat)));
    assert_eq!(ledger.apply_proof(&v1)?, Outcome::Duplicate);
    let mut third = first.clone();
    third.claimed_duration_ms += 9_000;
    assert!(matches!(
        ledger.apply_proof(&verified(&third, &cheat, &n)),
        Err(ApplyError::Rejected(LedgerError::ProofNonceConflict { .. }))
    ));
    assert_eq!(ledger.state_hash(), hash);
    let history = ledger.history(&cheat.node_id(), 10)?;
    let kinds: Vec<&str> = history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds, ["burn", "slashed", "clawback", "reward"]);
    Ok(())
}

/// The same for training proofs, paid by round: the round stays void after a reopen.
#[test]
fn a_void_round_survives_reopen() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (cheat, n) = (test_identity(42), test_identity(43));
    let first = training_proof(&cheat, &n, 2, T0);
    let mut second = first.clone();
    second.nonce += 1;
    second.tokens /= 2;
    let (v1, v2) = (verified(&first, &cheat, &n), verified(&second, &cheat, &n));
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        assert!(matches!(ledger.apply_proof(&v2)?, Outcome::Applied(_)));
        assert!(matches!(ledger.apply_proof(&v1)?, Outcome::Applied(_)));
        assert_eq!(ledger.state().account(&cheat.node_id()).balance, 0);
        hash = ledger.state_hash();
    }
    let mut ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    assert_eq!(ledger.apply_proof(&v2)?, Outcome::Duplicate);
    let mut third = first.clone();
    third.nonce += 7;
    assert!(matches!(
        ledger.apply_proof(&verified(&third, &cheat, &n)),
        Err(ApplyError::Rejected(LedgerError::RoundPaid { .. }))
    ));
    assert_eq!(ledger.state_hash(), hash);
    Ok(())
}

/// A live ledger's open rounds and what finality settled survive a reopen: the same state,
/// the settled round closed, an open round's contributors still in its pot.
#[test]
fn settled_and_open_rounds_survive_reopen() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, b, c) = (test_identity(51), test_identity(52), test_identity(53));
    // A claim whose pseudo-gradient `w` receipted (what vouches for it in its round).
    let claim = |id: &Identity, w: &Identity, round: u64| {
        let mut p = training_proof(id, w, round, T0);
        p.nonce = round;
        p.receipts = vec![neuroshard_proof::Receipt::sign(
            w,
            p.network,
            p.node_id,
            round,
            neuroshard_proof::ReceiptKind::Gradients,
            p.pseudo_gradient_hash,
        )];
        verified(&p, id, w)
    };
    let settled = [claim(&a, &b, 1), claim(&b, &a, 1)];
    let mut finalized = neuroshard_ledger::LedgerState::new();
    let items = settled.iter().cloned().map(EpochItem::Proof).collect();
    neuroshard_ledger::apply_epoch(&mut finalized, items);
    for _ in 0..neuroshard_ledger::SETTLE_EPOCHS {
        neuroshard_ledger::apply_epoch(&mut finalized, Vec::new());
    }
    assert_eq!(finalized.settled_round(settled[0].proof().layers), Some(1));
    let hash;
    {
        let mut ledger = Ledger::open(&path)?;
        // Round 2's claim carries a work tally by `c`, which its pot keeps.
        let mut open = claim(&a, &b, 2).proof().clone();
        open.receipts.push(neuroshard_proof::Receipt::sign(
            &c,
            open.network,
            open.node_id,
            2,
            neuroshard_proof::ReceiptKind::Activations,
            neuroshard_proof::fixtures::work_tally(5),
        ));
        let mut v = neuroshard_proof::ProofVerifier::new();
        v.add_known_node(b.public_key());
        v.add_known_node(c.public_key());
        let open = v.verify(&open.sign(&a), open.timestamp_ms)?;
        for p in settled.iter().chain([&claim(&c, &a, 1), &open]) {
            assert!(matches!(ledger.apply_proof(p)?, Outcome::Applied(_)));
        }
        let mut live = ledger.state().clone();
        let mut log = ledger.into_change_log();
        for changes in live.follow_settlements(&finalized)? {
            log.commit(&changes, &[])?;
        }
        assert_eq!(live.account(&a.node_id()).balance, 500_000_000);
        hash = live.state_hash();
    }
    let mut ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    assert_eq!(ledger.state().account(&c.node_id()).balance, 0);
    let pot = ledger.state().pot(settled[0].proof().layers, 2);
    assert_eq!(pot.len(), 1);
    let tally = neuroshard_proof::WorkTally::from_hash(&neuroshard_proof::fixtures::work_tally(5));
    assert_eq!(pot[0].1.work, vec![(c.node_id(), tally.expect("a tally"))]);
    assert!(matches!(
        ledger.apply_proof(&claim(&b, &a, 1)),
        Ok(Outcome::Duplicate)
    ));
    // A claim of the settled round is recorded and never paid.
    let late = claim(&test_identity(54), &a, 1);
    assert!(matches!(ledger.apply_proof(&late)?, Outcome::Applied(_)));
    assert!(ledger.state().pot(late.proof().layers, 1).is_empty());
    assert_eq!(
        ledger.state().account(&test_identity(54).node_id()).balance,
        0
    );
    let history = ledger.history(&a.node_id(), 10)?;
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].kind.as_str(), "reward");
    Ok(())
}

/// Unstaked funds still unbonding, and when they may be withdrawn, survive a reopen.
#[test]
fn unbonding_stake_survives_reopen() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let (a, n) = (test_identity(61), test_identity(62));
    const DAY: u64 = 24 * 60 * 60 * 1000;
    let before;
    {
        let mut ledger = Ledger::open(&path)?;
        let funds = verified(&uptime_proof(&a, 1, T0), &a, &n);
        assert!(matches!(ledger.apply_proof(&funds)?, Outcome::Applied(_)));
        let stake = Action::Stake {
            amount: 500,
            unlock_at_ms: T0 + DAY,
        };
        assert!(matches!(
            ledger.apply_op(op(&a, 0, T0, stake))?,
            Outcome::Applied(_)
        ));
        let unstake = op(&a, 1, T0 + DAY, Action::Unstake { amount: 200 });
        assert!(matches!(ledger.apply_op(unstake)?, Outcome::Applied(_)));
        before = ledger.state().account(&a.node_id());
    }
    let mut ledger = Ledger::open(&path)?;
    let after = ledger.state().account(&a.node_id());
    assert_eq!(after, before);
    assert_eq!((after.stake, after.unbonding), (300, 200));
    let early = op(&a, 2, after.unbonding_until_ms - 1, Action::Withdraw);
    assert!(matches!(
        ledger.apply_op(early),
        Err(ApplyError::Rejected(LedgerError::Unbonding { .. }))
    ));
    let due = op(&a, 2, after.unbonding_until_ms, Action::Withdraw);
    assert!(matches!(ledger.apply_op(due)?, Outcome::Applied(_)));
    assert_eq!(
        ledger.state().account(&a.node_id()).balance,
        before.balance + 200
    );
    let history = ledger.history(&a.node_id(), 1)?;
    assert_eq!(history[0].kind.as_str(), "withdraw");
    assert_eq!(ledger.state().check_invariants(), Ok(()));
    Ok(())
}
