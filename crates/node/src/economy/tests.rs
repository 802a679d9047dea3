use std::sync::OnceLock;

use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::plausibility::{CPU_LIMITS, check_static};
use proptest::prelude::*;

use super::*;
use neuroshard_proof::{Canonical, Signed};

const T: u64 = 1_800_000_000_000;

fn economy(seed: u64) -> Economy {
    match Economy::in_memory(test_identity(seed)) {
        Ok(mut e) => {
            e.min_interval_ms = 1_000;
            e
        }
        Err(err) => panic!("in-memory economy: {err}"),
    }
}

fn grad(node: &Economy, round: u64) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(&node.node_id().0);
    h.update(&round.to_le_bytes());
    *h.finalize().as_bytes()
}

fn work(node: &Economy, round: u64) -> WorkSummary {
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
fn prove(prover: &mut Economy, witness: &Economy, round: u64, now: u64) -> Vec<u8> {
    prover.learn_node(witness.public_key(), &[]);
    prover.record_round(work(prover, round));
    let receipt = witness.receipt_for(prover.node_id(), round, grad(prover, round));
    assert!(matches!(prover.on_receipt(round, receipt), Ok(true)));
    match prover.poll_proof(now) {
        Some(Ok(wire)) => wire,
        other => panic!("expected a proof, got {other:?}"),
    }
}

fn decode(wire: &[u8]) -> Proof {
    let signed = SignedProof::from_bytes(wire).ok();
    match signed.and_then(|s| Proof::from_canonical_bytes(s.payload_bytes()).ok()) {
        Some(p) => p,
        None => panic!("own proof must decode"),
    }
}

fn know_each_other(nodes: &mut [&mut Economy]) {
    let keys: Vec<PublicKey> = nodes.iter().map(|n| n.public_key()).collect();
    for n in nodes.iter_mut() {
        for k in &keys {
            n.learn_node(*k, &[]);
        }
    }
}

#[test]
fn three_nodes_reach_the_same_state_after_one_proof() {
    let (mut a, mut b, mut c) = (economy(1), economy(2), economy(3));
    know_each_other(&mut [&mut a, &mut b, &mut c]);
    let wire = prove(&mut a, &b, 1, T);
    assert!(a.own_balance() > 0);
    for node in [&mut b, &mut c] {
        assert_eq!(
            node.on_proof(&wire, T + 50),
            ProofOutcome::Applied {
                node: a.node_id(),
                reward: a.own_balance()
            }
        );
    }
    assert_eq!(a.state_hash(), b.state_hash());
    assert_eq!(a.state_hash(), c.state_hash());
    assert_eq!(c.balance(&a.node_id()), a.own_balance());
    assert_eq!(c.balances(), vec![(a.node_id(), a.own_balance())]);
    assert_eq!(c.proof_count(), 1);
    // Receipts vouch for one round only: no work, no second proof.
    assert!(a.poll_proof(T + 60_000).is_none());
}

#[test]
fn a_proof_delivered_twice_is_a_duplicate() {
    let (mut a, mut b) = (economy(4), economy(5));
    know_each_other(&mut [&mut a, &mut b]);
    let wire = prove(&mut a, &b, 1, T);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
    let hash = b.state_hash();
    assert_eq!(b.on_proof(&wire, T + 1), ProofOutcome::Duplicate);
    assert_eq!(a.on_proof(&wire, T + 1), ProofOutcome::Duplicate);
    assert_eq!(b.state_hash(), hash);
}

#[test]
fn unknown_receipt_signer_is_parked_until_learned() {
    let (mut a, b, mut c) = (economy(6), economy(7), economy(8));
    let wire = prove(&mut a, &b, 1, T);
    let empty = c.state_hash();
    assert!(matches!(c.on_proof(&wire, T), ProofOutcome::Parked(_)));
    assert!(matches!(c.on_proof(&wire, T), ProofOutcome::Parked(_)));
    assert_eq!((c.state_hash(), c.parked_count()), (empty, 1));
    // Learning an unrelated node retries nothing.
    assert_eq!(c.learn_node(a.public_key(), &[]), SyncSummary::default());
    let summary = c.learn_node(b.public_key(), &[]);
    assert_eq!(summary.applied, 1);
    assert_eq!((c.state_hash(), c.parked_count()), (a.state_hash(), 0));
    // Parked long enough to be "stale" by the arrival-time rules: still applied.
    let mut late = economy(9);
    let old = prove(&mut a, &b, 2, T + 2_000);
    assert!(matches!(
        late.on_proof(&old, T + 86_400_000),
        ProofOutcome::Parked(_)
    ));
    assert_eq!(late.learn_node(b.public_key(), &[]).applied, 1);
}

#[test]
fn garbage_and_tampered_proofs_are_rejected_with_a_reason() {
    let (mut a, mut b) = (economy(10), economy(11));
    know_each_other(&mut [&mut a, &mut b]);
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
    let mut early = economy(12);
    early.learn_node(b.public_key(), &[]);
    let future = prove(&mut early, &b, 1, T + 10 * 60_000);
    reject(b.on_proof(&future, T), "future");
    assert_eq!(b.proof_count(), 0);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
}

#[test]
fn anti_entropy_delivers_a_missed_proof() -> Result<(), EconomyError> {
    let (mut a, mut b, mut c) = (economy(13), economy(14), economy(15));
    know_each_other(&mut [&mut a, &mut b, &mut c]);
    let first = prove(&mut a, &b, 1, T);
    let second = prove(&mut a, &b, 2, T + 5_000);
    for w in [&first, &second] {
        assert!(matches!(
            b.on_proof(w, T + 6_000),
            ProofOutcome::Applied { .. }
        ));
    }
    assert!(matches!(
        c.on_proof(&first, T + 6_000),
        ProofOutcome::Applied { .. }
    ));
    assert_ne!(c.state_hash(), b.state_hash());

    let bytes = c.sync_request()?.to_canonical_bytes();
    let request = match LedgerSyncRequest::from_canonical_bytes(&bytes) {
        Ok(r) => r,
        Err(e) => panic!("request decodes: {e}"),
    };
    assert_eq!(b.answer_sync(&request, 10)?.proofs.len(), 0, "byte budget");
    let bytes = b.answer_sync(&request, 1 << 20)?.to_canonical_bytes();
    let response = match LedgerSyncResponse::from_canonical_bytes(&bytes) {
        Ok(r) => r,
        Err(e) => panic!("response decodes: {e}"),
    };
    assert_eq!(response.proofs, vec![second.clone()]);
    // Hours later: old proofs still apply.
    let summary = c.on_sync_response(&response, &[0; 32], T + 10 * 3_600_000);
    assert_eq!(summary.applied, 1);
    assert_eq!(c.state_hash(), b.state_hash());
    assert_eq!(c.proof_hashes()?, b.proof_hashes()?);
    assert!(
        c.proofs_missing_for(&b.sync_request()?, 1 << 20)?
            .is_empty()
    );
    Ok(())
}

/// Six proofs by three nodes and the keys that must be known to apply them.
fn corpus() -> &'static (Vec<Vec<u8>>, Vec<PublicKey>) {
    static CORPUS: OnceLock<(Vec<Vec<u8>>, Vec<PublicKey>)> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let (mut a, mut b, mut c) = (economy(16), economy(17), economy(18));
        know_each_other(&mut [&mut a, &mut b, &mut c]);
        let mut wires = Vec::new();
        for (i, t) in [T, T + 2_000].into_iter().enumerate() {
            let round = i as u64 + 1;
            wires.push(prove(&mut a, &b, round, t));
            wires.push(prove(&mut b, &c, round, t));
            wires.push(prove(&mut c, &a, round, t));
        }
        (wires, vec![a.public_key(), b.public_key(), c.public_key()])
    })
}

fn replay(order: &[usize], learn_late: bool) -> Hash32 {
    let (wires, keys) = corpus();
    let mut d = economy(19);
    if !learn_late {
        keys.iter().for_each(|k| {
            d.learn_node(*k, &[]);
        });
    }
    for &i in order {
        d.on_proof(&wires[i], T + 3_600_000);
    }
    keys.iter().for_each(|k| {
        d.learn_node(*k, &[]);
    });
    assert_eq!(d.proof_count(), wires.len());
    d.state_hash()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_delivery_order_gives_the_same_state_hash(
        order in Just((0..6usize).chain(0..3).collect::<Vec<_>>()).prop_shuffle(),
        learn_late in any::<bool>(),
    ) {
        let reference = replay(&[0, 1, 2, 3, 4, 5], false);
        prop_assert_eq!(replay(&order, learn_late), reference);
    }
}

#[test]
fn no_proof_before_the_interval_or_without_receipts() {
    let (mut a, b, stranger) = (economy(21), economy(22), economy(23));
    a.min_interval_ms = 30_000;
    assert!(a.poll_proof(T).is_none(), "no work yet");
    a.record_round(work(&a, 1));
    assert!(a.poll_proof(T).is_none(), "no receipt yet");
    // A receipt from a signer the node has not learned cannot back a proof.
    let r = stranger.receipt_for(a.node_id(), 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, r), Ok(true)));
    assert!(a.poll_proof(T).is_none(), "receipt signer unknown");
    let first = prove(&mut a, &b, 2, T);
    assert_eq!(decode(&first).round, 2);
    a.record_round(work(&a, 3));
    let r = b.receipt_for(a.node_id(), 3, grad(&a, 3));
    assert!(matches!(a.on_receipt(3, r), Ok(true)));
    assert!(a.poll_proof(T + 29_999).is_none(), "interval not over");
    assert!(matches!(a.poll_proof(T + 30_000), Some(Ok(_))));
}

#[test]
fn one_proof_covers_all_rounds_since_the_last_and_uses_the_latest_receipted_round() {
    let (mut a, b) = (economy(24), economy(25));
    a.learn_node(b.public_key(), &[]);
    a.record_round(work(&a, 1));
    a.record_round(work(&a, 2));
    let mut narrower = work(&a, 3);
    narrower.layers = LayerRange { start: 2, end: 6 };
    a.record_round(narrower);
    let r = b.receipt_for(a.node_id(), 2, grad(&a, 2));
    assert!(matches!(a.on_receipt(2, r), Ok(true)));
    let proof = decode(&match a.poll_proof(T) {
        Some(Ok(w)) => w,
        other => panic!("expected a proof, got {other:?}"),
    });
    assert_eq!((proof.round, proof.pseudo_gradient_hash), (2, grad(&a, 2)));
    assert_eq!((proof.tokens, proof.batches), (3 * 8 * 256, 24));
    assert_eq!(proof.claimed_duration_ms, 30_000);
    assert_eq!(proof.shards.len(), 3);
    // Only layers held in every round are claimed.
    assert_eq!(proof.layers, LayerRange { start: 2, end: 4 });
    assert_eq!(proof.nonce, T);
}

#[test]
fn implausible_work_is_under_claimed_not_refused() {
    let (mut a, mut b) = (economy(26), economy(27));
    know_each_other(&mut [&mut a, &mut b]);
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
fn whole_model_node_needs_no_receipts() {
    let (mut a, mut b) = (economy(28), economy(29));
    a.record_round(WorkSummary {
        roles: Roles::EMBEDDING.with(Roles::LM_HEAD),
        ..work(&a, 1)
    });
    let wire = match a.poll_proof(T) {
        Some(Ok(w)) => w,
        other => panic!("expected a proof, got {other:?}"),
    };
    assert!(decode(&wire).receipts.is_empty());
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));
    assert_eq!(a.state_hash(), b.state_hash());
}

#[test]
fn receipts_must_vouch_for_my_gradient_of_that_round() {
    let (mut a, b) = (economy(30), economy(31));
    a.learn_node(b.public_key(), &[]);
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
        a.node_id(),
        5,
        ReceiptKind::Activations,
        grad(&a, 5),
    );
    assert!(refused(a.on_receipt(5, activations)));
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
    let b = economy(33);
    let open = || -> Result<(LedgerStore, Economy), EconomyError> {
        let (store, snapshot) = LedgerStore::open(&path, &test_identity(32).node_id())?;
        Ok((store, Economy::resume(test_identity(32), snapshot)))
    };
    let (first, hash) = {
        let (mut store, mut a) = open()?;
        let wire = prove(&mut a, &b, 1, T);
        while let Some(w) = a.poll_write() {
            store.write(&w)?;
        }
        assert_eq!(store.state_hash(), a.state_hash());
        (decode(&wire).nonce, a.state_hash())
    };
    let (_store, mut a) = open()?;
    assert_eq!(a.state_hash(), hash);
    let second = decode(&prove(&mut a, &b, 2, T - 60_000)).nonce;
    assert!(second > first, "{second} <= {first}");
    assert_eq!(a.proof_count(), 2);
    Ok(())
}

#[test]
fn sync_messages_enforce_their_caps() {
    let one = ProverSummary {
        node: NodeId([1; 32]),
        count: 1,
        max_nonce: 2,
        digest: 3,
    };
    let too_many = LedgerSyncRequest {
        provers: vec![one; MAX_SYNC_PROVERS + 1],
    };
    let fine = LedgerSyncRequest {
        provers: vec![one; 3],
    };
    assert_eq!(
        LedgerSyncRequest::from_canonical_bytes(&fine.to_canonical_bytes()),
        Ok(fine)
    );
    assert!(LedgerSyncRequest::from_canonical_bytes(&too_many.to_canonical_bytes()).is_err());
    let too_big = LedgerSyncResponse {
        proofs: vec![vec![0; MAX_PROOF_WIRE + 1]],
        introductions: Vec::new(),
    };
    assert!(LedgerSyncResponse::from_canonical_bytes(&too_big.to_canonical_bytes()).is_err());
    let big_intro = LedgerSyncResponse {
        proofs: Vec::new(),
        introductions: vec![vec![0; MAX_INTRODUCTION + 1]],
    };
    assert!(LedgerSyncResponse::from_canonical_bytes(&big_intro.to_canonical_bytes()).is_err());
    let ok = LedgerSyncResponse {
        proofs: vec![vec![1, 2, 3], Vec::new()],
        introductions: vec![vec![4]],
    };
    assert_eq!(
        LedgerSyncResponse::from_canonical_bytes(&ok.to_canonical_bytes()),
        Ok(ok)
    );
}

/// A signed heartbeat of `network` by `id` naming `node`.
fn introduction(id: &Identity, node: NodeId, network: Hash32) -> Vec<u8> {
    let hb = crate::records::Heartbeat {
        node,
        network,
        stage: 3,
        step: 0,
        queue: 0,
        time_ms: T,
        leaving: false,
    };
    Signed::sign(id, &hb).to_bytes()
}

/// A node that never hears the prover's stage applies its proof once anti-entropy brings
/// the receipt signer's signed heartbeat along; a forged or foreign introduction makes no
/// key known (it would let a Sybil key vouch for receipts).
#[test]
fn introductions_make_far_receipt_signers_known_and_forged_ones_do_not() {
    const NET: Hash32 = [7; 32];
    let (mut a, mut b, mut far) = (economy(30), economy(31), economy(32));
    let (ida, idb) = (test_identity(30), test_identity(31));
    a.learn_node(b.public_key(), &introduction(&idb, idb.node_id(), NET));
    b.learn_node(a.public_key(), &introduction(&ida, ida.node_id(), NET));
    // A node's own first heartbeat introduces it (the core does this when it beats).
    b.learn_node(b.public_key(), &introduction(&idb, idb.node_id(), NET));
    let wire = prove(&mut a, &b, 1, T);
    assert!(matches!(b.on_proof(&wire, T), ProofOutcome::Applied { .. }));

    let request = far.sync_request().unwrap();
    let honest = b.answer_sync(&request, 1 << 20).unwrap();
    assert_eq!(honest.proofs, vec![wire.clone()]);
    assert!(!honest.introductions.is_empty());

    let mallory = test_identity(33);
    let forged = [
        // Mallory signs a heartbeat naming b.
        introduction(&mallory, idb.node_id(), NET),
        // b's genuine heartbeat, but of another network.
        introduction(&idb, idb.node_id(), [8; 32]),
        b"garbage".to_vec(),
    ];
    let mut tampered = introduction(&idb, idb.node_id(), NET);
    let last = tampered.len() - 70;
    tampered[last] ^= 1;
    let bad = LedgerSyncResponse {
        proofs: honest.proofs.clone(),
        introductions: forged.into_iter().chain([tampered]).collect(),
    };
    let summary = far.on_sync_response(&bad, &NET, T + 10);
    assert_eq!((summary.applied, summary.parked), (0, 1));
    assert_eq!(far.proof_count(), 0);

    let summary = far.on_sync_response(&honest, &NET, T + 20);
    assert_eq!(summary.applied, 1);
    assert_eq!(far.state_hash(), b.state_hash());
}

/// A node that holds a prover's first and third proofs but missed the second gets it: the
/// summaries (count, highest nonce, digest) show the hole without a list of hashes (the
/// answer then repeats that prover's older proofs, which the receiver drops as duplicates),
/// and once the ledgers agree nothing is sent at all.
#[test]
fn anti_entropy_fills_a_hole_below_the_highest_nonce() -> Result<(), EconomyError> {
    let (mut a, mut b, mut c) = (economy(40), economy(41), economy(42));
    know_each_other(&mut [&mut a, &mut b, &mut c]);
    let wires: Vec<Vec<u8>> = (1..=3)
        .map(|r| prove(&mut a, &b, r, T + 5_000 * r))
        .collect();
    for w in &wires {
        assert!(matches!(
            b.on_proof(w, T + 20_000),
            ProofOutcome::Applied { .. }
        ));
    }
    for w in [&wires[0], &wires[2]] {
        assert!(matches!(
            c.on_proof(w, T + 20_000),
            ProofOutcome::Applied { .. }
        ));
    }
    let answer = b.answer_sync(&c.sync_request()?, 1 << 20)?;
    assert!(answer.proofs.contains(&wires[1]));
    c.on_sync_response(&answer, &[0; 32], T + 21_000);
    assert_eq!(c.state_hash(), b.state_hash());
    assert!(
        b.answer_sync(&c.sync_request()?, 1 << 20)?
            .proofs
            .is_empty()
    );
    Ok(())
}

/// Proofs no node of this network makes mint nothing, whatever they claim: Uptime,
/// Inference and Verification proofs (the verifier asks them for no receipt), and training
/// claims for layers and roles that are no stage of the network (a whole-model claim needs
/// no receipt either). Before, each applied and paid.
#[test]
fn unproduced_proof_kinds_and_claims_beyond_a_stage_mint_nothing() {
    let (mut a, mut b) = (economy(50), economy(51));
    know_each_other(&mut [&mut a, &mut b]);
    let stages = vec![
        (LayerRange { start: 0, end: 2 }, Roles::EMBEDDING),
        (LayerRange { start: 2, end: 4 }, Roles::LM_HEAD),
    ];
    b.set_layout(stages.clone());
    let mallory = test_identity(52);
    let claim = |kind: ProofKind, layers: LayerRange, roles: Roles, nonce: u64| {
        Proof {
            kind,
            layers,
            roles,
            ..neuroshard_proof::fixtures::uptime_proof(&mallory, nonce, T)
        }
        .sign(&mallory)
        .to_bytes()
    };
    let whole = LayerRange { start: 0, end: 4 };
    let both = Roles::EMBEDDING.with(Roles::LM_HEAD);
    let attempts = [
        claim(ProofKind::Uptime, stages[0].0, stages[0].1, 1),
        claim(ProofKind::Inference, stages[0].0, stages[0].1, 2),
        claim(ProofKind::Verification, stages[1].0, stages[1].1, 3),
        claim(ProofKind::Training, whole, both, 4),
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
    // A claim of a real stage goes on to the receipt checks as before (`prove` claims layers
    // 0..4 without roles: make that a stage).
    b.set_layout(vec![(whole, Roles::NONE)]);
    let honest = prove(&mut a, &b, 1, T);
    assert!(matches!(
        b.on_proof(&honest, T + 10),
        ProofOutcome::Applied { .. }
    ));
}
