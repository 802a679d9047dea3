//! The HTTP API of a node: OpenAI-compatible `POST /v1/completions` (with `stream: true` as
//! server-sent events) and `GET /v1/models`, over a [`ServeHandle`] on the node's serving
//! path. Text lives here (tokenizing, detokenizing, stop strings); token ids cross into the
//! node.
//!
//! Beside it, read-only: the dashboard's JSON (`GET /api/status`, `/api/loss`, `/api/rounds`,
//! `/api/balances`, `/api/proofs`, in [`read`]) from the node's [`Telemetry`], and Prometheus
//! metrics at `GET /metrics` ([`metrics`]).

mod dashboard;
pub mod metrics;
pub mod read;
mod text;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use neuroshard_data::GenesisTokenizer;
use neuroshard_node::serve::{
    Completion, Finish, HandleError, OpenError, SampleSpec, ServeEvent, ServeHandle, StreamRx,
};
use neuroshard_node::telemetry::Telemetry;
use serde_json::{Value, json};

use metrics::{ApiMetrics, Outcome, Timing};
pub use text::Detokenizer;

/// The id clients name the model by.
pub const MODEL_ID: &str = "neuroshard";
/// Largest prompt accepted, in bytes (the model's context is the real bound, checked by the
/// node after tokenizing).
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;
/// Most stop strings, and longest one, per request.
const MAX_STOPS: usize = 4;
const MAX_STOP_BYTES: usize = 256;
/// Longest hex-encoded payment op accepted.
const MAX_PAYMENT_HEX: usize = 1024;

#[derive(Clone)]
pub struct ApiState {
    pub handle: ServeHandle,
    pub tokenizer: Arc<GenesisTokenizer>,
    /// The node's events folded for the read API and its metrics; without it (a bare
    /// front end, tests) the read routes answer 503 and `/metrics` has the API's only.
    pub telemetry: Option<Telemetry>,
    pub metrics: Arc<ApiMetrics>,
}

impl ApiState {
    pub fn new(handle: ServeHandle, tokenizer: Arc<GenesisTokenizer>) -> Self {
        Self {
            handle,
            tokenizer,
            telemetry: None,
            metrics: Arc::new(ApiMetrics::new()),
        }
    }

    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics::metrics))
        .merge(read::routes())
        .merge(dashboard::routes::<ApiState>())
        .with_state(state)
}

/// Serves the API on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: ApiState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

/// An OpenAI-style error: its status and the body's fields.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": Value::Null,
        }});
        (self.status, axum::Json(body)).into_response()
    }
}

fn error(
    status: StatusCode,
    kind: &'static str,
    message: impl Into<String>,
    param: Option<&'static str>,
) -> ApiError {
    ApiError {
        status,
        kind,
        message: message.into(),
        param,
    }
}

fn bad(message: impl Into<String>, param: &'static str) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        message,
        Some(param),
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [
        {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "neuroshard"}
    ]}))
    .into_response()
}

/// A request checked and in token ids.
struct Parsed {
    completion: Completion,
    stops: Vec<String>,
    stream: bool,
}

fn parse(body: &[u8], tokenizer: &GenesisTokenizer) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body is not valid JSON: {e}"), "body"))?;
    let Some(obj) = v.as_object() else {
        return Err(bad("the body must be a JSON object", "body"));
    };
    match obj.get("model").and_then(Value::as_str) {
        Some(MODEL_ID) | None => {}
        Some(other) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{other}` does not exist; this node serves `{MODEL_ID}`"),
                Some("model"),
            ));
        }
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        _ => {
            return Err(bad(
                "`prompt` must be a string (or a list of one)",
                "prompt",
            ));
        }
    };
    if prompt.len() > MAX_PROMPT_BYTES {
        return Err(bad(
            format!(
                "the prompt has {} bytes; at most {MAX_PROMPT_BYTES}",
                prompt.len()
            ),
            "prompt",
        ));
    }
    let max_tokens = match obj.get("max_tokens") {
        None | Some(Value::Null) => 16,
        Some(n) => match n.as_i64() {
            Some(n) if n >= 1 => n as usize,
            _ => {
                return Err(bad(
                    "`max_tokens` must be an integer of at least 1",
                    "max_tokens",
                ));
            }
        },
    };
    let number = |key: &'static str, default: f32| -> Result<f32, ApiError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(n) => n
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("`{key}` must be a number"), key)),
        }
    };
    let temperature = number("temperature", 1.0)?;
    let top_p = number("top_p", 1.0)?;
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => rand::random(),
        Some(n) => n
            .as_u64()
            .ok_or_else(|| bad("`seed` must be a non-negative integer", "seed"))?,
    };
    let stops: Vec<String> = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => return Err(bad("`stop` must be a string or a list of strings", "stop")),
    };
    if stops.len() > MAX_STOPS
        || stops
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(bad(
            format!("at most {MAX_STOPS} non-empty stop strings of {MAX_STOP_BYTES} bytes"),
            "stop",
        ));
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(bad("`stream` must be a boolean", "stream")),
    };
    // A paid request carries the caller's signed `PayInference` op, hex-encoded.
    let payment = match obj.get("payment") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) if h.len() <= MAX_PAYMENT_HEX => {
            Some(hex::decode(h).map_err(|e| bad(format!("`payment` is not hex: {e}"), "payment"))?)
        }
        _ => {
            return Err(bad(
                format!("`payment` must be a hex string of at most {MAX_PAYMENT_HEX} characters"),
                "payment",
            ));
        }
    };
    let sample = SampleSpec {
        temperature,
        top_p,
        top_k: 0,
        seed,
        draws: 0,
    };
    if let Err(e) = sample.check(tokenizer.vocab_size()) {
        return Err(bad(e.to_string(), "temperature"));
    }
    let ids = tokenizer
        .encode(&prompt)
        .map_err(|e| bad(format!("tokenizing the prompt: {e}"), "prompt"))?;
    Ok(Parsed {
        completion: Completion {
            prompt: ids,
            max_tokens,
            sample,
            stop_token: Some(tokenizer.eos_id()),
            payment,
        },
        stops,
        stream,
    })
}

fn open_error(e: HandleError) -> ApiError {
    match e {
        HandleError::Open(OpenError::Invalid(m)) => bad(m, "prompt"),
        HandleError::Open(OpenError::Payment(m)) => error(
            StatusCode::PAYMENT_REQUIRED,
            "payment_error",
            m.to_string(),
            Some("payment"),
        ),
        HandleError::Open(OpenError::Full(_)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "the node serves as many streams as it may; retry later",
            None,
        ),
        HandleError::Queue => error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "too many requests waiting at this node; retry later",
            None,
        ),
        HandleError::Stopped => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the node stopped",
            None,
        ),
    }
}

fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length | Finish::Cancelled => "length",
    }
}

fn chunk(id: &str, created: u64, text: &str, finish: Option<&str>) -> Value {
    json!({
        "id": id, "object": "text_completion", "created": created, "model": MODEL_ID,
        "choices": [{"text": text, "index": 0, "logprobs": Value::Null, "finish_reason": finish}],
    })
}

/// One stream's receiving end: its events, text and timing.
struct Receiving {
    rx: StreamRx,
    detok: Detokenizer,
    timing: Timing,
    metrics: Arc<ApiMetrics>,
}

/// A completion dropped before it ended (the client closed its connection) is counted as
/// abandoned; one that ended was counted then.
impl Drop for Receiving {
    fn drop(&mut self) {
        self.timing.abandon(&self.metrics);
    }
}

/// Why a completion stream ended without its finish.
#[derive(Debug, thiserror::Error)]
enum StreamFailed {
    /// What the node reported.
    #[error("{0}")]
    Node(String),
    #[error("the node dropped the stream")]
    Dropped,
}

impl Receiving {
    /// The next piece of text, and the finish reason once the stream ended.
    async fn next_piece(&mut self) -> Result<(String, Option<&'static str>), StreamFailed> {
        let piece = match self.rx.events.recv().await {
            Some(ServeEvent::Token { token, .. }) => {
                self.timing.token(&self.metrics);
                let (text, stopped) = self.detok.push(token);
                Ok((text, stopped.then_some("stop")))
            }
            Some(ServeEvent::Finished { reason, .. }) => {
                Ok((self.detok.finish(), Some(finish_name(reason))))
            }
            Some(ServeEvent::Failed { error, .. }) => Err(StreamFailed::Node(error)),
            None => Err(StreamFailed::Dropped),
        };
        match &piece {
            Ok((_, Some(_))) => self.timing.finish(&self.metrics, true),
            Err(_) => self.timing.finish(&self.metrics, false),
            Ok((_, None)) => {}
        }
        piece
    }
}

async fn completions(State(state): State<ApiState>, body: Bytes) -> Response {
    let timing = Timing::start();
    let parsed = match parse(&body, &state.tokenizer) {
        Ok(p) => p,
        Err(e) => {
            state.metrics.request(Outcome::Invalid);
            return e.into_response();
        }
    };
    let prompt_tokens = parsed.completion.prompt.len();
    let rx = match state.handle.open(parsed.completion).await {
        Ok(rx) => rx,
        Err(e) => {
            state.metrics.request(match &e {
                HandleError::Open(OpenError::Invalid(_)) => Outcome::Invalid,
                HandleError::Open(OpenError::Payment(_)) => Outcome::Unpaid,
                HandleError::Open(OpenError::Full(_)) | HandleError::Queue => Outcome::Overloaded,
                HandleError::Stopped => Outcome::Failed,
            });
            return open_error(e).into_response();
        }
    };
    state.metrics.opened(prompt_tokens);
    let id = format!("cmpl-{}", rx.id);
    let created = unix_now();
    let mut recv = Receiving {
        rx,
        detok: Detokenizer::new(state.tokenizer.clone(), parsed.stops),
        timing,
        metrics: state.metrics.clone(),
    };
    if parsed.stream {
        // State: the stream while it runs, then one `[DONE]` event, then the end.
        let stream = futures::stream::unfold(Some(recv), move |state| {
            let id = id.clone();
            async move {
                let mut recv = state?;
                let done = || Event::default().data("[DONE]");
                let ev = match recv.next_piece().await {
                    Ok((text, None)) => chunk(&id, created, &text, None),
                    Ok((text, Some(f))) => {
                        let last =
                            Event::default().data(chunk(&id, created, &text, Some(f)).to_string());
                        let rest = futures::stream::iter([Ok(last), Ok(done())]);
                        return Some((rest, None));
                    }
                    Err(e) => {
                        let err =
                            json!({"error": {"message": e.to_string(), "type": "server_error"}});
                        let err = Event::default().data(err.to_string());
                        return Some((futures::stream::iter([Ok(err), Ok(done())]), None));
                    }
                };
                let ev = Event::default().data(ev.to_string());
                // An empty second item keeps one item type for the flattened stream.
                let one = futures::stream::iter([Ok(ev), Err(())]);
                Some((one, Some(recv)))
            }
        })
        .flatten()
        .filter_map(|r: Result<Event, ()>| async move {
            r.ok().map(Ok::<_, std::convert::Infallible>)
        });
        return Sse::new(stream).into_response();
    }
    let mut text = String::new();
    loop {
        match recv.next_piece().await {
            Ok((piece, finish)) => {
                text.push_str(&piece);
                if let Some(f) = finish {
                    let mut body = chunk(&id, created, &text, Some(f));
                    let completion_tokens = recv.detok.tokens();
                    body["usage"] = json!({
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    });
                    return axum::Json(body).into_response();
                }
            }
            Err(e) => {
                return error(StatusCode::BAD_GATEWAY, "server_error", e.to_string(), None)
                    .into_response();
            }
        }
    }
}
