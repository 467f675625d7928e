//! The admin API (bearer admin token): tenants (creation, token rotation, limits,
//! deletion) and the cluster view. Lifecycle changes are registry writes, so they
//! act the same through any node; the registry's rejection decides the answer.

use super::query::StrictQuery;
use super::{json_body, json_response};
use crate::node::{CreateTenantError, Node};
use crate::peers::{Call, CallKind, Failure, To};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use keyhold_core::UnixMillis;
use keyhold_core::{Problem, TenantId};
use keyhold_registry::{
    Rejection, Request, Response as RegistryResponse, Survival, TenantRecord, TenantState,
};
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
    /// `"zone"` (the default) or `"region"`; read as any JSON value so that
    /// another one is refused with its pointer.
    #[serde(default)]
    survival: Option<serde_json::Value>,
}

/// The `survival` of a create body: absent is `zone`.
fn survival_field(value: Option<&serde_json::Value>) -> Result<Survival, ApiError> {
    let Some(value) = value else {
        return Ok(Survival::Zone);
    };
    value
        .as_str()
        .and_then(Survival::parse)
        .ok_or_else(|| ApiError::invalid("/survival", "survival must be \"zone\" or \"region\""))
}

fn tenant_json(record: &TenantRecord, survival: Survival) -> serde_json::Value {
    let (state, moving_to, operation_id) = match &record.state {
        TenantState::Active => ("active", None, None),
        TenantState::Moving { to, operation_id } => ("moving", Some(to), Some(operation_id)),
        TenantState::Deleted { .. } => ("deleted", None, None),
    };
    let mut body = serde_json::json!({
        "tenant_id": record.tenant_id,
        "home_region": record.home_region,
        "epoch": record.epoch,
        "state": state,
        "moving_to": moving_to,
        "operation_id": operation_id,
        "created_at": UnixMillis(record.created_at_ms).to_rfc3339(),
        "requests_per_second": record.requests_per_second,
        "new_keys_per_second": record.new_keys_per_second,
        "survival": survival.as_str(),
        "previous_token_valid_until": record
            .previous_token
            .as_ref()
            .map(|p| UnixMillis(p.valid_until_ms).to_rfc3339()),
    });
    if let TenantState::Deleted {
        deleted_at_ms,
        erased_in,
    } = &record.state
    {
        body["deleted_at"] = UnixMillis(*deleted_at_ms).to_rfc3339().into();
        body["erased_in"] = erased_in.clone().into();
    }
    body
}

/// A deleted tenant's JSON plus whether every region has erased its data.
fn tenant_view(node: &Node, record: &TenantRecord) -> serde_json::Value {
    let survival = node.registry().read(|s| s.survival_of(&record.tenant_id));
    let mut body = tenant_json(record, survival);
    if let TenantState::Deleted { erased_in, .. } = &record.state {
        let done = node
            .registry()
            .regions()
            .iter()
            .all(|r| erased_in.contains(&r.name));
        body["erasure"] = if done { "done" } else { "pending" }.into();
    }
    body
}

/// 200 with the tenant as [`tenant_view`] shows it.
fn tenant_response(node: &Node, record: &TenantRecord) -> Response {
    json_response(
        200,
        serde_json::to_vec(&tenant_view(node, record)).expect("json"),
    )
}

/// The answer to a lifecycle write the registry refused.
fn lifecycle_rejection(tenant_id: &str, reason: &Rejection) -> ApiError {
    match reason {
        Rejection::UnknownTenant { .. } => {
            ApiError::new(Problem::NotFound).detail(format!("no tenant {tenant_id}"))
        }
        Rejection::TenantDeleted { .. } => {
            ApiError::new(Problem::Conflict).detail(format!("tenant {tenant_id} was deleted"))
        }
        Rejection::TenantMoving { operation_id, .. } => {
            ApiError::new(Problem::Conflict).detail(format!(
                "tenant {tenant_id} is being moved (operation {operation_id}); try after it ends"
            ))
        }
        other => ApiError::invalid("", other.to_string()),
    }
}

/// Writes a lifecycle request and answers with the tenant after it.
async fn lifecycle_write(
    node: &Node,
    tenant_id: &str,
    request: Request,
) -> Result<TenantRecord, ApiError> {
    let written = node
        .registry()
        .write(request)
        .await
        .map_err(registry_unavailable)?;
    match written.response {
        RegistryResponse::TenantUpdated { record } => {
            // This node answers from its own replica next: let it catch up.
            let _ = node
                .registry()
                .wait_applied(
                    written.log_index,
                    std::time::Duration::from_millis(crate::limits::REGISTRY_READ_WAIT_MS),
                )
                .await;
            node.refresh_tenants();
            Ok(record)
        }
        RegistryResponse::Rejected { reason } => Err(lifecycle_rejection(tenant_id, &reason)),
        other => {
            Err(ApiError::new(Problem::StoreUnavailable)
                .detail(format!("registry answered {other:?}")))
        }
    }
}

/// A request body that may be empty (then `T::default()`), else strict JSON.
async fn optional_json<T: serde::de::DeserializeOwned + Default>(
    node: &Node,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = super::read_body(headers, body, node.config().body_bytes_max).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    super::require_json(headers)?;
    super::parse_json(&bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RotateToken {
    #[serde(default)]
    grace_seconds: Option<u64>,
}

/// `POST /admin/v1/tenants/{id}/token`: a new token, shown once; the old one
/// stays valid for `grace_seconds` (default one day) so clients can switch.
pub async fn rotate_token(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let req: RotateToken = optional_json(&node, &headers, body).await?;
    let grace_seconds = req
        .grace_seconds
        .unwrap_or(crate::limits::TOKEN_GRACE_SECONDS_DEFAULT);
    if grace_seconds > crate::limits::TOKEN_GRACE_SECONDS_MAX {
        return Err(ApiError::invalid(
            "/grace_seconds",
            format!(
                "must be 0 to {} (seven days)",
                crate::limits::TOKEN_GRACE_SECONDS_MAX
            ),
        ));
    }
    let token = crate::tenants::new_token();
    let until = crate::node::now().plus_ms(grace_seconds * 1000);
    let request = Request::RotateToken {
        tenant_id: tenant_id.clone(),
        token_sha256: hex::encode(crate::tenants::sha256(&token)),
        previous_valid_until_ms: until.0,
    };
    let record = lifecycle_write(&node, &tenant_id, request).await?;
    let mut body = tenant_view(&node, &record);
    body["token"] = token.into();
    Ok(json_response(200, serde_json::to_vec(&body).expect("json")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SetLimits {
    #[serde(default)]
    requests_per_second: Option<serde_json::Value>,
    #[serde(default)]
    new_keys_per_second: Option<serde_json::Value>,
}

/// One rate of a limits body: an integer from 1 to the maximum, or absent.
fn rate_field(value: Option<&serde_json::Value>, pointer: &str) -> Result<Option<u32>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let max = crate::limits::TENANT_RATE_PER_SECOND_MAX;
    match value.as_u64() {
        Some(n) if (1..=u64::from(max)).contains(&n) => Ok(Some(n as u32)),
        _ => Err(ApiError::invalid(
            pointer,
            format!("must be an integer from 1 to {max}"),
        )),
    }
}

/// `PUT /admin/v1/tenants/{id}/limits`: changes either rate or both; every node
/// applies it as soon as its replica has the change.
pub async fn set_limits(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let (bytes, _) = json_body(&node, &headers, body).await?;
    let req: SetLimits =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    let requests = rate_field(req.requests_per_second.as_ref(), "/requests_per_second")?;
    let new_keys = rate_field(req.new_keys_per_second.as_ref(), "/new_keys_per_second")?;
    if requests.is_none() && new_keys.is_none() {
        return Err(ApiError::invalid(
            "",
            "give requests_per_second, new_keys_per_second or both",
        ));
    }
    // The unchanged rate comes from the freshest replica view; the write is
    // refused if the tenant is unknown or deleted whatever this view says.
    let _ = node.catch_up_registry().await;
    let current = node.registry().tenant(&tenant_id);
    let (old_requests, old_new_keys) = current
        .as_ref()
        .map_or((1, 1), |t| (t.requests_per_second, t.new_keys_per_second));
    let request = Request::SetLimits {
        tenant_id: tenant_id.clone(),
        requests_per_second: requests.unwrap_or(old_requests),
        new_keys_per_second: new_keys.unwrap_or(old_new_keys),
    };
    let record = lifecycle_write(&node, &tenant_id, request).await?;
    Ok(tenant_response(&node, &record))
}

/// `DELETE /admin/v1/tenants/{id}`: the tenant's tokens stop working at once
/// everywhere and every region's store erases its data in the background
/// (`erasure` turns `done`); the id is never given out again.
pub async fn delete_tenant(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
) -> Result<Response, ApiError> {
    let request = Request::DeleteTenant {
        tenant_id: tenant_id.clone(),
        now_ms: crate::node::now().0,
    };
    let record = lifecycle_write(&node, &tenant_id, request).await?;
    Ok(tenant_response(&node, &record))
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
    let survival = survival_field(req.survival.as_ref())?;
    // Region survival needs a standby to wait for: without one, every write
    // would answer 503, so the tenant is refused instead.
    if survival == Survival::Region && !node.config().standbys.contains_key(&req.home_region) {
        return Err(ApiError::new(Problem::Conflict).detail(format!(
            "\"survival\": \"region\" needs a standby for home region {:?}, which has none",
            req.home_region
        )));
    }
    let (record, token) = node
        .create_tenant(id, &req.home_region, requests, new_keys, survival)
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
    let mut body = tenant_json(&record, survival);
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
    Path(tenant_id): Path<String>,
) -> Result<Response, ApiError> {
    let mut record = node.registry().tenant(&tenant_id);
    if record.is_none() && node.catch_up_registry().await {
        record = node.registry().tenant(&tenant_id);
    }
    let record = record.ok_or_else(|| ApiError::new(Problem::NotFound))?;
    Ok(tenant_response(&node, &record))
}

/// `GET /admin/v1/tenants`: the tenants this node's replica knows, deleted ones
/// included, in id order; at most `ADMIN_LIST_ITEMS_MAX` (`truncated` says
/// when more exist). The live cluster page polls it.
pub async fn list_tenants(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
    let tenants = node.registry().tenants();
    let max = crate::limits::ADMIN_LIST_ITEMS_MAX;
    let data: Vec<serde_json::Value> = tenants
        .iter()
        .take(max)
        .map(|t| tenant_view(&node, t))
        .collect();
    let body = serde_json::json!({ "data": data, "truncated": tenants.len() > max });
    Ok(json_response(200, serde_json::to_vec(&body).expect("json")))
}

pub async fn cluster(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
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
    let mut regions: Vec<serde_json::Value> = Vec::new();
    for r in registry.regions() {
        let tenants = registry.read(|s| {
            s.tenants
                .values()
                .filter(|t| t.home_region == r.name && !t.is_deleted())
                .count()
        });
        // The standby and its lag as the region's leader reports them; `null`
        // when the region cannot say (unreachable, or no standby copy streamed
        // to yet).
        let standby = node.config().standbys.get(&r.name).cloned();
        let lag = match standby {
            None => serde_json::Value::Null,
            Some(_) => crate::standby::lag_of_region(&node, &r.name)
                .await
                .and_then(|v| v.get("lag").cloned())
                .filter(|lag| !lag.is_null())
                .map_or(serde_json::Value::Null, |lag| {
                    serde_json::json!({"commands": lag["commands"], "seconds": lag["seconds"]})
                }),
        };
        let standby_state = registry.read(|s| s.standby_state(&r.name));
        regions.push(serde_json::json!({
            "name": r.name,
            "tenants": tenants,
            "standby": standby,
            "standby_state": standby.as_ref().map(|_| standby_state.as_str()),
            "replication_lag": lag,
        }));
    }
    let stats = node.store().stats();
    let region_metrics = node.store().group().raft().metrics().borrow().clone();
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
            // This node's view of its region group: who leads, and whether
            // this node may execute (`leads`: it leads and has applied its term).
            "group": keyhold_store::raft::group_name(node.region()),
            "leader": region_metrics.current_leader,
            "term": region_metrics.current_term,
            "leads": node.leads_region(),
            // The region lease: this node executes only while it holds it
            // (contact with the registry's majority within REGION_LEASE_MS).
            "lease": {
                "held": node.lease().holds(),
                "contact_age_ms": node.lease().age().map(|a| a.as_millis() as u64),
                "lease_ms": crate::limits::REGION_LEASE_MS,
            },
            "voters": region_metrics
                .membership_config
                .membership()
                .voter_ids()
                .collect::<Vec<_>>(),
            "applied_index": region_metrics.last_applied.map_or(0, |l| l.index),
            "snapshot_index": region_metrics.snapshot.map(|l| l.index),
            "purged_index": region_metrics.purged.map(|l| l.index),
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
            let consumers = crate::downstream::consumers(&node);
            node.store()
                .replay_outbox(from_seq, consumers)
                .await?
                .events
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
    StrictQuery(query): StrictQuery<ReservationsQuery>,
) -> Result<Response, ApiError> {
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
pub(crate) const KEYHOLD_SCOPE: &str = "keyhold-scope";

pub(crate) fn is_local_scope(headers: &HeaderMap) -> bool {
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

/// Sends an admin request to a node of every region (this one's included) with
/// `keyhold-scope: local`, and returns their JSON answers. Any region that does
/// not answer fails the whole call: a partial answer would read as complete.
async fn fan_out(
    node: &Node,
    method: reqwest::Method,
    path: &str,
    body: bytes::Bytes,
) -> Result<Vec<serde_json::Value>, ApiError> {
    let mut call = Call::new(method, CallKind::Admin, path)
        .with_admin_token(&node.config().admin_token)
        .header(KEYHOLD_SCOPE, HeaderValue::from_static("local"));
    if !body.is_empty() {
        call = call
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .body(body);
    }
    let mut answers = Vec::new();
    for region in node.registry().regions() {
        // Any node of the region: one that is not its store's leader sends the
        // call on to it.
        match node
            .peers()
            .call_json(To::Region(&region.name), &call)
            .await
        {
            Ok(answer) => answers.push(answer),
            // A region without nodes has no part to give.
            Err(e) if matches!(e.failure, Failure::NoNode) => {}
            // Any other failure, a refusal included, is this call's: a partial
            // answer would read as complete.
            Err(e) => return Err(ApiError::new(Problem::OwnerUnreachable).detail(e.to_string())),
        }
    }
    Ok(answers)
}
