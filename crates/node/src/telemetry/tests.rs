use super::*;

const ME: &str = "0101010101010101010101010101010101010101010101010101010101010101";

fn ready() -> NodeEvent {
    NodeEvent::Ready {
        version: 1,
        node: ME.into(),
        network: "aa".into(),
        peer: None,
        stage: 0,
        role: "driver".into(),
        addrs: vec![],
        resumed_step: 0,
        model_hash: "mh".into(),
        sync_round: 0,
        theta: "t".into(),
        joined_round: None,
        join_ms: None,
        time_ms: 1,
    }
}

fn step(step: u64, loss: Option<f32>) -> NodeEvent {
    NodeEvent::Step {
        stage: 0,
        step,
        loss,
        tokens: 64,
        lr: 1e-3,
        grad_norm: 1.0,
        model_hash: "mh".into(),
        busy_ms: Some(step as f64 * 10.0),
        time_ms: 1_000 + step * 100,
    }
}

fn sync(round: u64) -> NodeEvent {
    NodeEvent::Sync {
        stage: 0,
        round,
        theta: "t".into(),
        contributors: 2,
        expected: 3,
        included_self: true,
        wall_ms: 12.5,
        sent_bytes: 100,
        dense_bytes: 400,
        time_ms: round,
    }
}

fn ledger(applied: &str, kind: Option<&str>) -> NodeEvent {
    NodeEvent::Ledger {
        applied: applied.into(),
        reward: 7,
        kind: kind.map(str::to_string),
        state_hash: "ff".into(),
        time_ms: 9,
    }
}

#[test]
fn histories_stay_bounded_under_a_flood_of_events() {
    let mut f = TelemetryFold::new();
    f.on_event(&ready());
    let peer = "02".repeat(32);
    for i in 0..100_000u64 {
        f.on_event(&step(i, Some(2.0 + (i % 7) as f32)));
        f.on_event(&sync(i));
        f.on_event(&ledger(&peer, Some("training")));
    }
    let loss = f.train_loss();
    assert!(loss.len() <= MAX_LOSS_POINTS + 1, "{}", loss.len());
    assert!(loss.len() >= MAX_LOSS_POINTS / 2, "{}", loss.len());
    // The whole run is covered, in order, up to the latest step.
    assert_eq!(loss[0].step, 0);
    assert_eq!(loss.last().unwrap().step, 99_999);
    assert!(loss.windows(2).all(|w| w[0].step < w[1].step));
    let rounds = f.rounds();
    assert_eq!(rounds.len(), MAX_ROUNDS);
    assert_eq!(rounds.last().unwrap().round, 99_999, "oldest dropped first");
    assert_eq!(f.proofs(usize::MAX).len(), MAX_PROOFS);
    assert_eq!(f.status(5).unwrap().sync_round, 100_000);
}

#[test]
fn a_loss_that_is_not_finite_or_plausible_is_refused() {
    let mut f = TelemetryFold::new();
    f.on_event(&ready());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 1e9] {
        f.on_event(&step(1, Some(bad)));
        assert!(!f.on_train_loss(1, f64::from(bad), 5), "{bad}");
        assert!(!f.on_validation_loss(1, f64::from(bad), 5), "{bad}");
    }
    assert!(f.train_loss().is_empty());
    assert!(f.validation_loss().is_empty());
    f.on_event(&step(2, Some(3.5)));
    assert_eq!(
        f.train_loss(),
        vec![LossPoint {
            step: 2,
            loss: 3.5,
            time_ms: 1_200
        }]
    );
    // A worker's step carries no loss: nothing is invented.
    f.on_event(&step(3, None));
    assert_eq!(f.train_loss().len(), 1);
}

#[test]
fn snapshots_list_every_node_once_and_keep_the_dead_bounded() {
    let mut f = TelemetryFold::new();
    assert!(
        f.status(0).is_none(),
        "nothing to say before the node is ready"
    );
    f.on_event(&ready());
    let me = parse_node(ME).unwrap();
    let snap = |peers: Vec<SeenPeer>, registered| CoreSnapshot {
        model: ModelView {
            version: Some(2),
            layers: 6,
            d_model: 16,
            params: 900,
            stages: vec![(0, 2), (3, 2), (1, 2)],
        },
        stages: 3,
        step: 4,
        sync_round: 1,
        ledger: LedgerSummary {
            state_hash: "ab".into(),
            proofs: 2,
            balance: 10,
            stake: 0,
            pending: 0,
        },
        peers,
        registered,
        accounts: (0..300u64)
            .map(|i| AccountView {
                node: format!("{i:064x}"),
                balance: i,
                stake: 1,
            })
            .collect(),
    };
    let seen = |b: u8, stage, at| SeenPeer {
        node: [b; 32],
        stage,
        last_seen_ms: at,
    };
    // Peer 2 heard at stage 1, peer 3 known only by registration at stage 2, and ourselves
    // registered (listed once, as self).
    f.on_snapshot(snap(vec![seen(2, 1, 50)], vec![([3; 32], 2), (me, 0)]));
    let s = f.status(100).unwrap();
    assert_eq!(s.stages, 3);
    assert_eq!(s.ledger.proofs, 2);
    assert_eq!((s.model.version, s.model.layers), (Some(2), 6));
    assert_eq!(s.nodes.len(), 3, "{:?}", s.nodes);
    assert!(s.nodes[0].is_self && s.nodes[0].alive && s.nodes[0].role == "driver");
    let two = s.nodes.iter().find(|n| n.node == "02".repeat(32)).unwrap();
    assert!(two.alive && two.last_seen_ms == 50 && two.role == "worker");
    let three = s.nodes.iter().find(|n| n.node == "03".repeat(32)).unwrap();
    assert!(!three.alive && three.last_seen_ms == 0 && three.role == "validator");
    // Peer 2 went silent: still listed, not alive, its last sighting kept.
    f.on_snapshot(snap(vec![], vec![]));
    let s = f.status(200).unwrap();
    let two = s.nodes.iter().find(|n| n.node == "02".repeat(32)).unwrap();
    assert!(!two.alive && two.last_seen_ms == 50);
    // A flood of keys: the list stays bounded and the living are kept.
    let many: Vec<([u8; 32], usize)> = (0..5_000u32)
        .map(|i| {
            let mut id = [9u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            (id, 1)
        })
        .collect();
    f.on_snapshot(snap(vec![seen(4, 1, 300)], many));
    let s = f.status(300).unwrap();
    assert_eq!(s.nodes.len(), MAX_NODES + 1);
    assert!(s.nodes.iter().any(|n| n.node == "04".repeat(32) && n.alive));
    let accounts = f.accounts();
    assert_eq!(accounts.len(), MAX_ACCOUNTS);
    assert_eq!(accounts[0].balance, 299);
    assert!(accounts.windows(2).all(|w| w[0].balance >= w[1].balance));
}

#[test]
fn proofs_are_listed_newest_first_with_their_kind() {
    let mut f = TelemetryFold::new();
    f.on_event(&ready());
    f.on_event(&NodeEvent::Proof {
        bytes: 10,
        balance: 30,
        reward: Some(5),
        time_ms: 3,
    });
    f.on_event(&ledger(&"02".repeat(32), Some("uptime")));
    // A batch of parked proofs names no prover: not listed; nor are verdicts and fees.
    f.on_event(&ledger("parked proofs", None));
    f.on_event(&ledger(&"03".repeat(32), Some("verdict: guilty")));
    f.on_event(&ledger(&"04".repeat(32), Some("audit fee")));
    let p = f.proofs(50);
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].kind.as_str(), p[0].reward), ("uptime", 7));
    assert_eq!(
        (p[1].node.as_str(), p[1].kind.as_str(), p[1].reward),
        (ME, "training", 5)
    );
    assert_eq!(f.status(0).unwrap().ledger.balance, 30);
}

#[test]
fn metrics_follow_the_events() {
    let m = NodeMetrics::new();
    m.on_event(&ready());
    m.on_event(&step(1, Some(3.0)));
    m.on_event(&step(2, Some(f32::NAN)));
    for loss in [2.5, f64::INFINITY] {
        m.on_event(&NodeEvent::Validation {
            step: 2,
            round: 1,
            loss,
            tokens: 64,
            windows: 4,
            ms: 3.0,
            time_ms: 9,
        });
    }
    m.on_event(&sync(0));
    m.on_event(&ledger("parked proofs", None));
    m.on_event(&ledger("other", Some("training")));
    // Verdicts and fees are not proofs.
    m.on_event(&ledger(&"03".repeat(32), Some("verdict: guilty")));
    m.on_event(&ledger(&"04".repeat(32), Some("audit fee")));
    m.on_event(&ledger(&"05".repeat(32), Some("audit fee")));
    for outcome in [
        "passed",
        "passed",
        "refused: gone",
        "escalated: another class",
    ] {
        m.on_event(&NodeEvent::Audit {
            stage: 1,
            round: 2,
            worker: "w".into(),
            job: "j".into(),
            kind: "forward".into(),
            outcome: outcome.into(),
            time_ms: 3,
        });
    }
    m.on_event(&NodeEvent::Finalized {
        epoch: 7,
        state_hash: "ee".into(),
        items: 3,
        committee: 4,
        latency_ms: Some(120.0),
        time_ms: 10,
    });
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, m.registry()).unwrap();
    for line in [
        "neuroshard_steps_total 2",
        "neuroshard_training_tokens_total 128",
        "neuroshard_training_loss 3.0",
        "neuroshard_validation_loss 2.5",
        "neuroshard_step_duration_seconds_count 1",
        "neuroshard_sync_sent_bytes_total 100",
        "neuroshard_proofs_applied_total 1",
        "neuroshard_verdicts_applied_total 1",
        "neuroshard_audit_fees_total 2",
        "neuroshard_audits_total{outcome=\"passed\"} 2",
        "neuroshard_audits_total{outcome=\"refused\"} 1",
        "neuroshard_ledger_state{state_hash=\"ff\"} 1",
        "neuroshard_finalized_epoch 7",
        "neuroshard_finality_latency_seconds_count 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert_eq!(text.matches("neuroshard_ledger_state{").count(), 1);
}

#[test]
fn validation_events_make_the_validation_curve() {
    let mut f = TelemetryFold::new();
    f.on_event(&ready());
    for (step, loss) in [(0, 3.4), (10, f64::NAN), (20, 2.9)] {
        f.on_event(&NodeEvent::Validation {
            step,
            round: step / 10,
            loss,
            tokens: 64,
            windows: 4,
            ms: 3.0,
            time_ms: 9 + step,
        });
    }
    let v = f.validation_loss();
    assert_eq!(
        v.iter().map(|p| (p.step, p.loss)).collect::<Vec<_>>(),
        vec![(0, 3.4), (20, 2.9)]
    );
    assert!(f.train_loss().is_empty());
}

#[test]
fn transport_refusals_over_a_budget_are_counted_by_budget() {
    let m = NodeMetrics::new();
    for (dropped, over) in [(3, 7), (5, 7)] {
        m.on_event(&NodeEvent::Stats {
            stage: 0,
            step: 1,
            queue: 0,
            peers: 1,
            replicas: vec![1],
            net: Some(Box::new(neuroshard_net::Counters {
                events_dropped: dropped,
                gossip_over_rate: over,
                requests_over_rate: 2,
                ..Default::default()
            })),
            sync_round: 0,
            theta: String::new(),
            ledger: crate::events::LedgerSummary {
                state_hash: String::new(),
                proofs: 0,
                balance: 0,
                stake: 0,
                pending: 0,
            },
            time_ms: 1,
        });
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, m.registry()).unwrap();
    assert!(
        text.contains("neuroshard_net_refused_total{budget=\"inbound_queue\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("neuroshard_net_refused_total{budget=\"gossip_rate\"} 7"),
        "{text}"
    );
    assert!(
        text.contains("neuroshard_net_refused_total{budget=\"request_rate\"} 2"),
        "{text}"
    );
}

/// The dashboard's rounds say which architecture version each trained: a driver's the
/// version it drove (0 until it moves, even once the network's newest is later), another
/// stage's the newest its finalized state holds; a fixed network's none.
#[test]
fn rounds_name_the_architecture_version_they_trained() {
    let mut f = TelemetryFold::new();
    f.on_event(&ready());
    f.on_event(&sync(0));
    assert_eq!(f.rounds()[0].version, None, "a fixed network");
    let grown = CoreSnapshot {
        model: ModelView {
            version: Some(1),
            layers: 6,
            d_model: 16,
            params: 900,
            stages: vec![(0, 2), (2, 2), (1, 2)],
        },
        stages: 3,
        step: 4,
        sync_round: 1,
        ledger: LedgerSummary::default(),
        peers: Vec::new(),
        registered: Vec::new(),
        accounts: Vec::new(),
    };
    f.on_snapshot(grown.clone());
    f.on_event(&sync(1));
    assert_eq!(f.rounds()[1].version, Some(0), "the driver still trains v0");
    f.on_event(&NodeEvent::Driving {
        step: 20,
        version: 1,
        stages: vec![(0, 2), (2, 2), (1, 2)],
        time_ms: 3,
    });
    f.on_event(&sync(2));
    assert_eq!(f.rounds()[2].version, Some(1));

    // A later stage: the finalized state's newest.
    let mut f = TelemetryFold::new();
    let mut r = ready();
    if let NodeEvent::Ready { role, stage, .. } = &mut r {
        *role = "validator".into();
        *stage = 1;
    }
    f.on_event(&r);
    f.on_snapshot(grown);
    f.on_event(&sync(0));
    assert_eq!(f.rounds()[0].version, Some(1));
}
