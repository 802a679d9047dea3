//! The change log: what the caller's rules decided, stored as it is, and nothing after a
//! failed write.

use neuroshard_proof::Identity;
use neuroshard_proof::fixtures::test_identity;

use super::*;
use crate::{AccountOp, Action, Rules, VerifiedOp, verify_op};

const T0: u64 = 1_800_000_000_000;

fn register(id: &Identity, nonce: u64, stage: u16) -> VerifiedOp {
    own_op(id, nonce, Action::Register { stage })
}

fn own_op(id: &Identity, nonce: u64, action: Action) -> VerifiedOp {
    let signed = AccountOp {
        network: Rules::default().network,
        account: id.node_id(),
        nonce,
        timestamp_ms: T0,
        action,
    }
    .sign(id);
    verify_op(&signed).expect("fixture op verifies")
}

/// A temporary directory for a ledger, and a genesis staking `a` with the minimum stake.
fn founded_by(
    a: &Identity,
) -> Result<(tempfile::TempDir, LedgerGenesis), Box<dyn std::error::Error>> {
    let genesis = LedgerGenesis::new(
        Rules::default(),
        vec![(a.public_key(), Rules::default().min_stake)],
    )?;
    Ok((tempfile::tempdir()?, genesis))
}

fn applied(state: &mut LedgerState, op: VerifiedOp) -> Changes {
    match state.apply_op(op) {
        Ok(Outcome::Applied(changes)) => changes,
        other => panic!("fixture op applies: {other:?}"),
    }
}

/// A write that fails stops the log: a later write (here: once the disk has room again)
/// would put account values on disk without the records of the batch that was lost, so it is
/// refused, and a restart finds the last good prefix.
#[test]
fn after_a_failed_write_nothing_more_is_written() -> Result<(), Box<dyn std::error::Error>> {
    let a = test_identity(1);
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let ledger = Ledger::open_genesis(&path, &genesis)?;
    let mut state = ledger.state().clone();
    let mut log = ledger.into_change_log();

    log.commit(&applied(&mut state, register(&a, 0, 0)), &[])?;
    let good = state.state_hash();

    log.refuse_writes()?;
    let lost = applied(&mut state, register(&a, 1, 1));
    assert!(matches!(log.commit(&lost, &[]), Err(StoreError::Sqlite(_))));
    log.conn.pragma_update(None, "query_only", "OFF")?;
    let later = applied(&mut state, register(&a, 2, 0));
    assert!(matches!(
        log.commit(&later, &[]),
        Err(StoreError::Stopped(_))
    ));
    drop(log);

    let reopened = Ledger::open_genesis(&path, &genesis)?;
    assert_eq!(reopened.state_hash(), good);
    assert_eq!(reopened.state().check_invariants(), Ok(()));
    Ok(())
}

/// A paid validator fee is stored with its history line and read back on reopen: the same
/// state, the fee listed, and a second claim of the round still a duplicate.
#[test]
fn paid_fees_survive_a_reopen_and_are_listed() -> Result<(), Box<dyn std::error::Error>> {
    let (a, w) = (test_identity(1), test_identity(2));
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let ledger = Ledger::open_genesis(&path, &genesis)?;
    let mut state = ledger.state().clone();
    let mut log = ledger.into_change_log();
    let fee = crate::VerifiedAuditFee {
        network: [0; 32],
        auditor: a.node_id(),
        worker: w.node_id(),
        stage: 1,
        round: 4,
        job: [5; 32],
        beacon_epoch: 3,
        claim_hash: [6; 32],
        timestamp_ms: T0,
    };
    let Ok(Outcome::Applied(changes)) = state.apply_audit_fee(&fee) else {
        panic!("a first fee applies");
    };
    log.commit(&changes, &[])?;
    drop(log);
    let mut reopened = Ledger::open_genesis(&path, &genesis)?;
    assert_eq!(reopened.state_hash(), state.state_hash());
    assert_eq!(reopened.state().check_invariants(), Ok(()));
    let fees = reopened.audit_fees(10)?;
    assert_eq!(fees.len(), 1);
    assert_eq!((fees[0].round, fees[0].paid), (4, state.audit_fee()));
    let history = reopened.history(&a.node_id(), 10)?;
    assert!(history.iter().any(|h| h.kind == "audit_fee"));
    let summary = reopened.audit_summary(&a.node_id())?;
    assert_eq!(
        (summary.fees, summary.fees_paid, summary.account_fees),
        (1, state.audit_fee(), 1)
    );
    assert_eq!((summary.verdicts, summary.account_slashed), (0, 0));
    assert_eq!(reopened.audit_summary(&w.node_id())?.account_fees, 0);
    let again = crate::VerifiedAuditFee {
        job: [7; 32],
        ..fee
    };
    assert!(matches!(
        reopened.state.apply_audit_fee(&again),
        Ok(Outcome::Duplicate)
    ));
    Ok(())
}

/// Fraud reports are kept once each, survive a restart, and the oldest go once the kept
/// bytes pass the budget.
#[test]
fn fraud_reports_are_kept_once_across_restarts_within_a_byte_budget()
-> Result<(), Box<dyn std::error::Error>> {
    let a = test_identity(1);
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let mut log = Ledger::open_genesis(&path, &genesis)?.into_change_log();
    log.keep_report(&[1; 32], &[1; 100], 250)?;
    log.keep_report(&[1; 32], &[1; 100], 250)?;
    log.keep_report(&[2; 32], &[2; 100], 250)?;
    drop(log);
    let reopened = Ledger::open_genesis(&path, &genesis)?;
    assert_eq!(reopened.fraud_reports()?, vec![vec![1; 100], vec![2; 100]]);
    let mut log = reopened.into_change_log();
    log.keep_report(&[3; 32], &[3; 100], 250)?;
    drop(log);
    let reopened = Ledger::open_genesis(&path, &genesis)?;
    assert_eq!(reopened.fraud_reports()?, vec![vec![2; 100], vec![3; 100]]);
    Ok(())
}

/// Keys the ledger learned survive a restart; a ledger written before keys were stored gets
/// its op signers' keys back from the stored ops.
#[test]
fn learned_keys_survive_a_reopen() -> Result<(), Box<dyn std::error::Error>> {
    let a = test_identity(1);
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let mut ledger = Ledger::open_genesis(&path, &genesis)?;
    ledger.apply_op(register(&a, 0, 0))?;
    // A prover known only from a proof.
    let (prover, neighbour) = (test_identity(5), test_identity(6));
    let mut verifier = neuroshard_proof::ProofVerifier::new();
    verifier.add_known_node(neighbour.public_key());
    let proof = neuroshard_proof::fixtures::uptime_proof(&prover, 0, T0);
    let proof = verifier.verify(&proof.sign(&prover), T0)?;
    ledger.apply_proof(&proof)?;
    assert_eq!(ledger.state().key(&a.node_id()), Some(a.public_key()));
    drop(ledger);
    let ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state().key(&a.node_id()), Some(a.public_key()));
    assert_eq!(
        ledger.state().key(&prover.node_id()),
        Some(prover.public_key())
    );
    assert_eq!(
        ledger.state().staked_keys(),
        vec![(a.public_key(), Rules::default().min_stake)]
    );
    drop(ledger);
    // As an older ledger would be: no stored keys. The founder's came with its op.
    rusqlite::Connection::open(&path)?.execute("DELETE FROM keys", [])?;
    let ledger = Ledger::open(&path)?;
    assert_eq!(ledger.state().key(&a.node_id()), Some(a.public_key()));
    // A prover's key comes back only from the stored keys (until its next proof).
    assert_eq!(ledger.state().key(&prover.node_id()), None);
    Ok(())
}

/// The weights a replay verdict needs are kept once across restarts, within a byte budget,
/// oldest dropped first.
#[test]
fn verdict_weights_are_kept_once_across_restarts_within_a_byte_budget()
-> Result<(), Box<dyn std::error::Error>> {
    let a = test_identity(1);
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let mut log = Ledger::open_genesis(&path, &genesis)?.into_change_log();
    log.keep_verdict_weights(&[1; 32], &[1; 100], 250)?;
    log.keep_verdict_weights(&[1; 32], &[1; 100], 250)?;
    log.keep_verdict_weights(&[2; 32], &[2; 100], 250)?;
    drop(log);
    let reopened = Ledger::open(&path)?;
    assert_eq!(
        reopened.verdict_weights()?,
        vec![([1; 32], vec![1; 100]), ([2; 32], vec![2; 100])]
    );
    let mut log = reopened.into_change_log();
    log.keep_verdict_weights(&[3; 32], &[3; 100], 250)?;
    drop(log);
    assert_eq!(
        Ledger::open(&path)?.verdict_weights()?,
        vec![([2; 32], vec![2; 100]), ([3; 32], vec![3; 100])]
    );
    Ok(())
}

/// Capacity announcements are rebuilt from the stored ops on reopen, the latest by nonce.
#[test]
fn announcements_survive_a_reopen_the_latest_counting() -> Result<(), Box<dyn std::error::Error>> {
    let a = test_identity(1);
    let (dir, genesis) = founded_by(&a)?;
    let path = dir.path().join("ledger.db");
    let ledger = Ledger::open_genesis(&path, &genesis)?;
    let mut state = ledger.state().clone();
    let mut log = ledger.into_change_log();
    let announce = |nonce: u64, memory_bytes: u64| {
        let action = Action::Announce {
            memory_bytes,
            flops_per_s: 7,
        };
        own_op(&a, nonce, action)
    };
    log.commit(&applied(&mut state, register(&a, 0, 0)), &[])?;
    log.commit(&applied(&mut state, announce(1, 9)), &[])?;
    log.commit(&applied(&mut state, announce(2, 4)), &[])?;
    drop(log);
    let reopened = Ledger::open_genesis(&path, &genesis)?;
    assert_eq!(reopened.state().claim(&a.node_id()), Some((4, 7)));
    assert_eq!(reopened.state_hash(), state.state_hash());
    Ok(())
}
