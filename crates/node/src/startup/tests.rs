//! The start-up machine alone: stage choice, the network record, settle, resume and join,
//! and what it does with forged or malformed input from peers.

use std::time::{Duration, Instant};

use neuroshard_model::{ModelConfig, StageSpec};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Identity, NodeId, Signed};

use super::*;
use crate::network::{Network, NetworkGenesis, Protocol};
use crate::records::{Heartbeat, NETWORK_KEY, network_key};
use crate::sync::{ThetaRecord, theta_key};

const NET: Hash32 = [7; 32];
const UNIX: u64 = 1_000_000;
const SETTLE: Duration = Duration::from_secs(5);

/// Small enough that a blob over a stage's limit is cheap to make.
fn model() -> ModelConfig {
    ModelConfig {
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        ..ModelConfig::tiny(64)
    }
}

/// A signed network genesis described as `description`.
fn network(description: &str) -> Network {
    let mut settings = crate::settings::tests::settings(0);
    settings.model = model();
    let genesis = NetworkGenesis {
        dataset_root: [2; 32],
        founded_ms: UNIX,
        protocol: Protocol::from_settings(&settings),
        stakes: Vec::new(),
        description: description.into(),
    };
    Network::found(&test_identity(5), genesis).unwrap()
}

fn config(stages: usize) -> StartupConfig {
    StartupConfig {
        identity: test_identity(0),
        network: NET,
        genesis: network("ours").signed,
        model: model(),
        specs: StageSpec::split(&model(), stages).unwrap(),
        stage: None,
        need: vec![100; stages],
        budget: 1000,
        settle: SETTLE,
        sync: true,
        saved: None,
        grows: false,
        overhead: 0,
    }
}

fn saved(stage: usize, stages: usize) -> Option<Saved> {
    Some(Saved {
        path: "ck".into(),
        holds: Some((model(), StageSpec::split(&model(), stages).unwrap()[stage])),
    })
}

fn drain(m: &mut Startup) -> Vec<Request> {
    std::iter::from_fn(|| m.poll_request()).collect()
}

fn warnings(m: &mut Startup) -> Vec<String> {
    std::iter::from_fn(|| m.poll_event())
        .filter_map(|e| match e {
            NodeEvent::Warning { message, .. } => Some(message),
            _ => None,
        })
        .collect()
}

/// No network record yet, `providers[s]` serve stage s; returns the machine and its start.
fn listening(cfg: StartupConfig, providers: &[Vec<NodeId>]) -> (Startup, Instant) {
    let t0 = Instant::now();
    let stages = cfg.specs.len();
    let mut m = Startup::new(cfg, t0, UNIX);
    assert_eq!(
        drain(&mut m),
        vec![Request::GetRecord {
            key: NETWORK_KEY.to_vec()
        }]
    );
    let asked = providers_asked(&mut m, t0);
    assert_eq!(asked, (0..stages).collect::<Vec<_>>());
    for s in 0..stages {
        m.handle_providers(s, providers.get(s).cloned().unwrap_or_default(), t0);
    }
    (m, t0)
}

/// The network record is empty: the stages whose providers the machine then looks up.
fn providers_asked(m: &mut Startup, t0: Instant) -> Vec<usize> {
    m.handle_record(NETWORK_KEY, Vec::new(), t0);
    drain(m)
        .into_iter()
        .filter_map(|r| match r {
            Request::GetProviders { stage, .. } => Some(stage),
            _ => None,
        })
        .collect()
}

/// Listens to the end of the settle period; returns the load request.
fn settled(cfg: StartupConfig, providers: &[Vec<NodeId>]) -> (Startup, Instant, Request) {
    let (mut m, t0) = listening(cfg, providers);
    m.handle_timeout(t0 + SETTLE);
    let load = drain(&mut m).pop().expect("a load request");
    (m, t0, load)
}

fn node(i: u8) -> NodeId {
    NodeId([i; 32])
}

fn heartbeat(signer: &Identity, network: Hash32, stage: u16) -> Vec<u8> {
    heartbeat_naming(signer, network, stage, Default::default())
}

/// A heartbeat whose sender names `arch` as its network's newest architecture.
fn heartbeat_naming(
    signer: &Identity,
    network: Hash32,
    stage: u16,
    arch: crate::records::ArchView,
) -> Vec<u8> {
    let hb = Heartbeat {
        node: signer.node_id(),
        network,
        stage,
        step: 3,
        queue: 0,
        time_ms: UNIX,
        every_ms: 2_000,
        leaving: false,
        arch,
    };
    Signed::sign(signer, &hb).to_bytes()
}

fn theta_record(signer: &Identity, round: u64, f: impl FnOnce(&mut ThetaRecord)) -> Vec<u8> {
    let mut rec = ThetaRecord {
        node: signer.node_id(),
        network: NET,
        stage: 1,
        round,
        theta: outer_hash(signer),
        optimizer: *blake3::hash(&optimizer_bytes(signer)).as_bytes(),
        expires_ms: UNIX + 60_000,
    };
    f(&mut rec);
    Signed::sign(signer, &rec).to_bytes()
}

fn outer_bytes(signer: &Identity) -> Vec<u8> {
    format!("outer of {}", signer.node_id()).into_bytes()
}

fn outer_hash(signer: &Identity) -> Hash32 {
    *blake3::hash(&outer_bytes(signer)).as_bytes()
}

fn optimizer_bytes(signer: &Identity) -> Vec<u8> {
    format!("moments of {}", signer.node_id()).into_bytes()
}

/// A fresh stage-1 replica that read `records`; returns the requests after them.
fn joiner(records: Vec<Vec<u8>>) -> (Startup, Instant, Vec<Request>) {
    joiner_of(config(2), records)
}

/// The same, for a node started with `cfg`.
fn joiner_of(mut cfg: StartupConfig, records: Vec<Vec<u8>>) -> (Startup, Instant, Vec<Request>) {
    cfg.stage = Some(1);
    let (mut m, t0, _) = settled(cfg, &[]);
    m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0);
    assert_eq!(
        drain(&mut m),
        vec![Request::GetRecord {
            key: theta_key(&NET, 1)
        }]
    );
    m.handle_record(&theta_key(&NET, 1), records, t0);
    let requests = drain(&mut m);
    (m, t0, requests)
}

fn fetches(requests: &[Request]) -> Vec<(NodeId, Hash32)> {
    requests
        .iter()
        .filter_map(|r| match r {
            Request::FetchBlob { peer, hash, .. } => Some((*peer, *hash)),
            _ => None,
        })
        .collect()
}

#[test]
fn explicit_stage_beats_resume() {
    let mut cfg = config(2);
    cfg.stage = Some(0);
    cfg.saved = saved(1, 2);
    let (mut m, t0) = listening(cfg, &[]);
    // Told its stage, it still listens the whole settle period.
    assert_eq!(m.poll_timeout(), Some(t0 + SETTLE));
    m.handle_timeout(t0 + SETTLE);
    assert_eq!(
        drain(&mut m),
        vec![Request::Load {
            stage: 0,
            init: Init::Fresh
        }]
    );
    assert!(warnings(&mut m)[0].contains("not usable for stage 0"));
}

#[test]
fn resume_stage_comes_from_the_checkpoint_meta() {
    let mut cfg = config(3);
    cfg.saved = saved(2, 3);
    // Stage 2 has the most replicas: only the checkpoint can send the node there.
    let (_, _, load) = settled(cfg, &[vec![], vec![], vec![node(1), node(2)]]);
    assert_eq!(
        load,
        Request::Load {
            stage: 2,
            init: Init::Resume
        }
    );
}

#[test]
fn a_node_with_a_checkpoint_settles_with_zero_wait() {
    let mut cfg = config(2);
    cfg.saved = saved(1, 2);
    let (mut m, t0) = listening(cfg, &[]);
    // Decided as the last provider look-up answered, without a timeout.
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(
        drain(&mut m),
        vec![Request::Load {
            stage: 1,
            init: Init::Resume
        }]
    );
    // A checkpoint of another model names no stage: that node listens.
    let mut cfg = config(2);
    cfg.saved = Some(Saved {
        path: "ck".into(),
        holds: Some((
            ModelConfig {
                layers: 6,
                ..model()
            },
            cfg.specs[1],
        )),
    });
    let (mut m, t1) = listening(cfg, &[]);
    assert_eq!(m.poll_timeout(), Some(t1 + SETTLE));
    assert!(drain(&mut m).is_empty() && t1 >= t0);
}

#[test]
fn a_stage_that_does_not_exist_is_an_error() {
    let mut cfg = config(2);
    cfg.stage = Some(2);
    let (mut m, t0) = listening(cfg, &[]);
    m.handle_timeout(t0 + SETTLE);
    assert_eq!(
        m.poll_outcome().unwrap().unwrap_err(),
        StartError::NoSuchStage {
            stage: 2,
            stages: 2
        }
    );
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(t0 + SETTLE * 2);
    assert!(m.poll_outcome().is_none(), "one outcome");
}

#[test]
fn chooses_the_emptiest_stage_that_fits_the_budget() {
    let mut cfg = config(3);
    // Stage 2 is empty but too large for this node.
    cfg.need = vec![100, 100, 5000];
    let c = test_identity(3);
    let (mut m, t0) = listening(cfg, &[vec![node(1), node(2)], vec![], vec![]]);
    // Stage 1's replica is known only from its heartbeat.
    m.handle_gossip(c.node_id(), &heartbeat(&c, NET, 1), t0);
    m.handle_timeout(t0 + SETTLE);
    assert_eq!(
        drain(&mut m),
        vec![Request::Load {
            stage: 1,
            init: Init::Fresh
        }]
    );
    // With stage 1 fuller than stage 0, stage 0.
    let mut cfg = config(3);
    cfg.need = vec![100, 100, 5000];
    let (_, _, load) = settled(cfg, &[vec![node(1)], vec![node(2), node(3)], vec![]]);
    assert_eq!(
        load,
        Request::Load {
            stage: 0,
            init: Init::Fresh
        }
    );
}

#[test]
fn a_budget_too_small_is_an_error() {
    let mut cfg = config(2);
    cfg.need = vec![2 << 20, 3 << 20];
    cfg.budget = 1 << 20;
    let (mut m, t0) = listening(cfg, &[]);
    m.handle_timeout(t0 + SETTLE);
    assert_eq!(
        m.poll_outcome().unwrap().unwrap_err(),
        StartError::NoStageFits {
            budget_mib: 1,
            need_mib: vec![2, 3]
        }
    );
}

#[test]
fn heartbeats_count_only_when_signed_by_their_author_for_our_network() {
    let (a, b) = (test_identity(1), test_identity(2));
    let cfg = config(2);
    let (mut m, t0) = listening(cfg, &[]);
    // Relayed (signer ≠ author), foreign network, our own, a stage that does not exist,
    // garbage: none of them fill stage 0, so the node still takes it.
    m.handle_gossip(b.node_id(), &heartbeat(&a, NET, 0), t0);
    let naming_b = Heartbeat {
        node: b.node_id(),
        network: NET,
        stage: 0,
        step: 1,
        queue: 0,
        time_ms: UNIX,
        every_ms: 2_000,
        leaving: false,
        arch: Default::default(),
    };
    m.handle_gossip(a.node_id(), &Signed::sign(&a, &naming_b).to_bytes(), t0);
    m.handle_gossip(a.node_id(), &heartbeat(&a, [9; 32], 0), t0);
    m.handle_gossip(
        test_identity(0).node_id(),
        &heartbeat(&test_identity(0), NET, 0),
        t0,
    );
    m.handle_gossip(a.node_id(), &heartbeat(&a, NET, 7), t0);
    m.handle_gossip(a.node_id(), &[0xff; 300], t0);
    m.handle_gossip(a.node_id(), &[], t0);
    m.handle_providers(5, vec![node(1)], t0);
    m.handle_timeout(t0 + SETTLE);
    let load = drain(&mut m).pop().unwrap();
    assert_eq!(
        load,
        Request::Load {
            stage: 0,
            init: Init::Fresh
        }
    );
    m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0 + SETTLE);
    m.handle_record(&theta_key(&NET, 0), Vec::new(), t0 + SETTLE);
    assert!(m.poll_outcome().unwrap().unwrap().peers.is_empty());
}

#[test]
fn a_planted_foreign_network_genesis_cannot_stop_a_node() {
    let foreign = network("another\u{7} model").signed;
    let ours = network("ours");
    let ours_config = |stages| StartupConfig {
        network: ours.id,
        ..config(stages)
    };
    let t0 = Instant::now();
    // Only a stranger's genesis (the DHT keeps one value per key, so it may have replaced
    // ours): the node starts, warns, and writes ours back, also under its id's key.
    let mut m = Startup::new(ours_config(2), t0, UNIX);
    drain(&mut m);
    m.handle_record(NETWORK_KEY, vec![foreign.clone(), vec![1, 2, 3]], t0);
    assert!(
        m.poll_outcome().is_none(),
        "a foreign genesis refused the start"
    );
    let warning = std::iter::from_fn(|| m.poll_event()).find_map(|e| match e {
        NodeEvent::Warning { message, .. } => Some(message),
        _ => None,
    });
    let warning = warning.expect("a warning names the other network");
    assert!(warning.contains("another model"), "{warning}");
    let requests = drain(&mut m);
    for key in [NETWORK_KEY.to_vec(), network_key(&ours.id)] {
        assert!(
            requests.iter().any(
                |r| matches!(r, Request::PutRecord { key: k, value } if *k == key && *value == ours.signed)
            ),
            "ours is published again"
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| matches!(r, Request::GetProviders { .. }))
    );

    // Ours beside a foreign one: nothing to write.
    let mut m = Startup::new(ours_config(2), t0, UNIX);
    drain(&mut m);
    m.handle_record(NETWORK_KEY, vec![foreign, ours.signed.clone()], t0);
    assert!(m.poll_outcome().is_none());
    let requests = drain(&mut m);
    assert!(
        requests
            .iter()
            .all(|r| matches!(r, Request::GetProviders { .. }))
    );
}

#[test]
fn settle_ends_at_the_deadline() {
    let t0 = Instant::now();
    let mut m = Startup::new(config(2), t0, UNIX);
    drain(&mut m);
    m.handle_record(NETWORK_KEY, Vec::new(), t0);
    drain(&mut m);
    m.handle_providers(0, Vec::new(), t0);
    // A repeated answer is not stage 1's.
    m.handle_providers(0, Vec::new(), t0);
    // Past the deadline with a look-up unanswered: still waiting for it.
    m.handle_timeout(t0 + SETTLE * 2);
    assert!(drain(&mut m).is_empty());
    m.handle_providers(1, Vec::new(), t0 + SETTLE * 2);
    assert_eq!(drain(&mut m).len(), 1);

    let (mut m, t0) = listening(config(2), &[]);
    assert_eq!(m.poll_timeout(), Some(t0 + SETTLE));
    m.handle_timeout(t0 + SETTLE - Duration::from_millis(1));
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(t0 + SETTLE);
    assert!(matches!(drain(&mut m)[..], [Request::Load { .. }]));
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn join_prefers_the_state_most_publishers_name_then_the_earlier_round() {
    let ids: Vec<Identity> = (1..=8).map(test_identity).collect();
    let mallory = test_identity(9);
    let backed = outer_hash(&ids[0]);
    let me = test_identity(0);
    let records = vec![
        theta_record(&ids[0], 5, |_| {}),
        theta_record(&ids[1], 9, |r| r.expires_ms = UNIX),
        theta_record(&ids[2], 9, |r| r.network = [9; 32]),
        theta_record(&ids[3], 9, |r| r.stage = 0),
        theta_record(&ids[4], 9, |r| r.node = ids[0].node_id()),
        theta_record(&me, 9, |_| {}),
        theta_record(&ids[5], 9, |r| r.expires_ms = u64::MAX),
        theta_record(&ids[6], 7, |_| {}),
        theta_record(&ids[6], 2, |_| {}),
        theta_record(&ids[7], 5, |r| r.theta = backed),
        // One key claiming the stage is at round u64::MAX: it never goes first.
        theta_record(&mallory, u64::MAX, |_| {}),
        vec![0xAB; 200],
        Vec::new(),
    ];
    let (_, _, requests) = joiner(records);
    let learned: Vec<NodeId> = requests
        .iter()
        .filter_map(|r| match r {
            Request::LearnKey(k) => Some(k.node_id()),
            _ => None,
        })
        .collect();
    let mut pair = [ids[0].node_id(), ids[7].node_id()];
    pair.sort();
    let expected: Vec<NodeId> = pair
        .iter()
        .copied()
        .chain([ids[6].node_id(), mallory.node_id()])
        .collect();
    assert_eq!(learned, expected);
    assert_eq!(fetches(&requests), vec![(pair[0], backed)]);
}

/// The attack: two fresh keys publish records of one made-up θ₀ of a later round. By
/// publisher count they outrank the one record of a key the genesis stakes; a joiner that
/// knows the genesis's stakes borrows from the staked key.
#[test]
fn unstaked_keys_agreeing_on_a_state_never_outrank_a_staked_publisher() {
    let founder = test_identity(1);
    let (sybil_a, sybil_b) = (test_identity(90), test_identity(91));
    let forged = outer_hash(&sybil_a);
    let records = || {
        vec![
            theta_record(&founder, 5, |_| {}),
            theta_record(&sybil_a, 6, |_| {}),
            theta_record(&sybil_b, 6, |r| r.theta = forged),
        ]
    };
    let mut staked = network("staked founder");
    let mut genesis = staked.genesis.clone();
    genesis.stakes = vec![(founder.public_key(), 100)];
    staked = Network::found(&test_identity(5), genesis).unwrap();
    let cfg = StartupConfig {
        genesis: staked.signed.clone(),
        ..config(2)
    };
    let (_, _, requests) = joiner_of(cfg, records());
    assert_eq!(
        fetches(&requests),
        vec![(founder.node_id(), outer_hash(&founder))]
    );
    // Without stakes in the genesis the two keys' state goes first: the rule is what stops
    // them.
    let (_, _, requests) = joiner(records());
    assert_eq!(fetches(&requests), vec![(sybil_a.node_id(), forged)]);
}

/// Walks a join with `a` to its end; the optimizer blob answers `moments`.
fn join(moments: Result<Vec<u8>, TransferError>) -> (Decision, Vec<String>, Vec<Request>) {
    let a = test_identity(1);
    let (mut m, t0, _) = joiner(vec![theta_record(&a, 4, |_| {})]);
    let t1 = t0 + Duration::from_millis(300);
    m.handle_blob(outer_hash(&a), Ok(outer_bytes(&a)), t1);
    let adopt = drain(&mut m);
    assert_eq!(
        adopt,
        vec![Request::AdoptOuter {
            bytes: outer_bytes(&a),
            hash: outer_hash(&a),
            round: 4
        }]
    );
    m.handle_adopted(Part::Outer, Ok(()), t1);
    let opt_hash = *blake3::hash(&optimizer_bytes(&a)).as_bytes();
    assert_eq!(fetches(&drain(&mut m)), vec![(a.node_id(), opt_hash)]);
    m.handle_blob(opt_hash, moments, t1);
    let mut after = drain(&mut m);
    if let [Request::AdoptOptimizer { .. }] = after[..] {
        m.handle_adopted(Part::Optimizer, Ok(()), t1 + Duration::from_millis(10));
        after.extend(drain(&mut m));
    }
    let decision = m.poll_outcome().unwrap().unwrap();
    (decision, warnings(&mut m), after)
}

#[test]
fn a_join_borrows_theta_then_the_moments() {
    let a = test_identity(1);
    let (d, warned, after) = join(Ok(optimizer_bytes(&a)));
    assert_eq!(after.len(), 1);
    assert!(warned.is_empty());
    let joined = d.joined.unwrap();
    assert_eq!((joined.peer, joined.round), (a.node_id(), 4));
    assert_eq!(joined.took, Duration::from_millis(310));
    assert_eq!(d.hint.unwrap().round, 4);
    assert_eq!((d.stage, d.init), (1, Init::Fresh));
}

#[test]
fn moments_that_fail_keep_the_join_with_a_warning() {
    let (d, warned, after) = join(Ok(b"not the moments".to_vec()));
    assert!(after.is_empty(), "bytes off the hash are not adopted");
    assert!(d.joined.is_some());
    assert!(warned[0].contains("AdamW from zero"), "{warned:?}");
}

#[test]
fn a_failing_join_falls_back_to_a_fresh_start_with_a_warning() {
    let a = test_identity(1);
    let (mut m, t0, _) = joiner(vec![theta_record(&a, 4, |_| {})]);
    m.handle_blob(outer_hash(&a), Err(TransferError("timeout".into())), t0);
    let d = m.poll_outcome().unwrap().unwrap();
    assert!(d.joined.is_none());
    assert_eq!(d.init, Init::Fresh);
    // It still catches up from that replica at the stage's next round.
    assert_eq!(d.hint.unwrap().node, a.node_id());
    let warned = warnings(&mut m);
    assert!(warned[0].contains("starting from scratch"), "{warned:?}");
}

#[test]
fn a_publisher_that_fails_is_followed_by_the_next() {
    let (a, b) = (test_identity(1), test_identity(2));
    // `a` names a blob over the stage's outer-state limit.
    let big = vec![0u8; 1 << 20];
    let big_hash = *blake3::hash(&big).as_bytes();
    let records = vec![
        theta_record(&a, 3, |r| r.theta = big_hash),
        theta_record(&b, 4, |_| {}),
    ];
    let (mut m, t0, requests) = joiner(records);
    assert_eq!(fetches(&requests), vec![(a.node_id(), big_hash)]);
    // Too large, then a decode failure at the engine.
    m.handle_blob(big_hash, Ok(big), t0);
    assert_eq!(fetches(&drain(&mut m)), vec![(b.node_id(), outer_hash(&b))]);
    m.handle_blob(outer_hash(&b), Ok(outer_bytes(&b)), t0);
    drain(&mut m);
    m.handle_adopted(Part::Outer, Err(JoinError::Decode("bad".into())), t0);
    let d = m.poll_outcome().unwrap().unwrap();
    assert!(d.joined.is_none());
    let warned = warnings(&mut m);
    assert!(warned[0].contains("at most"), "{warned:?}");
    assert_eq!(warned.len(), 2);
}

#[test]
fn a_node_with_steps_does_not_join_but_is_hinted() {
    let a = test_identity(1);
    let mut cfg = config(2);
    cfg.saved = saved(1, 2);
    let (mut m, t0) = listening(cfg, &[]);
    drain(&mut m);
    m.handle_loaded(
        Ok(Local {
            steps: 40,
            round: 2,
        }),
        t0,
    );
    drain(&mut m);
    m.handle_record(&theta_key(&NET, 1), vec![theta_record(&a, 6, |_| {})], t0);
    assert!(fetches(&drain(&mut m)).is_empty());
    let d = m.poll_outcome().unwrap().unwrap();
    assert_eq!((d.init, d.joined), (Init::Resume, None));
    assert_eq!(d.hint.unwrap().round, 6);
}

#[test]
fn an_unreadable_checkpoint_falls_back_to_a_fresh_start() {
    let mut cfg = config(2);
    cfg.saved = saved(0, 2);
    cfg.sync = false;
    let (mut m, t0) = listening(cfg, &[]);
    drain(&mut m);
    m.handle_loaded(Err(ModelError::Checkpoint("truncated".into())), t0);
    assert_eq!(
        drain(&mut m),
        vec![Request::Load {
            stage: 0,
            init: Init::Fresh
        }]
    );
    assert!(warnings(&mut m)[0].contains("truncated"));
    m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0);
    let d = m.poll_outcome().unwrap().unwrap();
    assert_eq!((d.stage, d.init, d.hint), (0, Init::Fresh, None));
}

#[test]
fn answers_out_of_turn_and_garbage_never_panic_or_decide() {
    let a = test_identity(1);
    let t0 = Instant::now();
    let mut m = Startup::new(config(2), t0, UNIX);
    drain(&mut m);
    // Answers to questions not asked.
    m.handle_providers(0, vec![node(1)], t0);
    m.handle_record(&theta_key(&NET, 0), vec![vec![1; 5]], t0);
    m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0);
    m.handle_blob([0; 32], Ok(vec![1]), t0);
    m.handle_adopted(Part::Outer, Ok(()), t0);
    m.handle_timeout(t0 + SETTLE * 10);
    assert!(m.poll_outcome().is_none() && drain(&mut m).is_empty());
    // Random bytes of every length as records and heartbeats.
    for len in 0..300usize {
        let junk: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
        m.handle_gossip(a.node_id(), &junk, t0);
    }
    let junk: Vec<Vec<u8>> = (0..300usize).map(|n| vec![n as u8; n]).collect();
    m.handle_record(NETWORK_KEY, junk.clone(), t0);
    for s in 0..2 {
        m.handle_providers(s, vec![node(1); 5000], t0);
    }
    m.handle_timeout(t0 + SETTLE);
    // node(1), known first on stage 0, stays there: stage 1 is the emptier.
    assert_eq!(
        drain(&mut m).pop(),
        Some(Request::Load {
            stage: 1,
            init: Init::Fresh
        })
    );
    m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0);
    drain(&mut m);
    // A record claiming round u64::MAX is just the latest round.
    let mut records = junk;
    records.push(theta_record(&a, u64::MAX, |_| {}));
    m.handle_record(&theta_key(&NET, 1), records, t0);
    let requests = drain(&mut m);
    assert_eq!(fetches(&requests), vec![(a.node_id(), outer_hash(&a))]);
    // The wrong hash, then an answer for the wrong part, change nothing.
    m.handle_blob([1; 32], Ok(outer_bytes(&a)), t0);
    m.handle_adopted(Part::Optimizer, Ok(()), t0);
    assert!(drain(&mut m).is_empty() && m.poll_outcome().is_none());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// A θ₀ record changed anywhere in transit is never trusted: no fetch, no hint.
    #[test]
    fn a_record_changed_in_transit_is_not_trusted(at in 0usize..400, xor in 1u8..=255) {
        let a = test_identity(1);
        let mut bytes = theta_record(&a, 4, |_| {});
        let at = at % bytes.len();
        bytes[at] ^= xor;
        let (mut m, _, requests) = joiner(vec![bytes]);
        proptest::prop_assert!(fetches(&requests).is_empty());
        let d = m.poll_outcome().unwrap().unwrap();
        proptest::prop_assert!(d.hint.is_none() && d.joined.is_none());
    }

    /// Whatever bytes peers put in records and gossip, start-up ends once, on a stage that
    /// exists, without a panic.
    #[test]
    fn peer_bytes_never_panic(
        values in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..160), 0..12),
        providers in proptest::collection::vec(0u8..=255, 0..40),
    ) {
        let t0 = Instant::now();
        let mut m = Startup::new(config(3), t0, UNIX);
        drain(&mut m);
        m.handle_record(NETWORK_KEY, values.clone(), t0);
        for v in &values {
            m.handle_gossip(node(v.first().copied().unwrap_or(0)), v, t0);
        }
        for s in 0..3 {
            m.handle_providers(s, providers.iter().map(|b| node(*b)).collect(), t0);
        }
        m.handle_timeout(t0 + SETTLE);
        let stage = match drain(&mut m).pop() {
            Some(Request::Load { stage, .. }) => stage,
            other => panic!("{other:?}"),
        };
        proptest::prop_assert!(stage < 3);
        m.handle_loaded(Ok(Local { steps: 0, round: 0 }), t0 + SETTLE);
        drain(&mut m);
        m.handle_record(&theta_key(&NET, stage), values, t0 + SETTLE);
        proptest::prop_assert!(fetches(&drain(&mut m)).is_empty());
        proptest::prop_assert_eq!(m.poll_outcome().unwrap().unwrap().stage, stage);
        proptest::prop_assert!(m.poll_outcome().is_none());
    }
}

#[path = "grown_tests.rs"]
mod grown;
