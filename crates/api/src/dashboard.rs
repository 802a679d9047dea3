//! The web dashboard at `/`: the page built from `web/` (see the README) and checked in under
//! `crates/api/dashboard/`, embedded in the binary so that a node needs no Node.js or files at
//! run time. The page reads the node's `/api/*` routes and streams `/v1/completions`.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One embedded file and its entity tag (a hash of its bytes, fixed at first use).
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    etag: std::sync::OnceLock<String>,
}

impl Asset {
    const fn new(body: &'static [u8], content_type: &'static str) -> Self {
        Asset {
            body,
            content_type,
            etag: std::sync::OnceLock::new(),
        }
    }

    fn etag(&self) -> &str {
        self.etag.get_or_init(|| {
            // FNV-1a: the tag only has to change when the bytes do.
            let hash = self.body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            format!("\"{hash:016x}\"")
        })
    }

    fn respond(&self, headers: &HeaderMap) -> Response {
        let etag = self.etag();
        let common = [
            // The file names are fixed, so browsers must ask again each load; the tag makes
            // that a 304 when nothing changed.
            (header::CACHE_CONTROL, "no-cache"),
            (header::ETAG, etag),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::REFERRER_POLICY, "no-referrer"),
        ];
        let fresh = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
        if fresh {
            return (StatusCode::NOT_MODIFIED, common).into_response();
        }
        let content_type = HeaderValue::from_static(self.content_type);
        (common, [(header::CONTENT_TYPE, content_type)], self.body).into_response()
    }
}

/// The page loads only its own script and style and talks only to its own node: peer data
/// that slipped into markup could neither run nor phone out.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

static INDEX: Asset = Asset::new(
    include_bytes!("../dashboard/index.html"),
    "text/html; charset=utf-8",
);
static SCRIPT: Asset = Asset::new(
    include_bytes!("../dashboard/app.js"),
    "text/javascript; charset=utf-8",
);
static STYLE: Asset = Asset::new(
    include_bytes!("../dashboard/app.css"),
    "text/css; charset=utf-8",
);

/// The dashboard's routes, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { INDEX.respond(&h) }))
        .route(
            "/index.html",
            get(|h: HeaderMap| async move { INDEX.respond(&h) }),
        )
        .route(
            "/app.js",
            get(|h: HeaderMap| async move { SCRIPT.respond(&h) }),
        )
        .route(
            "/app.css",
            get(|h: HeaderMap| async move { STYLE.respond(&h) }),
        )
}
