//! The node-to-node routes of a region failover (design: issue 12), open only
//! to callers holding the cluster's node credential. A failover of region `r`
//! to region `to` imports r's tenants from a standby copy (`node::StandbyCopy`,
//! kept by every node of `to`) into `to`'s own store.
//!
//! On any node holding a copy of r (the *source*):
//! - `GET /internal/v1/failover/{r}/copy`: where the copy stands
//!   (`last_log_term`, `last_log_index`, `applied_index`), the last lag it
//!   knew, and how long ago it last heard from r and last grew
//!   (`heard_ms_ago`, `grew_ms_ago`), for the driver to pick the most complete
//!   copy and bound what the failover loses;
//! - `POST /internal/v1/failover/{r}/promote`: makes the copy final
//!   (`Store::promote`) and answers `at`, the last index it applied, and
//!   `tail`, the leaders of the entries it applied without knowing them
//!   committed (`LogTail`: they tell r which of its entries the copy holds);
//! - `GET .../entries/{tenant}` and `GET .../events/{tenant}`: pages of one
//!   tenant's entries and of its unhandled outbox events, out of the promoted
//!   copy (promoting it first).
//!
//! The source acts only while its registry replica shows a failover from r
//! running (a promoted copy leaves r's group until it is reset, `copies.rs`).
//!
//! On `to`'s region leader: `POST /internal/v1/failover/{r}/import`, the
//! driver's step (a follower sends it on to the leader once). For every tenant the registry shows homed in r, it copies
//! the tenant's entries and unhandled events from the source's copy (read
//! directly when the source is this node) into this region's store, under the
//! guard `Importing { operation_id, epoch + 1 }`, the epoch the tenant gets
//! when the failover completes. The events wait there, held out of the
//! relays' sight: the failover may still fail, and then r keeps its tenants
//! and delivers them itself; they join the outbox when the store takes the
//! tenant over (`Node::ensure_owned`, once the registry shows the failover
//! done). Every step repeats safely: entries are
//! overwritten with the same values, events are imported once per event id,
//! so a retry or a new leader's run answers the same and adds nothing.

use super::internal::{
    entry_bytes, guard_answer, ok_json, page_from, page_response, split_by_bytes, tenant_param,
};
use super::query::StrictQuery;
use crate::limits::{MOVE_IMPORT_COMMAND_BYTES_MAX, MOVE_PAGE_BYTES_MAX};
use crate::node::{now, Node, StandbyCopy};
use crate::peers::{AtLeader, Call, CallKind, Patience, To};
use crate::problem::ApiError;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use keyhold_core::{Problem, TenantId};
use keyhold_registry::{NodeId, TenantRecord, TenantState};
use keyhold_store::{CarriedEvent, ExportEntry, LogTail, Store};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

pub fn router(node: Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/internal/v1/failover/{region}/copy", get(copy_position))
        .route("/internal/v1/failover/{region}/promote", post(promote))
        .route(
            "/internal/v1/failover/{region}/entries/{tenant_id}",
            get(entries_page),
        )
        .route(
            "/internal/v1/failover/{region}/events/{tenant_id}",
            get(events_page),
        )
        .route("/internal/v1/failover/{region}/import", post(import))
        .route_layer(axum::middleware::from_fn_with_state(
            node,
            super::require_node_credential,
        ))
}

/// This node's copy of `region`, or 404 `not-found`.
fn copy_of(node: &Node, region: &str) -> Result<StandbyCopy, ApiError> {
    node.standby_copy(region).ok_or_else(|| {
        ApiError::new(Problem::NotFound).detail(format!("this node holds no copy of {region}"))
    })
}

/// `GET /internal/v1/failover/{r}/copy`: where this node's copy of r stands.
async fn copy_position(
    State(node): State<Arc<Node>>,
    Path(region): Path<String>,
) -> Result<Response, ApiError> {
    let copy = copy_of(&node, &region)?;
    let lag = copy.lag.lock().expect("not poisoned").clone();
    let (last_log_term, last_log_index) = copy.store.last_log_position().await?;
    let (heard, grew) = copy.clock.ages(std::time::Instant::now());
    let ms = |age: Option<Duration>| age.map(|a| a.as_millis() as u64);
    Ok(ok_json(serde_json::json!({
        "node_id": node.config().node_id,
        "last_log_term": last_log_term,
        "last_log_index": last_log_index,
        "applied_index": copy.store.applied_index()?,
        "promoted": copy.store.promoted()?.is_some(),
        "heard_ms_ago": ms(heard),
        "grew_ms_ago": ms(grew),
        "lag": lag.map(|l| serde_json::json!({ "commands": l.commands, "seconds": l.seconds })),
    })))
}

/// 409 `conflict` unless this node's registry replica (after one bounded
/// catch-up) shows a failover from `region` running.
async fn require_running_failover(node: &Node, region: &str) -> Result<(), ApiError> {
    if crate::operations::failover_from(node.registry(), region).is_some() {
        return Ok(());
    }
    node.catch_up_registry().await;
    if crate::operations::failover_from(node.registry(), region).is_some() {
        return Ok(());
    }
    Err(ApiError::new(Problem::Conflict).detail(format!("no failover from {region} is running")))
}

/// The copy of `region`, promoted (the source's part of every failover call).
async fn promoted_copy(node: &Node, region: &str) -> Result<(Store, LogTail), ApiError> {
    let copy = copy_of(node, region)?;
    require_running_failover(node, region).await?;
    let tail = copy.store.promote().await?;
    Ok((copy.store, tail))
}

/// `POST /internal/v1/failover/{r}/promote`: this node's copy of r becomes
/// final; answers the last index it applied and its tail.
async fn promote(
    State(node): State<Arc<Node>>,
    Path(region): Path<String>,
) -> Result<Response, ApiError> {
    let (_, tail) = promoted_copy(&node, &region).await?;
    Ok(ok_json(
        serde_json::json!({ "at": tail.last, "tail": tail }),
    ))
}

#[derive(Deserialize)]
struct EntriesQuery {
    /// The key (hex) the previous page ended at.
    #[serde(default)]
    after: Option<String>,
}

/// `GET /internal/v1/failover/{r}/entries/{tenant}`: one page of the tenant's
/// entries in the promoted copy (as a move's `export` pages).
async fn entries_page(
    State(node): State<Arc<Node>>,
    Path((region, tenant_id)): Path<(String, String)>,
    StrictQuery(q): StrictQuery<EntriesQuery>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let after = super::internal::hex_cursor(q.after)?;
    let (store, _) = promoted_copy(&node, &region).await?;
    let (entries, next) = store
        .export_tenant(&tenant, after.as_deref(), MOVE_PAGE_BYTES_MAX)
        .await?;
    Ok(page_response(ExportEntry::encode_page(&entries), next))
}

#[derive(Deserialize)]
struct EventsQuery {
    #[serde(default)]
    after_seq: u64,
}

/// `GET /internal/v1/failover/{r}/events/{tenant}`: one page of the tenant's
/// events in the promoted copy that some consumer had not handled.
async fn events_page(
    State(node): State<Arc<Node>>,
    Path((region, tenant_id)): Path<(String, String)>,
    StrictQuery(q): StrictQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let (store, _) = promoted_copy(&node, &region).await?;
    let consumers = crate::downstream::consumers(&node);
    let (events, next) = store
        .unhandled_events(&tenant, &consumers, q.after_seq, MOVE_PAGE_BYTES_MAX)
        .await?;
    // The cursor travels as the bytes of its decimal form, like a key.
    let next = next.map(|seq| seq.to_string().into_bytes());
    Ok(page_response(CarriedEvent::encode_page(&events), next))
}

/// Where the failover reads the promoted copy: here, or on another node of
/// this region.
enum Source {
    Local(StandbyCopy),
    Remote(RemoteCopy),
}

/// The promoted copy on another node of this region, read over HTTP.
struct RemoteCopy {
    api_addr: String,
}

impl Source {
    fn of(node: &Node, region: &str, source: NodeId) -> Result<Source, ApiError> {
        if source == node.config().node_id {
            return Ok(Source::Local(copy_of(node, region)?));
        }
        let info = node.registry().nodes().remove(&source).ok_or_else(|| {
            ApiError::new(Problem::NotFound).detail(format!("no node {source} in the registry"))
        })?;
        Ok(Source::Remote(RemoteCopy {
            api_addr: info.api_addr,
        }))
    }

    /// Promotes the copy; its tail (`last`: the last log index it applied).
    async fn promote(&self, node: &Node, region: &str) -> Result<LogTail, ApiError> {
        match self {
            Source::Local(copy) => {
                require_running_failover(node, region).await?;
                Ok(copy.store.promote().await?)
            }
            Source::Remote(remote) => remote.promote(node, region).await,
        }
    }

    /// One page of `tenant`'s entries after `after`, and the next cursor.
    async fn entries(
        &self,
        node: &Node,
        region: &str,
        tenant: &TenantId,
        after: Option<Vec<u8>>,
    ) -> Result<(Vec<ExportEntry>, Option<Vec<u8>>), ApiError> {
        let remote = match self {
            Source::Local(copy) => {
                return Ok(copy
                    .store
                    .export_tenant(tenant, after.as_deref(), MOVE_PAGE_BYTES_MAX)
                    .await?)
            }
            Source::Remote(remote) => remote,
        };
        let query = after.map_or(String::new(), |a| format!("after={}", hex::encode(a)));
        let (body, next) = remote.page(node, region, "entries", tenant, &query).await?;
        let entries = ExportEntry::decode_page(&body).map_err(undecodable)?;
        Ok((entries, next))
    }

    /// One page of `tenant`'s unhandled events after `after_seq`, and the
    /// sequence number to continue after.
    async fn events(
        &self,
        node: &Node,
        region: &str,
        tenant: &TenantId,
        after_seq: u64,
    ) -> Result<(Vec<CarriedEvent>, Option<u64>), ApiError> {
        let remote = match self {
            Source::Local(copy) => {
                let consumers = crate::downstream::consumers(node);
                return Ok(copy
                    .store
                    .unhandled_events(tenant, &consumers, after_seq, MOVE_PAGE_BYTES_MAX)
                    .await?);
            }
            Source::Remote(remote) => remote,
        };
        let query = format!("after_seq={after_seq}");
        let (body, next) = remote.page(node, region, "events", tenant, &query).await?;
        let events = CarriedEvent::decode_page(&body).map_err(undecodable)?;
        let next = match next {
            None => None,
            Some(bytes) => Some(
                String::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(undecodable_cursor)?,
            ),
        };
        Ok((events, next))
    }
}

impl RemoteCopy {
    fn to(&self) -> To<'_> {
        To::Node(&self.api_addr)
    }

    /// Has the copy's node promote it; its tail.
    async fn promote(&self, node: &Node, region: &str) -> Result<LogTail, ApiError> {
        let call = Call::post(
            CallKind::CopyPage,
            format!("/internal/v1/failover/{region}/promote"),
        );
        let answer: Promoted = node
            .peers()
            .call_json(self.to(), &call)
            .await
            .map_err(|e| e.into_api(Problem::OwnerUnreachable))?;
        // A node of an earlier release answers its index alone.
        Ok(answer.tail.unwrap_or_else(|| LogTail::confirmed(answer.at)))
    }

    /// A page from the copy's `kind` route of `tenant`, and its next cursor
    /// (the `NEXT_CURSOR` header, hex).
    async fn page(
        &self,
        node: &Node,
        region: &str,
        kind: &str,
        tenant: &TenantId,
        query: &str,
    ) -> Result<(axum::body::Bytes, Option<Vec<u8>>), ApiError> {
        let path = format!(
            "/internal/v1/failover/{region}/{kind}/{}?{query}",
            tenant.as_str()
        );
        let call = Call::get(CallKind::CopyPage, path);
        let (body, next) = page_from(node, self.to(), &call).await?;
        Ok((body, next.and_then(|h| hex::decode(h).ok())))
    }
}

/// The answer of `POST /internal/v1/failover/{r}/promote`.
#[derive(Deserialize)]
struct Promoted {
    at: u64,
    #[serde(default)]
    tail: Option<LogTail>,
}

fn undecodable(e: keyhold_store::Error) -> ApiError {
    ApiError::new(Problem::OwnerUnreachable).detail(format!("undecodable page: {e}"))
}

fn undecodable_cursor() -> ApiError {
    ApiError::new(Problem::OwnerUnreachable).detail("undecodable event cursor")
}

#[derive(Deserialize)]
struct ImportQuery {
    operation_id: String,
    /// The node whose copy the driver chose.
    source: NodeId,
}

/// 409 `conflict` unless the local registry replica shows `operation_id` as a
/// running failover from `region` to this node's region.
fn check_import(node: &Node, region: &str, operation_id: &str) -> Result<(), ApiError> {
    let running =
        crate::operations::failover_running(node.registry(), operation_id, region, node.region());
    if running {
        return Ok(());
    }
    metrics::counter!("keyhold_failover_calls_refused_total").increment(1);
    Err(ApiError::new(Problem::Conflict).detail(format!(
        "operation {operation_id} is not a running failover from {region} to {}",
        node.region()
    )))
}

/// The tenants a failover from `region` takes over: homed there and not
/// deleted (a tenant moving away from it included: its move fails).
fn tenants_homed_in(node: &Node, region: &str) -> Vec<TenantRecord> {
    node.registry()
        .tenants()
        .into_iter()
        .filter(|t| t.home_region == region)
        .filter(|t| matches!(t.state, TenantState::Active | TenantState::Moving { .. }))
        .collect()
}

/// `POST /internal/v1/failover/{r}/import?operation_id=..&source=..` on this
/// region's leader: promotes the source's copy of r and imports every tenant
/// homed in r from it; answers `{"at", "tenants", "entries", "events"}`
/// (entries and events the copy holds for them, the same on a repeat).
async fn import(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    uri: Uri,
    Path(region): Path<String>,
    StrictQuery(q): StrictQuery<ImportQuery>,
) -> Result<Response, ApiError> {
    if !node.leads_region() {
        return Ok(import_at_leader(&node, &headers, &uri).await);
    }
    if check_import(&node, &region, &q.operation_id).is_err() {
        // The replica may not have applied `BeginFailover` yet.
        node.catch_up_registry().await;
        check_import(&node, &region, &q.operation_id)?;
    }
    let source = Source::of(&node, &region, q.source)?;
    let tail = source.promote(&node, &region).await?;
    let tenants = tenants_homed_in(&node, &region);
    let (mut entries, mut events) = (0u64, 0u64);
    for record in &tenants {
        check_import(&node, &region, &q.operation_id)?;
        let tenant = tenant_param(&record.tenant_id)?;
        let scope = Scope {
            operation_id: &q.operation_id,
            epoch: record.epoch + 1,
        };
        entries += import_entries(&node, &source, &region, &tenant, &scope).await?;
        events += import_events(&node, &source, &region, &tenant, &scope).await?;
    }
    metrics::counter!("keyhold_failover_imports_total").increment(1);
    tracing::info!(
        region,
        operation_id = %q.operation_id,
        at = tail.last,
        committed = tail.committed,
        tenants = tenants.len(),
        entries,
        events,
        "failover imported"
    );
    Ok(ok_json(serde_json::json!({
        "at": tail.last,
        "tail": tail,
        "tenants": tenants.len(),
        "entries": entries,
        "events": events,
    })))
}

/// On a node that does not lead its region: sends the import on to the
/// leader once (`Keyhold-Hop: region`, the same hop as `leader::at_region_leader`,
/// but as a `CallKind::FailoverImport`, which waits as long as an import may
/// take, where a tenant request's hop gives up after seconds, and trying only
/// the leader known now: the driver calls again) and relays its answer. A hop
/// that reaches a node that does not lead, or a region without a known leader,
/// is 503 with `Keyhold-Not-Leader`: nothing was imported, the driver tries
/// again.
async fn import_at_leader(node: &Node, headers: &HeaderMap, uri: &Uri) -> Response {
    if super::leader::Arrival::of(node, headers) == super::leader::Arrival::RegionHop {
        return super::leader::not_leader();
    }
    let call = Call::post(CallKind::FailoverImport, super::leader::path_of(uri));
    match super::leader::send_to_leader(node, &call, Patience::Once).await {
        AtLeader::Answered(answer) => super::leader::relay(answer, Problem::StoreUnavailable).await,
        // It led a moment ago (the import checks first): the driver's next
        // call finds it leading.
        AtLeader::Here | AtLeader::NoLeader => super::leader::not_leader(),
        AtLeader::Failed(e) => axum::response::IntoResponse::into_response(e),
    }
}

/// The failover and the guard epoch one tenant is imported under.
struct Scope<'a> {
    operation_id: &'a str,
    epoch: u64,
}

/// Copies every entry of `tenant` from the source's copy into this store, in
/// commands of at most `MOVE_IMPORT_COMMAND_BYTES_MAX` bytes (one empty
/// command for a tenant without entries: it still sets the guard). Returns
/// how many entries the copy held.
async fn import_entries(
    node: &Node,
    source: &Source,
    region: &str,
    tenant: &TenantId,
    scope: &Scope<'_>,
) -> Result<u64, ApiError> {
    let mut after = None;
    let mut count = 0u64;
    loop {
        let (page, next) = source.entries(node, region, tenant, after).await?;
        count += page.len() as u64;
        let mut runs = split_by_bytes(page, MOVE_IMPORT_COMMAND_BYTES_MAX, entry_bytes);
        if runs.is_empty() {
            runs.push(Vec::new());
        }
        for run in runs {
            let outcome = node
                .store()
                .import(
                    tenant.clone(),
                    scope.operation_id.to_owned(),
                    scope.epoch,
                    run,
                )
                .await?;
            guard_answer(outcome)?;
        }
        match next {
            Some(cursor) => after = Some(cursor),
            None => return Ok(count),
        }
    }
}

fn event_bytes(carried: &CarriedEvent) -> usize {
    carried.event.payload.len() + carried.event.event_id.len()
}

/// Carries `tenant`'s unhandled events from the source's copy into this
/// outbox (`Store::import_events`, once per event id). Returns how many the
/// copy offered.
async fn import_events(
    node: &Node,
    source: &Source,
    region: &str,
    tenant: &TenantId,
    scope: &Scope<'_>,
) -> Result<u64, ApiError> {
    let mut after = 0;
    let mut count = 0u64;
    loop {
        let (page, next) = source.events(node, region, tenant, after).await?;
        count += page.len() as u64;
        for run in split_by_bytes(page, MOVE_IMPORT_COMMAND_BYTES_MAX, event_bytes) {
            let outcome = node
                .store()
                .import_events(
                    tenant.clone(),
                    scope.operation_id.to_owned(),
                    scope.epoch,
                    run,
                    now(),
                )
                .await?;
            guard_answer(outcome)?;
        }
        match next {
            Some(seq) => after = seq,
            None => return Ok(count),
        }
    }
}
