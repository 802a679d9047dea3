//! The read API a dashboard polls: `GET /api/status`, `/api/loss`, `/api/rounds`,
//! `/api/balances` and `/api/proofs`, all JSON, all read-only. Each copies a view out of the
//! node's [`Telemetry`] under its lock and serializes after releasing it.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::ApiState;

/// Most proofs `/api/proofs` lists.
pub const PROOFS_LISTED: usize = 50;

pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/api/status", get(status))
        .route("/api/loss", get(loss))
        .route("/api/rounds", get(rounds))
        .route("/api/balances", get(balances))
        .route("/api/proofs", get(proofs))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn unavailable(message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "server_error"}});
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

/// The 503 of a server without a node behind it.
fn no_telemetry() -> Response {
    unavailable("this server has no node telemetry")
}

async fn status(State(state): State<ApiState>) -> Response {
    let Some(t) = &state.telemetry else {
        return no_telemetry();
    };
    match t.read(|f| f.status(now_ms())) {
        Some(s) => axum::Json(s).into_response(),
        None => unavailable("the node is starting"),
    }
}

async fn loss(State(state): State<ApiState>) -> Response {
    let Some(t) = &state.telemetry else {
        return no_telemetry();
    };
    let (train, validation) = t.read(|f| (f.train_loss(), f.validation_loss()));
    axum::Json(json!({"train": train, "validation": validation})).into_response()
}

async fn rounds(State(state): State<ApiState>) -> Response {
    let Some(t) = &state.telemetry else {
        return no_telemetry();
    };
    let rounds = t.read(|f| f.rounds());
    axum::Json(json!({ "rounds": rounds })).into_response()
}

async fn balances(State(state): State<ApiState>) -> Response {
    let Some(t) = &state.telemetry else {
        return no_telemetry();
    };
    let accounts = t.read(|f| f.accounts().to_vec());
    axum::Json(json!({ "accounts": accounts })).into_response()
}

async fn proofs(State(state): State<ApiState>) -> Response {
    let Some(t) = &state.telemetry else {
        return no_telemetry();
    };
    let proofs = t.read(|f| f.proofs(PROOFS_LISTED));
    axum::Json(json!({ "proofs": proofs })).into_response()
}
