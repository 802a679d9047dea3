//! Claims past a stage's certified round: held, not paid, and paid alike in any order once
//! the stage reaches them.

use neuroshard_ledger::LedgerGenesis;

use super::tests::{T, economy_with, genesis, prove, registered, rules};
use super::*;

/// Economies under a round lead of 8 (the default for new networks).
fn led(seed: u64) -> Economy {
    let rules = neuroshard_ledger::Rules {
        round_lead: 8,
        ..rules()
    };
    let genesis = LedgerGenesis::new(rules, genesis().stakes).expect("genesis");
    economy_with(seed, &genesis)
}

/// Three honest replicas of stage 0 prove rounds 1 to 10; two staked keys of the same
/// stage receipt each other's claims of rounds 11 to 500. Before the round lead the observer
/// paid every one of them (490 NEURO a key, at once); now it pays rounds up to 18, the
/// lead past what the honest majority reached, holds the rest, and none of those reaches
/// finality. A second observer that gets everything in the reverse order ends on the same
/// state.
#[test]
fn two_staked_keys_receipting_each_other_are_paid_only_as_far_as_their_stage_got() {
    let (mut h1, mut h2, mut h3) = (led(1), led(2), led(3));
    let (mut s1, mut s2) = (led(4), led(5));
    let (mut x, mut y) = (led(6), led(7));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x, &mut y]);
    let mut wires = Vec::new();
    for round in 1..=10 {
        let at = T + round * 1_000;
        wires.push(prove(&mut h1, &h2, round, at));
        wires.push(prove(&mut h2, &h3, round, at));
        wires.push(prove(&mut h3, &h1, round, at));
    }
    let honest = wires.len();
    let at = T + 20_000;
    for round in (11..=500).step_by(7) {
        wires.push(prove(&mut s1, &s2, round, at));
        wires.push(prove(&mut s2, &s1, round, at));
    }
    while x.poll_epoch_item().is_some() {}
    for w in &wires {
        x.on_proof(w, at);
    }
    for w in wires.iter().rev() {
        y.on_proof(w, at);
    }
    let paid = |e: &Economy, who: &Economy| e.balance(&who.node_id()) / rules().round_reward;
    for e in [&x, &y] {
        assert_eq!(paid(e, &h1), 10);
        // Rounds 11 and 18 of the Sybils' claims are within the lead of round 10.
        assert_eq!(paid(e, &s1), 2, "the Sybil was paid past its stage");
        assert_eq!(paid(e, &s2), 2);
        assert_eq!(e.parked_count(), wires.len() - honest - 4);
    }
    assert_eq!(x.state_hash(), y.state_hash());
    let mut finalized = 0;
    while let Some((item, _)) = x.poll_epoch_item() {
        if let neuroshard_ledger::EpochItem::Proof(p) = item {
            assert!(
                p.proof().round <= 18,
                "round {} went to finality",
                p.proof().round
            );
            finalized += 1;
        }
    }
    assert_eq!(finalized, honest + 4);

    // The honest replicas go on to round 30: the held claims up to round 38 are paid.
    for round in 11..=30 {
        let at = T + 20_000 + round * 1_000;
        for w in [
            prove(&mut h1, &h2, round, at),
            prove(&mut h2, &h3, round, at),
            prove(&mut h3, &h1, round, at),
        ] {
            x.on_proof(&w, at);
        }
    }
    assert_eq!(paid(&x, &s1), 4, "rounds 11, 18, 25 and 32 of the claims");
}

/// A replica's own proof of a round its co-replicas have not proved yet is held at home too,
/// and still handed out to be gossiped.
#[test]
fn an_own_proof_ahead_of_the_stage_is_gossiped_and_paid_once_the_stage_gets_there() {
    let (mut a, mut b, mut c) = (led(11), led(12), led(13));
    registered(&mut [&mut a, &mut b, &mut c]);
    for round in 1..=3 {
        let at = T + round * 1_000;
        let wb = prove(&mut b, &c, round, at);
        let wc = prove(&mut c, &b, round, at);
        a.on_proof(&wb, at);
        a.on_proof(&wc, at);
    }
    // Round 12 is nine past the stage's 3: held, not paid.
    let wire = prove(&mut a, &b, 12, T + 5_000);
    assert_eq!(a.own_balance(), 0);
    assert_eq!(a.parked_count(), 1);
    for round in 4..=4 {
        let at = T + 6_000;
        a.on_proof(&prove(&mut b, &c, round, at), at);
        a.on_proof(&prove(&mut c, &b, round, at), at);
    }
    assert_eq!(a.own_balance(), rules().round_reward);
    assert_eq!(a.parked_count(), 0);
    assert!(!wire.is_empty());
}

/// Two keys that register once their stage ran 30 rounds receipt each other's claims of all
/// 30. A live ledger pays what reaches it (it cannot judge a claim's age alike in every
/// arrival order), but finality admits none more than the lead behind the stage.
#[test]
fn finality_refuses_a_newcomers_claims_of_rounds_its_stage_ran_before_it() {
    let (mut h1, mut h2, mut h3) = (led(21), led(22), led(23));
    let (mut s1, mut s2, mut x) = (led(24), led(25), led(26));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x]);
    for round in 1..=30 {
        let at = T + round * 1_000;
        for w in [
            prove(&mut h1, &h2, round, at),
            prove(&mut h2, &h3, round, at),
            prove(&mut h3, &h1, round, at),
        ] {
            x.on_proof(&w, at);
        }
    }
    let at = T + 31_000;
    let mut verifier = ProofVerifier::new();
    for round in 1..=30 {
        let wire = prove(&mut s1, &s2, round, at);
        let signed = SignedProof::from_bytes(&wire).expect("signed");
        let verified = verifier.check_content(&signed, at).expect("verifies");
        let item = neuroshard_ledger::EpochItem::Proof(verified);
        match x.admit(x.ledger(), &item, at) {
            epochs::Admit::No(why) if round < 22 => assert!(why.contains("long gone"), "{why}"),
            epochs::Admit::Yes if round >= 22 => {}
            other => panic!("round {round}: {other:?}"),
        }
    }
}
