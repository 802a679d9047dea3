//! The round rules on live ledgers, judged by the finalized state's progress: claims past a
//! stage's certified round, or of keys with no final claim of the stage, are held and paid
//! alike in any order once an epoch allows them; claims long gone are refused.

use neuroshard_ledger::LedgerGenesis;
use proptest::prelude::*;

use neuroshard_proof::fixtures::test_identity;

use super::tests::{T, claimed, decode, economy_with, genesis, prove, registered, rules};
use super::*;

/// What finality would hold after paying `wires` onto `state` (judged with the round rules on,
/// as a finalized state is).
fn finalize(state: &mut LedgerState, wires: &[Vec<u8>], at: u64) {
    let mut verifier = ProofVerifier::new();
    for w in wires {
        let signed = SignedProof::from_bytes(w).expect("signed");
        let proof = verifier.check_content(&signed, at).expect("verifies");
        state.check_round_rules(&proof).expect("finality admits it");
        state.apply_proof(&proof).expect("finality pays it");
    }
}

/// Three replicas' proofs of `round`, each receipted by the next.
fn round_of_three(
    h1: &mut Economy,
    h2: &mut Economy,
    h3: &mut Economy,
    round: u64,
    at: u64,
) -> [Vec<u8>; 3] {
    let a = prove(h1, h2, round, at);
    let b = prove(h2, h3, round, at);
    let c = prove(h3, h1, round, at);
    [a, b, c]
}

/// Economies under a round lead of 8 (the default for new networks).
fn led(seed: u64) -> Economy {
    let rules = neuroshard_ledger::Rules {
        round_lead: 8,
        ..rules()
    };
    let genesis = LedgerGenesis::new(rules, genesis().stakes).expect("genesis");
    economy_with(seed, &genesis)
}

/// Three honest replicas of stage 0 prove rounds 1 to 10; two staked keys of the same stage
/// receipt each other's claims of rounds 11 to 500. Before the round lead every ledger paid
/// every one of them (70 NEURO a key, at once). Now a live ledger pays neither key before one of
/// its claims is final, hands finality none more than 64 rounds past the stage, and pays what
/// finality allows: rounds 11 and 18, the lead past what the honest majority reached. A
/// second node that gets everything in the reverse order ends on the same state.
#[test]
fn two_staked_keys_receipting_each_other_are_paid_only_as_far_as_their_stage_got() {
    let (mut h1, mut h2, mut h3) = (led(1), led(2), led(3));
    let (mut s1, mut s2) = (led(4), led(5));
    let (mut x, mut y) = (led(6), led(7));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x, &mut y]);
    let mut honest = Vec::new();
    for round in 1..=10 {
        let at = T + round * 1_000;
        honest.extend(round_of_three(&mut h1, &mut h2, &mut h3, round, at));
    }
    for w in &honest {
        x.on_proof(w, T + 10_000);
        y.on_proof(w, T + 10_000);
    }
    let mut fin = x.ledger().clone();
    x.on_finalized(&fin);
    y.on_finalized(&fin);
    while x.poll_epoch_item().is_some() {}
    let at = T + 20_000;
    let mut claims = Vec::new();
    for round in (11..=500).step_by(7) {
        claims.push((round, prove(&mut s1, &s2, round, at)));
        claims.push((round, prove(&mut s2, &s1, round, at)));
    }
    for (_, w) in &claims {
        x.on_proof(w, at);
    }
    for (_, w) in claims.iter().rev() {
        y.on_proof(w, at);
    }
    // Counted on the ledger (paid when finality settles the round: `ledger::state::pots`).
    let paid = |e: &Economy, who: &Economy| claimed(e, &who.node_id());
    for e in [&x, &y] {
        assert_eq!(paid(e, &s1), 0, "paid before a claim of the key was final");
        assert_eq!(e.parked_count(), claims.len());
    }
    assert_eq!(x.state_hash(), y.state_hash());
    while let Some((item, _)) = x.poll_epoch_item() {
        if let neuroshard_ledger::EpochItem::Proof(p) = item {
            let round = p.proof().round;
            assert!(round <= 10 + FEED_AHEAD, "round {round} went to finality");
        }
    }
    // An epoch pays the keys' rounds 11 and 18 (finality's own judgement is tested in the
    // ledger and in the simulator).
    let within: Vec<Vec<u8>> = claims
        .iter()
        .filter(|(r, _)| *r <= 18)
        .map(|(_, w)| w.clone())
        .collect();
    finalize(&mut fin, &within, at);
    x.on_finalized(&fin);
    y.on_finalized(&fin);
    for e in [&x, &y] {
        assert_eq!(paid(e, &s1), 2, "the key was paid past its stage");
        assert_eq!(paid(e, &s2), 2);
        assert_eq!(e.parked_count(), claims.len() - 4);
    }
    assert_eq!(x.state_hash(), y.state_hash());

    // The honest replicas go on to round 30, and an epoch pays them: the held claims up to
    // round 38 are paid.
    let mut more = Vec::new();
    for round in 11..=30 {
        let at = T + 20_000 + round * 1_000;
        more.extend(round_of_three(&mut h1, &mut h2, &mut h3, round, at));
    }
    finalize(&mut fin, &more, T + 60_000);
    x.on_finalized(&fin);
    assert_eq!(paid(&x, &s1), 4, "rounds 11, 18, 25 and 32 of the claims");
}

/// A replica's own proof of a round its stage has not reached in the finalized state is held
/// at home too, still handed out to be gossiped, and paid once an epoch allows it.
#[test]
fn an_own_proof_ahead_of_the_stage_is_gossiped_and_paid_once_the_stage_gets_there() {
    let (mut a, mut b, mut c) = (led(11), led(12), led(13));
    registered(&mut [&mut a, &mut b, &mut c]);
    let first = prove(&mut a, &b, 1, T + 1_000);
    let mut fin = a.ledger().clone();
    let mut others = Vec::new();
    for round in 1..=3 {
        let at = T + round * 1_000;
        others.push(prove(&mut b, &c, round, at));
        others.push(prove(&mut c, &b, round, at));
    }
    finalize(&mut fin, &others, T + 4_000);
    a.on_finalized(&fin);
    // Round 12 is nine past the stage's 3: held, not paid, but gossiped.
    let before = claimed(&a, &a.node_id());
    let wire = prove(&mut a, &b, 12, T + 5_000);
    assert!(!wire.is_empty());
    assert_eq!(claimed(&a, &a.node_id()), before);
    assert_eq!(a.parked_count(), 1);
    let next = vec![
        prove(&mut b, &c, 4, T + 6_000),
        prove(&mut c, &b, 4, T + 6_000),
        first,
    ];
    finalize(&mut fin, &next, T + 6_000);
    a.on_finalized(&fin);
    assert_eq!(claimed(&a, &a.node_id()), before + 1);
    assert_eq!(a.parked_count(), 0);
}

/// Two keys that register once their stage ran 30 rounds receipt each other's claims of all
/// 30: a finalized epoch pays none more than the lead behind the stage.
#[test]
fn finality_refuses_a_newcomers_claims_of_rounds_its_stage_ran_before_it() {
    let (mut h1, mut h2, mut h3) = (led(21), led(22), led(23));
    let (mut s1, mut s2, mut x) = (led(24), led(25), led(26));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x]);
    for round in 1..=30 {
        let at = T + round * 1_000;
        for w in round_of_three(&mut h1, &mut h2, &mut h3, round, at) {
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
        let mut epoch = x.ledger().clone();
        let out =
            neuroshard_ledger::apply_epoch_admitted(&mut epoch, vec![item.clone()], |s, i| match x
                .admit(s, i, at)
            {
                epochs::Admit::Yes => Ok(()),
                other => Err(format!("{other:?}")),
            });
        match out.refused.first() {
            Some((_, why)) if round < 22 => {
                let why = why.to_string();
                assert!(why.contains("long gone"), "{why}");
            }
            None if round >= 22 => assert_eq!(out.applied, 1),
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
        for w in round_of_three(&mut h1, &mut h2, &mut h3, round, at) {
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
        assert_eq!(
            claimed(e, &s1.node_id()),
            0,
            "paid before a claim was final"
        );
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
        assert_eq!(claimed(e, &s1.node_id()), 16);
        assert_eq!(e.parked_count(), 0);
        match e.ledger().check_round_rules(&first) {
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

/// Three replicas proving rounds 1 to 6 and two staked keys of their stage claiming rounds 3
/// to 39 (each receipting the other's), once, for every arrival order below.
fn mixed_claims() -> &'static (Vec<Vec<u8>>, NodeId) {
    static WIRES: std::sync::OnceLock<(Vec<Vec<u8>>, NodeId)> = std::sync::OnceLock::new();
    WIRES.get_or_init(|| {
        let (mut h1, mut h2, mut h3) = (led(41), led(42), led(43));
        let (mut s1, mut s2) = (led(44), led(45));
        registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2]);
        let mut wires = Vec::new();
        for round in 1..=6 {
            let at = T + round * 1_000;
            wires.extend(round_of_three(&mut h1, &mut h2, &mut h3, round, at));
        }
        for round in (3..=40).step_by(3) {
            wires.push(prove(&mut s1, &s2, round, T + 7_000));
            wires.push(prove(&mut s2, &s1, round, T + 7_000));
        }
        (wires, s1.node_id())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever order the proofs arrive in, two nodes at the same finalized state pay the
    /// same ones and hold the same ones, before and after the next epoch: the honest rounds,
    /// then, of the keys' claims, those within the lead of round 6.
    #[test]
    fn any_arrival_order_pays_the_same_claims(
        order in Just((0..44usize).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let (wires, s1) = mixed_claims();
        let (mut x, mut y, mut z) = (led(46), led(47), led(48));
        registered(&mut [&mut x, &mut y, &mut z]);
        for id in [41, 42, 43, 44, 45] {
            // The provers' registrations (the same ops their economies signed).
            let mut e = led(id);
            let op = super::tests::register(&mut e);
            for n in [&mut x, &mut y, &mut z] {
                n.on_op(&op, T);
            }
        }
        // Finalized: the honest replicas' round 1.
        let mut fin = z.ledger().clone();
        finalize(&mut fin, &wires[..3], T + 8_000);
        x.on_finalized(&fin);
        y.on_finalized(&fin);
        for w in wires {
            x.on_proof(w, T + 8_000);
        }
        for &i in &order {
            y.on_proof(&wires[i], T + 8_000);
        }
        prop_assert_eq!(x.state_hash(), y.state_hash());
        prop_assert_eq!(claimed(&y, s1), 0);
        prop_assert_eq!(y.parked_count(), 26);
        // An epoch pays the honest rounds 2 to 6 and the keys' round 3.
        let mut next: Vec<Vec<u8>> = wires[3..18].to_vec();
        next.extend(wires[18..20].iter().cloned());
        finalize(&mut fin, &next, T + 8_000);
        x.on_finalized(&fin);
        y.on_finalized(&fin);
        prop_assert_eq!(x.state_hash(), y.state_hash());
        // Rounds 3, 6, 9, 12 of the keys' claims: 14 is the lead past 6.
        prop_assert_eq!(claimed(&y, s1), 4);
        prop_assert_eq!(y.parked_count(), 18);
    }
}

/// A key that floods a node with claims far past the stage holds at most [`MAX_AHEAD`] of
/// them, the furthest dropped first: an honest replica's claim just past the lead stays held
/// and is paid once an epoch allows it.
#[test]
fn a_flood_of_far_claims_holds_a_bounded_number_and_keeps_the_nearest() {
    let (mut h1, mut h2, mut h3) = (led(51), led(52), led(53));
    let (mut s1, mut s2, mut x) = (led(54), led(55), led(56));
    registered(&mut [&mut h1, &mut h2, &mut h3, &mut s1, &mut s2, &mut x]);
    let mut honest = Vec::new();
    for round in 1..=3 {
        honest.extend(round_of_three(
            &mut h1,
            &mut h2,
            &mut h3,
            round,
            T + round * 1_000,
        ));
    }
    for w in &honest {
        x.on_proof(w, T + 4_000);
    }
    let mut fin = x.ledger().clone();
    x.on_finalized(&fin);
    // Round 12 is one past the lead of the finalized stage's 3.
    let near = prove(&mut h1, &h2, 12, T + 5_000);
    assert!(matches!(
        x.on_proof(&near, T + 5_000),
        ProofOutcome::Parked(_)
    ));
    let flood = MAX_AHEAD as u64 + 40;
    for round in 100..100 + flood {
        x.on_proof(&prove(&mut s1, &s2, round, T + 6_000), T + 6_000);
    }
    assert_eq!(x.parked_count(), MAX_AHEAD);
    let next: Vec<Vec<u8>> = [
        prove(&mut h2, &h3, 4, T + 7_000),
        prove(&mut h3, &h1, 4, T + 7_000),
    ]
    .into();
    finalize(&mut fin, &next, T + 7_000);
    x.on_finalized(&fin);
    assert_eq!(claimed(&x, &h1.node_id()), 4, "rounds 1 to 3 and 12");
    assert_eq!(claimed(&x, &s1.node_id()), 0);
}
