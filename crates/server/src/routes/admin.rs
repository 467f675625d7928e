//! The admin API (bearer admin token): tenants and the cluster view.

use super::{json_body, json_response};
use crate::node::{CreateTenantError, Node};
use crate::problem::ApiError;
use crate::tenants::authenticate_admin;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use keyhold_core::UnixMillis;
use keyhold_core::{Problem, TenantId};
use keyhold_registry::{TenantRecord, TenantState};
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

fn tenant_json(record: &TenantRecord) -> serde_json::Value {
    let (state, moving_to, operation_id) = match &record.state {
        TenantState::Active => ("active", None, None),
        TenantState::Moving { to, operation_id } => ("moving", Some(to), Some(operation_id)),
    };
    serde_json::json!({
        "tenant_id": record.tenant_id,
        "home_region": record.home_region,
        "epoch": record.epoch,
        "state": state,
        "moving_to": moving_to,
        "operation_id": operation_id,
        "created_at": UnixMillis(record.created_at_ms).to_rfc3339(),
        "requests_per_second": record.requests_per_second,
        "new_keys_per_second": record.new_keys_per_second,
    })
}

fn registry_unavailable(e: keyhold_registry::Error) -> ApiError {
    tracing::warn!(error = %e, "registry write failed");
    ApiError::new(Problem::StoreUnavailable).detail(format!("registry: {e}"))
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
    let (record, token) = node
        .create_tenant(id, &req.home_region, requests, new_keys)
        .await
        .map_err(|e| match e {
            CreateTenantError::Exists => {
                ApiError::new(Problem::Conflict).detail("a tenant with this id exists")
            }
            CreateTenantError::UnknownRegion => ApiError::invalid(
                "/home_region",
                format!(
                    "unknown region; regions are {:?}",
                    node.registry()
                        .regions()
                        .into_iter()
                        .map(|r| r.name)
                        .collect::<Vec<_>>()
                ),
            ),
            CreateTenantError::Registry(e) => registry_unavailable(e),
        })?;
    let mut body = tenant_json(&record);
    body["token"] = serde_json::Value::String(token);
    let mut response = json_response(201, serde_json::to_vec(&body).expect("json"));
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/admin/v1/tenants/{}", record.tenant_id)).expect("safe id"),
    );
    Ok(response)
}

pub async fn get_tenant(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let mut record = node.registry().tenant(&tenant_id);
    if record.is_none() && node.catch_up_registry().await {
        record = node.registry().tenant(&tenant_id);
    }
    let record = record.ok_or_else(|| ApiError::new(Problem::NotFound))?;
    Ok(json_response(
        200,
        serde_json::to_vec(&tenant_json(&record)).expect("json"),
    ))
}

pub async fn cluster(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let registry = node.registry();
    let metrics = registry.metrics();
    let voters: Vec<u64> = metrics.membership_config.membership().voter_ids().collect();
    let nodes: Vec<serde_json::Value> = registry
        .nodes()
        .into_iter()
        .map(|(id, info)| {
            serde_json::json!({
                "node_id": id,
                "region": info.region,
                "api_url": format!("http://{}", info.api_addr),
                "raft_addr": info.raft_addr,
                "voter": voters.contains(&id),
            })
        })
        .collect();
    let regions: Vec<serde_json::Value> = registry
        .regions()
        .into_iter()
        .map(|r| {
            let tenants = registry.read(|s| {
                s.tenants
                    .values()
                    .filter(|t| t.home_region == r.name)
                    .count()
            });
            serde_json::json!({ "name": r.name, "tenants": tenants })
        })
        .collect();
    let stats = node.store().stats();
    let body = serde_json::json!({
        "this_node": {
            "node_id": registry.id(),
            "region": node.region(),
        },
        "registry": {
            "leader": registry.leader(),
            "term": metrics.current_term,
            "applied_index": registry.applied_index(),
        },
        "regions": regions,
        "nodes": nodes,
        "tenants": registry.tenants().len(),
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
    if !is_local_scope(&headers) {
        // Every region keeps its own outbox: replay them all.
        let answers = fan_out(
            &node,
            reqwest::Method::POST,
            "/admin/v1/outbox/replay",
            bytes,
        )
        .await?;
        let replayed: u64 = answers.iter().filter_map(|a| a["replayed"].as_u64()).sum();
        return Ok(json_response(
            202,
            serde_json::to_vec(&serde_json::json!({ "replayed": replayed })).expect("json"),
        ));
    }
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
    if !is_local_scope(&headers) {
        // The ledger is per region store: gather every region's entries.
        let path = format!(
            "/admin/v1/inventory/reservations?order_id={}",
            urlencode(&order_id)
        );
        let answers = fan_out(&node, reqwest::Method::GET, &path, Default::default()).await?;
        let data: Vec<serde_json::Value> = answers
            .into_iter()
            .flat_map(|a| a["data"].as_array().cloned().unwrap_or_default())
            .collect();
        return Ok(json_response(
            200,
            serde_json::to_vec(&serde_json::json!({ "data": data })).expect("json"),
        ));
    }
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

/// Marks an admin request one node sends another to act on its own store only.
const KEYHOLD_SCOPE: &str = "keyhold-scope";

fn is_local_scope(headers: &HeaderMap) -> bool {
    headers
        .get(KEYHOLD_SCOPE)
        .is_some_and(|v| v.as_bytes() == b"local")
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Sends an admin request to every region's store node (this one included) with
/// `keyhold-scope: local`, and returns their JSON answers. Any region that does
/// not answer fails the whole call: a partial answer would read as complete.
async fn fan_out(
    node: &Node,
    method: reqwest::Method,
    path: &str,
    body: bytes::Bytes,
) -> Result<Vec<serde_json::Value>, ApiError> {
    let mut answers = Vec::new();
    for region in node.registry().regions() {
        let Some((_, target)) = node.store_node_of(&region.name) else {
            continue;
        };
        let mut request = node
            .http()
            .request(method.clone(), format!("http://{}{path}", target.api_addr))
            .bearer_auth(&node.config().admin_token)
            .header(KEYHOLD_SCOPE, "local")
            .timeout(std::time::Duration::from_millis(
                crate::limits::FORWARD_TIMEOUT_MS,
            ));
        if !body.is_empty() {
            request = request
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone());
        }
        let unreachable = |detail: String| ApiError::new(Problem::OwnerUnreachable).detail(detail);
        let response = request
            .send()
            .await
            .map_err(|e| unreachable(format!("region {} did not answer: {e}", region.name)))?;
        if !response.status().is_success() {
            return Err(unreachable(format!(
                "region {} answered {}",
                region.name,
                response.status()
            )));
        }
        let answer = response
            .json()
            .await
            .map_err(|e| unreachable(format!("region {}: {e}", region.name)))?;
        answers.push(answer);
    }
    Ok(answers)
}
