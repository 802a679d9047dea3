//! Valid encodings of every message and blob a node reads from a peer, mutated: decoding and
//! the checks behind it return Ok or Err, never panic, and never allocate out of proportion to
//! the input; what decodes re-encodes to the same bytes. Signed messages are mutated two ways:
//! as wire bytes (the signature then almost always fails, which tests the envelope framing)
//! and as payloads signed again by the author, which carries mutants past the signature into
//! the decoder and the checks behind it. Valid messages must round-trip and be accepted, so
//! a decoder that refused everything would fail here.

use neuroshard_aggregate::Attack;
use neuroshard_ledger::{AccountOp, Action, LedgerGenesis, Rules};
use neuroshard_model::{Activations, AdamW, AdamWConfig, ModelConfig, ParamSet, StageSpec, Tokens};
use neuroshard_mutate::{Mutation, TrackingAlloc, apply, largest_allocation, mutations};
use neuroshard_net::Validation;
use neuroshard_node::act_codec::{Packed, Scheme, pack};
use neuroshard_node::economy::{
    Economy, EconomyConfig, LedgerSyncRequest, LedgerSyncResponse, MAX_SYNC_PROOFS, ProofOutcome,
};
use neuroshard_node::network::{Network, NetworkGenesis, Protocol};
use neuroshard_node::records::{
    Heartbeat, NETWORK_KEY, NodeRecord, Topic, node_key, validate_gossip, validate_record,
};
use neuroshard_node::replica::{Diloco, DilocoConfig, decode_adamw, encode_adamw, outer_theta};
use neuroshard_node::serve::{Chunk, Head, InferMsg, InferReply, SampleSpec};
use neuroshard_node::sync::{
    SyncDone, SyncMsg, SyncOffer, SyncPull, SyncPullAnswer, ThetaRecord, theta_key,
};
use neuroshard_node::wire::{
    Ack, DriverStamp, Handoff, MicroBatchId, Msg, Payload, TargetWindow, Targets,
};
use neuroshard_proof::fixtures::{TEST_NETWORK, test_identity, training_proof};
use neuroshard_proof::{Canonical, Hash32, Identity, NodeId, Receipt, ReceiptKind, Signed};
use neuroshard_proof::{LayerRange, Roles};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

const T0: u64 = 1_800_000_000_000;
const NETWORK: Hash32 = [0x4e; 32];
/// What a decoder may allocate beyond a copy of its input: error strings, small tables.
const FIXED_BUDGET: usize = 64 * 1024;

fn alice() -> Identity {
    test_identity(1)
}

fn neighbour() -> Identity {
    test_identity(2)
}

fn bob() -> Identity {
    test_identity(3)
}

fn msg(kind: u8) -> Msg {
    let mb = MicroBatchId {
        origin: [7; 32],
        step: 12,
        index: 3,
    };
    match kind % 3 {
        0 => Msg::Forward {
            mb,
            version: 0,
            stamp: None,
            route: Vec::new(),
            input: Payload::Tokens(Tokens {
                batch: 2,
                seq: 4,
                ids: (0..8).collect(),
            }),
            targets: Targets::new(
                (1..9).collect(),
                vec![
                    TargetWindow {
                        shard: 0,
                        window: 7,
                    },
                    TargetWindow {
                        shard: 3,
                        window: u64::MAX,
                    },
                ],
            ),
        },
        1 => Msg::Forward {
            mb,
            version: 2,
            stamp: Some(Signed::sign(
                &test_identity(7),
                &DriverStamp {
                    network: TEST_NETWORK,
                    mb,
                    version: 2,
                },
            )),
            route: vec![Signed::sign(
                &test_identity(7),
                &Handoff {
                    network: TEST_NETWORK,
                    mb,
                    version: 2,
                    to: test_identity(8).node_id(),
                },
            )],
            input: Payload::Hidden(packed(
                Activations {
                    batch: 1,
                    seq: 2,
                    dim: 4,
                    data: vec![0.5, -1.0, 2.0, 1e-9, 0.0, -0.0, 3.5, 7.25],
                },
                Scheme::Int8,
            )),
            targets: vec![4, 5].into(),
        },
        _ => Msg::Backward {
            mb,
            grad: packed(
                Activations {
                    batch: 1,
                    seq: 2,
                    dim: 2,
                    data: vec![0.25, -0.5, 1e-3, 4.0],
                },
                Scheme::Int4,
            ),
            loss: 3.25,
        },
    }
}

fn packed(a: Activations, scheme: Scheme) -> Packed {
    pack(&a, scheme).expect("finite values")
}

/// A decoded tensor's bytes are what its declared shape needs in its scheme.
fn shape_ok(m: &Msg) -> bool {
    let fits = |p: &Packed| {
        let (b, s, d) = p.shape();
        p.scheme().encoded_len(b * s, d) == Some(p.bytes().len())
    };
    match m {
        Msg::Forward {
            input: Payload::Tokens(t),
            ..
        } => t.ids.len() == t.batch * t.seq,
        Msg::Forward {
            input: Payload::Hidden(a),
            ..
        } => fits(a),
        Msg::Backward { grad, .. } => fits(grad),
    }
}

fn infer_msg(kind: u8) -> InferMsg {
    match kind % 3 {
        0 => InferMsg::Step {
            stream: 3,
            pos: 0,
            chunks: vec![Chunk::Tokens(vec![1, 2, 3]), Chunk::Tokens(vec![4])],
            head: None,
        },
        1 => InferMsg::Step {
            stream: 9,
            pos: 7,
            chunks: vec![Chunk::Hidden(vec![0.5, -1.0, 3.25, 0.0])],
            head: Some(Head::Sample(SampleSpec {
                temperature: 0.7,
                top_p: 0.9,
                top_k: 5,
                seed: 9,
                draws: 4,
            })),
        },
        _ => InferMsg::Close { stream: 3 },
    }
}

fn infer_reply(kind: u8) -> InferReply {
    match kind % 4 {
        0 => InferReply::Hidden {
            stream: 3,
            pos: 4,
            data: vec![1.0, 2.0, -0.5],
        },
        1 => InferReply::Token {
            stream: 3,
            pos: 5,
            token: 17,
            draws: 6,
        },
        2 => InferReply::Restart { stream: 3, have: 2 },
        _ => InferReply::Rejected("positions beyond max_seq".into()),
    }
}

fn sync_msg(done: bool) -> SyncMsg {
    if !done {
        return SyncMsg::Offer(SyncOffer {
            network: NETWORK,
            stage: 1,
            round: 4,
            base: [1; 32],
            blob: [2; 32],
            bytes: 1_000,
            dense_bytes: 8_000,
            commitment: Some(Box::new(offer_commitment(&alice()))),
        });
    }
    let (a, n) = (alice(), neighbour());
    let receipt = Receipt::sign(&n, NETWORK, a.node_id(), 4, ReceiptKind::Gradients, [9; 32]);
    SyncMsg::Done(SyncDone {
        network: NETWORK,
        stage: 1,
        round: 4,
        theta: [3; 32],
        contributors: vec![a.node_id(), n.node_id()],
        blobs: vec![[2; 32], [4; 32]],
        receipts: vec![(a.node_id(), receipt)],
    })
}

fn theta_record() -> ThetaRecord {
    ThetaRecord {
        node: alice().node_id(),
        network: NETWORK,
        stage: 1,
        round: 4,
        theta: [3; 32],
        optimizer: [5; 32],
        expires_ms: T0 + 60_000,
    }
}

fn heartbeat(node: NodeId) -> Heartbeat {
    Heartbeat {
        node,
        network: NETWORK,
        stage: 1,
        step: 12,
        queue: 2,
        time_ms: T0,
        every_ms: 2_000,
        leaving: false,
        arch: Default::default(),
    }
}

fn node_record() -> NodeRecord {
    NodeRecord {
        node: alice().node_id(),
        network: NETWORK,
        stage: 1,
        expires_ms: T0 + 60_000,
        addrs: vec![
            "/ip4/10.0.0.2/tcp/4001".into(),
            "/ip4/10.0.0.2/udp/4001/quic-v1".into(),
        ],
    }
}

/// A network genesis: what the DHT's network key holds.
fn network_genesis() -> NetworkGenesis {
    let model = ModelConfig {
        layers: 2,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        max_seq: 8,
        ..ModelConfig::tiny(32)
    };
    let settings: neuroshard_node::NodeSettings = serde_json::from_value(serde_json::json!({
        "data_dir": "d", "genesis": "g", "listen": [], "bootstrap": [], "model": model,
        "stages": 2, "stage": null, "memory_budget": 0, "micro_batches": 1, "batch": 2,
        "seq": 8, "steps": 0, "lr": 0.001, "warmup": 1, "clip_norm": 0.0, "seed": 0,
        "data_order": "assigned", "threads": 1, "queue_capacity": 2, "grad_timeout_ms": 1000,
        "settle_ms": 0, "checkpoint_secs": 0, "wait_replicas": 1, "max_frame": 1048576
    }))
    .expect("settings");
    NetworkGenesis {
        dataset_root: [6; 32],
        founded_ms: T0,
        protocol: Protocol::from_settings(&settings),
        stakes: vec![(alice().public_key(), 1 << 40)],
        description: "mutations".into(),
    }
}

/// `payload` in an envelope signed by `by`, so a mutated payload passes the signature.
fn signed_again<T: Canonical>(by: &Identity, payload: &[u8]) -> Vec<u8> {
    Signed::<T>::from_parts(payload.to_vec(), by.public_key(), by.sign(payload)).to_bytes()
}

/// Wire bytes of `value` signed by `by`, or of its payload mutated and signed again.
fn mutated_signed<T: Canonical>(by: &Identity, value: &T, m: &[Mutation], resign: bool) -> Vec<u8> {
    if resign {
        signed_again::<T>(by, &apply(&value.to_canonical_bytes(), m))
    } else {
        apply(&Signed::sign(by, value).to_bytes(), m)
    }
}

/// The stage the sample proofs claim (the fixture's layers 4..8, no role).
fn layout() -> Vec<(LayerRange, Roles)> {
    vec![(LayerRange { start: 4, end: 8 }, Roles::NONE)]
}

/// Alice's and the neighbour's registrations for that stage.
fn registrations() -> Vec<Vec<u8>> {
    [alice(), neighbour()]
        .iter()
        .map(|id| {
            AccountOp {
                network: TEST_NETWORK,
                account: id.node_id(),
                nonce: 0,
                timestamp_ms: T0,
                action: Action::Register { stage: 0 },
            }
            .sign(id)
            .to_bytes()
        })
        .collect()
}

/// Alice's training proofs, each backed by the neighbour's gradient receipt.
fn proof_wires() -> Vec<Vec<u8>> {
    let (a, n) = (alice(), neighbour());
    (0..3)
        .map(|nonce| {
            let mut p = training_proof(&a, &n, nonce, T0 + nonce);
            p.receipts = vec![Receipt::sign(
                &n,
                p.network,
                p.node_id,
                p.round,
                ReceiptKind::Gradients,
                p.pseudo_gradient_hash,
            )];
            p.sign(&a).to_bytes()
        })
        .collect()
}

/// Bob's economy: a ledger that stakes Alice and the neighbour, not yet knowing their
/// registrations.
fn fresh_economy() -> Economy {
    let rules = Rules {
        network: TEST_NETWORK,
        ..Rules::default()
    };
    let stakes = [alice(), neighbour()]
        .iter()
        .map(|id| (id.public_key(), rules.min_stake))
        .collect();
    let genesis = LedgerGenesis::new(rules, stakes).expect("genesis");
    let cfg = EconomyConfig {
        network: TEST_NETWORK,
        layout: layout(),
        min_receipts: 1,
        audit_rate: neuroshard_audit::AuditRate::default(),
    };
    Economy::in_memory(bob(), cfg, &genesis).expect("in-memory economy")
}

/// Bob's economy, which holds the registrations the sample proofs need.
fn economy() -> Economy {
    let mut e = fresh_economy();
    for op in registrations() {
        e.on_op(&op, T0);
    }
    e
}

fn economy_with_proofs() -> Economy {
    let mut e = economy();
    for wire in proof_wires() {
        let outcome = e.on_proof(&wire, T0 + 10);
        assert!(
            matches!(outcome, ProofOutcome::Applied { .. }),
            "{outcome:?}"
        );
    }
    e
}

/// The peer the tests' economies reconcile with.
const PEER: NodeId = NodeId([0xee; 32]);

/// The holder's answer to [`sync_request`]: a range message, the proofs and registrations.
fn sync_response() -> LedgerSyncResponse {
    let mut response = economy_with_proofs().answer_sync(&sync_request(), 1 << 20, T0 + 10);
    response.ops = registrations();
    response
}

/// A fresh economy's first request (its range message), asking for the holder's proofs.
fn sync_request() -> LedgerSyncRequest {
    let mut request = fresh_economy().start_sync(PEER, T0);
    request.want = economy_with_proofs().proof_hashes().expect("hashes");
    request
}

fn params() -> ParamSet {
    let config = ModelConfig {
        layers: 1,
        d_model: 4,
        heads: 1,
        kv_heads: 1,
        ffn: 4,
        vocab: 8,
        max_seq: 4,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
    };
    ParamSet::init(StageSpec::full(&config).param_specs(&config), 1)
}

fn diloco_config(aggregator: &str) -> DilocoConfig {
    DilocoConfig {
        me: bob().node_id(),
        aggregator: aggregator.into(),
        byzantine: 0,
        compression: "topk:0.25:int8".parse().expect("valid spec"),
        outer_lr: 0.7,
        outer_momentum: 0.9,
        seed: 5,
        attack: Attack::None,
        norm_bound: 3.0,
    }
}

/// AdamW state an honest run could hold (|m| well inside the bound √v allows).
fn adamw(p: &ParamSet) -> AdamW {
    let m: Vec<Vec<f32>> = p
        .values()
        .iter()
        .map(|t| t.iter().map(|x| x * 1e-3).collect())
        .collect();
    let v = m
        .iter()
        .map(|t| t.iter().map(|x| x * x).collect())
        .collect();
    AdamW::from_state(AdamWConfig::default(), p, 17, m, v).expect("consistent state")
}

#[test]
fn valid_messages_round_trip_and_are_accepted() {
    for k in 0..4 {
        let m = infer_msg(k);
        assert_eq!(
            InferMsg::from_canonical_bytes(&m.to_canonical_bytes()),
            Ok(m)
        );
        let r = infer_reply(k);
        assert_eq!(
            InferReply::from_canonical_bytes(&r.to_canonical_bytes()),
            Ok(r)
        );
    }
    for kind in 0..3 {
        let m = msg(kind);
        assert_eq!(Msg::from_canonical_bytes(&m.to_canonical_bytes()), Ok(m));
    }
    let a = alice();
    let author = a.node_id();
    for done in [false, true] {
        let wire = Signed::sign(&a, &sync_msg(done)).to_bytes();
        assert_eq!(
            validate_gossip(&Topic::Sync(1).name(), &author, &wire),
            Validation::Accept
        );
        assert_eq!(
            validate_gossip(&Topic::Sync(0).name(), &author, &wire),
            Validation::Reject
        );
    }
    let wire = Signed::sign(&a, &theta_record()).to_bytes();
    assert!(validate_record(
        &theta_key(&NETWORK, 1),
        &wire,
        Some(&author),
        T0
    ));
    let wire = Signed::sign(&a, &heartbeat(author)).to_bytes();
    assert_eq!(
        validate_gossip(&Topic::Heartbeat(1).name(), &author, &wire),
        Validation::Accept
    );
    let wire = Signed::sign(&a, &node_record()).to_bytes();
    assert!(validate_record(
        &node_key(&author),
        &wire,
        Some(&author),
        T0
    ));
    let wire = Network::found(&a, network_genesis())
        .expect("genesis")
        .signed;
    assert!(validate_record(NETWORK_KEY, &wire, None, T0));

    let mut holder = economy_with_proofs();
    let answer = holder.answer_sync(&sync_request(), 1 << 20, T0 + 10);
    assert_eq!(answer.proofs.len(), 3);
    assert!(!answer.neg.is_empty());
    let bytes = sync_response().to_canonical_bytes();
    let response = LedgerSyncResponse::from_canonical_bytes(&bytes).expect("decodes");
    let mut fresh = fresh_economy();
    let (summary, _) = fresh.on_sync_response(PEER, &response, T0 + 10);
    assert_eq!((summary.applied, fresh.proof_count()), (3, 3));

    let p = params();
    let d = Diloco::new(diloco_config("mean"), &p).expect("replica");
    let outer = d.outer_bytes();
    let restored = Diloco::restore(diloco_config("mean"), &outer, p.numel()).expect("restores");
    assert_eq!(restored.outer_bytes(), outer);
    let blob = encode_adamw(&adamw(&p));
    let opt = decode_adamw(&blob, AdamWConfig::default(), &p).expect("decodes");
    assert_eq!(encode_adamw(&opt), blob);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Pipeline requests and acks: what decodes is canonical and has the shape it declares.
    #[test]
    fn mutated_pipeline_messages(kind in any::<u8>(), m in mutations()) {
        let bad = apply(&msg(kind).to_canonical_bytes(), &m);
        let (decoded, largest) = largest_allocation(|| Msg::from_canonical_bytes(&bad));
        prop_assert!(largest <= bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(decoded) = decoded {
            prop_assert!(shape_ok(&decoded));
            prop_assert_eq!(decoded.to_canonical_bytes(), bad);
        }
        let ack = [Ack::Accepted, Ack::Busy, Ack::Rejected("wrong stage".into())];
        let bad = apply(&ack[usize::from(kind) % 3].to_canonical_bytes(), &m);
        if let Ok(a) = Ack::from_canonical_bytes(&bad) {
            // Reasons are read lossily: the value is stable, not the bytes.
            prop_assert_eq!(Ack::from_canonical_bytes(&a.to_canonical_bytes()), Ok(a));
        }
    }

    /// Inference steps and replies: list lengths are checked before allocating, and what
    /// decodes re-encodes to the same bytes.
    #[test]
    fn mutated_inference_messages(kind in any::<u8>(), m in mutations()) {
        let bad = apply(&infer_msg(kind).to_canonical_bytes(), &m);
        let (decoded, largest) = largest_allocation(|| InferMsg::from_canonical_bytes(&bad));
        prop_assert!(largest <= bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(decoded) = decoded {
            prop_assert_eq!(decoded.to_canonical_bytes(), bad);
        }
        let bad = apply(&infer_reply(kind).to_canonical_bytes(), &m);
        let (decoded, largest) = largest_allocation(|| InferReply::from_canonical_bytes(&bad));
        prop_assert!(largest <= bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(r) = decoded {
            // Reasons are read lossily: the encoding of the decoded value is stable, not the
            // input bytes (compared as bytes: hidden values may be NaN, which is unequal to
            // itself; the receiver refuses non-finite states).
            let enc = r.to_canonical_bytes();
            let again = InferReply::from_canonical_bytes(&enc).map(|x| x.to_canonical_bytes());
            prop_assert_eq!(again, Ok(enc));
        }
    }

    /// Sync offers and announcements through the gossip validator, and θ₀ records through the
    /// DHT validator: an accepted message is the author's and names the topic's stage.
    #[test]
    fn mutated_sync_messages(done in any::<bool>(), resign in any::<bool>(), m in mutations()) {
        let a = alice();
        let author = a.node_id();
        let payload = apply(&sync_msg(done).to_canonical_bytes(), &m);
        let (decoded, largest) = largest_allocation(|| SyncMsg::from_canonical_bytes(&payload));
        prop_assert!(largest <= payload.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(d) = &decoded {
            prop_assert_eq!(d.to_canonical_bytes(), payload.clone());
        }
        let wire = mutated_signed(&a, &sync_msg(done), &m, resign);
        for stage in [0, 1] {
            if validate_gossip(&Topic::Sync(stage).name(), &author, &wire) == Validation::Accept {
                let opened = Signed::<SyncMsg>::from_bytes(&wire).ok().and_then(|s| s.verify().ok());
                prop_assert_eq!(opened.map(|m| m.stage()), Some(stage));
            }
        }
        let wire = mutated_signed(&a, &theta_record(), &m, resign);
        if validate_record(&theta_key(&NETWORK, 1), &wire, Some(&author), T0) {
            let rec = Signed::<ThetaRecord>::from_bytes(&wire).ok().and_then(|s| s.verify().ok());
            prop_assert!(rec.is_some_and(|r| r.node == author && r.expires_ms > T0));
        }
    }

    /// Round pulls (own messages, or the offers an outcome names) and their answers: decoded
    /// within their bounds, re-encoded to the same bytes.
    #[test]
    fn mutated_sync_pulls(answer in any::<bool>(), m in mutations()) {
        let valid = if answer {
            SyncPullAnswer {
                messages: vec![
                    Signed::sign(&alice(), &sync_msg(false)).to_bytes(),
                    Signed::sign(&neighbour(), &sync_msg(true)).to_bytes(),
                ],
            }
            .to_canonical_bytes()
        } else {
            SyncPull {
                network: NETWORK,
                stage: 1,
                round: 4,
                of: vec![alice().node_id(), neighbour().node_id()],
            }
            .to_canonical_bytes()
        };
        let bad = apply(&valid, &m);
        if answer {
            let (decoded, largest) =
                largest_allocation(|| SyncPullAnswer::from_canonical_bytes(&bad));
            prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
            if let Ok(a) = decoded {
                prop_assert_eq!(a.to_canonical_bytes(), bad);
            }
        } else {
            let (decoded, largest) = largest_allocation(|| SyncPull::from_canonical_bytes(&bad));
            prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
            if let Ok(p) = decoded {
                prop_assert_eq!(p.to_canonical_bytes(), bad);
            }
        }
    }

    /// Heartbeats on gossip, node and network records in the DHT.
    #[test]
    fn mutated_records(which in 0u8..3, resign in any::<bool>(), m in mutations()) {
        let a = alice();
        let author = a.node_id();
        let wire = match which {
            0 => mutated_signed(&a, &heartbeat(author), &m, resign),
            1 => mutated_signed(&a, &node_record(), &m, resign),
            _ => mutated_signed(&a, &network_genesis(), &m, resign),
        };
        let (verdict, largest) = largest_allocation(|| {
            validate_gossip(&Topic::Heartbeat(1).name(), &author, &wire)
        });
        prop_assert!(largest <= wire.len() + FIXED_BUDGET, "{largest} bytes");
        if verdict == Validation::Accept {
            let hb = Signed::<Heartbeat>::from_bytes(&wire).ok().and_then(|s| s.verify().ok());
            prop_assert!(hb.is_some_and(|hb| hb.node == author && hb.stage == 1));
        }
        let _ = validate_gossip(&Topic::Proof(1).name(), &author, &wire);
        if validate_record(&node_key(&author), &wire, Some(&author), T0) {
            let rec = Signed::<NodeRecord>::from_bytes(&wire).ok().and_then(|s| s.verify().ok());
            prop_assert!(rec.is_some_and(|r| r.node == author && r.expires_ms > T0));
        }
        let _ = validate_record(NETWORK_KEY, &wire, None, T0);
        for payload in [heartbeat(author).to_canonical_bytes(), node_record().to_canonical_bytes()] {
            let bad = apply(&payload, &m);
            if let Ok(hb) = Heartbeat::from_canonical_bytes(&bad) {
                prop_assert_eq!(hb.to_canonical_bytes(), bad.clone());
            }
            if let Ok(r) = NodeRecord::from_canonical_bytes(&bad) {
                prop_assert_eq!(r.to_canonical_bytes(), bad);
            }
        }
    }

    /// Ledger anti-entropy: a mutated request is answered within the limits; a mutated
    /// response, and a mutated proof alone, applied by a fresh economy keep its ledger sound.
    #[test]
    fn mutated_ledger_sync(which in 0u8..3, m in mutations()) {
        match which {
            0 => {
                let bad = apply(&sync_request().to_canonical_bytes(), &m);
                let (decoded, largest) =
                    largest_allocation(|| LedgerSyncRequest::from_canonical_bytes(&bad));
                prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
                if let Ok(request) = decoded {
                    prop_assert_eq!(request.to_canonical_bytes(), bad);
                    let answer = economy_with_proofs().answer_sync(&request, 4096, T0 + 10);
                    prop_assert!(answer.proofs.len() <= MAX_SYNC_PROOFS);
                    let items: usize = answer.proofs.iter().chain(&answer.ops).map(Vec::len).sum();
                    prop_assert!(items <= 4096);
                }
            }
            1 => {
                let bad = apply(&sync_response().to_canonical_bytes(), &m);
                let (decoded, largest) =
                    largest_allocation(|| LedgerSyncResponse::from_canonical_bytes(&bad));
                prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
                if let Ok(response) = decoded {
                    prop_assert_eq!(response.to_canonical_bytes(), bad);
                    let mut e = fresh_economy();
                    let _ = e.start_sync(PEER, T0);
                    let _ = e.on_sync_response(PEER, &response, T0 + 10);
                    prop_assert!(e.proof_count() <= response.proofs.len());
                    prop_assert_eq!(e.ledger().check_invariants(), Ok(()));
                }
            }
            _ => {
                let wire = &proof_wires()[0];
                let bad = apply(wire, &m);
                let mut e = economy();
                let outcome = e.on_proof(&bad, T0 + 10);
                if matches!(outcome, ProofOutcome::Applied { .. }) {
                    // The signature covers the payload: only the original proof applies.
                    prop_assert_eq!(e.proof_hashes().ok().map(|h| h.len()), Some(1));
                }
                prop_assert_eq!(e.ledger().check_invariants(), Ok(()));
            }
        }
    }

    /// Outer-state and AdamW blobs a joiner fetches: an accepted blob holds only finite
    /// values and re-encodes to its input.
    #[test]
    fn mutated_replica_blobs(median in any::<bool>(), m in mutations()) {
        let p = params();
        let n = p.numel();
        let cfg = diloco_config(if median { "median" } else { "mean" });
        let outer = Diloco::new(cfg.clone(), &p).expect("replica").outer_bytes();
        let bad = apply(&outer, &m);
        let (restored, largest) = largest_allocation(|| Diloco::restore(cfg, &bad, n));
        prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
        let head = outer_theta(&bad, n);
        if let Ok(r) = restored {
            prop_assert!(head.is_ok());
            prop_assert_eq!(r.outer_bytes(), bad);
            prop_assert!(r.theta().iter().all(|x| x.is_finite()));
        }
        let bad = apply(&encode_adamw(&adamw(&p)), &m);
        let (opt, largest) =
            largest_allocation(|| decode_adamw(&bad, AdamWConfig::default(), &p));
        prop_assert!(largest <= 2 * bad.len() + FIXED_BUDGET, "{largest} bytes");
        if let Ok(opt) = opt {
            prop_assert_eq!(encode_adamw(&opt), bad);
            let (m1, v) = opt.moments();
            prop_assert!(m1.iter().chain(v).flatten().all(|x| x.is_finite()));
        }
    }
}

/// A round-4 offer's signed commitment (stage 1, base [1; 32], blob [2; 32]).
fn offer_commitment(worker: &neuroshard_proof::Identity) -> neuroshard_audit::SignedJob {
    let class = neuroshard_audit::DeterminismClass {
        build: [8; 32],
        isa: neuroshard_audit::IsaLevel::X86V3,
        cache_bytes: [32 << 10, 1 << 20, 32 << 20],
        micro_batches: 2,
    };
    let claims = neuroshard_audit::OfferClaims {
        step: 12,
        class,
        weights: [5; 32],
        outer: [1; 32],
        blob: [2; 32],
        round_state: [6; 32],
        epoch: 7,
    };
    neuroshard_audit::JobCommitment::offer(NETWORK, worker.node_id(), 1, 3, claims).sign(worker)
}
