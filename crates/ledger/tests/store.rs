//! The SQLite adapter keeps exactly what the rules decided, across reopen.

mod common;

use common::{T0, op, verified};
use neuroshard_ledger::{Action, ApplyError, Ledger, LedgerError, Message, Outcome};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};

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
