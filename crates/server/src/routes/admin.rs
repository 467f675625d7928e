//! The admin API (bearer admin token): tenants and the cluster view.

use super::{json_body, json_response};
use crate::node::{CreateTenantError, Node};
use crate::problem::ApiError;
use crate::tenants::authenticate_admin;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use keyhold_core::{Problem, TenantId};
use keyhold_store::TenantEntry;
use serde::Deserialize;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTenant {
    tenant_id: String,
    home_region: String,
    #[serde(default)]
    requests_per_second: Option<u32>,
    #[serde(default)]
    new_keys_per_second: Option<u32>,
}

fn tenant_json(entry: &TenantEntry) -> serde_json::Value {
    serde_json::json!({
        "tenant_id": entry.id.as_str(),
        "home_region": entry.home_region,
        // Homes do not change until tenant moves exist, so every tenant is at its
        // first epoch.
        "epoch": 1,
        "state": "active",
        "created_at": entry.created_at.to_rfc3339(),
        "requests_per_second": entry.requests_per_second,
        "new_keys_per_second": entry.new_keys_per_second,
    })
}

pub async fn create_tenant(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let (bytes, _) = json_body(&node, &headers, body).await?;
    let req: CreateTenant =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    let id = TenantId::parse(&req.tenant_id)
        .map_err(|e| ApiError::invalid("/tenant_id", e.to_string()))?;
    let rate = |v: Option<u32>, default: u32, pointer: &str| match v {
        Some(0) => Err(ApiError::invalid(pointer, "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let requests = rate(
        req.requests_per_second,
        node.config().tenant_requests_per_second,
        "/requests_per_second",
    )?;
    let new_keys = rate(
        req.new_keys_per_second,
        node.config().tenant_new_keys_per_second,
        "/new_keys_per_second",
    )?;
    let (entry, token) = node
        .create_tenant(id, &req.home_region, requests, new_keys)
        .await
        .map_err(|e| match e {
            CreateTenantError::Exists => {
                ApiError::new(Problem::Conflict).detail("a tenant with this id exists")
            }
            CreateTenantError::UnknownRegion => ApiError::invalid(
                "/home_region",
                format!("unknown region; regions are {:?}", node.config().regions),
            ),
            CreateTenantError::NotThisRegion => ApiError::invalid(
                "/home_region",
                format!(
                    "this node homes tenants in region {:?} only; create the tenant on a node of its home region",
                    node.region()
                ),
            ),
            CreateTenantError::Store(e) => e.into(),
        })?;
    let mut body = tenant_json(&entry);
    body["token"] = serde_json::Value::String(token);
    let mut response = json_response(201, serde_json::to_vec(&body).expect("json"));
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/admin/v1/tenants/{}", entry.id)).expect("safe id"),
    );
    Ok(response)
}

pub async fn get_tenant(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let tenant = TenantId::parse(&tenant_id)
        .ok()
        .and_then(|id| node.tenants.get(&id))
        .ok_or_else(|| ApiError::new(Problem::NotFound))?;
    Ok(json_response(
        200,
        serde_json::to_vec(&tenant_json(&tenant.entry)).expect("json"),
    ))
}

pub async fn cluster(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let stats = node.store().stats();
    let body = serde_json::json!({
        "this_region": node.region(),
        "regions": node.config().regions.iter().map(|r| serde_json::json!({
            "name": r,
            "local": r == node.region(),
        })).collect::<Vec<_>>(),
        "tenants": node.tenants.len(),
        "store": {
            "healthy": node.store().is_healthy(),
            "batches": stats.batches(),
            "commands": stats.commands(),
            "size_on_disk_bytes": node.store().size_on_disk(),
        },
    });
    Ok(json_response(200, serde_json::to_vec(&body).expect("json")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    #[serde(default)]
    since: Option<String>,
}

/// `POST /admin/v1/outbox/replay`: re-publishes kept events (all of them, or
/// those after `since`). Consumers dedupe by `(event_id, consumer)` and the
/// payment provider by the charge's key, so this causes no second effect.
pub async fn replay_outbox(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let bytes = super::read_body(&headers, body, node.config().body_bytes_max).await?;
    let since = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        super::require_json(&headers)?;
        super::parse_json(&bytes)?;
        let req: ReplayRequest =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
        match req.since {
            None => None,
            Some(text) => Some(
                keyhold_core::UnixMillis::parse_rfc3339(&text)
                    .ok_or_else(|| ApiError::invalid("/since", "since must be an RFC 3339 time"))?,
            ),
        }
    };
    let replayed = match node.store().first_outbox_seq_after(since)? {
        None => 0,
        Some(from_seq) => {
            let command = keyhold_store::Command::ReplayOutbox {
                from_seq,
                consumers: crate::downstream::consumers(&node),
            };
            match node.store().execute(command).await? {
                keyhold_store::Applied::Replayed { events } => events,
                other => unreachable!("replay answered {other:?}"),
            }
        }
    };
    node.outbox_notify.notify_waiters();
    Ok(json_response(
        202,
        serde_json::to_vec(&serde_json::json!({ "replayed": replayed })).expect("json"),
    ))
}

#[derive(Deserialize)]
pub struct ReservationsQuery {
    order_id: Option<String>,
}

/// `GET /admin/v1/inventory/reservations?order_id=X`: the inventory consumer's
/// stock reservations for one order, one per reserved item line.
pub async fn reservations(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ReservationsQuery>,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let Some(order_id) = query.order_id.filter(|o| !o.is_empty()) else {
        return Err(ApiError::invalid(
            "/order_id",
            "the order_id query parameter is required",
        ));
    };
    let data: Vec<serde_json::Value> = node
        .store()
        .reservations(&order_id)
        .await?
        .into_iter()
        .map(|r| {
            serde_json::json!({
                "order_id": r.order_id,
                "line": r.line,
                "sku": r.sku,
                "quantity": r.quantity,
                "event_id": r.event_id,
                "reserved_at": r.at.to_rfc3339(),
            })
        })
        .collect();
    Ok(json_response(
        200,
        serde_json::to_vec(&serde_json::json!({ "data": data })).expect("json"),
    ))
}
