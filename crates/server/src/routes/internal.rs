//! The node-to-node routes of a tenant move, open only to callers holding the
//! cluster's node credential (`require_node_credential`): fence on the old home,
//! export pages from it, import pages into the new home.
//!
//! Every call names the move's operation id and the tenant's epoch during the
//! move. A node acts only while its registry replica shows that very move
//! running (the tenant `moving` under that operation, at that epoch, from or to
//! this region): a late or replayed call for a move that ended is 409
//! `conflict` and changes nothing. The store checks the same scope again in its
//! apply thread (`Command::Fence` / `Command::Import` are refused once it owns
//! the tenant at a later epoch), so a call that passed this check just before
//! the registry moved on still cannot overwrite the new home.

use super::{json_response, read_body};
use crate::limits::{
    MOVE_DRAIN_POLL_MS, MOVE_DRAIN_WAIT_MS, MOVE_IMPORT_BODY_BYTES_MAX, MOVE_PAGE_BYTES_MAX,
    REGISTRY_READ_WAIT_MS,
};
use crate::node::Node;
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use keyhold_core::{Problem, TenantId};
use keyhold_registry::TenantState;
use keyhold_store::{Applied, Command, ExportEntry, GuardOutcome};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// On an export page: the cursor of the next page, absent on the last one.
pub const NEXT_CURSOR: HeaderName = HeaderName::from_static("keyhold-next-cursor");

/// Set in a node's environment, the process aborts right after its store fenced
/// a tenant for a move: the one way tests lose the old home mid-move.
const FAULT_ABORT_AFTER_FENCE: &str = "KEYHOLD_FAULT_ABORT_AFTER_FENCE";

pub fn router(node: Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/internal/v1/moves/{tenant_id}/fence", post(fence))
        .route("/internal/v1/moves/{tenant_id}/export", get(export))
        .route("/internal/v1/moves/{tenant_id}/import", post(import))
        .route_layer(axum::middleware::from_fn_with_state(
            node,
            super::require_node_credential,
        ))
}

/// Which move a call belongs to, and which driver makes it.
#[derive(Deserialize)]
struct MoveScope {
    operation_id: String,
    epoch: u64,
    /// The generation of the caller's driver lease: a driver that lost the
    /// lease is refused.
    generation: u64,
    /// The registry entry that granted that lease, for this replica to wait for.
    registry_index: u64,
}

/// Which end of the move this node must be.
#[derive(Clone, Copy)]
enum End {
    From,
    To,
}

fn tenant_param(tenant_id: &str) -> Result<TenantId, ApiError> {
    TenantId::parse(tenant_id).map_err(|_| ApiError::new(Problem::NotFound))
}

/// 409 `conflict` unless this node's registry replica, once it has applied the
/// entry that granted the caller's lease, shows the move `scope` of
/// `tenant_id` running under that lease, with this node's region at `end`.
async fn check_running(
    node: &Node,
    tenant_id: &str,
    scope: &MoveScope,
    end: End,
) -> Result<(), ApiError> {
    node.registry()
        .wait_applied(
            scope.registry_index,
            Duration::from_millis(REGISTRY_READ_WAIT_MS),
        )
        .await
        .map_err(|e| ApiError::new(Problem::StoreUnavailable).detail(e.to_string()))?;
    let not_running = |why: &str| {
        metrics::counter!("keyhold_move_calls_refused_total").increment(1);
        Err(ApiError::new(Problem::Conflict).detail(format!(
            "operation {} is not running here: {why}",
            scope.operation_id
        )))
    };
    let Some(record) = node.registry().tenant(tenant_id) else {
        return not_running("unknown tenant");
    };
    let TenantState::Moving { to, operation_id } = &record.state else {
        return not_running("the tenant is not moving");
    };
    if operation_id != &scope.operation_id || record.epoch != scope.epoch {
        return not_running("another operation or epoch");
    }
    let lease = node
        .registry()
        .read(|s| s.drivers.get(&scope.operation_id).copied());
    if lease.is_none_or(|l| l.generation != scope.generation) {
        return not_running("the caller does not hold the driver lease");
    }
    let here = node.region();
    let ok = match end {
        End::From => record.home_region == here,
        End::To => to == here,
    };
    if !ok {
        return not_running("this region is not that end of the move");
    }
    Ok(())
}

fn guard_answer(applied: Applied) -> Result<u64, ApiError> {
    match applied {
        Applied::Guard(GuardOutcome::Accepted { imported, .. }) => Ok(imported),
        Applied::Guard(GuardOutcome::Refused { current }) => {
            metrics::counter!("keyhold_move_calls_refused_total").increment(1);
            Err(ApiError::new(Problem::Conflict)
                .detail(format!("the store has moved on: {current:?}")))
        }
        other => {
            Err(ApiError::new(Problem::Internal)
                .detail(format!("a guard command answered {other:?}")))
        }
    }
}

/// On the old home: wait for the registry entry that granted the caller's
/// lease, fence the store for the move, let the relay deliver the tenant's events (so order states are
/// final before they travel), and report how many entries will travel.
async fn fence(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    Query(scope): Query<MoveScope>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    check_running(&node, &tenant_id, &scope, End::From).await?;
    let command = Command::Fence {
        tenant: tenant.clone(),
        operation_id: scope.operation_id,
        epoch: scope.epoch,
    };
    guard_answer(node.store().execute(command).await?)?;
    if std::env::var_os(FAULT_ABORT_AFTER_FENCE).is_some() {
        tracing::error!("{FAULT_ABORT_AFTER_FENCE} is set: aborting after the fence");
        std::process::abort();
    }
    let head = node.store().tenant_last_event_seq(&tenant)?;
    let deadline = Instant::now() + Duration::from_millis(MOVE_DRAIN_WAIT_MS);
    for consumer in crate::downstream::consumers(&node) {
        while node.store().cursor(&consumer).await? < head {
            if Instant::now() > deadline {
                return Err(ApiError::new(Problem::StoreUnavailable)
                    .detail(format!("consumer {consumer} did not catch up")));
            }
            tokio::time::sleep(Duration::from_millis(MOVE_DRAIN_POLL_MS)).await;
        }
    }
    let entries = node.store().tenant_entry_count(&tenant)?;
    Ok(json_response(
        200,
        serde_json::to_vec(&serde_json::json!({ "fenced": true, "entries": entries }))
            .expect("json"),
    ))
}

#[derive(Deserialize)]
struct ExportQuery {
    #[serde(default)]
    after: Option<String>,
    bytes_max: usize,
}

/// One page of the tenant's entries, at most `bytes_max` (capped by
/// `MOVE_PAGE_BYTES_MAX`) unless one entry alone is larger.
async fn export(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let after = match q.after {
        None => None,
        Some(h) => {
            Some(hex::decode(h).map_err(|_| ApiError::invalid("/after", "after must be hex"))?)
        }
    };
    let (entries, next) = node
        .store()
        .export_tenant(
            &tenant,
            after.as_deref(),
            q.bytes_max.clamp(1, MOVE_PAGE_BYTES_MAX),
        )
        .await?;
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        ExportEntry::encode_page(&entries),
    )
        .into_response();
    if let Some(next) = next {
        response.headers_mut().insert(
            NEXT_CURSOR,
            HeaderValue::from_str(&hex::encode(next)).expect("hex is header-safe"),
        );
    }
    Ok(response)
}

/// On the new home: write one exported page for the running move.
async fn import(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    Query(scope): Query<MoveScope>,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let bytes = read_body(&headers, body, MOVE_IMPORT_BODY_BYTES_MAX).await?;
    check_running(&node, &tenant_id, &scope, End::To).await?;
    let entries =
        ExportEntry::decode_page(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    let command = Command::Import {
        tenant,
        operation_id: scope.operation_id,
        epoch: scope.epoch,
        entries,
    };
    let imported = guard_answer(node.store().execute(command).await?)?;
    metrics::counter!("keyhold_move_pages_total").increment(1);
    metrics::counter!("keyhold_move_bytes_total").increment(bytes.len() as u64);
    Ok(json_response(
        200,
        serde_json::to_vec(&serde_json::json!({ "imported": imported })).expect("json"),
    ))
}
