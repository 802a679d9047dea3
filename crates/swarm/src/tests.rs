//! The report reads typed events; unreadable lines are kept, not dropped.

use std::sync::mpsc;

use neuroshard_node::events::{LedgerSummary, NodeEvent};

use crate::launch::{Line, read_events};
use crate::{Kill, Report};

fn sync(stage: usize, round: u64, theta: &str) -> NodeEvent {
    NodeEvent::Sync {
        stage,
        round,
        theta: theta.into(),
        contributors: 2,
        expected: 2,
        included_self: true,
        wall_ms: 3.0,
        sent_bytes: 100,
        dense_bytes: 400,
        time_ms: 1,
    }
}

#[test]
fn lines_become_events_or_reported_leftovers() {
    let step = NodeEvent::Finished {
        steps: 3,
        reason: None,
        time_ms: 9,
    };
    let text = format!(
        "{}\nnot json\n{{\"event\":\"nope\"}}\n",
        step.to_json_line()
    );
    let (tx, rx) = mpsc::channel();
    let mut copy = Vec::new();
    read_events(7, text.as_bytes(), &mut copy, tx);
    assert_eq!(copy, text.as_bytes(), "every line is kept beside the log");
    let got: Vec<(usize, Line)> = rx.iter().collect();
    assert_eq!(got.len(), 3);
    assert!(matches!(&got[0], (7, Line::Event(ev)) if *ev == step));
    for (i, want) in [(1, "not json"), (2, "{\"event\":\"nope\"}")] {
        match &got[i] {
            (7, Line::Unparsed { line, error }) => {
                assert_eq!(line, want);
                assert!(!error.is_empty());
            }
            _ => panic!("line {i} should be reported as unreadable"),
        }
    }
}

#[test]
fn report_follows_steps_rounds_traffic_and_ledgers() {
    let mut r = Report::new(10);
    for (step, loss) in [(1, 5.0), (2, 4.0)] {
        r.on_event(
            0,
            &NodeEvent::Step {
                stage: 0,
                step,
                loss: Some(loss),
                tokens: 64,
                lr: 1e-3,
                grad_norm: 1.0,
                model_hash: String::new(),
                busy_ms: None,
                time_ms: 1_000 * step,
            },
        );
    }
    assert_eq!(r.max_driver_step(), 2);
    assert_eq!(r.driver_steps_total(), 2);
    // Two replicas agree on round 1; round 2 they disagree.
    r.on_event(1, &sync(1, 1, "aa"));
    r.on_event(2, &sync(1, 1, "aa"));
    r.on_event(1, &sync(1, 2, "bb"));
    r.on_event(2, &sync(1, 2, "cc"));
    let figures = r.sync_figures();
    assert_eq!(figures["rounds"], 2);
    assert_eq!(figures["rounds_all_replicas_agree"], 1);
    assert_eq!(figures["rounds_disagreeing"][0]["round"], 2);
    assert_eq!(figures["compression_ratio"], 4.0);
    // Transport counters arrive untyped and are read into fields.
    let net = serde_json::json!({
        "gossip": {"sent_bytes": 1_000_000, "received_bytes": 0},
        "request": {"sent_bytes": 1_000_000, "received_bytes": 3_000_000},
        "blob": {},
        "kad_queries": 4
    });
    for (i, hash) in [(0, "h1"), (1, "h1")] {
        r.on_event(
            i,
            &NodeEvent::Stats {
                stage: 0,
                step: 2,
                queue: 0,
                peers: 1,
                replicas: vec![1],
                net: Some(Box::new(serde_json::from_value(net.clone()).unwrap())),
                sync_round: 1,
                theta: "aa".into(),
                ledger: LedgerSummary {
                    state_hash: hash.into(),
                    proofs: 1,
                    balance: 5,
                    stake: 0,
                    pending: 0,
                },
                time_ms: 3_000,
            },
        );
    }
    let line = r.progress_line(&[], 2);
    assert!(line.contains("sent 4.0 MB recv 6.0 MB"), "{line}");
    // Equal hashes, but they only just changed: not settled yet.
    let now = crate::report::now_ms();
    assert!(!r.settled(&[0, 1], now));
    assert!(r.settled(&[0, 1], now + 7_000));
    // A replica ended a round since: two outcomes may still be reconciling, so the swarm
    // waits until rounds too have been quiet for as long.
    let mut late = sync(0, 3, "dd");
    if let NodeEvent::Sync { time_ms, .. } = &mut late {
        *time_ms = now + 5_000;
    }
    r.on_event(1, &late);
    assert!(!r.settled(&[0, 1], now + 7_000));
    assert!(r.settled(&[0, 1], now + 12_000));
    assert_eq!(r.ledger_figures()["all_equal"], true);
    // A node whose claims wait for finality to settle their rounds has not been paid yet.
    let stats = |pending| NodeEvent::Stats {
        stage: 0,
        step: 2,
        queue: 0,
        peers: 1,
        replicas: vec![1],
        net: None,
        sync_round: 1,
        theta: "aa".into(),
        ledger: LedgerSummary {
            state_hash: "h1".into(),
            proofs: 1,
            balance: 5,
            stake: 0,
            pending,
        },
        time_ms: 3_000,
    };
    r.on_event(1, &stats(2));
    assert!(!r.settled(&[0, 1], now + 12_000));
    r.on_event(1, &stats(0));
    assert!(r.settled(&[0, 1], now + 12_000));
}

#[test]
fn utilization_is_busy_time_over_the_training_window_per_stage() {
    let step = |stage, busy: f64, time_ms| NodeEvent::Step {
        stage,
        step: 1,
        loss: None,
        tokens: 0,
        lr: 1e-3,
        grad_norm: 1.0,
        model_hash: String::new(),
        busy_ms: Some(busy),
        time_ms,
    };
    let mut r = Report::new(10);
    // Node 0 (stage 0): 5 s of its engine's start-up before the window, then 800 of 1000 ms.
    r.on_event(0, &step(0, 5_000.0, 10_000));
    r.on_event(0, &step(0, 5_800.0, 11_000));
    // Stage 1: replicas busy 50% and 30%; node 3 restarted (its counter went back) and is
    // measured from its restart.
    r.on_event(1, &step(1, 0.0, 10_000));
    r.on_event(1, &step(1, 1_000.0, 12_000));
    r.on_event(3, &step(1, 9_000.0, 10_000));
    r.on_event(3, &step(1, 100.0, 11_000));
    r.on_event(3, &step(1, 400.0, 12_000));
    // One step only: no window, not counted.
    r.on_event(2, &step(1, 10.0, 10_000));
    let u = r.stage_utilization();
    assert!((u[&0] - 0.8).abs() < 1e-9, "{u:?}");
    assert!((u[&1] - 0.4).abs() < 1e-9, "{u:?}");
}

/// The audits' share of compute: each node's latest audit and engine times, summed.
#[test]
fn audit_share_is_audit_time_over_engine_time() {
    let evidence = |audit: f64, busy: f64| NodeEvent::Evidence {
        bytes: 1,
        budget: 2,
        audit_ms: Some(audit),
        busy_ms: Some(busy),
        time_ms: 0,
    };
    let mut r = Report::new(10);
    r.on_event(0, &evidence(10.0, 100.0));
    r.on_event(0, &evidence(30.0, 1_000.0));
    r.on_event(1, &evidence(90.0, 1_000.0));
    let share = r.audit_share();
    assert!(
        (share["all"].as_f64().unwrap() - 0.06).abs() < 1e-9,
        "{share}"
    );
    assert!(
        (share["max_node"].as_f64().unwrap() - 0.09).abs() < 1e-9,
        "{share}"
    );
}

#[test]
fn kill_specs() {
    let k = Kill::parse("3@20", Some(500)).unwrap();
    assert_eq!((k.node, k.at_step, k.restart_after_ms), (3, 20, Some(500)));
    for bad in ["3", "a@1", "1@b", ""] {
        assert!(Kill::parse(bad, None).is_err(), "{bad}");
    }
}
