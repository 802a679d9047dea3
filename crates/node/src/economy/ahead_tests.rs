//! Claims past a stage's certified round: held, not paid, and paid alike in any order once
//! the stage reaches them.

use neuroshard_ledger::LedgerGenesis;

use neuroshard_proof::fixtures::test_identity;

use super::tests::{T, decode, economy_with, genesis, prove, registered, rules};
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

/// Live ledgers judge the floor too, by the first paid rounds of the finalized state: a
/// newcomer's claims wait until one of them is final, only those within reach of the stage
/// go to finality, and then the live ledger pays from the lead before that first one, the
/// same whatever order the claims came in.
#[test]
fn a_live_ledger_pays_a_newcomer_only_from_the_lead_before_its_first_final_claim() {
    let (mut h1, mut h2, mut h3) = (led(31), led(32), led(33));
    let (mut s1, mut s2, mut x, mut y) = (led(34), led(35), led(36), led(37));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x, &mut y]);
    for round in 1..=30 {
        let at = T + round * 1_000;
        for w in [
            prove(&mut h1, &h2, round, at),
            prove(&mut h2, &h3, round, at),
            prove(&mut h3, &h1, round, at),
        ] {
            x.on_proof(&w, at);
            y.on_proof(&w, at);
        }
    }
    // Finality runs: the honest replicas' first rounds are final.
    let finalized = x.ledger().clone();
    x.on_finalized(&finalized);
    y.on_finalized(&finalized);
    while x.poll_epoch_item().is_some() {}
    while y.poll_epoch_item().is_some() {}
    let at = T + 31_000;
    let claims: Vec<Vec<u8>> = (1..=30).map(|r| prove(&mut s1, &s2, r, at)).collect();
    for w in &claims {
        x.on_proof(w, at);
    }
    for w in claims.iter().rev() {
        y.on_proof(w, at);
    }
    let fed = |e: &mut Economy| {
        let mut rounds = Vec::new();
        while let Some((neuroshard_ledger::EpochItem::Proof(p), _)) = e.poll_epoch_item() {
            rounds.push(p.proof().round);
        }
        rounds
    };
    assert_eq!(fed(&mut x), (22..=30).collect::<Vec<_>>());
    assert_eq!(fed(&mut y), vec![30]);
    for e in [&x, &y] {
        assert_eq!(e.balance(&s1.node_id()), 0, "paid before a claim was final");
        assert_eq!(e.parked_count(), HELD_PER_KEY);
    }
    // An epoch pays the newcomer's lowest claim it was handed, 22: the floor is 14.
    let mut verifier = ProofVerifier::new();
    let first = SignedProof::from_bytes(&claims[21]).expect("signed");
    let first = verifier.check_content(&first, at).expect("verifies");
    let mut finalized = finalized;
    assert!(finalized.apply_proof(&first).is_ok());
    x.on_finalized(&finalized);
    y.on_finalized(&finalized);
    for e in [&x, &y] {
        // The sixteen highest were held: 15 to 30.
        assert_eq!(e.balance(&s1.node_id()) / rules().round_reward, 16);
        assert_eq!(e.parked_count(), 0);
        match e.ledger().check_round_floor(first.proof()) {
            Ok(()) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(x.state_hash(), y.state_hash());
    match x.on_proof(&prove(&mut s1, &s2, 31, at), at) {
        ProofOutcome::Applied { .. } => {}
        other => panic!("round 31: {other:?}"),
    }
    let mut late = decode(&claims[0]);
    late.round = 13;
    late.nonce += 1_000;
    late.receipts = vec![s2.receipt_for(s1.node_id(), 13, late.pseudo_gradient_hash)];
    match x.on_proof(&late.sign(&test_identity(34)).to_bytes(), at) {
        ProofOutcome::Rejected(why) => assert!(why.contains("long gone"), "{why}"),
        other => panic!("round 13: {other:?}"),
    }
}
