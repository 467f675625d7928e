//! The HTTP surface: the router, layers shared by every route, and the request
//! helpers (content type, bounded body, strict JSON) every handler uses.

mod admin;
mod admin_page;
mod claims;
mod failover;
mod forward;
pub(crate) mod guard;
mod internal;
mod leader;
mod members;
mod meta;
mod moves;
mod orders;
mod query;
mod reconcile;
mod regions;

pub(crate) use internal::Pass;

use crate::node::Node;
use crate::problem::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use keyhold_core::Problem;
use keyhold_fingerprint::Value;
use std::sync::Arc;
use std::time::Instant;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;

pub const KEYHOLD_REGION: HeaderName = HeaderName::from_static("keyhold-region");
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const IDEMPOTENCY_FINGERPRINT: HeaderName = HeaderName::from_static("idempotency-fingerprint");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

pub fn router(node: Arc<Node>) -> Router {
    let region = HeaderValue::from_str(node.region()).expect("region names are header-safe");
    // Tenant routes execute only in the tenant's home region; the layer forwards
    // everything else there.
    let tenant_routes = Router::new()
        .route("/v1/orders", post(orders::create).get(orders::find))
        .route("/v1/orders/{order_id}", get(orders::get_one))
        .route("/v1/claims", post(claims::claim))
        .route("/v1/claims/complete", post(claims::complete))
        .route("/v1/claims/heartbeat", post(claims::heartbeat))
        .route_layer(middleware::from_fn_with_state(node.clone(), forward::route));
    // Every admin API route opens with the admin token, checked once here.
    let admin_routes = Router::new()
        .route(
            "/admin/v1/tenants",
            post(admin::create_tenant).get(admin::list_tenants),
        )
        .route(
            "/admin/v1/tenants/{tenant_id}",
            get(admin::get_tenant).delete(admin::delete_tenant),
        )
        .route(
            "/admin/v1/tenants/{tenant_id}/token",
            post(admin::rotate_token),
        )
        .route(
            "/admin/v1/tenants/{tenant_id}/limits",
            put(admin::set_limits),
        )
        .route(
            "/admin/v1/tenants/{tenant_id}/move",
            post(moves::start_move),
        )
        .route(
            "/admin/v1/operations/{operation_id}",
            get(moves::get_operation),
        )
        .route("/admin/v1/operations", get(moves::list_operations))
        .route("/admin/v1/cluster", get(admin::cluster))
        .route(
            "/admin/v1/regions/{region}/reconciliation",
            get(reconcile::get_reconciliation),
        )
        .route("/admin/v1/outbox/replay", post(admin::replay_outbox))
        .route("/admin/v1/inventory/reservations", get(admin::reservations))
        .route(
            "/admin/v1/regions/{region}/failover",
            post(regions::start_failover),
        )
        .route("/admin/v1/nodes", post(members::add_node))
        .route(
            "/admin/v1/nodes/{node_id}/remove",
            post(members::remove_node),
        )
        // A fanned-out call's local part acts on this region's store: on its leader.
        .route_layer(middleware::from_fn_with_state(
            (node.clone(), node.config().body_bytes_max),
            leader::admin_local_at_leader,
        ))
        .route_layer(middleware::from_fn_with_state(node.clone(), require_admin));
    Router::new()
        .merge(tenant_routes)
        .merge(admin_routes)
        .merge(internal::router(node.clone()))
        .merge(failover::router(node.clone()))
        .merge(admin_page::router())
        .route("/v1/idempotency-policy", get(meta::policy))
        .route("/v1/fingerprint-specs", get(meta::specs))
        .route("/healthz", get(meta::healthz))
        .route("/readyz", get(meta::readyz))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(meta::openapi))
        .nest_service(crate::demo::MOUNT, crate::demo::service(&node))
        .fallback(|| async { ApiError::new(Problem::NotFound) })
        .method_not_allowed_fallback(|| async { ApiError::new(Problem::MethodNotAllowed) })
        .layer(middleware::from_fn(record_metrics))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(guard::problems_only))
        .layer(middleware::from_fn(guard::check_message))
        .layer(middleware::from_fn(guard::bound_time))
        // Outside the time bound: a request cut off by it still leaves a clean
        // connection (or says close).
        .layer(middleware::from_fn(guard::settle_body))
        // A forwarded answer already names the region that executed it.
        .layer(SetResponseHeaderLayer::if_not_present(
            KEYHOLD_REGION,
            region,
        ))
        // Failures are logged by `record_metrics` with route and slug, at
        // WARN for 503s: tower_http's own line was an ERROR without either.
        .layer(TraceLayer::new_for_http().on_failure(()))
        .layer(cluster_pages())
        .with_state(node)
}

/// Cross-origin reads: `/admin/` served by one node asks the others (their
/// readiness, their view of their region, and everything when its own node is
/// down or cut off), at whatever addresses the registry holds for them (behind
/// `keyhold up`'s proxies, or a load balancer, not the page's own origin). So
/// any origin may read a `GET` answer, sending `Authorization`. This opens
/// nothing: every answer but the public ones needs a bearer token, which a
/// page of another origin does not hold (keyhold sets no cookies, and the
/// page keeps the token in its own tab's storage); nothing is changed
/// cross-origin (no other method is allowed).
fn cluster_pages() -> tower_http::cors::CorsLayer {
    use tower_http::cors::{Any, CorsLayer};
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([axum::http::Method::GET])
        .allow_headers([header::AUTHORIZATION])
        .max_age(std::time::Duration::from_secs(600))
}

/// The gate of every node-to-node route: 401 `unauthenticated` (problem+json)
/// unless the caller presents the cluster's node credential. Tenant and admin
/// tokens open nothing here.
pub(crate) async fn require_node_credential(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
    request: Request,
    next: Next,
) -> Response {
    if node.credentials().check(request.headers()) {
        return next.run(request).await;
    }
    metrics::counter!("keyhold_node_credential_refused_total").increment(1);
    ApiError::new(Problem::Unauthenticated)
        .detail("inter-node endpoints accept only the cluster's node credential")
        .into_response()
}

/// The gate of the admin API: 401 `unauthenticated` (problem+json) unless the caller
/// presents the admin token. Runs after routing (unknown paths and methods answer
/// 404/405 as anywhere) and before any extractor, so a caller without the token learns
/// nothing from the validation of its path, query or body.
async fn require_admin(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
    request: Request,
    next: Next,
) -> Response {
    match crate::tenants::authenticate_admin(request.headers(), node.admin_token_sha256()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// A panicking handler is a bug; the client still gets a problem document, and
/// the node keeps serving.
fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    metrics::counter!("keyhold_handler_panics_total").increment(1);
    ApiError::new(Problem::Internal).into_response()
}

/// Counts requests by route and status and times them. Routes are the matched
/// templates (`/v1/orders/{order_id}`), never raw paths, so no ids reach labels.
async fn record_metrics(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    log_failure(&method, &route, &response);
    if let Some(problem) = response.extensions().get::<Problem>() {
        crate::metrics::count_problem(*problem, 1);
    }
    let status = response.status().as_u16().to_string();
    metrics::counter!("keyhold_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("keyhold_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// The one log line of a 5xx answer, with its route and slug (`forwarded`: an
/// answer another node gave, which logged it). 503s are expected while a
/// region, its standby or the registry is away, and retried by clients: WARN,
/// summarised with their repeats by the binary's log layer; a 500 is a bug:
/// ERROR. 4xx answers are the client's business and are not logged.
fn log_failure(method: &str, route: &str, response: &Response) {
    let status = response.status().as_u16();
    if status < 500 {
        return;
    }
    if route == "/readyz" {
        // A readiness probe's 503 is its answer, polled by every orchestrator
        // while a node starts or its region is cut off: not a failure.
        tracing::debug!(status, "not ready");
        return;
    }
    let slug = response
        .extensions()
        .get::<Problem>()
        .map_or("forwarded", |p| p.slug());
    if status == 500 {
        tracing::error!(method, route, status, slug, "answered 500");
    } else {
        tracing::warn!(method, route, status, slug, "answered 5xx");
    }
}

/// 415 unless the body is declared as JSON (`application/json` or any
/// `application/*+json`, parameters allowed).
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    if headers
        .get_all(header::CONTENT_TYPE)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(ApiError::invalid(
            "",
            "the Content-Type header was given more than once",
        ));
    }
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match declared.as_deref() {
        Some("application/json") => Ok(()),
        Some(t) if t.starts_with("application/") && t.ends_with("+json") => Ok(()),
        _ => Err(ApiError::new(Problem::UnsupportedMediaType)
            .detail("send the body as application/json")),
    }
}

/// Reads the whole body, refusing (413) past `limit` bytes without buffering more,
/// and (408 `request-timeout`) a body that has not fully arrived within
/// `BODY_READ_MS`: a slow or unfinished body cannot hold the request open. What
/// is left of a refused body is drained or the connection closed by
/// `guard::settle_body`.
pub async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(Problem::PayloadTooLarge)
            .detail(format!("the body must be at most {limit} bytes"))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let read = async {
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::invalid("", format!("could not read the body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(Bytes::from(buf))
    };
    // Client bodies get BODY_READ_MS; a larger limit (a move's import page)
    // gets the time its size needs at the slowest accepted rate.
    let wait_ms = crate::limits::BODY_READ_MS
        .max(limit as u64 * 1000 / crate::limits::BODY_READ_BYTES_PER_SECOND_MIN);
    let wait = std::time::Duration::from_millis(wait_ms);
    tokio::time::timeout(wait, read).await.unwrap_or_else(|_| {
        Err(ApiError::new(Problem::RequestTimeout)
            .detail(format!("the body did not arrive within {wait_ms} ms")))
    })
}

/// Strict I-JSON: duplicate names, lone surrogates, non-finite numbers and
/// excessive nesting are 400 `invalid-request`, with the rule and byte offset.
pub fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    keyhold_fingerprint::parse(bytes).map_err(|e| ApiError::invalid("", e.to_string()))
}

/// The checks of a tenant request that need only its headers, in the order the
/// handler makes them after authentication: for a new order its key, its
/// fingerprint header and its media type; for any other POST its media type. A
/// forwarding node makes them too before it reads the body, so a request gets
/// the same answer through any node.
pub fn header_checks(
    method: &axum::http::Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    if method != axum::http::Method::POST {
        return Ok(());
    }
    if path == "/v1/orders" {
        return orders::header_checks(headers).map(drop);
    }
    require_json(headers)
}

/// Content type, size and strictness checks, then the parsed body.
pub async fn json_body(
    node: &Node,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Value), ApiError> {
    require_json(headers)?;
    let bytes = read_body(headers, body, node.config().body_bytes_max).await?;
    let value = parse_json(&bytes)?;
    Ok((bytes, value))
}

/// A JSON response with the given status.
pub fn json_response(status: u16, body: Vec<u8>) -> Response {
    (
        axum::http::StatusCode::from_u16(status).expect("valid status"),
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}
