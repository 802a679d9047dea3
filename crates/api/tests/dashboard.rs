//! The embedded dashboard: `/` is the page, the script and style it names are served with
//! their content types, a revalidation with the entity tag gets a 304, and the script is the
//! one that reads the node's API.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use neuroshard_api::{ApiState, router};
use neuroshard_data::GenesisTokenizer;
use neuroshard_node::serve::ServeHandle;
use tower::ServiceExt;

/// A state whose serving loop is never asked: the dashboard's routes do not touch it.
fn state() -> ApiState {
    let tokenizer = Arc::new(GenesisTokenizer::train(300, ["hello there"].iter()).unwrap());
    let (handle, _commands) = ServeHandle::new(1);
    ApiState::new(handle, tokenizer)
}

async fn get(path: &str, etag: Option<&str>) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::get(path);
    if let Some(tag) = etag {
        req = req.header(header::IF_NONE_MATCH, tag);
    }
    let resp = router(state())
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = to_bytes(resp.into_body(), 1 << 22).await.unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// The value of the first `name="..."` after `marker` in `html`.
fn attr<'a>(html: &'a str, marker: &str, name: &str) -> &'a str {
    let tag = &html[html.find(marker).unwrap_or_else(|| panic!("no {marker}"))..];
    let at = tag.find(&format!("{name}=\"")).expect("the attribute") + name.len() + 2;
    &tag[at..at + tag[at..].find('"').unwrap()]
}

fn content_type(headers: &axum::http::HeaderMap) -> &str {
    headers[header::CONTENT_TYPE].to_str().unwrap()
}

#[tokio::test]
async fn the_page_its_script_and_its_style_are_served() {
    let (status, headers, html) = get("/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type(&headers).starts_with("text/html"));
    assert!(html.contains("<title>NeuroShard node</title>"), "{html}");
    assert!(headers.contains_key(header::CONTENT_SECURITY_POLICY));

    let script = attr(&html, "<script", "src").trim_start_matches('.');
    let (status, headers, js) = get(script, None).await;
    assert_eq!(status, StatusCode::OK, "{script}");
    assert!(content_type(&headers).starts_with("text/javascript"));
    for route in ["/api/status", "/api/loss", "/api/rounds", "/v1/completions"] {
        assert!(js.contains(route), "the script does not use {route}");
    }

    let style = attr(&html, "<link rel=\"stylesheet\"", "href").trim_start_matches('.');
    let (status, headers, css) = get(style, None).await;
    assert_eq!(status, StatusCode::OK, "{style}");
    assert!(content_type(&headers).starts_with("text/css"));
    assert!(css.contains(".swarm-grid"));
}

#[tokio::test]
async fn an_unchanged_page_revalidates_to_304() {
    let (_, headers, _) = get("/app.js", None).await;
    assert_eq!(headers[header::CACHE_CONTROL], "no-cache");
    let etag = headers[header::ETAG].to_str().unwrap().to_string();
    let (status, _, body) = get("/app.js", Some(&etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (status, _, _) = get("/app.js", Some("\"stale\"")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = get("/app.map", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
