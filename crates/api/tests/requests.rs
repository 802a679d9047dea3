//! The API over a stand-in serving loop: bad requests get a 4xx with an OpenAI-style error,
//! good ones a completion or a server-sent event stream ending in `[DONE]`, and stop strings
//! cut the text.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use neuroshard_api::{ApiState, router};
use neuroshard_data::GenesisTokenizer;
use neuroshard_node::core::PaymentRefused;
use neuroshard_node::serve::{Finish, OpenError, ServeCmd, ServeEvent, ServeHandle};
use serde_json::{Value, json};
use tower::ServiceExt;

const CONTEXT: usize = 64;

/// A loop that answers every stream with the tokens of "hello world, hello" (after the
/// checks a node makes), and refuses when `full`.
fn state(full: bool) -> ApiState {
    let tokenizer = Arc::new(
        GenesisTokenizer::train(300, ["hello world, hello there"].iter()).expect("trains"),
    );
    let reply = tokenizer.encode("hello world, hello").unwrap();
    let (handle, mut rx) = ServeHandle::new(4);
    tokio::spawn(async move {
        let mut next = 1;
        while let Some(cmd) = rx.recv().await {
            let ServeCmd::Open { req, reply: answer } = cmd else {
                continue;
            };
            if full {
                let _ = answer.send(Err(OpenError::Full(8)));
                continue;
            }
            // A node refuses this payment (the core's checks are tested in the node crate).
            if req.payment.as_deref() == Some(&[0xde, 0xad][..]) {
                let _ = answer.send(Err(OpenError::Payment(PaymentRefused::Balance {
                    holds: 0,
                    offers: 10,
                })));
                continue;
            }
            if req.prompt.len() >= CONTEXT {
                let _ = answer.send(Err(OpenError::Invalid(
                    "prompt longer than the context".into(),
                )));
                continue;
            }
            let (tx, events) = tokio::sync::mpsc::unbounded_channel();
            let stream = next;
            next += 1;
            let n = reply.len().min(req.max_tokens);
            for &token in &reply[..n] {
                let _ = tx.send(ServeEvent::Token { stream, token });
            }
            let reason = if n < reply.len() {
                Finish::Length
            } else {
                Finish::Stop
            };
            let _ = tx.send(ServeEvent::Finished { stream, reason });
            let _ = answer.send(Ok((stream, events)));
        }
    });
    ApiState::new(handle, tokenizer)
}

async fn post(state: ApiState, body: impl Into<Body>) -> (StatusCode, String) {
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let resp = router(state).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("a JSON error");
    v["error"]["message"]
        .as_str()
        .expect("a message")
        .to_string()
}

#[tokio::test]
async fn bad_requests_get_a_4xx_with_a_reason() {
    let long = "hello ".repeat(200);
    let huge = "x".repeat(70_000);
    let cases: Vec<(String, StatusCode, &str)> = vec![
        (
            "{not json".into(),
            StatusCode::BAD_REQUEST,
            "not valid JSON",
        ),
        (
            json!({"model": "gpt-4", "prompt": "hi"}).to_string(),
            StatusCode::NOT_FOUND,
            "does not exist",
        ),
        (
            json!({"prompt": "hi", "max_tokens": -3}).to_string(),
            StatusCode::BAD_REQUEST,
            "max_tokens",
        ),
        (
            json!({"prompt": huge}).to_string(),
            StatusCode::BAD_REQUEST,
            "at most",
        ),
        (
            json!({"prompt": long}).to_string(),
            StatusCode::BAD_REQUEST,
            "context",
        ),
        (
            json!({"prompt": 5}).to_string(),
            StatusCode::BAD_REQUEST,
            "prompt",
        ),
        (
            json!({"prompt": "hi", "temperature": -1}).to_string(),
            StatusCode::BAD_REQUEST,
            "temperature",
        ),
        (
            json!({"prompt": "hi", "top_p": 0}).to_string(),
            StatusCode::BAD_REQUEST,
            "top_p",
        ),
    ];
    for (body, status, reason) in cases {
        let (got, text) = post(state(false), body.clone()).await;
        assert_eq!(got, status, "{body:.80}: {text}");
        assert!(error_message(&text).contains(reason), "{text}");
    }
    let (got, text) = post(state(true), json!({"prompt": "hi"}).to_string()).await;
    assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE, "{text}");
}

#[tokio::test]
async fn completions_stream_as_server_sent_events_and_stop_strings_cut() {
    let (status, text) = post(
        state(false),
        json!({"prompt": "hi", "max_tokens": 50, "seed": 1}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["text"], "hello world, hello");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let body = json!({"prompt": "hi", "max_tokens": 50, "stop": [","]}).to_string();
    let (_, text) = post(state(false), body).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["text"], "hello world");

    let body = json!({"prompt": "hi", "max_tokens": 50, "stream": true}).to_string();
    let (status, text) = post(state(false), body).await;
    assert_eq!(status, StatusCode::OK);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let mut joined = String::new();
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "text_completion");
        joined.push_str(v["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(joined, "hello world, hello");

    let resp = router(state(false))
        .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = to_bytes(resp.into_body(), 1 << 16).await.unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["data"][0]["id"], "neuroshard");
}

#[tokio::test]
async fn a_payment_that_is_not_hex_is_a_400_and_a_refused_one_a_402() {
    let (status, body) = post(
        state(false),
        json!({"prompt": "hello", "payment": "zz"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_message(&body).contains("hex"), "{body}");
    let (status, body) = post(
        state(false),
        json!({"prompt": "hello", "payment": "x".repeat(5000)}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = post(
        state(false),
        json!({"prompt": "hello", "payment": "dead"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    assert!(error_message(&body).contains("holds 0"), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["param"], "payment");
}
