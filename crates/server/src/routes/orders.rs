//! `POST /v1/orders`, `GET /v1/orders/{id}` and `GET /v1/orders?client_order_id=`.
//!
//! Creation follows the contract's outcome table. A completed record is replayed
//! straight from a durable read, without a store command; a first attempt runs as
//! one `CreateOrder` command; concurrent duplicates wait for it (coalesced per
//! scope) and then replay. A `"survival": "region"` tenant's answer waits for
//! the standby to hold the entry it comes from (`survival.rs`).

use super::query::StrictQuery;
use super::{
    json_response, parse_json, read_body, require_json, IDEMPOTENCY_FINGERPRINT, IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
};
use crate::inflight::{wait_for_leader, Slot};
use crate::node::{now, Fingerprints, Node};
use crate::problem::ApiError;
use crate::survival;
use crate::tenants::Tenant;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use keyhold_core::scope::Namespace;
use keyhold_core::{
    IdempotencyKey, Operation, Order, OrderRequest, OrderStatus, Problem, Scope, StoredResponse,
};
use keyhold_store::{Logged, OrderOutcome};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Everything known about a create request once it passed validation.
struct Prepared {
    tenant: Arc<Tenant>,
    scope: Scope,
    request: OrderRequest,
    fingerprints: Fingerprints,
}

pub async fn create(State(node): State<Arc<Node>>, headers: HeaderMap, body: Body) -> Response {
    let prepared = match prepare(&node, &headers, body).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut response = match decide(&node, &prepared).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    // Every POST answer past fingerprinting names the digest the server computed.
    response.headers_mut().insert(
        IDEMPOTENCY_FINGERPRINT,
        HeaderValue::from_str(prepared.fingerprints.plain.as_str()).expect("hex is header-safe"),
    );
    response
}

/// Contract section 2 in order: authentication, rate, key, media type, size,
/// JSON, field rules, then the fingerprint and its optional client-sent copy.
async fn prepare(node: &Node, headers: &HeaderMap, body: Body) -> Result<Prepared, ApiError> {
    let tenant = node.tenants.authenticate(headers)?;
    tenant.check_request_rate()?;
    let key = header_checks(headers)?;
    let bytes = read_body(headers, body, node.config().body_bytes_max).await?;
    let value = parse_json(&bytes)?;
    let request = OrderRequest::from_value(&value).map_err(|errors| {
        ApiError::new(Problem::InvalidRequest)
            .detail("the order failed field rules")
            .errors(errors)
    })?;
    let fingerprints = node.fingerprints(node.orders_spec(), &value);
    if let Some(sent) = headers.get(IDEMPOTENCY_FINGERPRINT) {
        let sent = sent.to_str().unwrap_or("").trim().trim_matches('"');
        if sent != fingerprints.plain.as_str() {
            return Err(ApiError::new(Problem::FingerprintMismatch).detail(format!(
                "the request says {sent:?}; the server computed {}",
                fingerprints.plain
            )));
        }
    }
    let scope = Scope {
        namespace: Namespace::Orders,
        tenant: tenant.id().clone(),
        operation: Operation::orders_create(),
        key,
    };
    Ok(Prepared {
        tenant,
        scope,
        request,
        fingerprints,
    })
}

/// The checks of a create that need only the headers, in order: the key, at
/// most one `Idempotency-Fingerprint` (two are ambiguous), the media type.
pub fn header_checks(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let key = idempotency_key(headers)?;
    if headers
        .get_all(IDEMPOTENCY_FINGERPRINT)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(ApiError::invalid(
            "",
            "the Idempotency-Fingerprint header was given more than once",
        ));
    }
    require_json(headers)?;
    Ok(key)
}

pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Err(ApiError::new(Problem::IdempotencyKeyMissing));
    };
    if values.next().is_some() {
        return Err(ApiError::new(Problem::IdempotencyKeyInvalid)
            .detail("the Idempotency-Key header was given more than once"));
    }
    let text = value.to_str().map_err(|_| {
        ApiError::new(Problem::IdempotencyKeyInvalid).detail("the key must be visible ASCII")
    })?;
    IdempotencyKey::from_header(text)
        .map_err(|e| ApiError::new(Problem::IdempotencyKeyInvalid).detail(e.to_string()))
}

async fn decide(node: &Node, p: &Prepared) -> Result<Response, ApiError> {
    let wait = Duration::from_millis(node.policy().inflight_wait_ms);
    let deadline = Instant::now() + wait;
    let scope_key = p.scope.storage_key();
    loop {
        // Fast path: a live record decides replay and key reuse by itself, and a
        // durable read of it needs no command and no fsync.
        let record = node.store().record_logged(&p.scope).await?;
        let live = record.filter(|r| r.value.is_live(now()));
        if let Some(Logged {
            value: record,
            index,
        }) = &live
        {
            if record.fingerprint != p.fingerprints.stored {
                count("key_reused");
                return Err(ApiError::new(Problem::IdempotencyKeyReused));
            }
            if record.state.is_replayable() {
                if let Some(stored) = &record.response {
                    // A first attempt may have been answered 503 before the
                    // standby held it: its replay waits for the entry too.
                    survival::hold(node, &p.tenant, *index).await?;
                    count("replay");
                    return Ok(replay(stored));
                }
            }
        }
        match node.inflight.enter(scope_key.clone()) {
            Slot::Follower(rx) => {
                if tokio::time::timeout_at(deadline, wait_for_leader(rx))
                    .await
                    .is_err()
                {
                    count("in_progress");
                    return Err(ApiError::new(Problem::RequestInProgress));
                }
            }
            Slot::Leader(guard) => {
                if live.is_none() {
                    p.tenant.check_new_key_rate()?;
                }
                let result = execute(node, p).await;
                drop(guard);
                return result;
            }
        }
    }
}

async fn execute(node: &Node, p: &Prepared) -> Result<Response, ApiError> {
    let at = now();
    let order = Order {
        order_id: format!("ord_{}", uuid::Uuid::now_v7().simple()),
        tenant: p.tenant.id().clone(),
        request: p.request.clone(),
        status: OrderStatus::Confirmed,
        home_region: node.region().to_owned(),
        created_at: at,
    };
    let scope = p.scope.clone();
    let fingerprint = p.fingerprints.stored.clone();
    let Logged { value, index } = node
        .store()
        .create_order(scope, fingerprint, order, at, node.policy())
        .await?;
    Ok(match value {
        OrderOutcome::Created { response } => {
            count("new");
            node.outbox_notify.notify_waiters();
            survival::hold(node, &p.tenant, index).await?;
            stored(&response)
        }
        OrderOutcome::Replayed { response } => {
            survival::hold(node, &p.tenant, index).await?;
            count("replay");
            replay(&response)
        }
        OrderOutcome::MarkerHit { order } => {
            survival::hold(node, &p.tenant, index).await?;
            count("marker_hit");
            order_response(200, &order)
        }
        OrderOutcome::KeyReused => {
            count("key_reused");
            return Err(ApiError::new(Problem::IdempotencyKeyReused));
        }
        OrderOutcome::Fenced => {
            count("tenant_moving");
            return Err(ApiError::new(Problem::TenantMoving));
        }
        OrderOutcome::MarkerConflict => {
            count("marker_conflict");
            return Err(ApiError::new(Problem::ClientOrderIdConflict));
        }
        OrderOutcome::InProgress { retry_after_ms } => {
            count("in_progress");
            return Err(ApiError::new(Problem::RequestInProgress).retry_after_ms(retry_after_ms));
        }
    })
}

fn count(outcome: &'static str) {
    metrics::counter!("keyhold_orders_total", "outcome" => outcome).increment(1);
}

fn stored(response: &StoredResponse) -> Response {
    let mut out = json_response(response.status, response.body.clone());
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            out.headers_mut().insert(name, value);
        }
    }
    out
}

fn replay(response: &StoredResponse) -> Response {
    let mut out = stored(response);
    out.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    out
}

fn order_response(status: u16, order: &Order) -> Response {
    let mut out = json_response(status, order.body_json());
    out.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&order.location()).expect("order ids are header-safe"),
    );
    out
}

pub async fn get_one(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(order_id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = node.tenants.authenticate(&headers)?;
    tenant.check_request_rate()?;
    match node.store().order(&order_id).await? {
        // Another tenant's order is indistinguishable from a missing one.
        Some(order) if &order.tenant == tenant.id() => Ok(order_response(200, &order)),
        _ => Err(ApiError::new(Problem::NotFound)),
    }
}

#[derive(Deserialize)]
pub struct FindQuery {
    client_order_id: Option<String>,
}

pub async fn find(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<FindQuery>,
) -> Result<Response, ApiError> {
    let tenant = node.tenants.authenticate(&headers)?;
    tenant.check_request_rate()?;
    let Some(client_order_id) = query.client_order_id.filter(|c| !c.is_empty()) else {
        return Err(ApiError::invalid(
            "/client_order_id",
            "the client_order_id query parameter is required",
        ));
    };
    match node
        .store()
        .order_by_client_order_id(tenant.id(), &client_order_id)
        .await?
    {
        Some(order) => Ok(order_response(200, &order)),
        None => Err(ApiError::new(Problem::NotFound)),
    }
}
