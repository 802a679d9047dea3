//! The read API and `/metrics` over the in-process router: every route's JSON has the
//! dashboard's schema, a server without telemetry still answers (503 on the read routes), and
//! `promtool check metrics` accepts the exposition.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use neuroshard_api::{ApiState, router};
use neuroshard_data::GenesisTokenizer;
use neuroshard_node::events::{LedgerSummary, NodeEvent};
use neuroshard_node::serve::{Finish, ServeCmd, ServeEvent, ServeHandle};
use neuroshard_node::telemetry::{AccountView, CoreSnapshot, SeenPeer, Telemetry};
use serde_json::{Value, json};
use tower::ServiceExt;

const ME: &str = "0101010101010101010101010101010101010101010101010101010101010101";

/// A front end whose loop answers every stream with two tokens.
fn bare() -> ApiState {
    let tokenizer = Arc::new(
        GenesisTokenizer::train(300, ["hello world, hello there"].iter()).expect("trains"),
    );
    let reply = tokenizer.encode("hello world").unwrap();
    let (handle, mut rx) = ServeHandle::new(4);
    tokio::spawn(async move {
        while let Some(cmd) = rx.recv().await {
            let ServeCmd::Open { reply: answer, .. } = cmd else {
                continue;
            };
            let (tx, events) = tokio::sync::mpsc::unbounded_channel();
            for &token in &reply {
                let _ = tx.send(ServeEvent::Token { stream: 1, token });
            }
            let _ = tx.send(ServeEvent::Finished {
                stream: 1,
                reason: Finish::Stop,
            });
            let _ = answer.send(Ok((1, events)));
        }
    });
    ApiState::new(handle, tokenizer)
}

/// A node's telemetry after a few events of a driver of a 2-stage network.
fn telemetry() -> Telemetry {
    let t = Telemetry::new();
    t.record(&NodeEvent::Ready {
        version: 1,
        node: ME.into(),
        network: "ab".repeat(32),
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
        time_ms: 1_000,
    });
    for step in 1..=3u64 {
        t.record(&NodeEvent::Step {
            stage: 0,
            step,
            loss: Some(5.0 - step as f32),
            tokens: 128,
            lr: 1e-3,
            grad_norm: 0.5,
            model_hash: "mh".into(),
            busy_ms: Some(step as f64 * 40.0),
            time_ms: 1_000 + step * 250,
        });
    }
    t.record(&NodeEvent::Sync {
        stage: 0,
        round: 0,
        theta: "t".into(),
        contributors: 2,
        expected: 2,
        included_self: true,
        wall_ms: 30.0,
        sent_bytes: 1_000,
        dense_bytes: 8_000,
        time_ms: 2_000,
    });
    t.record(&NodeEvent::Proof {
        bytes: 300,
        balance: 40,
        reward: Some(40),
        time_ms: 2_100,
    });
    t.record(&NodeEvent::Ledger {
        applied: "02".repeat(32),
        reward: 35,
        kind: Some("training".into()),
        state_hash: "cd".repeat(32),
        time_ms: 2_200,
    });
    t.snapshot(CoreSnapshot {
        model: neuroshard_node::telemetry::ModelView {
            version: None,
            layers: 2,
            d_model: 16,
            params: 1_000,
            stages: Vec::new(),
        },
        stages: 2,
        step: 3,
        sync_round: 1,
        ledger: LedgerSummary {
            state_hash: "cd".repeat(32),
            proofs: 2,
            balance: 40,
            stake: 0,
            pending: 0,
        },
        peers: vec![SeenPeer {
            node: [2; 32],
            stage: 1,
            last_seen_ms: 2_300,
        }],
        registered: vec![([2; 32], 1)],
        accounts: vec![
            AccountView {
                node: ME.into(),
                balance: 40,
                stake: 100,
            },
            AccountView {
                node: "02".repeat(32),
                balance: 35,
                stake: 100,
            },
        ],
    });
    t
}

async fn get(state: ApiState, path: &str, accept: Option<&str>) -> (StatusCode, String, String) {
    let mut req = Request::get(path);
    if let Some(a) = accept {
        req = req.header(header::ACCEPT, a);
    }
    let resp = router(state)
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let kind = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = to_bytes(resp.into_body(), 1 << 22).await.unwrap();
    (status, kind, String::from_utf8_lossy(&bytes).into_owned())
}

async fn get_json(state: ApiState, path: &str) -> Value {
    let (status, _, body) = get(state, path, None).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn is_hex(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[tokio::test]
async fn status_lists_this_node_and_its_peers() {
    let state = bare().with_telemetry(telemetry());
    let s = get_json(state, "/api/status").await;
    assert_eq!(s["node"], ME);
    assert!(is_hex(&s["network"]), "{s}");
    assert_eq!(
        (s["stage"].as_u64(), s["stages"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(s["role"], "driver");
    assert_eq!(
        (s["step"].as_u64(), s["sync_round"].as_u64()),
        (Some(3), Some(1))
    );
    assert!(s["time_ms"].as_u64().unwrap() > 1_600_000_000_000, "{s}");
    assert_eq!(s["ledger"]["proofs"], 2);
    assert_eq!(s["ledger"]["balance"], 40);
    // The model trained: a fixed one has no version.
    assert_eq!(
        (s["model"]["layers"].as_u64(), &s["model"]["version"]),
        (Some(2), &serde_json::Value::Null)
    );
    assert!(is_hex(&s["ledger"]["state_hash"]));
    let nodes = s["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{s}");
    assert_eq!(nodes[0]["node"], ME);
    assert_eq!(nodes[0]["self"], true);
    let peer = &nodes[1];
    assert_eq!(peer["node"], "02".repeat(32));
    assert_eq!(
        (&peer["stage"], &peer["role"], &peer["alive"], &peer["self"]),
        (&json!(1), &json!("validator"), &json!(true), &json!(false))
    );
    assert_eq!(peer["last_seen_ms"], 2_300);
}

#[tokio::test]
async fn loss_rounds_balances_and_proofs_have_the_dashboard_schema() {
    let state = bare().with_telemetry(telemetry());
    let loss = get_json(state.clone(), "/api/loss").await;
    let train = loss["train"].as_array().unwrap();
    assert_eq!(train.len(), 3, "{loss}");
    assert_eq!(train[0], json!({"step": 1, "loss": 4.0, "time_ms": 1_250}));
    assert_eq!(loss["validation"], json!([]));

    let rounds = get_json(state.clone(), "/api/rounds").await;
    assert_eq!(
        rounds["rounds"],
        json!([{"stage": 0, "round": 0, "version": null, "contributors": 2, "expected": 2,
                "wall_ms": 30.0, "sent_bytes": 1_000, "dense_bytes": 8_000, "time_ms": 2_000}])
    );

    let balances = get_json(state.clone(), "/api/balances").await;
    let accounts = balances["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2);
    assert_eq!(
        accounts[0],
        json!({"node": ME, "balance": 40, "stake": 100})
    );
    assert_eq!(accounts[1]["balance"], 35);

    let proofs = get_json(state, "/api/proofs").await;
    assert_eq!(
        proofs["proofs"],
        json!([
            {"node": "02".repeat(32), "kind": "training", "reward": 35, "time_ms": 2_200},
            {"node": ME, "kind": "training", "reward": 40, "time_ms": 2_100},
        ])
    );
}

#[tokio::test]
async fn without_telemetry_the_read_routes_say_so_and_completions_still_work() {
    for path in [
        "/api/status",
        "/api/loss",
        "/api/rounds",
        "/api/balances",
        "/api/proofs",
    ] {
        let (status, _, body) = get(bare(), path, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert!(body.contains("telemetry"), "{body}");
    }
    // Ready not yet folded: status is not invented.
    let state = bare().with_telemetry(Telemetry::new());
    let (status, _, _) = get(state, "/api/status", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, body) = get(bare(), "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("neuroshard_inference_requests_total"),
        "{body}"
    );
    assert!(!body.contains("neuroshard_steps_total"), "{body}");
}

/// `/metrics` after one completion and one bad request.
async fn scraped(accept: Option<&str>) -> (String, String) {
    let state = bare().with_telemetry(telemetry());
    for body in [
        json!({"prompt": "hello", "max_tokens": 4}),
        json!({"prompt": 3}),
    ] {
        let req = Request::post("/v1/completions")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = router(state.clone()).oneshot(req).await.unwrap();
        to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    }
    let (status, kind, body) = get(state, "/metrics", accept).await;
    assert_eq!(status, StatusCode::OK);
    (kind, body)
}

#[tokio::test]
async fn metrics_count_training_sync_ledger_and_inference() {
    let (kind, text) = scraped(None).await;
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    for line in [
        "neuroshard_steps_total 3",
        "neuroshard_training_tokens_total 384",
        "neuroshard_training_loss 2.0",
        "neuroshard_step_duration_seconds_count 2",
        "neuroshard_sync_round_duration_seconds_count 1",
        "neuroshard_sync_sent_bytes_total 1000",
        "neuroshard_sync_dense_bytes_total 8000",
        "neuroshard_proofs_made_total 1",
        "neuroshard_proofs_applied_total 1",
        "neuroshard_engine_queue_depth 0",
        "neuroshard_inference_requests_total{outcome=\"ok\"} 1",
        "neuroshard_inference_requests_total{outcome=\"invalid\"} 1",
        "neuroshard_inference_time_to_first_token_seconds_count 1",
        "neuroshard_inference_duration_seconds_count 1",
        "# TYPE neuroshard_steps_total counter",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    let tokens: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("neuroshard_inference_tokens_total "))
        .and_then(|v| v.parse().ok())
        .expect("a token count");
    assert!(tokens >= 1, "{text}");
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );

    let (kind, open) = scraped(Some("application/openmetrics-text;version=1.0.0")).await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(open.ends_with("# EOF\n"), "{open}");
    assert!(open.contains("# TYPE neuroshard_steps counter"), "{open}");
}

/// Runs `promtool check metrics` on `text`: its verdict, or none when promtool is missing
/// (a failure under CI, where `.ci/run` installs it).
pub fn promtool_check(text: &str) -> Option<(bool, String)> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is needed under CI (apt-get install prometheus): {e}"
            );
            eprintln!("promtool not found ({e}): the exposition check is skipped");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

#[tokio::test]
async fn promtool_accepts_the_exposition() {
    let (_, text) = scraped(None).await;
    if let Some((ok, said)) = promtool_check(&text) {
        assert!(ok, "promtool check metrics: {said}\n{text}");
    }
    // The check can fail: a counter family named without its suffix is refused.
    let bad = "# HELP x_steps Steps.\n# TYPE x_steps counter\nx_steps_total 1\n";
    if let Some((ok, said)) = promtool_check(bad) {
        assert!(!ok, "{said}");
    }
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_counted_as_abandoned() {
    let state = bare().with_telemetry(telemetry());
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": "hello", "max_tokens": 4, "stream": true}).to_string(),
        ))
        .unwrap();
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The client closes the connection before reading a single event.
    drop(resp);
    let (_, _, body) = get(state, "/metrics", None).await;
    for line in [
        "neuroshard_inference_requests_total{outcome=\"abandoned\"} 1",
        "neuroshard_inference_requests_total{outcome=\"ok\"} 0",
        "neuroshard_inference_duration_seconds_count 1",
    ] {
        assert!(body.contains(line), "{line} missing from\n{body}");
    }
}
