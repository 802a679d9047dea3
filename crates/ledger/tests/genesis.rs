//! The network's genesis, registration and per-round rewards, through the SQLite store.

mod common;

use common::{T0, op, verified};
use neuroshard_ledger::{
    Action, Ledger, LedgerError, LedgerGenesis, Rules, StoreError, UNITS_PER_NEURO,
};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::{Identity, NodeId};

const STAKE: u64 = 50 * UNITS_PER_NEURO;

fn rules() -> Rules {
    Rules {
        network: [0; 32],
        founded_ms: T0 - 3_600_000,
        min_stake: 10 * UNITS_PER_NEURO,
        round_reward: 2 * UNITS_PER_NEURO,
        min_round_ms: 1_000,
        round_lead: 0,
        ..Rules::default()
    }
}

fn genesis(founders: &[&Identity]) -> LedgerGenesis {
    let stakes = founders.iter().map(|id| (id.public_key(), STAKE)).collect();
    match LedgerGenesis::new(rules(), stakes) {
        Ok(g) => g,
        Err(e) => panic!("fixture genesis: {e}"),
    }
}

fn register(id: &Identity, nonce: u64, stage: u16) -> neuroshard_ledger::VerifiedOp {
    op(id, nonce, T0, Action::Register { stage })
}

#[test]
fn a_genesis_stakes_its_founders_and_a_ledger_keeps_its_network()
-> Result<(), Box<dyn std::error::Error>> {
    let (a, b) = (test_identity(1), test_identity(2));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let g = genesis(&[&a, &b]);
    let ledger = Ledger::open_genesis(&path, &g)?;
    assert_eq!(ledger.state().account(&a.node_id()).stake, STAKE);
    assert_eq!(ledger.state().minted(), 2 * STAKE);
    // The founders' keys are known from the start: the first finality committee.
    let mut founders = vec![(a.public_key(), STAKE), (b.public_key(), STAKE)];
    founders.sort_by_key(|(k, _)| k.node_id());
    assert_eq!(ledger.state().staked_keys(), founders);
    assert_eq!(ledger.state().rules(), &rules());
    let hash = ledger.state_hash();
    drop(ledger);
    // Reopened with the same genesis: nothing is minted twice.
    let ledger = Ledger::open_genesis(&path, &g)?;
    assert_eq!(ledger.state_hash(), hash);
    assert_eq!(
        ledger.state().staked_keys().len(),
        2,
        "keys survive a reopen"
    );
    drop(ledger);
    // Another network's genesis on this database is refused, not merged.
    let other = genesis(&[&a]);
    assert!(matches!(
        Ledger::open_genesis(&path, &other),
        Err(StoreError::OtherGenesis { .. })
    ));
    Ok(())
}

#[test]
fn registering_needs_the_minimum_stake_and_survives_a_restart()
-> Result<(), Box<dyn std::error::Error>> {
    let (staked, sybil) = (test_identity(3), test_identity(4));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let g = genesis(&[&staked]);
    let mut ledger = Ledger::open_genesis(&path, &g)?;
    ledger.apply_op(register(&staked, 0, 1))?;
    assert!(matches!(
        ledger.apply_op(register(&sybil, 0, 1)),
        Err(neuroshard_ledger::ApplyError::Rejected(
            LedgerError::StakeTooLow { .. }
        ))
    ));
    let registered: Vec<NodeId> = ledger.state().registered(1).collect();
    assert_eq!(registered, vec![staked.node_id()]);
    assert!(ledger.state().was_registered(&staked.node_id(), 1));
    assert!(!ledger.state().was_registered(&staked.node_id(), 0));
    let hash = ledger.state_hash();
    drop(ledger);
    let ledger = Ledger::open_genesis(&path, &g)?;
    assert_eq!(ledger.state_hash(), hash);
    assert!(ledger.state().is_registered(&staked.node_id(), 1));
    Ok(())
}

#[test]
fn a_round_is_never_paid_twice_in_either_order_nor_before_it_could_happen()
-> Result<(), Box<dyn std::error::Error>> {
    let (prover, neighbour) = (test_identity(5), test_identity(6));
    let g = genesis(&[&prover]);
    let honest = training_proof(&prover, &neighbour, 7, T0);
    let mut greedy = honest.clone();
    greedy.nonce = 8;
    greedy.batches *= 4;
    greedy.tokens *= 4;
    let (h, gr) = (
        verified(&honest, &prover, &neighbour),
        verified(&greedy, &prover, &neighbour),
    );
    // A second proof for the round is an equivocation: in either order neither is paid (the
    // first reward is taken back) and the ledgers agree.
    let mut first = Ledger::in_memory_genesis(&g)?;
    first.apply_proof(&h)?;
    // Counted in its round's pot, paid when finality settles the round.
    assert_eq!(first.state().pot(honest.layers, 7).len(), 1);
    first.apply_proof(&gr)?;
    let mut second = Ledger::in_memory_genesis(&g)?;
    second.apply_proof(&gr)?;
    second.apply_proof(&h)?;
    assert_eq!(first.state_hash(), second.state_hash());
    assert_eq!(first.state().account(&prover.node_id()).balance, 0);
    // Founded an hour before T0 with 1 s rounds: round 3600 is the last one possible.
    let mut ledger = Ledger::in_memory_genesis(&g)?;
    let edge = training_proof(&prover, &neighbour, 3_600, T0);
    ledger.apply_proof(&verified(&edge, &prover, &neighbour))?;
    let early = training_proof(&prover, &neighbour, 3_601, T0);
    assert!(matches!(
        ledger.apply_proof(&verified(&early, &prover, &neighbour)),
        Err(neuroshard_ledger::ApplyError::Rejected(
            LedgerError::RoundTooEarly { max: 3_600, .. }
        ))
    ));
    Ok(())
}

#[test]
fn proofs_and_ops_of_another_network_are_refused() -> Result<(), Box<dyn std::error::Error>> {
    let (prover, neighbour) = (test_identity(7), test_identity(8));
    let mut g = genesis(&[&prover]);
    g.rules.network = [9; 32];
    let mut ledger = Ledger::in_memory_genesis(&g)?;
    let foreign = uptime_proof(&prover, 1, T0);
    assert!(matches!(
        ledger.apply_proof(&verified(&foreign, &prover, &neighbour)),
        Err(neuroshard_ledger::ApplyError::Rejected(
            LedgerError::OtherNetwork { .. }
        ))
    ));
    assert!(matches!(
        ledger.apply_op(register(&prover, 0, 0)),
        Err(neuroshard_ledger::ApplyError::Rejected(
            LedgerError::OtherNetwork { .. }
        ))
    ));
    Ok(())
}
