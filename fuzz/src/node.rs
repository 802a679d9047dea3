//! Samples of the node's messages and state blobs (feature `node`): seeds for the node
//! targets and the fixed context (network, parameters, an economy holding proofs) they
//! decode against.

use std::sync::LazyLock;

use neuroshard_aggregate::Attack;
use neuroshard_ledger::{AccountOp, Action, LedgerGenesis, Rules};
use neuroshard_model::{Activations, AdamW, AdamWConfig, ModelConfig, ParamSet, StageSpec, Tokens};
use neuroshard_node::act_codec::{ActSpec, Packed, Scheme, pack};
use neuroshard_node::economy::{Economy, EconomyConfig, LedgerSyncRequest, LedgerSyncResponse};
use neuroshard_node::network::{NetworkGenesis, Protocol};
use neuroshard_node::records::{Heartbeat, NodeRecord};
use neuroshard_node::replica::{Diloco, DilocoConfig, encode_adamw};
use neuroshard_node::serve::{Chunk, Head, InferMsg, InferReply, SampleSpec};
use neuroshard_node::sync::{SyncDone, SyncMsg, SyncOffer, ThetaRecord};
use neuroshard_node::wire::{
    Ack, DriverStamp, Handoff, MicroBatchId, Msg, Payload, PipeAnswer, PipeRequest, TargetWindow,
    Targets,
};
use neuroshard_proof::fixtures::{TEST_NETWORK, training_proof};
use neuroshard_proof::{Hash32, LayerRange, NodeId, Receipt, ReceiptKind, Roles, Signed};

use crate::{ALICE, BOB, NEIGHBOUR, T0};

/// The network every sample belongs to.
pub const NETWORK: Hash32 = [0x4e; 32];

fn mb() -> MicroBatchId {
    MicroBatchId {
        origin: ALICE.node_id().0,
        step: 12,
        index: 3,
    }
}

pub fn sample_msgs() -> Vec<Msg> {
    vec![
        Msg::Forward {
            mb: mb(),
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
                        shard: 2,
                        window: 1,
                    },
                ],
            ),
        },
        Msg::Forward {
            mb: mb(),
            version: 0,
            stamp: Some(Signed::sign(
                &ALICE,
                &DriverStamp {
                    network: NETWORK,
                    mb: mb(),
                    version: 0,
                },
            )),
            route: vec![Signed::sign(
                &ALICE,
                &Handoff {
                    network: NETWORK,
                    mb: mb(),
                    version: 0,
                    to: BOB.node_id(),
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
        Msg::Backward {
            mb: mb(),
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
        Msg::Backward {
            mb: mb(),
            grad: packed(
                Activations {
                    batch: 1,
                    seq: 1,
                    dim: 3,
                    data: vec![1.0, -2.5, 0.125],
                },
                Scheme::F32,
            ),
            loss: 1.5,
        },
        Msg::Backward {
            mb: mb(),
            grad: packed(
                Activations {
                    batch: 1,
                    seq: 2,
                    dim: 5,
                    data: vec![0.5, -1.0, 0.25, 0.0, 2.0, -0.75, 1e-3, 3.0, -3.0, 0.1],
                },
                Scheme::Int2,
            ),
            loss: 2.0,
        },
    ]
}

/// Sample values pack: they are finite and small.
fn packed(a: Activations, scheme: Scheme) -> Packed {
    match pack(&a, scheme) {
        Ok(p) => p,
        Err(e) => panic!("sample activations must pack: {e}"),
    }
}

/// Inference steps (tokens, hidden states with sampling rules, a close) and replies.
pub fn sample_infer() -> (Vec<InferMsg>, Vec<InferReply>) {
    let sample = SampleSpec {
        temperature: 0.7,
        top_p: 0.9,
        top_k: 5,
        seed: 9,
        draws: 4,
    };
    let msgs = vec![
        InferMsg::Step {
            stream: 3,
            pos: 0,
            chunks: vec![Chunk::Tokens(vec![1, 2, 3]), Chunk::Tokens(vec![4])],
            head: None,
        },
        InferMsg::Step {
            stream: 9,
            pos: 7,
            chunks: vec![Chunk::Hidden(vec![0.5, -1.0, 3.25, 0.0])],
            head: Some(Head::Sample(sample)),
        },
        InferMsg::Step {
            stream: 4,
            pos: 0,
            chunks: vec![Chunk::Hidden(vec![0.5, -1.0])],
            head: Some(Head::Score(vec![7, 0])),
        },
        InferMsg::Close { stream: 3 },
    ];
    let replies = vec![
        InferReply::Hidden {
            stream: 3,
            pos: 4,
            data: vec![1.0, 2.0],
        },
        InferReply::Token {
            stream: 3,
            pos: 5,
            token: 17,
            draws: 6,
        },
        InferReply::Restart { stream: 3, have: 0 },
        InferReply::Rejected("no".into()),
        InferReply::Scored {
            stream: 4,
            pos: 2,
            nll: 3.5,
        },
    ];
    (msgs, replies)
}

/// Each sample message with a job commitment signed by its sender, and answers with and
/// without the receiver's countersignature.
pub fn sample_pipe() -> (Vec<PipeRequest>, Vec<PipeAnswer>) {
    use neuroshard_audit::{
        DeterminismClass, IsaLevel, JobCommitment, JobKind, MicroBatchRef, NO_HASH, countersign,
    };
    let requests: Vec<PipeRequest> = sample_msgs()
        .into_iter()
        .map(|msg| {
            let m = msg.mb();
            let job = JobCommitment {
                network: NETWORK,
                worker: ALICE.node_id(),
                stage: 0,
                round: 2,
                step: m.step,
                micro_batch: MicroBatchRef {
                    origin: NodeId(m.origin),
                    step: m.step,
                    index: m.index,
                },
                kind: match msg {
                    Msg::Forward { .. } => JobKind::Forward,
                    Msg::Backward { .. } => JobKind::Backward,
                },
                class: DeterminismClass {
                    build: [1; 32],
                    isa: IsaLevel::X86V3,
                    cache_bytes: [32 << 10, 1 << 20, 32 << 20],
                    micro_batches: 2,
                },
                weights_hash: [2; 32],
                input_hash: [3; 32],
                upstream_hash: NO_HASH,
                output_hash: [4; 32],
                grads_hash: NO_HASH,
                epoch: 0,
            }
            .sign(&ALICE);
            PipeRequest { msg, job }
        })
        .collect();
    let cs = requests
        .first()
        .and_then(|r| countersign(&BOB, &r.job, [4; 32]).ok());
    let answers = vec![
        PipeAnswer {
            ack: Ack::Accepted,
            countersign: cs,
            tally: Some(neuroshard_proof::Receipt::sign(
                &BOB,
                [0; 32],
                ALICE.node_id(),
                1,
                neuroshard_proof::ReceiptKind::Activations,
                neuroshard_proof::fixtures::work_tally(1),
            )),
        },
        PipeAnswer {
            ack: Ack::Rejected("commitment: for another job".into()),
            countersign: None,
            tally: None,
        },
    ];
    (requests, answers)
}

pub fn sample_acks() -> Vec<Ack> {
    vec![
        Ack::Accepted,
        Ack::Busy,
        Ack::Rejected("wrong stage".into()),
    ]
}

pub fn sample_sync() -> Vec<SyncMsg> {
    let receipt = Receipt::sign(
        &NEIGHBOUR,
        NETWORK,
        ALICE.node_id(),
        4,
        ReceiptKind::Gradients,
        [9; 32],
    );
    vec![
        SyncMsg::Offer(SyncOffer {
            network: NETWORK,
            stage: 1,
            round: 4,
            base: [1; 32],
            blob: [2; 32],
            bytes: 1_000,
            dense_bytes: 8_000,
            commitment: Some(Box::new(offer_commitment(&ALICE))),
        }),
        SyncMsg::Done(SyncDone {
            network: NETWORK,
            stage: 1,
            round: 4,
            theta: [3; 32],
            contributors: vec![ALICE.node_id(), NEIGHBOUR.node_id()],
            blobs: vec![[2; 32], [4; 32]],
            receipts: vec![(ALICE.node_id(), receipt)],
        }),
    ]
}

pub fn sample_theta_record() -> ThetaRecord {
    ThetaRecord {
        node: ALICE.node_id(),
        network: NETWORK,
        stage: 1,
        round: 4,
        theta: [3; 32],
        optimizer: [5; 32],
        expires_ms: T0 + 60_000,
    }
}

pub fn sample_heartbeat() -> Heartbeat {
    Heartbeat {
        node: ALICE.node_id(),
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

pub fn sample_node_record() -> NodeRecord {
    NodeRecord {
        node: ALICE.node_id(),
        network: NETWORK,
        stage: 1,
        expires_ms: T0 + 60_000,
        addrs: vec![
            "/ip4/10.0.0.2/tcp/4001".into(),
            "/ip4/10.0.0.2/udp/4001/quic-v1".into(),
        ],
    }
}

/// A network genesis (what the DHT's network key holds).
pub fn sample_network_genesis() -> NetworkGenesis {
    let model = ModelConfig {
        layers: 2,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        max_seq: 8,
        ..ModelConfig::tiny(32)
    };
    NetworkGenesis {
        dataset_root: [6; 32],
        founded_ms: T0,
        protocol: Protocol {
            model,
            stages: 2,
            batch: 2,
            micro_batches: 1,
            seq: 8,
            sync_every: 20,
            aggregator: "trimmed-mean".into(),
            byzantine: 1,
            compression: "fp32".into(),
            outer_lr: 0.7,
            outer_momentum: 0.9,
            activations: ActSpec::default(),
            weight_lag: 1,
            norm_bound: 3.0,
            min_stake: 10,
            round_reward: 1,
            min_round_ms: 0,
            min_receipts: 1,
            round_lead: 8,
            unbonding_ms: neuroshard_ledger::rules::DEFAULT_UNBONDING_MS,
            audit_per_million: 50_000,
            growth: None,
        },
        stakes: vec![(ALICE.public_key(), 1 << 40)],
        description: "fuzz".into(),
    }
}

/// ALICE's and NEIGHBOUR's registrations for the sample proofs' stage.
pub fn sample_registrations() -> Vec<Vec<u8>> {
    [&*ALICE, &*NEIGHBOUR]
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

/// Wire bytes of a few training proofs by ALICE with gradient receipts by NEIGHBOUR.
pub fn sample_proof_wires() -> Vec<Vec<u8>> {
    (0..3)
        .map(|nonce| {
            let mut p = training_proof(&ALICE, &NEIGHBOUR, nonce, T0 + nonce);
            p.receipts = vec![Receipt::sign(
                &NEIGHBOUR,
                p.network,
                p.node_id,
                p.round,
                ReceiptKind::Gradients,
                p.pseudo_gradient_hash,
            )];
            p.sign(&ALICE).to_bytes()
        })
        .collect()
}

/// The peer the fuzzed economies reconcile with.
pub const SYNC_PEER: NodeId = NodeId([0xee; 32]);

/// A first request of a fresh economy (its range message), asking for the sample proofs.
pub fn sample_sync_request() -> LedgerSyncRequest {
    let mut request = fresh_economy()
        .map(|mut e| e.start_sync(SYNC_PEER, T0))
        .unwrap_or_default();
    request.want = economy_with_proofs()
        .and_then(|e| e.proof_hashes().ok())
        .unwrap_or_default();
    request
}

/// The holder's answer to [`sample_sync_request`]: its range message and the proofs asked.
pub fn sample_sync_response() -> LedgerSyncResponse {
    let mut response = economy_with_proofs()
        .map(|mut e| e.answer_sync(&sample_sync_request(), 1 << 20, T0 + 10))
        .unwrap_or_default();
    response.ops = sample_registrations();
    response
}

/// An economy (BOB's) on a fresh ledger that stakes ALICE and NEIGHBOUR (their registrations
/// come in the sync response).
pub fn fresh_economy() -> Option<Economy> {
    let rules = Rules {
        network: TEST_NETWORK,
        ..Rules::default()
    };
    let stakes = vec![
        (ALICE.public_key(), rules.min_stake),
        (NEIGHBOUR.public_key(), rules.min_stake),
    ];
    let genesis = LedgerGenesis::new(rules, stakes).ok()?;
    let cfg = EconomyConfig {
        network: TEST_NETWORK,
        layout: vec![(LayerRange { start: 4, end: 8 }, Roles::NONE)],
        min_receipts: 1,
        audit_rate: neuroshard_audit::AuditRate::default(),
    };
    Economy::in_memory(BOB.clone(), cfg, &genesis).ok()
}

/// An economy holding the sample proofs, to answer fuzzed sync requests.
pub fn economy_with_proofs() -> Option<Economy> {
    let mut economy = fresh_economy()?;
    for op in sample_registrations() {
        economy.on_op(&op, T0);
    }
    for wire in sample_proof_wires() {
        economy.on_proof(&wire, T0 + 10);
    }
    Some(economy)
}

/// A one-layer model of 4 dimensions: outer and optimizer blobs of a few KiB.
fn micro_config() -> ModelConfig {
    ModelConfig {
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
    }
}

/// The parameters replica blobs are decoded for.
pub static PARAMS: LazyLock<ParamSet> = LazyLock::new(|| {
    let config = micro_config();
    ParamSet::init(StageSpec::full(&config).param_specs(&config), 1)
});

pub fn diloco_config(aggregator: &str) -> Option<DilocoConfig> {
    Some(DilocoConfig {
        me: BOB.node_id(),
        aggregator: aggregator.into(),
        byzantine: 0,
        compression: "topk:0.25:int8".parse().ok()?,
        outer_lr: 0.7,
        outer_momentum: 0.9,
        seed: 5,
        attack: Attack::None,
        norm_bound: 3.0,
    })
}

/// The outer state of a fresh replica over [`PARAMS`].
pub fn sample_outer() -> Option<Vec<u8>> {
    Some(
        Diloco::new(diloco_config("mean")?, &PARAMS)
            .ok()?
            .outer_bytes(),
    )
}

/// AdamW state with moments an honest run could hold.
pub fn sample_adamw() -> Option<Vec<u8>> {
    let m: Vec<Vec<f32>> = PARAMS
        .values()
        .iter()
        .map(|p| p.iter().map(|x| x * 1e-3).collect())
        .collect();
    let v: Vec<Vec<f32>> = m
        .iter()
        .map(|t| t.iter().map(|x| x * x).collect())
        .collect();
    let opt = AdamW::from_state(AdamWConfig::default(), &PARAMS, 17, m, v).ok()?;
    Some(encode_adamw(&opt))
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
