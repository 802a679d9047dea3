use std::sync::OnceLock;

use neuroshard_ledger::{LedgerGenesis, Rules, UNITS_PER_NEURO};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::plausibility::{CPU_LIMITS, check_static};
use proptest::prelude::*;

use super::*;
use neuroshard_proof::Canonical;

pub(crate) const T: u64 = 1_800_000_000_000;
pub(crate) const NET: Hash32 = [7; 32];
/// Keys from this seed on hold no stake in the test genesis (Sybils).
const SYBIL_SEEDS: u64 = 90;

fn layout() -> Vec<(LayerRange, Roles)> {
    vec![
        (LayerRange { start: 0, end: 4 }, Roles::NONE),
        (LayerRange { start: 4, end: 8 }, Roles::NONE),
    ]
}

pub(crate) fn rules() -> Rules {
    Rules {
        network: NET,
        founded_ms: T - 86_400_000,
        min_stake: 10 * UNITS_PER_NEURO,
        round_reward: UNITS_PER_NEURO,
        min_round_ms: 1_000,
        round_lead: 0,
        ..Rules::default()
    }
}

pub(crate) fn genesis() -> LedgerGenesis {
    let stakes = (1..SYBIL_SEEDS)
        .map(|s| (test_identity(s).public_key(), 50 * UNITS_PER_NEURO))
        .collect();
    match LedgerGenesis::new(rules(), stakes) {
        Ok(g) => g,
        Err(e) => panic!("test genesis: {e}"),
    }
}

pub(crate) fn config() -> EconomyConfig {
    EconomyConfig {
        network: NET,
        layout: layout(),
        min_receipts: 1,
        audit_rate: neuroshard_audit::AuditRate::default(),
    }
}

pub(crate) fn economy(seed: u64) -> Economy {
    economy_with(seed, &genesis())
}

pub(crate) fn economy_with(seed: u64, genesis: &LedgerGenesis) -> Economy {
    match Economy::in_memory(test_identity(seed), config(), genesis) {
        Ok(e) => e,
        Err(err) => panic!("in-memory economy: {err}"),
    }
}

pub(crate) fn grad(node: &Economy, round: u64) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(&node.node_id().0);
    h.update(&round.to_le_bytes());
    *h.finalize().as_bytes()
}

pub(crate) fn work(node: &Economy, round: u64) -> WorkSummary {
    WorkSummary {
        round,
        layers: LayerRange { start: 0, end: 4 },
        roles: Roles::NONE,
        tokens: 8 * 256,
        batches: 8,
        shards: vec![ShardWork {
            shard_id: round,
            batch_token_hash: [round as u8; 32],
        }],
        model_hash_before: [1; 32],
        model_hash_after: [2; 32],
        pseudo_gradient_hash: grad(node, round),
        loss_micros: 3_000_000,
        duration_ms: 10_000,
    }
}

/// `prover` does `round`, `witness` receipts it, `prover` emits the proof at `now`.
pub(crate) fn prove(prover: &mut Economy, witness: &Economy, round: u64, now: u64) -> Vec<u8> {
    prover.record_round(work(prover, round));
    let receipt = witness.receipt_for(prover.node_id(), round, grad(prover, round));
    assert!(matches!(prover.on_receipt(round, receipt), Ok(true)));
    match prover.poll_proof(now) {
        Some(Ok(wire)) => wire,
        other => panic!("expected a proof, got {other:?}"),
    }
}

pub(crate) fn decode(wire: &[u8]) -> Proof {
    let signed = SignedProof::from_bytes(wire).ok();
    match signed.and_then(|s| Proof::from_canonical_bytes(s.payload_bytes()).ok()) {
        Some(p) => p,
        None => panic!("own proof must decode"),
    }
}

/// How many rounds of stage 0 (of rounds 0 to 1,000) `who` has a claim of in `e`'s ledger:
/// what a live ledger counts for it (training pays when finality settles a round).
pub(crate) fn claimed(e: &Economy, who: &NodeId) -> u64 {
    let layers = e.cfg.layout[0].0;
    (0..=1_000u64)
        .filter(|r| {
            e.ledger()
                .round_claimed(&neuroshard_ledger::round_key_of(who, layers, *r))
        })
        .count() as u64
}

/// `node`'s registration for stage 0, applied at home.
pub(crate) fn register(node: &mut Economy) -> Vec<u8> {
    match node.register(0, T - 1_000) {
        Some(Ok(wire)) => wire,
        other => panic!("registration: {other:?}"),
    }
}

/// Every node registers for stage 0 and every other node applies the op.
pub(crate) fn registered(nodes: &mut [&mut Economy]) {
    let ops: Vec<Vec<u8>> = nodes.iter_mut().map(|n| register(n)).collect();
    for n in nodes.iter_mut() {
        for op in &ops {
            n.on_op(op, T);
        }
    }
}

#[test]
fn three_nodes_reach_the_same_state_after_one_proof() {
    let (mut a, mut b, mut c) = (economy(1), economy(2), economy(3));
    registered(&mut [&mut a, &mut b, &mut c]);
    let wire = prove(&mut a, &b, 1, T);
    assert_eq!(claimed(&a, &a.node_id()), 1);
    for node in [&mut b, &mut c] {
        assert_eq!(
            node.on_proof(&wire, T + 50),
            ProofOutcome::Applied {
                node: a.node_id(),
                reward: 0
            }
        );
    }
    assert_eq!(a.state_hash(), b.state_hash());
    assert_eq!(a.state_hash(), c.state_hash());
    assert_eq!(c.balance(&a.node_id()), a.own_balance());
    assert_eq!(c.proof_count(), 1);
    // The round was claimed: no work left, no second proof.
    assert!(a.poll_proof(T + 60_000).is_none());
}

#[test]
fn a_proof_delivered_twice_is_a_duplicate() {
    let (mut a, mut b) = (economy(4), economy(5));
    registered(&mut [&mut a, &mut b]);
    let wire = prove(&mut a, &b, 1, T);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
    let hash = b.state_hash();
    assert_eq!(b.on_proof(&wire, T + 1), ProofOutcome::Duplicate);
    assert_eq!(a.on_proof(&wire, T + 1), ProofOutcome::Duplicate);
    assert_eq!(b.state_hash(), hash);
}

/// Registration is ledger state: a node that has not seen the prover's or the receipt
/// signer's Register op parks the proof and applies it when the op arrives, however late.
#[test]
fn a_proof_waits_for_the_registrations_it_needs() {
    let (mut a, mut b, mut c) = (economy(6), economy(7), economy(8));
    let (reg_a, reg_b) = (register(&mut a), register(&mut b));
    a.on_op(&reg_b, T);
    let wire = prove(&mut a, &b, 1, T);
    let empty = c.state_hash();
    assert!(matches!(c.on_proof(&wire, T), ProofOutcome::Parked(_)));
    assert!(matches!(c.on_proof(&wire, T), ProofOutcome::Parked(_)));
    assert_eq!((c.state_hash(), c.parked_count()), (empty, 1));
    // The prover's registration alone: the receipt signer is still unknown.
    let (_, retried) = c.on_op(&reg_a, T);
    assert_eq!(retried.applied, 0);
    assert_eq!(c.parked_count(), 1);
    let (_, retried) = c.on_op(&reg_b, T + 86_400_000);
    assert_eq!(retried.applied, 1);
    assert_eq!(c.parked_count(), 0);
    b.on_op(&reg_a, T);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
    assert_eq!(c.state_hash(), b.state_hash());
}

#[test]
fn garbage_and_tampered_proofs_are_rejected_with_a_reason() {
    let (mut a, mut b, mut early) = (economy(10), economy(11), economy(12));
    registered(&mut [&mut a, &mut b, &mut early]);
    let wire = prove(&mut a, &b, 1, T);
    let reject = |outcome: ProofOutcome, want: &str| match outcome {
        ProofOutcome::Rejected(why) => assert!(why.contains(want), "{why} lacks {want}"),
        other => panic!("expected rejection, got {other:?}"),
    };
    reject(b.on_proof(b"not a proof", T), "format");
    reject(b.on_proof(&wire[..wire.len() - 1], T), "format");
    let mut flipped = wire.clone();
    flipped[100] ^= 1; // inside the signed payload
    reject(b.on_proof(&flipped, T), "signature");
    let mut bad_sig = wire.clone();
    let last = bad_sig.len() - 1;
    bad_sig[last] ^= 1;
    reject(b.on_proof(&bad_sig, T), "signature");
    // A correctly signed proof from too far in the future.
    let future = prove(&mut early, &b, 1, T + 10 * 60_000);
    reject(b.on_proof(&future, T), "future");
    assert_eq!(b.proof_count(), 0);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
}

/// Wire bytes of proofs, and of the ops they need.
type Corpus = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Six proofs by three nodes and the registrations they need.
fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let (mut a, mut b, mut c) = (economy(16), economy(17), economy(18));
        let ops = vec![register(&mut a), register(&mut b), register(&mut c)];
        for n in [&mut a, &mut b, &mut c] {
            for op in &ops {
                n.on_op(op, T);
            }
        }
        let mut wires = Vec::new();
        for (i, t) in [T, T + 2_000].into_iter().enumerate() {
            let round = i as u64 + 1;
            wires.push(prove(&mut a, &b, round, t));
            wires.push(prove(&mut b, &c, round, t));
            wires.push(prove(&mut c, &a, round, t));
        }
        (wires, ops)
    })
}

/// Delivers proofs and ops in `order` (indices ≥ 6 are ops).
fn replay(order: &[usize]) -> Hash32 {
    let (wires, ops) = corpus();
    let mut d = economy(19);
    for &i in order {
        match wires.get(i) {
            Some(w) => {
                d.on_proof(w, T + 3_600_000);
            }
            None => {
                d.on_op(&ops[i - wires.len()], T + 3_600_000);
            }
        }
    }
    assert_eq!(d.proof_count(), wires.len());
    d.state_hash()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Proofs, their repeats and the registrations they need, in any order: one state.
    #[test]
    fn any_delivery_order_gives_the_same_state_hash(
        order in Just((0..9usize).chain(0..3).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let reference = replay(&[6, 7, 8, 0, 1, 2, 3, 4, 5]);
        prop_assert_eq!(replay(&order), reference);
    }

    /// What the store writes is what the economy applied, however the deliveries come and
    /// however the writes are batched, with finality's records between them (writes that
    /// change no account: merged last into a batch, their empty totals once reset the
    /// database's minted and burned to 0, and the node could not reopen it): the reopened
    /// ledger has the economy's state hash.
    #[test]
    fn persisted_changes_reopen_to_the_economys_state(
        order in Just((0..9usize).chain(0..3).collect::<Vec<_>>()).prop_shuffle(),
        cuts in proptest::collection::vec(any::<bool>(), 12),
        finality in proptest::collection::vec(any::<bool>(), 12),
    ) {
        let (wires, ops) = corpus();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let me = test_identity(19).node_id();
        let (mut store, snapshot) = LedgerStore::open(&path, &me, &genesis()).unwrap();
        let mut d = Economy::resume(test_identity(19), config(), snapshot);
        let mut batch = Vec::new();
        for (&i, cut) in order.iter().zip(&cuts) {
            match wires.get(i) {
                Some(w) => {
                    d.on_proof(w, T + 3_600_000);
                }
                None => {
                    d.on_op(&ops[i - wires.len()], T + 3_600_000);
                }
            }
            batch.extend(std::iter::from_fn(|| d.poll_write()));
            if finality[batch.len() % finality.len()] {
                batch.push(LedgerWrite::finality(FinalityWrite::Wal {
                    epoch: 1,
                    entry: vec![batch.len() as u8],
                }));
            }
            if *cut {
                store.write_batch(&std::mem::take(&mut batch)).unwrap();
            }
        }
        store.write_batch(&batch).unwrap();
        drop(store);
        let (_, reopened) = LedgerStore::open(&path, &me, &genesis()).unwrap();
        prop_assert_eq!(reopened.state.state_hash(), d.state_hash());
        prop_assert_eq!(reopened.wires.len(), wires.len());
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut e = economy(20);
        prop_assert!(matches!(e.on_proof(&bytes, T), ProofOutcome::Rejected(_)));
        prop_assert!(matches!(e.on_op(&bytes, T).0, ProofOutcome::Rejected(_)));
        let _ = LedgerSyncRequest::from_canonical_bytes(&bytes);
        let _ = LedgerSyncResponse::from_canonical_bytes(&bytes);
    }
}

/// One proof per round, made only once a co-replica registered for the stage has receipted
/// the round; a receipt from a key that is not registered there backs nothing.
#[test]
fn a_proof_per_round_backed_by_a_registered_co_replica() {
    let (mut a, mut b, mut stranger) = (economy(21), economy(22), economy(23));
    registered(&mut [&mut a, &mut b]);
    assert!(a.poll_proof(T).is_none(), "no work yet");
    a.record_round(work(&a, 1));
    assert!(a.poll_proof(T).is_none(), "no receipt yet");
    // Staked, but registered for another stage (and not known to `a` at all yet).
    let other_stage = match stranger.register(1, T) {
        Some(Ok(w)) => w,
        other => panic!("registration: {other:?}"),
    };
    a.on_op(&other_stage, T);
    let r = stranger.receipt_for(a.node_id(), 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, r), Ok(true)));
    assert!(
        a.poll_proof(T).is_none(),
        "receipt signer serves another stage"
    );
    let r = b.receipt_for(a.node_id(), 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, r), Ok(true)));
    let first = decode(&match a.poll_proof(T) {
        Some(Ok(w)) => w,
        other => panic!("expected a proof, got {other:?}"),
    });
    assert_eq!((first.round, first.receipts.len()), (1, 1));
    let second = decode(&prove(&mut a, &b, 2, T + 1));
    assert_eq!(second.round, 2);
    assert!(second.nonce > first.nonce);
    assert_eq!(claimed(&a, &a.node_id()), 2);
}

#[test]
fn implausible_work_is_under_claimed_not_refused() {
    let (mut a, mut b) = (economy(26), economy(27));
    registered(&mut [&mut a, &mut b]);
    for (round, tokens, batches, duration_ms) in [
        (1, 1_000_000_000, 1_000_000, 10_000),
        (2, 8, 8, 10),
        (3, 10_000, 100, 2 * 3_600_000),
    ] {
        a.record_round(WorkSummary {
            tokens,
            batches,
            duration_ms,
            ..work(&a, round)
        });
        let r = b.receipt_for(a.node_id(), round, grad(&a, round));
        assert!(matches!(a.on_receipt(round, r), Ok(true)));
        let wire = match a.poll_proof(T + round * 60_000) {
            Some(Ok(w)) => w,
            other => panic!("round {round}: {other:?}"),
        };
        let proof = decode(&wire);
        assert_eq!(check_static(&proof), Ok(()));
        assert!(proof.tokens <= tokens && proof.batches <= batches);
        let layer_tokens = proof.tokens * u64::from(proof.layers.len());
        assert!(
            layer_tokens * 1000 / proof.claimed_duration_ms <= CPU_LIMITS.max_layer_tokens_per_sec
        );
        assert!(matches!(
            b.on_proof(&wire, T + round * 60_000),
            ProofOutcome::Applied { .. }
        ));
    }
    assert_eq!(a.state_hash(), b.state_hash());
}

#[test]
fn receipts_must_vouch_for_my_gradient_of_that_round() {
    let (mut a, mut b) = (economy(30), economy(31));
    registered(&mut [&mut a, &mut b]);
    // Arrives before the round is recorded: held, then matched.
    let early = b.receipt_for(a.node_id(), 5, grad(&a, 5));
    assert!(matches!(a.on_receipt(5, early), Ok(true)));
    assert!(matches!(a.on_receipt(5, early), Ok(false)));
    a.record_round(work(&a, 5));
    assert!(
        matches!(a.on_receipt(5, early), Ok(false)),
        "duplicate signer"
    );
    let refused = |r: Result<bool, EconomyError>| matches!(r, Err(EconomyError::Receipt(_)));
    let wrong_hash = b.receipt_for(a.node_id(), 5, [9; 32]);
    assert!(refused(a.on_receipt(5, wrong_hash)));
    let for_other = b.receipt_for(b.node_id(), 5, grad(&a, 5));
    assert!(refused(a.on_receipt(5, for_other)));
    let own = a.receipt_for(a.node_id(), 5, grad(&a, 5));
    assert!(refused(a.on_receipt(5, own)));
    let identity = test_identity(31);
    let activations = Receipt::sign(
        &identity,
        NET,
        a.node_id(),
        5,
        ReceiptKind::Activations,
        grad(&a, 5),
    );
    assert!(refused(a.on_receipt(5, activations)));
    // A receipt signed for another network does not verify here.
    let foreign = Receipt::sign(
        &identity,
        [8; 32],
        a.node_id(),
        5,
        ReceiptKind::Gradients,
        grad(&a, 5),
    );
    assert!(refused(a.on_receipt(5, foreign)));
    // A forgotten past round is ignored.
    let old = b.receipt_for(a.node_id(), 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, old), Ok(false)));
    let proof = decode(&match a.poll_proof(T) {
        Some(Ok(w)) => w,
        other => panic!("the early receipt must back a proof: {other:?}"),
    });
    assert_eq!(proof.receipts.len(), 1);
}

#[test]
fn nonces_keep_rising_across_a_reopen_even_if_the_clock_goes_back()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ledger.db");
    let mut b = economy(33);
    let reg_b = register(&mut b);
    let open = || -> Result<(LedgerStore, Economy), EconomyError> {
        let (store, snapshot) = LedgerStore::open(&path, &test_identity(32).node_id(), &genesis())?;
        Ok((
            store,
            Economy::resume(test_identity(32), config(), snapshot),
        ))
    };
    let flush = |store: &mut LedgerStore, a: &mut Economy| -> Result<(), EconomyError> {
        let writes: Vec<_> = std::iter::from_fn(|| a.poll_write()).collect();
        store.write_batch(&writes)
    };
    let (first, hash) = {
        let (mut store, mut a) = open()?;
        register(&mut a);
        a.on_op(&reg_b, T);
        let wire = prove(&mut a, &b, 1, T);
        flush(&mut store, &mut a)?;
        (decode(&wire).nonce, a.state_hash())
    };
    let (mut store, mut a) = open()?;
    assert_eq!(a.state_hash(), hash, "registrations and the proof survive");
    let second = decode(&prove(&mut a, &b, 2, T - 60_000)).nonce;
    assert!(second > first, "{second} <= {first}");
    assert_eq!(a.proof_count(), 2);
    flush(&mut store, &mut a)?;
    drop(store);
    let (_, again) = open()?;
    assert_eq!(again.state_hash(), a.state_hash());
    Ok(())
}

/// Proofs no node of this network makes mint nothing, whatever they claim: Uptime,
/// Inference and Verification proofs, training claims for layers and roles that are no
/// stage of the network (a whole-model claim), and proofs naming another network.
#[test]
fn unproduced_proof_kinds_and_claims_beyond_a_stage_mint_nothing() {
    let (mut a, mut b, mut mallory) = (economy(50), economy(51), economy(52));
    registered(&mut [&mut a, &mut b, &mut mallory]);
    let m = test_identity(52);
    let claim = |kind: ProofKind, layers: LayerRange, roles: Roles, nonce: u64| {
        Proof {
            network: NET,
            kind,
            layers,
            roles,
            ..neuroshard_proof::fixtures::uptime_proof(&m, nonce, T)
        }
        .sign(&m)
        .to_bytes()
    };
    let stages = layout();
    let whole = LayerRange { start: 0, end: 8 };
    let both = Roles::EMBEDDING.with(Roles::LM_HEAD);
    let mut foreign = decode(&prove(&mut mallory, &a, 1, T));
    foreign.network = [8; 32];
    let attempts = [
        claim(ProofKind::Uptime, stages[0].0, stages[0].1, 1),
        claim(ProofKind::Inference, stages[0].0, stages[0].1, 2),
        claim(ProofKind::Verification, stages[1].0, stages[1].1, 3),
        claim(ProofKind::Training, whole, both, 4),
        foreign.sign(&m).to_bytes(),
    ];
    for wire in &attempts {
        assert!(
            matches!(b.on_proof(wire, T + 10), ProofOutcome::Rejected(_)),
            "{:?}",
            decode(wire).kind
        );
    }
    assert_eq!(b.balance(&mallory.node_id()), 0);
    assert_eq!(b.proof_count(), 0);
    let honest = prove(&mut a, &b, 1, T);
    assert!(matches!(
        b.on_proof(&honest, T + 10),
        ProofOutcome::Applied { .. }
    ));
}

/// Attacks on minting: a key without stake cannot register, so receipts it signs back
/// nothing (a colluding prover's proof waits forever for a registration that cannot come);
/// a round re-signed with a fresh nonce, a bigger claim or a later timestamp is not paid
/// again; a round that cannot have happened yet is not paid at all.
#[test]
fn sybil_receipts_resigned_back_dated_and_future_rounds_mint_nothing() {
    let (mut a, mut b) = (economy(60), economy(61));
    registered(&mut [&mut a, &mut b]);
    let mut sybil = economy(SYBIL_SEEDS);
    assert!(sybil.register(0, T).is_none(), "no stake, no registration");

    // `a` colludes with the Sybil: it signs a proof backed only by the Sybil's receipt.
    let ida = test_identity(60);
    let mut forged = decode(&prove(&mut a, &b, 1, T));
    forged.round = 2;
    forged.nonce += 1;
    forged.receipts = vec![sybil.receipt_for(a.node_id(), 2, forged.pseudo_gradient_hash)];
    let forged = forged.sign(&ida).to_bytes();
    assert!(matches!(b.on_proof(&forged, T), ProofOutcome::Parked(_)));
    assert_eq!(claimed(&b, &a.node_id()), 0);

    // Round 1 again: new nonce, four times the claim, a later time.
    let honest = prove(&mut a, &b, 3, T);
    assert!(matches!(
        b.on_proof(&honest, T),
        ProofOutcome::Applied { .. }
    ));
    let mut again = decode(&honest);
    again.nonce += 10;
    again.tokens *= 4;
    again.batches *= 4;
    again.timestamp_ms += 60_000;
    let again = again.sign(&ida).to_bytes();
    // Two proofs for one round are an equivocation: neither is paid, the stake is slashed,
    // and a third proof for the round is refused.
    let stake = b.ledger().account(&a.node_id()).stake;
    assert!(matches!(
        b.on_proof(&again, T + 60_000),
        ProofOutcome::Applied { .. }
    ));
    // Out of its round's pot: the round pays `a` nothing when it settles.
    let layers = layout()[0].0;
    assert!(b.ledger().pot(layers, 3).is_empty());
    assert!(b.ledger().account(&a.node_id()).stake < stake);
    let mut third = decode(&honest);
    third.nonce += 11;
    match b.on_proof(&third.sign(&ida).to_bytes(), T + 60_000) {
        ProofOutcome::Rejected(why) => assert!(why.contains("already paid"), "{why}"),
        other => panic!("a third proof for the round was {other:?}"),
    }
    assert!(b.ledger().pot(layers, 3).is_empty());
    let proofs = b.proof_count();

    // Founded a day before T with rounds of at least 1 s: round 86 401 is in the future.
    let mut early = decode(&honest);
    early.round = 86_401;
    early.nonce += 20;
    early.receipts = vec![b.receipt_for(a.node_id(), 86_401, early.pseudo_gradient_hash)];
    match b.on_proof(&early.sign(&ida).to_bytes(), T) {
        ProofOutcome::Rejected(why) => assert!(why.contains("cannot have happened"), "{why}"),
        other => panic!("a future round was {other:?}"),
    }
    assert_eq!(b.proof_count(), proofs);

    // Back-dated: a new round signed as if a second after the founding, when round 4 could
    // not have happened yet (four rounds need four seconds).
    let mut back = decode(&honest);
    back.round = 4;
    back.nonce += 30;
    back.timestamp_ms = rules().founded_ms + 1_000;
    back.receipts = vec![b.receipt_for(a.node_id(), 4, back.pseudo_gradient_hash)];
    match b.on_proof(&back.sign(&ida).to_bytes(), T) {
        ProofOutcome::Rejected(why) => assert!(why.contains("cannot have happened"), "{why}"),
        other => panic!("a back-dated round was {other:?}"),
    }
    assert_eq!(b.proof_count(), proofs);
    let round4 = neuroshard_ledger::round_key_of(&a.node_id(), layers, 4);
    assert!(!b.ledger().round_claimed(&round4));
}

/// An op signed with a time beyond the clock skew is refused: its signed time decides when a
/// stake unlocks, so a stake still locked now could be unstaked by post-dating the op. The
/// same op applies once its time has come.
#[test]
fn a_post_dated_unstake_is_refused_until_its_time() {
    use neuroshard_ledger::{AccountOp, Action};
    let mut b = economy(71);
    let id = test_identity(70);
    // Genesis stakes unlock a day after the founding, which is T.
    let (before, after) = (T - 3_600_000, T + 3_600_000);
    let unstake = AccountOp {
        network: NET,
        account: id.node_id(),
        nonce: 0,
        timestamp_ms: after,
        action: Action::Unstake { amount: 1 },
    }
    .sign(&id)
    .to_bytes();
    let stake = b.ledger().account(&id.node_id()).stake;
    assert!(matches!(
        b.on_op(&unstake, before).0,
        ProofOutcome::Rejected(_)
    ));
    assert_eq!(b.ledger().account(&id.node_id()).stake, stake);
    assert!(matches!(
        b.on_op(&unstake, after).0,
        ProofOutcome::Applied { .. }
    ));
    assert_eq!(b.ledger().account(&id.node_id()).stake, stake - 1);
}
