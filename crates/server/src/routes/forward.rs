//! Routing of tenant requests to the tenant's home region.
//!
//! Every tenant route passes through here first. The request is authenticated
//! (401 before anything else), then placed by the local registry replica: the
//! home region executes it (while the tenant moves, its old home does until
//! the move fences its store, then answers 503 `tenant-moving`); otherwise the
//! whole request is forwarded to a node of the home region (the one that
//! answered last, else the next that can be reached), carrying the epoch this
//! node believes. A home that is not the owner at that epoch answers 421; this
//! node then waits for its replica to reach the home's registry index and
//! places the request once more. An unreachable home is 503
//! `owner-unreachable`: never local execution. Inside the home region, the
//! store's leader executes; a follower sends the request on to it (`leader.rs`).
//!
//! A forward carries the cluster's node credential; only then does the home
//! trust `Keyhold-Epoch`. A client cannot set it: without the credential the
//! header is ignored (the request is placed like any other), with a wrong one
//! the answer is 401 `unauthenticated`. Forwards copy an allow-list of the
//! client's headers, so nothing internal a client sent travels on.

use super::leader::{self, Arrival, AtLeader};
use super::{read_body, KEYHOLD_REGION};
use crate::limits::{FORWARD_ATTEMPTS_MAX, REGISTRY_READ_WAIT_MS};
use crate::node::{Node, Placement};
use crate::peers::{Call, CallKind, Failure, Patience, To};
use crate::problem::ApiError;
use crate::tenants::{has_tenant_token_form, Tenant};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keyhold_core::Problem;
use std::sync::Arc;
use std::time::Duration;

/// Executes here, once the store owns the tenant at the epoch the registry
/// replica shows (lifting the guard an ended move left); a store that knows a
/// later epoch refuses, and nothing executes.
async fn run_local(node: &Node, tenant: &Tenant, request: Request, next: Next) -> Response {
    // A region cut off from the registry majority stops executing within its
    // lease: a failover may already be giving its tenants to another region.
    let wait = Duration::from_millis(crate::limits::REGION_LEASE_RENEWAL_WAIT_MS);
    if !node.lease().holds_within(wait).await {
        return lease_lost();
    }
    // The placement was made before the lease check, which may have waited
    // for a renewal that brought the replica up to date (a region back from
    // isolation learning that a failover re-homed the tenant): place again.
    let current = node.registry().tenant(tenant.id().as_str());
    let still_here = current.as_ref().is_some_and(|record| {
        record.home_region == node.region() && record.epoch == tenant.record.epoch
    });
    if !still_here {
        return ApiError::new(Problem::TenantMoving)
            .detail("the tenant's home changed while this request waited")
            .into_response();
    }
    match node.ensure_owned(tenant.id(), tenant.record.epoch).await {
        Ok(true) => {
            let response = next.run(request).await;
            // An answer is given only inside the lease: a failover waits the
            // lease out before it commits, so nothing this region executed is
            // acknowledged after the failover is done. The command may have
            // taken effect; the client's retry finds it, or the region's
            // reconciliation lists it.
            if !node.lease().holds() {
                return lease_lost();
            }
            response
        }
        Ok(false) if !tenant.record.is_active() => ApiError::new(Problem::TenantMoving)
            .detail("the tenant's move is switching it to its new home")
            .into_response(),
        Ok(false) => ApiError::new(Problem::TenantMoving)
            .detail("this node's registry replica is behind the store")
            .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// 503 `owner-unreachable`: this region's lease has lapsed.
fn lease_lost() -> Response {
    metrics::counter!("keyhold_lease_refused_total").increment(1);
    ApiError::new(Problem::OwnerUnreachable)
        .detail("this region has lost contact with the registry's majority")
        .into_response()
}

/// Executes in this region: here when this node leads the region's store, else
/// on the leader, which receives the request once (a hop is not sent on again).
async fn run_in_region(
    node: &Node,
    tenant: &Tenant,
    request: Request,
    next: Next,
    arrival: Arrival,
) -> Response {
    if node.leads_region() {
        return run_local(node, tenant, request, next).await;
    }
    if arrival == Arrival::RegionHop {
        return leader::not_leader();
    }
    let (parts, body) = request.into_parts();
    let bytes = match buffer(node, &parts, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let mut headers = client_headers(&parts.headers);
    headers.insert(KEYHOLD_EPOCH, HeaderValue::from(tenant.record.epoch));
    let call = Call::new(
        parts.method.clone(),
        CallKind::Forward,
        leader::path_of(&parts.uri),
    )
    .headers(headers)
    .body(bytes.clone());
    match leader::send_to_leader(node, &call, Patience::Wait).await {
        // The leader's registry replica disagrees with this one (a move just
        // ended): a forwarding region handles its 421; a client is told to retry.
        AtLeader::Answered(response)
            if response.status() == StatusCode::MISDIRECTED_REQUEST
                && arrival == Arrival::Client =>
        {
            ApiError::new(Problem::TenantMoving)
                .detail("the home region's replicas are catching up with a move")
                .into_response()
        }
        AtLeader::Answered(response) => leader::relay(response, Problem::StoreUnavailable).await,
        AtLeader::Here => {
            let request = Request::from_parts(parts, Body::from(bytes));
            run_local(node, tenant, request, next).await
        }
        AtLeader::NoLeader => leader::not_leader(),
        AtLeader::Failed(e) => e.into_response(),
    }
}

/// Reads a request's body to send it on. The executing node checks the headers
/// before it reads the body; so does this one, so that a request it would
/// refuse for its headers gets that answer here too, even when its body is over
/// the limit this node reads.
async fn buffer(node: &Node, parts: &Parts, body: Body) -> Result<Bytes, ApiError> {
    super::header_checks(&parts.method, parts.uri.path(), &parts.headers)?;
    read_body(&parts.headers, body, node.config().body_bytes_max).await
}

/// The allow-listed client headers of a request, for sending it on.
fn client_headers(from: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in FORWARDED_HEADERS {
        for value in from.get_all(name) {
            headers.append(name, value.clone());
        }
    }
    headers
}

/// The epoch a forwarding node believes the tenant is at.
pub const KEYHOLD_EPOCH: HeaderName = HeaderName::from_static("keyhold-epoch");
/// On a 421: the registry index the home had applied, for the sender to wait for.
pub const KEYHOLD_REGISTRY_INDEX: HeaderName = HeaderName::from_static("keyhold-registry-index");

/// Request headers a forward carries; everything else is hop-by-hop or the
/// forwarder's business.
const FORWARDED_HEADERS: [&str; 6] = [
    "authorization",
    "content-type",
    "idempotency-key",
    "idempotency-fingerprint",
    "accept",
    "user-agent",
];

fn misdirected(node: &Node) -> Response {
    metrics::counter!("keyhold_forward_misdirected_total").increment(1);
    let mut response = ApiError::new(Problem::Misdirected).into_response();
    response.headers_mut().insert(
        KEYHOLD_REGISTRY_INDEX,
        HeaderValue::from(node.registry().applied_index()),
    );
    response
}

pub async fn route(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let mut authenticated = node.tenants.authenticate(request.headers());
    // Only a token of the tenant form can be a tenant created through another
    // node a moment ago; a missing or malformed one is refused at once, so a
    // flood of bad tokens costs nobody a wait, and the waits of well-formed
    // unknown ones are bounded in number.
    if authenticated.is_err()
        && has_tenant_token_form(request.headers())
        && node.catch_up_registry_for_token().await
    {
        authenticated = node.tenants.authenticate(request.headers());
    }
    let tenant = match authenticated {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let believed_epoch = match forwarded_epoch(&node, request.headers()) {
        Ok(epoch) => epoch,
        Err(e) => return e.into_response(),
    };
    let arrival = Arrival::of(&node, request.headers());
    match (node.placement(&tenant.record), believed_epoch) {
        (Placement::Closed, _) => ApiError::new(Problem::TenantMoving).into_response(),
        // A forwarder that believes another epoch must refresh first, whether it
        // is behind or (after a move back) ahead.
        (Placement::Local, Some(e)) if e != tenant.record.epoch => misdirected(&node),
        (Placement::Local, _) => run_in_region(&node, &tenant, request, next, arrival).await,
        // Forwarded to a node that is not home: never forward twice.
        (Placement::Remote { .. }, Some(_)) => misdirected(&node),
        (Placement::Remote { region }, None) => forward(node, request, next, region).await,
    }
}

/// The epoch a forwarding node believes, trusted only from a caller holding the
/// node credential. No credential header: a client's request, whose
/// `Keyhold-Epoch` (if any) means nothing. A credential that is not accepted:
/// 401, whatever else the request carries.
fn forwarded_epoch(node: &Node, headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    if !crate::peers::carries_credential(headers) {
        return Ok(None);
    }
    if !node.credentials().check(headers) {
        metrics::counter!("keyhold_node_credential_refused_total").increment(1);
        return Err(
            ApiError::new(Problem::Unauthenticated).detail("the node credential is not accepted")
        );
    }
    Ok(headers
        .get(KEYHOLD_EPOCH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok()))
}

async fn forward(node: Arc<Node>, request: Request, next: Next, region: String) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match buffer(&node, &parts, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let path = leader::path_of(&parts.uri).to_owned();
    let mut region = region;
    for attempt in 0..FORWARD_ATTEMPTS_MAX {
        let Some(tenant) = node.tenants.authenticate(&parts.headers).ok() else {
            return ApiError::new(Problem::Unauthenticated).into_response();
        };
        if attempt > 0 {
            match node.placement(&tenant.record) {
                Placement::Closed => return ApiError::new(Problem::TenantMoving).into_response(),
                // After a refresh the tenant turned out to live here.
                Placement::Local => {
                    let request = Request::from_parts(parts, Body::from(bytes));
                    return run_in_region(&node, &tenant, request, next, Arrival::Client).await;
                }
                Placement::Remote { region: r } => region = r,
            }
        }
        let call = Call::new(parts.method.clone(), CallKind::Forward, path.as_str())
            .headers(client_headers(&parts.headers))
            .header(KEYHOLD_EPOCH, HeaderValue::from(tenant.record.epoch))
            .body(bytes.clone());
        let started = std::time::Instant::now();
        let sent = node.peers().send(To::Region(&region), &call).await;
        metrics::histogram!("keyhold_forward_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                // Unless nothing was sent, whether it executed is unknown; the
                // client retries with its key.
                if !matches!(e.failure, Failure::NoNode) {
                    metrics::counter!("keyhold_forward_failures_total").increment(1);
                    tracing::warn!(region, error = %e, "forward to home region failed");
                }
                return e.into_api(Problem::OwnerUnreachable).into_response();
            }
        };
        if response.status() == StatusCode::MISDIRECTED_REQUEST {
            let index = response
                .headers()
                .get(KEYHOLD_REGISTRY_INDEX)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let wait = Duration::from_millis(REGISTRY_READ_WAIT_MS);
            if node.registry().wait_applied(index, wait).await.is_err() {
                // This replica cannot catch up (partitioned?): refuse rather than guess.
                return ApiError::new(Problem::TenantMoving)
                    .detail("this node's registry replica is behind")
                    .into_response();
            }
            node.refresh_tenants();
            continue;
        }
        metrics::counter!("keyhold_forwarded_total").increment(1);
        return relay(response).await;
    }
    ApiError::new(Problem::OwnerUnreachable)
        .detail("the tenant's home kept changing")
        .into_response()
}

/// Copies the home's answer, `Keyhold-Region` included, back to the client.
async fn relay(response: reqwest::Response) -> Response {
    let out = leader::relay(response, Problem::OwnerUnreachable).await;
    debug_assert!(out.headers().contains_key(KEYHOLD_REGION));
    out
}
