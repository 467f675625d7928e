//! Planned tenant moves: the admin endpoints, the node-to-node endpoints that
//! fence, export and import one tenant, and the task that drives a move.
//!
//! A move is four steps, each safe to repeat:
//! 1. `BeginMove` in the registry: the tenant is `Moving`, so no node places
//!    requests for it any more (503 `tenant-moving`).
//! 2. The old home waits until its replica has applied that entry, then runs a
//!    `Fence` command through its apply loop: every command already queued for the
//!    tenant is applied before it and every later one is refused, so the tenant's
//!    data there can no longer change. It then lets its outbox relay deliver the
//!    tenant's events, so order states settle before they are copied.
//! 3. The tenant's records, markers and orders are copied page by page into the
//!    new home's store.
//! 4. `CompleteMove` in the registry: home is the new region, epoch + 1. `done` is
//!    reported by that same committed entry.
//!
//! A failure aborts the move (`AbortMove`: back to the old home, epoch + 1) and
//! lifts the old home's fence.

use super::{json_response, read_body};
use crate::limits::{MOVE_DRAIN_WAIT_MS, MOVE_PAGE_ENTRIES_MAX, REGISTRY_READ_WAIT_MS};
use crate::node::{now, Node};
use crate::problem::ApiError;
use crate::tenants::authenticate_admin;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use keyhold_core::{Problem, TenantId, UnixMillis};
use keyhold_registry::NODE_CREDENTIAL_HEADER;
use keyhold_registry::{
    Operation, OperationState, Rejection, Request, Response as RegistryResponse, TenantState,
};
use keyhold_store::{Applied, Command, ExportEntry};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bodies of the internal import endpoint: one page of entries.
const IMPORT_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;
/// One internal call between nodes during a move.
const MOVE_CALL_TIMEOUT_MS: u64 = 60_000;
/// While a long step runs, the driver reports this often that it is alive.
const MOVE_HEARTBEAT_MS: u64 = 15_000;
const _: () = assert!(MOVE_HEARTBEAT_MS < MOVE_STALL_MS);
const NEXT_CURSOR: &str = "keyhold-next-cursor";
/// Pages copied between two progress reports.
const PROGRESS_EVERY_PAGES: u64 = 10;

/// An operation whose driver has not reported for this long is taken over by
/// the registry leader's node (the driver may have died with its node).
pub const MOVE_STALL_MS: u64 = 60_000;
/// How often the leader's node looks for stalled moves.
pub const MOVE_WATCH_INTERVAL_MS: u64 = 10_000;
const _: () = assert!(MOVE_WATCH_INTERVAL_MS < MOVE_STALL_MS);

/// On the registry leader's node: re-drives moves whose driver went silent.
/// Every step of a move is safe to repeat, so a second driver racing a slow first
/// one is harmless (imports overwrite, `CompleteMove` answers a replay alike).
pub async fn resume_stalled(node: Arc<Node>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut resumed: std::collections::HashMap<String, Instant> = Default::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(MOVE_WATCH_INTERVAL_MS)) => {}
            _ = stop.changed() => return,
        }
        let registry = node.registry();
        if registry.leader() != Some(registry.id()) {
            continue;
        }
        let at = now().0;
        let stalled: Vec<Operation> = registry.read(|s| {
            s.operations
                .values()
                .filter(|op| !op.state.is_terminal())
                .filter(|op| at.saturating_sub(op.updated_at_ms) > MOVE_STALL_MS)
                .cloned()
                .collect()
        });
        for op in stalled {
            let recent = resumed
                .get(&op.operation_id)
                .is_some_and(|t| t.elapsed() < Duration::from_millis(MOVE_STALL_MS));
            if recent {
                continue;
            }
            tracing::warn!(operation = %op.operation_id, tenant = %op.tenant_id, "resuming a stalled move");
            metrics::counter!("keyhold_moves_resumed_total").increment(1);
            resumed.insert(op.operation_id.clone(), Instant::now());
            tokio::spawn(drive(
                node.clone(),
                op.tenant_id,
                op.from,
                op.to,
                op.operation_id,
                registry.applied_index(),
            ));
        }
    }
}

/// The node-to-node routes, open only to callers holding the node credential.
pub fn internal_router(node: Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/internal/v1/moves/{tenant_id}/fence", post(fence))
        .route("/internal/v1/moves/{tenant_id}/export", get(export))
        .route("/internal/v1/moves/{tenant_id}/import", post(import))
        .route("/internal/v1/moves/{tenant_id}/unfence", post(unfence))
        .route_layer(axum::middleware::from_fn_with_state(
            node,
            super::require_node_credential,
        ))
}

fn operation_json(op: &Operation) -> serde_json::Value {
    serde_json::json!({
        "operation_id": op.operation_id,
        "kind": op.kind.as_str(),
        "state": op.state.as_str(),
        "progress": op.progress,
        "error": op.error,
        "tenant_id": op.tenant_id,
        "from": op.from,
        "to": op.to,
        "updated_at": UnixMillis(op.updated_at_ms).to_rfc3339(),
    })
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
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let (bytes, _) = super::json_body(&node, &headers, body).await?;
    let req: MoveRequest =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    let Some(tenant) = node.registry().tenant(&tenant_id) else {
        return Err(ApiError::new(Problem::NotFound));
    };
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
    match &written.response {
        RegistryResponse::MoveUpdated { .. } => {}
        RegistryResponse::Rejected { reason } => {
            return Err(match reason {
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
    }
    metrics::counter!("keyhold_moves_started_total").increment(1);
    tokio::spawn(drive(
        node.clone(),
        tenant_id,
        tenant.home_region,
        req.to,
        operation_id.clone(),
        written.log_index,
    ));
    // The entry is applied on the leader; wait for this replica too, so that the
    // Location below answers at once on this node (as tenant creation does). The
    // move is under way either way, so a slow replica does not fail the request.
    let applied = node
        .registry()
        .wait_applied(
            written.log_index,
            Duration::from_millis(REGISTRY_READ_WAIT_MS),
        )
        .await;
    if let Err(e) = applied {
        tracing::warn!(operation_id, error = %e, "move started; this replica lags behind");
    }
    let mut response = json_response(
        202,
        serde_json::to_vec(&serde_json::json!({ "operation_id": operation_id })).expect("json"),
    );
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/admin/v1/operations/{operation_id}")).expect("safe id"),
    );
    Ok(response)
}

/// `GET /admin/v1/operations/{id}`.
pub async fn get_operation(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(operation_id): Path<String>,
) -> Result<Response, ApiError> {
    authenticate_admin(&headers, node.admin_token_sha256())?;
    let mut op = node.registry().operation(&operation_id);
    if op.is_none() && node.catch_up_registry().await {
        op = node.registry().operation(&operation_id);
    }
    let op = op.ok_or_else(|| ApiError::new(Problem::NotFound))?;
    Ok(json_response(
        200,
        serde_json::to_vec(&operation_json(&op)).expect("json"),
    ))
}

/// Drives one move to `done`, or aborts it.
pub(crate) async fn drive(
    node: Arc<Node>,
    tenant_id: String,
    from: String,
    to: String,
    operation_id: String,
    begin_index: u64,
) {
    let started = Instant::now();
    let result = copy(&node, &tenant_id, &from, &to, &operation_id, begin_index).await;
    let registry = node.registry();
    match result {
        Ok(()) => {
            let request = Request::CompleteMove {
                tenant_id: tenant_id.clone(),
                operation_id: operation_id.clone(),
                now_ms: now().0,
            };
            match registry.write(request).await {
                Ok(_) => {
                    metrics::histogram!("keyhold_move_duration_seconds")
                        .record(started.elapsed().as_secs_f64());
                    tracing::info!(tenant = %tenant_id, from, to, "tenant moved");
                }
                Err(e) => {
                    tracing::error!(tenant = %tenant_id, error = %e, "move copied but not completed; the operation stays running")
                }
            }
        }
        Err(error) => {
            tracing::error!(tenant = %tenant_id, from, to, error, "tenant move failed; aborting");
            metrics::counter!("keyhold_moves_failed_total").increment(1);
            let request = Request::AbortMove {
                tenant_id: tenant_id.clone(),
                operation_id,
                error,
                now_ms: now().0,
            };
            if let Err(e) = registry.write(request).await {
                tracing::error!(tenant = %tenant_id, error = %e, "abort not recorded");
            }
            if let Some((_, old)) = node.store_node_of(&from) {
                let url = format!(
                    "http://{}/internal/v1/moves/{tenant_id}/unfence",
                    old.api_addr
                );
                let lifted = internal(&node, node.http().post(url)).await;
                if let Err(e) = lifted {
                    tracing::error!(tenant = %tenant_id, error = e, "old home's fence not lifted");
                }
            }
        }
    }
}

async fn internal(
    node: &Node,
    builder: reqwest::RequestBuilder,
) -> Result<reqwest::Response, String> {
    internal_within(node, builder, MOVE_CALL_TIMEOUT_MS).await
}

async fn internal_within(
    node: &Node,
    builder: reqwest::RequestBuilder,
    timeout_ms: u64,
) -> Result<reqwest::Response, String> {
    let response = builder
        .header(NODE_CREDENTIAL_HEADER, node.credentials().current())
        .timeout(Duration::from_millis(timeout_ms))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status().is_success() {
        Ok(response)
    } else {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(format!("{status}: {text}"))
    }
}

async fn progress(node: &Node, operation_id: &str, fraction: f64) {
    let request = Request::UpdateOperation {
        operation_id: operation_id.to_owned(),
        state: OperationState::Running,
        progress: fraction.clamp(0.0, 0.99),
        error: None,
        now_ms: now().0,
    };
    if let Err(e) = node.registry().write(request).await {
        tracing::warn!(operation_id, error = %e, "progress not recorded");
    }
}

async fn copy(
    node: &Node,
    tenant_id: &str,
    from: &str,
    to: &str,
    operation_id: &str,
    begin_index: u64,
) -> Result<(), String> {
    progress(node, operation_id, 0.0).await;
    let (_, old) = node
        .store_node_of(from)
        .ok_or(format!("no node of region {from}"))?;
    let (_, new) = node
        .store_node_of(to)
        .ok_or(format!("no node of region {to}"))?;
    let fence_url = format!(
        "http://{}/internal/v1/moves/{tenant_id}/fence?registry_index={begin_index}",
        old.api_addr
    );
    // Fencing includes letting the old home's relay deliver the tenant's events.
    let fence_timeout_ms = MOVE_DRAIN_WAIT_MS + MOVE_CALL_TIMEOUT_MS;
    let fence = internal_within(node, node.http().post(fence_url), fence_timeout_ms);
    let fenced: serde_json::Value = alive_while(node, operation_id, fence)
        .await?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let estimate = fenced["entries"].as_u64().unwrap_or(0).max(1) as f64;
    let mut cursor: Option<String> = None;
    let mut copied = 0u64;
    let mut pages = 0u64;
    loop {
        let mut url = format!(
            "http://{}/internal/v1/moves/{tenant_id}/export?max={MOVE_PAGE_ENTRIES_MAX}",
            old.api_addr
        );
        if let Some(c) = &cursor {
            url.push_str("&after=");
            url.push_str(c);
        }
        let page = internal(node, node.http().get(url)).await?;
        let next = page
            .headers()
            .get(NEXT_CURSOR)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = page.bytes().await.map_err(|e| e.to_string())?;
        let entries: Vec<ExportEntry> = decode(&bytes)?;
        copied += entries.len() as u64;
        let import_url = format!(
            "http://{}/internal/v1/moves/{tenant_id}/import",
            new.api_addr
        );
        internal(node, node.http().post(import_url).body(bytes.to_vec())).await?;
        pages += 1;
        // A registry write per page would cost a Raft round trip each; report
        // every few pages.
        if pages.is_multiple_of(PROGRESS_EVERY_PAGES) {
            progress(node, operation_id, copied as f64 / estimate).await;
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    tracing::info!(tenant = %tenant_id, copied, "tenant data copied");
    Ok(())
}

/// Runs `step`, reporting progress 0 every `MOVE_HEARTBEAT_MS` meanwhile, so the
/// leader's watchdog knows this driver is alive.
async fn alive_while<T>(
    node: &Node,
    operation_id: &str,
    step: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(step);
    loop {
        tokio::select! {
            out = &mut step => return out,
            _ = tokio::time::sleep(Duration::from_millis(MOVE_HEARTBEAT_MS)) => {
                progress(node, operation_id, 0.0).await;
            }
        }
    }
}

fn encode(entries: &[ExportEntry]) -> Vec<u8> {
    bincode::serde::encode_to_vec(entries, bincode::config::standard()).expect("entries encode")
}

fn decode(bytes: &[u8]) -> Result<Vec<ExportEntry>, String> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| format!("undecodable page: {e}"))
}

fn tenant_param(tenant_id: &str) -> Result<TenantId, ApiError> {
    TenantId::parse(tenant_id).map_err(|_| ApiError::new(Problem::NotFound))
}

#[derive(Deserialize)]
struct FenceQuery {
    registry_index: u64,
}

/// On the old home: wait for the registry entry that fenced the tenant, fence the
/// store, let the relay deliver, and report how many entries will travel.
async fn fence(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    Query(q): Query<FenceQuery>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    node.registry()
        .wait_applied(
            q.registry_index,
            Duration::from_millis(REGISTRY_READ_WAIT_MS),
        )
        .await
        .map_err(|e| ApiError::new(Problem::StoreUnavailable).detail(e.to_string()))?;
    let moving = node
        .registry()
        .tenant(&tenant_id)
        .is_some_and(|t| matches!(t.state, TenantState::Moving { .. }));
    if !moving {
        return Err(ApiError::new(Problem::Conflict).detail("the tenant is not moving"));
    }
    match node
        .store()
        .execute(Command::Fence {
            tenant: tenant.clone(),
        })
        .await?
    {
        Applied::Fenced => {}
        other => unreachable!("fence answered {other:?}"),
    }
    // Let the relay deliver what the tenant's orders caused, so their states are
    // final before they are copied.
    // Only this tenant's events matter; the rest of the outbox may lag.
    let head = node.store().tenant_last_event_seq(&tenant)?;
    let deadline = Instant::now() + Duration::from_millis(MOVE_DRAIN_WAIT_MS);
    for consumer in crate::downstream::consumers(&node) {
        while node.store().cursor(&consumer).await? < head {
            if Instant::now() > deadline {
                return Err(ApiError::new(Problem::StoreUnavailable)
                    .detail(format!("consumer {consumer} did not catch up")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
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
    max: usize,
}

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
    let (entries, next) = node.store().export_tenant(
        &tenant,
        after.as_deref(),
        q.max.clamp(1, MOVE_PAGE_ENTRIES_MAX),
    )?;
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        encode(&entries),
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

async fn import(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let bytes = read_body(&headers, body, IMPORT_BODY_BYTES_MAX).await?;
    let entries = decode(&bytes).map_err(|e| ApiError::invalid("", e))?;
    let imported = match node
        .store()
        .execute(Command::Import { tenant, entries })
        .await?
    {
        Applied::Imported { entries } => entries,
        other => unreachable!("import answered {other:?}"),
    };
    Ok(json_response(
        200,
        serde_json::to_vec(&serde_json::json!({ "imported": imported })).expect("json"),
    ))
}

async fn unfence(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let command = Command::Import {
        tenant,
        entries: Vec::new(),
    };
    node.store().execute(command).await?;
    Ok(json_response(200, br#"{"fenced":false}"#.to_vec()))
}
