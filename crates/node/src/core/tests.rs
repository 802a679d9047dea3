//! The core alone: what it does with forged, replayed and malformed input, and its timers.

use std::time::{Duration, Instant};

use neuroshard_model::StageSpec;
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity, Signed};

use super::*;
use crate::economy::{Economy, LedgerSyncRequest, LedgerSyncResponse};
use crate::peers::PeerTable;
use crate::records::{Heartbeat, Topic};
use crate::replica::tests::tiny_config;
use crate::settings::{DataOrder, SyncSettings};

struct NoData;

impl BatchSource for NoData {
    fn batch(
        &self,
        _: &[u8; 32],
        _: u64,
        _: &[[u8; 32]],
    ) -> Result<neuroshard_data::Batch, BatchError> {
        Err(BatchError("no data in this test".into()))
    }

    fn validation(&self, _: usize, _: usize) -> Result<Vec<Window>, BatchError> {
        Err(BatchError("no data in this test".into()))
    }

    fn genesis_window(&self, _: u32, _: u64, _: u32) -> Option<Vec<u32>> {
        None
    }

    fn check_targets(
        &self,
        _: &[u8; 32],
        _: u64,
        _: usize,
        _: &crate::wire::Targets,
    ) -> Result<(), BatchError> {
        Err(BatchError("no data in this test".into()))
    }
}

fn settings() -> NodeSettings {
    NodeSettings {
        data_dir: "t".into(),
        genesis: "t".into(),
        listen: Vec::new(),
        bootstrap: Vec::new(),
        model: neuroshard_model::ModelConfig {
            layers: 2,
            ..tiny_config()
        },
        stages: 2,
        stage: None,
        memory_budget: u64::MAX,
        micro_batches: 2,
        activations: Default::default(),
        weight_lag: 0,
        batch: 2,
        seq: 8,
        steps: 0,
        lr: 1e-3,
        warmup: 1,
        clip_norm: 0.0,
        beta2: None,
        seed: 1,
        data_order: DataOrder::Assigned,
        threads: 1,
        queue_capacity: 4,
        grad_timeout_ms: 1_000,
        settle_ms: 0,
        checkpoint_secs: 0,
        wait_replicas: 3,
        max_frame: 1 << 20,
        sync: SyncSettings::default(),
        network_genesis: None,
        network: None,
        stake_for: Vec::new(),
        http: None,
        paid_only: false,
        min_fee_per_stage: 0,
        eval_windows: 0,
        budgets: Default::default(),
        audit: Default::default(),
        epoch_ms: crate::settings::DEFAULT_EPOCH_MS,
        growth: None,
        capacity: Default::default(),
    }
}

pub(super) const NETWORK: [u8; 32] = [9; 32];

pub(super) fn core(identity: &Identity, start: Instant) -> NodeCore {
    core_at(identity, start, 1, 2)
}

/// A core serving `stage` of `stages` (one layer per stage).
pub(super) fn core_at(
    identity: &Identity,
    start: Instant,
    stage: usize,
    stages: usize,
) -> NodeCore {
    core_with(identity, start, stage, stages, |_| {})
}

/// [`core_at`] with its settings changed by `change` first.
pub(super) fn core_with(
    identity: &Identity,
    start: Instant,
    stage: usize,
    stages: usize,
    change: impl FnOnce(&mut NodeSettings),
) -> NodeCore {
    let mut s = settings();
    change(&mut s);
    s.stages = stages;
    s.model.layers = stages;
    let spec = StageSpec::split(&s.model, stages).unwrap()[stage];
    let s_model = s.model.clone();
    NodeCore::new(
        CoreConfig {
            settings: s,
            identity: identity.clone(),
            network: NETWORK,
            network_genesis: b"the test network's genesis".to_vec(),
            stage,
            spec,
            layouts: crate::layout::Layouts::fixed(&s_model, stages).unwrap(),
            numel: 1000,
            steps_done: 0,
            sync_round: 0,
            sync_theta: [0; 32],
            seed: 3,
            start,
            start_unix_ms: 1_800_000_000_000,
            addrs: Vec::new(),
            peers: PeerTable::default(),
            class: neuroshard_model::replay::determinism_class(2),
        },
        registered_economy(identity, &s_model, stages),
        Box::new(NoData),
    )
}

/// An economy whose ledger stakes test identities 0..32 and registers each for every stage
/// (the core only routes to, and counts, registered replicas).
fn registered_economy(
    identity: &Identity,
    model: &neuroshard_model::ModelConfig,
    stages: usize,
) -> Economy {
    use neuroshard_ledger::{AccountOp, Action, LedgerGenesis, Rules, verify_op};
    let ids: Vec<Identity> = (0..32).map(test_identity).collect();
    let rules = Rules {
        network: NETWORK,
        ..Default::default()
    };
    let stakes = ids
        .iter()
        .map(|id| (id.public_key(), rules.min_stake))
        .collect();
    let genesis = LedgerGenesis::new(rules, stakes).unwrap();
    let (mut state, _) = neuroshard_ledger::LedgerState::from_genesis(&genesis).unwrap();
    for id in &ids {
        for (nonce, stage) in (0..stages as u16).enumerate() {
            let op = AccountOp {
                network: NETWORK,
                account: id.node_id(),
                nonce: nonce as u64,
                timestamp_ms: 1_800_000_000_000,
                action: Action::Register { stage },
            };
            state.apply_op(verify_op(&op.sign(id)).unwrap()).unwrap();
        }
    }
    Economy::resume(
        identity.clone(),
        crate::economy::EconomyConfig::new(
            NETWORK,
            model,
            stages,
            1,
            neuroshard_audit::AuditRate::default(),
        )
        .unwrap(),
        crate::economy::LedgerSnapshot {
            state,
            ..Default::default()
        },
    )
}

pub(super) fn heartbeat(from: &Identity, stage: u16) -> Vec<u8> {
    let hb = Heartbeat {
        node: from.node_id(),
        network: NETWORK,
        stage,
        step: 0,
        queue: 0,
        time_ms: 1_800_000_000_000,
        every_ms: 2_000,
        leaving: false,
        arch: Default::default(),
    };
    Signed::sign(from, &hb).to_bytes()
}

/// `who`'s offer of `round` on stage 1 (blob `[blob; 32]`, base `[0; 32]`), with the signed
/// commitment every offer carries.
pub(super) fn committed_offer(who: &Identity, round: u64, blob: u8) -> crate::sync::SyncOffer {
    let claims = neuroshard_audit::OfferClaims {
        step: 4 * round,
        class: neuroshard_model::replay::determinism_class(2),
        weights: [7; 32],
        outer: [0; 32],
        blob: [blob; 32],
        round_state: [8; 32],
        epoch: 0,
    };
    let jobs_round = round.saturating_sub(1);
    let commitment =
        neuroshard_audit::JobCommitment::offer(NETWORK, who.node_id(), 1, jobs_round, claims);
    crate::sync::SyncOffer {
        network: NETWORK,
        stage: 1,
        round,
        base: [0; 32],
        blob: [blob; 32],
        bytes: 10,
        dense_bytes: 40,
        commitment: Some(Box::new(commitment.sign(who))),
    }
}

pub(super) fn drain(core: &mut NodeCore) -> Vec<Transmit> {
    std::iter::from_fn(|| core.poll_transmit()).collect()
}

#[test]
fn a_heartbeat_relayed_by_another_node_or_forged_is_refused_and_penalised() {
    let now = Instant::now();
    let (me, alice, mallory) = (test_identity(1), test_identity(2), test_identity(3));
    let mut c = core(&me, now);
    drain(&mut c);
    let gossip = |data| Inbound::Gossip {
        topic: Topic::Heartbeat(0).name(),
        data,
    };
    // Alice's heartbeat delivered as if Mallory authored it: not Mallory's to send.
    c.handle_message(mallory.node_id(), gossip(heartbeat(&alice, 0)), now);
    assert_eq!(c.peer_count(), 0);
    // A signature from another key over Alice's heartbeat.
    let hb = Signed::<Heartbeat>::from_bytes(&heartbeat(&alice, 0)).unwrap();
    let forged = Signed::<Heartbeat>::from_parts(
        hb.payload_bytes().to_vec(),
        alice.public_key(),
        mallory.sign(hb.payload_bytes()),
    )
    .to_bytes();
    c.handle_message(alice.node_id(), gossip(forged), now);
    assert_eq!(c.peer_count(), 0);
    let penalties = drain(&mut c)
        .into_iter()
        .filter(|t| matches!(t, Transmit::Penalize { .. }))
        .count();
    assert_eq!(penalties, 2);
    // The genuine one counts, and again after it was seen once (the verified-envelope cache
    // must not let the forged copy through later either).
    c.handle_message(alice.node_id(), gossip(heartbeat(&alice, 0)), now);
    assert_eq!(c.peer_count(), 1);
    let forged_again = Signed::<Heartbeat>::from_parts(
        hb.payload_bytes().to_vec(),
        alice.public_key(),
        mallory.sign(hb.payload_bytes()),
    )
    .to_bytes();
    assert!(open_from::<Heartbeat>(&forged_again, &alice.node_id()).is_err());
}

#[test]
fn a_crowd_of_unregistered_keys_holds_a_bounded_share_of_the_peer_table() {
    let now = Instant::now();
    let me = test_identity(1);
    let mut c = core(&me, now);
    drain(&mut c);
    let gossip = |data| Inbound::Gossip {
        topic: Topic::Heartbeat(0).name(),
        data,
    };
    // Identities 0..32 are registered in this ledger; these 600 are fresh keys.
    for i in 0..600 {
        let sybil = test_identity(1_000 + i);
        c.handle_message(sybil.node_id(), gossip(heartbeat(&sybil, 0)), now);
    }
    assert_eq!(c.peer_count(), MAX_UNREGISTERED_PEERS);
    // A registered replica always gets in, and a Sybil already held is still heard.
    let alice = test_identity(2);
    c.handle_message(alice.node_id(), gossip(heartbeat(&alice, 0)), now);
    assert_eq!(c.peer_count(), MAX_UNREGISTERED_PEERS + 1);
    let held = test_identity(1_000);
    let later = now + Duration::from_secs(1);
    c.handle_message(held.node_id(), gossip(heartbeat(&held, 0)), later);
    assert_eq!(
        c.pipeline.peers.get(&held.node_id()).map(|p| p.last_seen),
        Some(later)
    );
}

/// A joiner that names no network asks its bootstrap peer for its genesis: any key may ask
/// (the genesis is public and proves itself by its hash), none is penalised for it, and the
/// answer is the signed genesis bytes, nothing else.
#[test]
fn a_genesis_request_from_any_key_is_answered_with_the_signed_genesis() {
    let now = Instant::now();
    let me = test_identity(4);
    let stranger = test_identity(9_999).node_id();
    let mut c = core(&me, now);
    drain(&mut c);
    c.handle_message(
        stranger,
        Inbound::Request {
            token: 11,
            data: crate::network::GenesisRequest.to_canonical_bytes(),
        },
        now,
    );
    let out = drain(&mut c);
    assert!(!out.iter().any(|t| matches!(t, Transmit::Penalize { .. })));
    let answer = out.into_iter().find_map(|t| match t {
        Transmit::Respond { token: 11, data } => Some(data),
        _ => None,
    });
    assert_eq!(answer.as_deref(), Some(&b"the test network's genesis"[..]));
}

#[test]
fn malformed_requests_are_answered_rejected_and_ledger_requests_answered() {
    let now = Instant::now();
    let me = test_identity(4);
    let peer = test_identity(5).node_id();
    let mut c = core(&me, now);
    drain(&mut c);
    c.handle_message(
        peer,
        Inbound::Request {
            token: 7,
            data: vec![0xff; 40],
        },
        now,
    );
    let out = drain(&mut c);
    assert!(
        out.iter()
            .any(|t| matches!(t, Transmit::Respond { token: 7, .. }))
    );
    assert!(out.iter().any(|t| matches!(t, Transmit::Penalize { .. })));
    let req = LedgerSyncRequest::default();
    c.handle_message(
        peer,
        Inbound::Request {
            token: 8,
            data: req.to_canonical_bytes(),
        },
        now,
    );
    let answer = drain(&mut c).into_iter().find_map(|t| match t {
        Transmit::Respond { token: 8, data } => Some(data),
        _ => None,
    });
    let resp = LedgerSyncResponse::from_canonical_bytes(&answer.unwrap()).unwrap();
    assert!(resp.proofs.is_empty());
    // An answer to a request we never made changes nothing.
    c.handle_message(
        peer,
        Inbound::Response {
            token: 999,
            result: Ok(vec![1, 2, 3]),
        },
        now,
    );
    assert!(drain(&mut c).is_empty());
}

#[test]
fn timers_advance_and_never_ask_for_the_past() {
    let start = Instant::now();
    let me = test_identity(6);
    let mut c = core(&me, start);
    let mut now = start;
    let mut beats = 0;
    for _ in 0..200 {
        let next = c.poll_timeout().expect("a core always has a next deadline");
        assert!(
            next > now || now == start,
            "deadline {next:?} not after {now:?}"
        );
        now = next;
        c.handle_timeout(now);
        beats += drain(&mut c)
            .iter()
            .filter(
                |t| matches!(t, Transmit::Publish { topic, .. } if *topic == Topic::Heartbeat(1)),
            )
            .count();
    }
    let elapsed = now - start;
    assert!(elapsed > Duration::from_secs(10), "{elapsed:?}");
    // One heartbeat per period, give or take the first; the ledger registers 32 replicas in
    // this node's stage, so its period is longer than a small stage's.
    let period = crate::peers::heartbeat_every(32);
    assert!(period > HEARTBEAT_EVERY);
    let expected = (elapsed.as_secs_f64() / period.as_secs_f64()) as usize;
    assert!(
        beats.abs_diff(expected) <= 1,
        "{beats} heartbeats in {elapsed:?}"
    );
}

/// A node hears its own stage and its neighbours only: a heartbeat whose stage differs from
/// its topic's, or one of a stage two away (heard while choosing a stage, or pushed by a
/// peer), never enters the peer table the router and the rounds read.
#[test]
fn heartbeats_count_only_on_their_own_stages_topic_and_near_stages() {
    let now = Instant::now();
    let me = test_identity(20);
    let mut c = core_at(&me, now, 0, 4);
    drain(&mut c);
    let beat = |who: &Identity, stage: u16, topic: Topic| Inbound::Gossip {
        topic: topic.name(),
        data: heartbeat(who, stage),
    };
    let (a, b, d) = (test_identity(21), test_identity(22), test_identity(23));
    // Stage 1 claimed on stage 0's topic, and stage 2 (not a neighbour of 0).
    c.handle_message(a.node_id(), beat(&a, 1, Topic::Heartbeat(0)), now);
    c.handle_message(b.node_id(), beat(&b, 2, Topic::Heartbeat(2)), now);
    assert_eq!(c.peer_count(), 0);
    c.handle_message(d.node_id(), beat(&d, 1, Topic::Heartbeat(1)), now);
    assert_eq!(c.peer_count(), 1);
    assert_eq!(
        c.topics(),
        vec![
            Topic::Heartbeat(0),
            Topic::Heartbeat(1),
            Topic::Proof(0),
            Topic::Proof(1),
            Topic::Sync(0),
            Topic::Ops,
            Topic::Finality
        ]
    );
}

/// A proof gossiped by someone other than its prover is not applied (provers publish their
/// own; relays go through anti-entropy, where introductions are checked).
#[test]
fn a_proof_gossiped_by_another_node_than_its_prover_is_dropped() {
    let now = Instant::now();
    let (me, prover, relay) = (test_identity(24), test_identity(25), test_identity(26));
    let mut c = core_at(&me, now, 0, 2);
    drain(&mut c);
    let proof = neuroshard_proof::fixtures::uptime_proof(&prover, 1, 1_800_000_000_000);
    let wire = proof.sign(&prover).to_bytes();
    let gossip = |data: Vec<u8>| Inbound::Gossip {
        topic: Topic::Proof(0).name(),
        data,
    };
    c.handle_message(relay.node_id(), gossip(wire.clone()), now);
    let dropped = std::iter::from_fn(|| c.poll_event()).any(|e| {
        matches!(e, NodeEvent::Dropped { reason, .. } if reason.contains("another node than its prover"))
    });
    assert!(dropped);
    assert_eq!(c.economy().proof_count(), 0);
}

/// Sync messages from keys not registered for the stage are held for a replay and their
/// senders asked for their ledger, both bounded: a flood of fresh Sybil keys holds at most
/// [`MAX_UNREGISTERED_HELD`] messages and sends at most as many ledger requests.
#[test]
fn a_flood_of_sync_messages_from_unregistered_keys_is_held_within_a_bound() {
    let now = Instant::now();
    let mut c = core(&test_identity(1), now);
    drain(&mut c);
    for seed in 100..300u64 {
        let sybil = test_identity(seed);
        let offer = crate::sync::SyncMsg::Offer(crate::sync::SyncOffer {
            network: NETWORK,
            stage: 1,
            round: 1,
            base: [0; 32],
            blob: [seed as u8; 32],
            bytes: 10,
            dense_bytes: 40,
            commitment: None,
        });
        let data = Signed::sign(&sybil, &offer).to_bytes();
        let inbound = Inbound::Gossip {
            topic: Topic::Sync(1).name(),
            data,
        };
        c.handle_message(sybil.node_id(), inbound, now);
    }
    let asks = drain(&mut c)
        .into_iter()
        .filter(|t| matches!(t, Transmit::Request { .. }))
        .count();
    assert!(
        asks > 0 && asks <= MAX_UNREGISTERED_HELD,
        "{asks} ledger requests"
    );
    assert_eq!(c.unregistered.len(), MAX_UNREGISTERED_HELD);
    assert!(c.asked.len() <= MAX_UNREGISTERED_HELD);
}
