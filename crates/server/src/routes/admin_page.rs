//! `/admin/`: the live cluster page for operators, compiled into the binary
//! (crates/server/assets/admin.html). The page itself needs no token; it asks
//! for the admin token, keeps it in the tab's sessionStorage and sends it in
//! the Authorization header of the admin API calls it polls, never in a URL.
//! A page, not API: its routes live here, outside the router that
//! docs/openapi.json mirrors.

use crate::node::Node;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

const PAGE: &str = include_str!("../../assets/admin.html");

/// `/admin/` and the redirect to it from `/admin`.
pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route("/admin/", get(page))
        .route("/admin", get(redirect))
}

/// `GET /admin/`.
async fn page() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /admin` → `/admin/`.
async fn redirect() -> Response {
    Redirect::permanent("/admin/").into_response()
}
