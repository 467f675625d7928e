//! The admin endpoints of planned tenant moves: start one
//! (`POST /admin/v1/tenants/{id}/move`) and follow it
//! (`GET /admin/v1/operations/{id}`). The move itself is driven by
//! `crate::mover`; the node-to-node calls it makes are in `routes::internal`.

use super::json_response;
use crate::limits::REGISTRY_READ_WAIT_MS;
use crate::mover::MoveJob;
use crate::node::{now, Node};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use keyhold_core::{Problem, UnixMillis};
use keyhold_registry::{
    FailoverResult, Operation, OperationKind, Rejection, Request, Response as RegistryResponse,
};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// An operation as the admin API shows it; a done failover carries its
/// `result` (contract section 10), a move names its tenant.
fn operation_json(op: &Operation, failover: Option<&FailoverResult>) -> serde_json::Value {
    let mut json = serde_json::json!({
        "operation_id": op.operation_id,
        "kind": op.kind.as_str(),
        "state": op.state.as_str(),
        "progress": op.progress,
        "error": op.error,
        "tenant_id": op.tenant_id,
        "from": op.from,
        "to": op.to,
        "updated_at": UnixMillis(op.updated_at_ms).to_rfc3339(),
    });
    if op.kind == OperationKind::Failover {
        json["tenant_id"] = serde_json::Value::Null;
        json["result"] = match failover {
            Some(result) => serde_json::json!({
                "from": op.from,
                "to": op.to,
                "at": result.at,
                "estimated_lost": {
                    "commands": result.estimated_lost.commands,
                    "seconds": result.estimated_lost.seconds,
                },
                "tenants": result.tenants.len(),
            }),
            None => serde_json::Value::Null,
        };
    }
    json
}

/// `operation_json` of `op`, with its failover result from this replica.
fn operation_view(node: &Node, op: &Operation) -> serde_json::Value {
    node.registry()
        .read(|s| operation_json(op, s.failover_result(&op.operation_id)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveRequest {
    to: String,
}

/// `POST /admin/v1/tenants/{id}/move {"to"}` → 202 with the operation to poll.
pub async fn start_move(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let (bytes, _) = super::json_body(&node, &headers, body).await?;
    let req: MoveRequest =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    // No check against this node's registry replica first: right after a restart
    // it may not have applied the tenant's creation yet, and the registry leader
    // decides anyway (an unknown tenant is refused there, answered 404 below).
    let operation_id = format!("op_{}", uuid::Uuid::now_v7().simple());
    let request = Request::BeginMove {
        tenant_id: tenant_id.clone(),
        to: req.to.clone(),
        operation_id: operation_id.clone(),
        now_ms: now().0,
    };
    let written =
        node.registry().write(request).await.map_err(|e| {
            ApiError::new(Problem::StoreUnavailable).detail(format!("registry: {e}"))
        })?;
    let (epoch, from) = match written.response {
        RegistryResponse::MoveUpdated { record, operation } => (record.epoch, operation.from),
        RegistryResponse::Rejected { reason } => {
            return Err(match reason {
                Rejection::UnknownTenant { .. } => ApiError::new(Problem::NotFound),
                Rejection::UnknownRegion { .. }
                | Rejection::AlreadyHome { .. }
                | Rejection::Invalid { .. } => ApiError::invalid("/to", reason.to_string()),
                Rejection::TenantMoving { .. } => {
                    ApiError::new(Problem::Conflict).detail(reason.to_string())
                }
                _ => ApiError::new(Problem::Conflict).detail(reason.to_string()),
            })
        }
        other => {
            return Err(ApiError::new(Problem::StoreUnavailable)
                .detail(format!("registry answered {other:?}")))
        }
    };
    metrics::counter!("keyhold_moves_started_total").increment(1);
    let job = MoveJob {
        tenant_id,
        from,
        to: req.to,
        operation_id: operation_id.clone(),
        epoch,
        begin_index: written.log_index,
    };
    node.drivers.start(node.clone(), job);
    Ok(accepted(&node, written.log_index, &operation_id).await)
}

/// 202 `{"operation_id"}` with its `Location`, once this replica applied the
/// entry at `log_index` that opened the operation (or waited
/// `REGISTRY_READ_WAIT_MS` for it). The entry is applied on the leader; waiting
/// for this replica too makes the Location answer at once on this node (as
/// tenant creation does). The operation is under way either way, so a slow
/// replica does not fail the request.
pub async fn accepted(node: &Node, log_index: u64, operation_id: &str) -> Response {
    let applied = node
        .registry()
        .wait_applied(log_index, Duration::from_millis(REGISTRY_READ_WAIT_MS))
        .await;
    if let Err(e) = applied {
        tracing::warn!(operation_id, error = %e, "operation started; this replica lags behind");
    }
    let mut response = json_response(
        202,
        serde_json::to_vec(&serde_json::json!({ "operation_id": operation_id })).expect("json"),
    );
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/admin/v1/operations/{operation_id}")).expect("safe id"),
    );
    response
}

/// `GET /admin/v1/operations/{id}`.
pub async fn get_operation(
    State(node): State<Arc<Node>>,
    Path(operation_id): Path<String>,
) -> Result<Response, ApiError> {
    let mut op = node.registry().operation(&operation_id);
    if op.is_none() && node.catch_up_registry().await {
        op = node.registry().operation(&operation_id);
    }
    let op = op.ok_or_else(|| ApiError::new(Problem::NotFound))?;
    Ok(json_response(
        200,
        serde_json::to_vec(&operation_view(&node, &op)).expect("json"),
    ))
}

/// `GET /admin/v1/operations`: every operation the registry knows, the most
/// recently updated first; at most `ADMIN_LIST_ITEMS_MAX` (`truncated` says
/// when more exist). The live cluster page polls it.
pub async fn list_operations(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
    let mut ops: Vec<Operation> = node
        .registry()
        .read(|s| s.operations.values().cloned().collect());
    ops.sort_by_key(|op| std::cmp::Reverse(op.updated_at_ms));
    let max = crate::limits::ADMIN_LIST_ITEMS_MAX;
    let data: Vec<serde_json::Value> = ops
        .iter()
        .take(max)
        .map(|op| operation_view(&node, op))
        .collect();
    let body = serde_json::json!({ "data": data, "truncated": ops.len() > max });
    Ok(json_response(200, serde_json::to_vec(&body).expect("json")))
}
