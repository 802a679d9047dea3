//! `GET /metrics`: the node's metrics (when it has telemetry) and the API's own: completion
//! requests by outcome, their time to first token and total latency, tokens generated.
//!
//! `prometheus-client` writes OpenMetrics text. A scraper that asks for it (`Accept:
//! application/openmetrics-text`, as Prometheus does) gets it as is; others get the classic
//! Prometheus text format (0.0.4), in which a counter's family is named with its `_total`
//! and there are no `# UNIT` or `# EOF` lines: older parsers (promtool's lint among them)
//! read a counter family without its suffix as an untyped metric without help.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::ApiState;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

type Labels = Vec<(String, String)>;

/// How a completion request ended: the label values of `neuroshard_inference_requests_total`
/// (a fixed set, so clients cannot grow the exposition).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Ok,
    Invalid,
    /// Refused for its payment (missing on a paid-only node, or not good).
    Unpaid,
    Overloaded,
    Failed,
    /// The client left before the completion ended.
    Abandoned,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Unpaid => "unpaid",
            Outcome::Overloaded => "overloaded",
            Outcome::Failed => "failed",
            Outcome::Abandoned => "abandoned",
        }
    }
}

pub struct ApiMetrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    first_token: Histogram,
    duration: Histogram,
    tokens: Counter,
    prompt_tokens: Counter,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiMetrics {
    pub fn new() -> Self {
        let requests = Family::<Labels, Counter>::default();
        // 1 ms to ~65 s.
        let first_token = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        let tokens = Counter::default();
        let prompt_tokens = Counter::default();
        let mut registry = Registry::default();
        registry.register(
            "neuroshard_inference_requests",
            "Completion requests, by outcome",
            requests.clone(),
        );
        registry.register_with_unit(
            "neuroshard_inference_time_to_first_token",
            "From a completion request to its first generated token",
            Unit::Seconds,
            first_token.clone(),
        );
        registry.register_with_unit(
            "neuroshard_inference_duration",
            "From a completion request to its last token",
            Unit::Seconds,
            duration.clone(),
        );
        registry.register(
            "neuroshard_inference_tokens",
            "Tokens generated for completions",
            tokens.clone(),
        );
        registry.register(
            "neuroshard_inference_prompt_tokens",
            "Prompt tokens of the completions opened",
            prompt_tokens.clone(),
        );
        // Every outcome present from the start: a rate over an absent series reads as none.
        for o in [
            Outcome::Ok,
            Outcome::Invalid,
            Outcome::Unpaid,
            Outcome::Overloaded,
            Outcome::Failed,
            Outcome::Abandoned,
        ] {
            // The guard is dropped at once: only the series' creation matters.
            drop(requests.get_or_create(&labels(o)));
        }
        Self {
            registry,
            requests,
            first_token,
            duration,
            tokens,
            prompt_tokens,
        }
    }

    pub(crate) fn request(&self, outcome: Outcome) {
        self.requests.get_or_create(&labels(outcome)).inc();
    }

    pub(crate) fn opened(&self, prompt_tokens: usize) {
        self.prompt_tokens.inc_by(prompt_tokens as u64);
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

fn labels(o: Outcome) -> Labels {
    vec![("outcome".to_string(), o.name().to_string())]
}

/// Times one completion from its request: the first token and the end.
pub(crate) struct Timing {
    start: Instant,
    first: bool,
    ended: bool,
}

impl Timing {
    pub(crate) fn start() -> Self {
        Self {
            start: Instant::now(),
            first: false,
            ended: false,
        }
    }

    /// A token was generated.
    pub(crate) fn token(&mut self, m: &ApiMetrics) {
        m.tokens.inc();
        if !self.first {
            self.first = true;
            m.first_token.observe(self.start.elapsed().as_secs_f64());
        }
    }

    /// The completion ended (`ok`: with a finish reason, not an error).
    pub(crate) fn finish(&mut self, m: &ApiMetrics, ok: bool) {
        self.end(m, if ok { Outcome::Ok } else { Outcome::Failed });
    }

    /// The client went away (its connection closed) before the completion ended.
    pub(crate) fn abandon(&mut self, m: &ApiMetrics) {
        self.end(m, Outcome::Abandoned);
    }

    /// Counts the request once, however it ends.
    fn end(&mut self, m: &ApiMetrics, outcome: Outcome) {
        if !self.ended {
            self.ended = true;
            m.duration.observe(self.start.elapsed().as_secs_f64());
            m.request(outcome);
        }
    }
}

/// The whole exposition in OpenMetrics text.
pub fn openmetrics(state: &ApiState) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    if let Some(t) = &state.telemetry {
        encode_registry(&mut out, t.metrics().registry())?;
    }
    encode_registry(&mut out, state.metrics.registry())?;
    encode_eof(&mut out)?;
    Ok(out)
}

/// OpenMetrics text as written by `prometheus-client`, in the Prometheus 0.0.4 text format:
/// counter families renamed to their samples' `_total` name, `# UNIT` and `# EOF` dropped.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE: held until the type says whether to rename it.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let renamed = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            if let Some((h, text)) = help.take() {
                let h = if h == name { renamed.as_str() } else { h };
                out.push_str(&format!("# HELP {h} {text}\n"));
            }
            out.push_str(&format!("# TYPE {renamed} {kind}\n"));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some((name, text)) = help.take() {
            out.push_str(&format!("# HELP {name} {text}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

pub(crate) async fn metrics(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let text = match openmetrics(&state) {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let wants_openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            to_prometheus_text(&text),
        )
            .into_response()
    }
}
