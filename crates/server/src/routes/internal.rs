//! The node-to-node routes of a tenant move, open only to callers holding the
//! cluster's node credential (`require_node_credential`). On the old home:
//! `track` (its store starts the tenant's change index while it keeps serving
//! it), `fence`, and two read-only page sources, `export` (the tenant's
//! entries) and `changes` (what changed since `track`). On the new home:
//! `pull`, by which the new home copies pages straight from the old home (one
//! inter-region hop per page, not two through the driver), and `import` of
//! one page.
//!
//! Every call names the move's operation id and the tenant's epoch during the
//! move. A node acts only while its registry replica shows that very move
//! running (the tenant `moving` under that operation, at that epoch, from or to
//! this region): a late or replayed call for a move that ended is 409
//! `conflict` and changes nothing. The store checks the same scope again in its
//! state machine (`Command::Fence` / `Command::Import` are refused once it owns
//! the tenant at a later epoch), so a call that passed this check just before
//! the registry moved on still cannot overwrite the new home.

use super::query::StrictQuery;
use super::{json_response, read_body};
use crate::limits::{
    MOVE_COPY_BYTES_PER_SECOND, MOVE_DRAIN_POLL_MS, MOVE_DRAIN_WAIT_MS, MOVE_IMPORT_BODY_BYTES_MAX,
    MOVE_IMPORT_COMMANDS_IN_FLIGHT, MOVE_IMPORT_COMMAND_BYTES_MAX,
    MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX, MOVE_PAGE_BYTES_MAX, MOVE_PULL_BUDGET_MS,
    MOVE_PULL_PAGES_MAX, REGISTRY_READ_WAIT_MS,
};
use crate::node::Node;
use crate::peers::{Call, CallKind, PeerError, To};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use keyhold_core::{Problem, TenantId};
use keyhold_store::{ChangePage, ExportEntry, GuardOutcome};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// On an export page: the cursor of the next page, absent on the last one.
pub const NEXT_CURSOR: HeaderName = HeaderName::from_static("keyhold-next-cursor");

/// Set in a node's environment, the process aborts right after its store fenced
/// a tenant for a move: the one way tests lose the old home mid-move.
const FAULT_ABORT_AFTER_FENCE: &str = "KEYHOLD_FAULT_ABORT_AFTER_FENCE";

#[derive(Deserialize)]
struct ProberQuery {
    /// The prober's region.
    #[serde(default)]
    region: Option<String>,
}

/// `GET /internal/v1/registry/quorum-age?region=R`: on the registry's leader,
/// how long ago a quorum last acknowledged it; elsewhere 503 with
/// `Keyhold-Not-Leader`; 409 `conflict` while R is fenced by a failover.
async fn quorum_age(
    State(node): State<Arc<Node>>,
    StrictQuery(q): StrictQuery<ProberQuery>,
) -> Response {
    use crate::lease::NoContact;
    match crate::lease::quorum_age(&node, q.region.as_deref()) {
        Ok(age) => json_response(200, serde_json::to_vec(&age).expect("json")),
        Err(NoContact::NotLeader) => super::leader::not_leader(),
        Err(NoContact::Fenced { operation_id }) => ApiError::new(Problem::Conflict)
            .detail(format!(
                "this region is being failed over (operation {operation_id})"
            ))
            .into_response(),
    }
}

#[derive(Deserialize)]
struct FencedQuery {
    /// The region a failover fences.
    region: String,
}

/// `GET /internal/v1/registry/lease-end?region=R`: on the registry's leader,
/// at most how much longer a lease of R, which a running failover fences, may
/// hold; elsewhere 503 with `Keyhold-Not-Leader`; 409 `conflict` while R is
/// not fenced (by this replica) or its lease is bounded only from the fence.
async fn lease_end(
    State(node): State<Arc<Node>>,
    StrictQuery(q): StrictQuery<FencedQuery>,
) -> Response {
    use crate::lease::NoLeaseEnd;
    match crate::lease::lease_end(&node, &q.region).await {
        Ok(end) => json_response(200, serde_json::to_vec(&end).expect("json")),
        Err(NoLeaseEnd::NotLeader) => super::leader::not_leader(),
        Err(NoLeaseEnd::NotFenced) => ApiError::new(Problem::Conflict)
            .detail(format!("no failover of region {} runs", q.region))
            .into_response(),
        Err(NoLeaseEnd::Unknown) => ApiError::new(Problem::Conflict)
            .detail("a node of an earlier release renews its lease here: no bound is known")
            .into_response(),
    }
}

#[derive(Deserialize)]
struct HeardQuery {
    /// The asking registry leader's term.
    before_term: u64,
}

/// `GET /internal/v1/registry/heard?before_term=T`, on any registry voter: how
/// long ago it last handled an AppendEntries of a leader before term T, or
/// proved a contact as one (`lease::heard_before`).
async fn heard(State(node): State<Arc<Node>>, StrictQuery(q): StrictQuery<HeardQuery>) -> Response {
    let at = crate::lease::heard_before(&node, q.before_term);
    let heard = crate::lease::Heard {
        ms_ago: u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    json_response(200, serde_json::to_vec(&heard).expect("json"))
}

/// `GET /internal/v1/standby/lag` (on the region store's leader): this region's
/// standby and its lag.
async fn standby_lag(State(node): State<Arc<Node>>) -> Response {
    let lag = crate::standby::lag(&node);
    json_response(200, serde_json::to_vec(&lag).expect("json"))
}

pub fn router(node: Arc<Node>) -> Router<Arc<Node>> {
    // Membership changes: the registry's on its leader (the handler checks), the
    // region group's on the region's leader (the layer sends it there).
    let registry_membership = Router::new()
        .route(
            "/internal/v1/membership/registry",
            post(super::members::registry_change),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            super::require_node_credential,
        ));
    let region_membership = Router::new()
        .route(
            "/internal/v1/membership/region",
            post(super::members::region_change),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (node.clone(), crate::limits::BODY_BYTES_MAX_DEFAULT),
            super::leader::at_region_leader,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            super::require_node_credential,
        ));
    // The registry leader's quorum age, for the other nodes' region leases.
    let quorum = Router::new()
        .route("/internal/v1/registry/quorum-age", get(quorum_age))
        .route("/internal/v1/registry/lease-end", get(lease_end))
        .route("/internal/v1/registry/heard", get(heard))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            super::require_node_credential,
        ));
    // Every move call acts on this region's store: on its leader. Inside the
    // credential check, so only a cluster node is sent on. (A route layer covers
    // every route of its router, so each group of routes has its own router.)
    let moves = Router::new()
        .route("/internal/v1/moves/{tenant_id}/track", post(track))
        .route("/internal/v1/moves/{tenant_id}/fence", post(fence))
        .route("/internal/v1/moves/{tenant_id}/export", get(export))
        .route("/internal/v1/moves/{tenant_id}/changes", get(changes))
        .route("/internal/v1/moves/{tenant_id}/pull", post(pull))
        .route("/internal/v1/moves/{tenant_id}/import", post(import))
        .route_layer(axum::middleware::from_fn_with_state(
            (node.clone(), MOVE_IMPORT_BODY_BYTES_MAX),
            super::leader::at_region_leader,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            super::require_node_credential,
        ));
    // A region's standby lag, as its store's leader knows it.
    let standby = Router::new()
        .route("/internal/v1/standby/lag", get(standby_lag))
        .route_layer(axum::middleware::from_fn_with_state(
            (node.clone(), crate::limits::BODY_BYTES_MAX_DEFAULT),
            super::leader::at_region_leader,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            super::require_node_credential,
        ));
    // The reconciling region's question to a tenant's new home: on its leader.
    let reconcile = Router::new()
        .route(
            "/internal/v1/reconcile/{tenant_id}/markers",
            post(super::reconcile::markers),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            (node.clone(), crate::limits::RECONCILE_MARKER_BODY_BYTES_MAX),
            super::leader::at_region_leader,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            node,
            super::require_node_credential,
        ));
    Router::new()
        .merge(reconcile)
        .merge(standby)
        .merge(quorum)
        .merge(registry_membership)
        .merge(region_membership)
        .merge(moves)
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

pub(super) fn tenant_param(tenant_id: &str) -> Result<TenantId, ApiError> {
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
    let Some(moving) = crate::operations::move_of(node.registry(), tenant_id) else {
        return not_running("the tenant is unknown or not moving");
    };
    if moving.operation_id != scope.operation_id || moving.epoch != scope.epoch {
        return not_running("another operation or epoch");
    }
    if moving.driver_generation != Some(scope.generation) {
        return not_running("the caller does not hold the driver lease");
    }
    let here = node.region();
    let ok = match end {
        End::From => moving.from == here,
        End::To => moving.to == here,
    };
    if !ok {
        return not_running("this region is not that end of the move");
    }
    Ok(())
}

pub(super) fn guard_answer(outcome: GuardOutcome) -> Result<u64, ApiError> {
    match outcome {
        GuardOutcome::Accepted { imported, .. } => Ok(imported),
        GuardOutcome::Refused { current } => {
            metrics::counter!("keyhold_move_calls_refused_total").increment(1);
            Err(ApiError::new(Problem::Conflict)
                .detail(format!("the store has moved on: {current:?}")))
        }
        GuardOutcome::Superseded { generation } => {
            metrics::counter!("keyhold_move_calls_refused_total").increment(1);
            Err(ApiError::new(Problem::Conflict).detail(format!(
                "a driver of generation {generation} imports this move now"
            )))
        }
    }
}

/// On the old home: start the tenant's change index for the move (the store
/// keeps executing for the tenant), and report how many entries the first
/// pass will carry and the `mark`: the index of the log entry that (re)started
/// tracking, after which every change of the tenant is stamped higher. A
/// driver tracks again before the online catch-up, so that the fenced pass
/// carries only what changed since that mark.
async fn track(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    StrictQuery(scope): StrictQuery<MoveScope>,
) -> Result<Response, ApiError> {
    let (tenant, mark) = at_old_home(&node, &tenant_id, scope, OldHomeStep::Track).await?;
    let entries = node.store().tenant_entry_count(&tenant)?;
    Ok(ok_json(
        serde_json::json!({ "tracking": true, "entries": entries, "mark": mark }),
    ))
}

/// The old home's steps of a move that set where its store stands.
#[derive(Clone, Copy)]
enum OldHomeStep {
    Track,
    Fence,
}

/// Checks the call as `check_running` does for the old home, then applies the
/// store command of `step` for the move's scope; with the index of the log
/// entry that carried a `Track` (its mark).
async fn at_old_home(
    node: &Node,
    tenant_id: &str,
    scope: MoveScope,
    step: OldHomeStep,
) -> Result<(TenantId, Option<u64>), ApiError> {
    let tenant = tenant_param(tenant_id)?;
    check_running(node, tenant_id, &scope, End::From).await?;
    let (operation_id, epoch) = (scope.operation_id, scope.epoch);
    let store = node.store();
    let (outcome, mark) = match step {
        OldHomeStep::Track => {
            let logged = store
                .track_changes(tenant.clone(), operation_id, epoch)
                .await?;
            (logged.value, Some(logged.index))
        }
        OldHomeStep::Fence => (
            store.fence(tenant.clone(), operation_id, epoch).await?,
            None,
        ),
    };
    guard_answer(outcome)?;
    Ok((tenant, mark))
}

/// 409 `conflict` while this region still holds stale data of the tenant from
/// before a failover away from it (`reconcile::import_blocked`): an import now
/// would be erased, or mixed with it.
fn refuse_unreconciled(node: &Node, tenant_id: &str) -> Result<(), ApiError> {
    match crate::reconcile::import_blocked(node, tenant_id) {
        Some(reason) => Err(ApiError::new(Problem::Conflict).detail(reason)),
        None => Ok(()),
    }
}

pub(super) fn ok_json(value: serde_json::Value) -> Response {
    json_response(200, serde_json::to_vec(&value).expect("json"))
}

/// On the old home: wait for the registry entry that granted the caller's
/// lease, fence the store for the move, and let the relay deliver the tenant's
/// events (so order states are final before the last changes travel).
async fn fence(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    StrictQuery(scope): StrictQuery<MoveScope>,
) -> Result<Response, ApiError> {
    let (tenant, _) = at_old_home(&node, &tenant_id, scope, OldHomeStep::Fence).await?;
    if std::env::var_os(FAULT_ABORT_AFTER_FENCE).is_some() {
        tracing::error!("{FAULT_ABORT_AFTER_FENCE} is set: aborting after the fence");
        std::process::abort();
    }
    let head = node.store().tenant_last_event_seq(&tenant)?;
    let deadline = Instant::now() + Duration::from_millis(MOVE_DRAIN_WAIT_MS);
    for consumer in crate::downstream::consumers(&node) {
        while node.store().cursor(consumer).await? < head {
            if Instant::now() > deadline {
                return Err(ApiError::new(Problem::StoreUnavailable)
                    .detail(format!("consumer {consumer} did not catch up")));
            }
            tokio::time::sleep(Duration::from_millis(MOVE_DRAIN_POLL_MS)).await;
        }
    }
    Ok(ok_json(serde_json::json!({ "fenced": true })))
}

#[derive(Deserialize)]
struct ExportQuery {
    #[serde(default)]
    after: Option<String>,
    bytes_max: usize,
    /// For the change passes: only keys changed by log entries above this
    /// index (a `track` mark); 0, every change since tracking began.
    #[serde(default)]
    since: u64,
}

impl ExportQuery {
    /// The cursor, and the page size capped by `MOVE_PAGE_BYTES_MAX`.
    fn parse(self) -> Result<(Option<Vec<u8>>, usize), ApiError> {
        let after = hex_cursor(self.after)?;
        Ok((after, self.bytes_max.clamp(1, MOVE_PAGE_BYTES_MAX)))
    }
}

/// A page cursor as it travels in a query (`after`, hex), decoded.
pub(super) fn hex_cursor(after: Option<String>) -> Result<Option<Vec<u8>>, ApiError> {
    after
        .map(|h| hex::decode(h).map_err(|_| ApiError::invalid("/after", "after must be hex")))
        .transpose()
}

/// A page's wire form, with the cursor of the next page when there is one.
pub(super) fn page_response(body: Vec<u8>, next: Option<Vec<u8>>) -> Response {
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        body,
    )
        .into_response();
    if let Some(next) = next {
        response.headers_mut().insert(
            NEXT_CURSOR,
            HeaderValue::from_str(&hex::encode(next)).expect("hex is header-safe"),
        );
    }
    response
}

/// Which of the old home's sources a page comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `export`: the tenant's entries.
    Entries,
    /// `changes`: what changed in the tenant since its move began tracking
    /// it, or since a mark (entries as they are now, and keys deleted).
    Changes,
}

/// One page of `source` on the old home. At most `bytes_max` (capped by
/// `MOVE_PAGE_BYTES_MAX`) unless one entry alone is larger.
async fn source_page(
    node: Arc<Node>,
    tenant_id: String,
    q: ExportQuery,
    source: Source,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let since = q.since;
    let (after, bytes_max) = q.parse()?;
    let store = node.store();
    Ok(match source {
        Source::Entries => {
            let (entries, next) = store
                .export_tenant(&tenant, after.as_deref(), bytes_max)
                .await?;
            page_response(ExportEntry::encode_page(&entries), next)
        }
        Source::Changes => {
            let (page, next) = store
                .export_changes(&tenant, after.as_deref(), bytes_max, since)
                .await?;
            page_response(page.encode(), next)
        }
    })
}

async fn export(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    StrictQuery(q): StrictQuery<ExportQuery>,
) -> Result<Response, ApiError> {
    source_page(node, tenant_id, q, Source::Entries).await
}

async fn changes(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    StrictQuery(q): StrictQuery<ExportQuery>,
) -> Result<Response, ApiError> {
    source_page(node, tenant_id, q, Source::Changes).await
}

/// Which pass of a move a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// The tenant's entries, read while the old home still serves it.
    Full,
    /// What changed since the first pass began, read while the old home
    /// still serves the tenant: so that the fenced pass carries only what
    /// changed during this one.
    Catchup,
    /// What changed since the catch-up began (its `since` mark), read under
    /// the fence.
    Changes,
}

impl Pass {
    pub fn as_str(self) -> &'static str {
        match self {
            Pass::Full => "full",
            Pass::Catchup => "catchup",
            Pass::Changes => "changes",
        }
    }

    /// The old home's source of this pass's pages.
    fn source(self) -> Source {
        match self {
            Pass::Full => Source::Entries,
            Pass::Catchup | Pass::Changes => Source::Changes,
        }
    }

    /// The pace of this pass's imports: the online passes run while the
    /// tenant is served and share the new home's apply thread with its own
    /// tenants; the final pass runs under the fence, where every second is a
    /// second of 503 `tenant-moving`.
    fn bytes_per_second(self) -> Option<u64> {
        match self {
            Pass::Full | Pass::Catchup => Some(MOVE_COPY_BYTES_PER_SECOND),
            Pass::Changes => None,
        }
    }

    /// The bytes of one import command of this pass: small while the new
    /// home's own tenants share each entry with it, large under the fence.
    fn command_bytes_max(self) -> usize {
        match self {
            Pass::Full | Pass::Catchup => MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX,
            Pass::Changes => MOVE_IMPORT_COMMAND_BYTES_MAX,
        }
    }
}

/// Splits `items` into runs of at most `bytes_max` bytes by `size`, in order;
/// a run holds at least one item, however large.
pub(super) fn split_by_bytes<T>(
    items: Vec<T>,
    bytes_max: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let n = size(&item);
        match runs.last_mut() {
            Some(run) if bytes + n <= bytes_max => {
                bytes += n;
                run.push(item);
            }
            _ => {
                bytes = n;
                runs.push(vec![item]);
            }
        }
    }
    runs
}

pub(super) fn entry_bytes(entry: &ExportEntry) -> usize {
    entry.key.len() + entry.payload.len()
}

/// One page of `pass` as the pages of import commands of at most
/// `MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX` bytes each in the online passes and
/// `MOVE_IMPORT_COMMAND_BYTES_MAX` in the fenced one, with their sizes. An
/// empty page is one empty command: it still sets the tenant's guard for the
/// move.
fn import_commands(pass: Pass, bytes: &[u8]) -> Result<Vec<(ChangePage, usize)>, ApiError> {
    let undecodable = |e: keyhold_store::Error| ApiError::invalid("", e.to_string());
    let max = pass.command_bytes_max();
    let mut commands = Vec::new();
    match pass.source() {
        Source::Entries => {
            let entries = ExportEntry::decode_page(bytes).map_err(undecodable)?;
            for entries in split_by_bytes(entries, max, entry_bytes) {
                let size = entries.iter().map(entry_bytes).sum();
                let removed = Vec::new();
                commands.push((ChangePage { entries, removed }, size));
            }
        }
        Source::Changes => {
            let page = ChangePage::decode(bytes).map_err(undecodable)?;
            for entries in split_by_bytes(page.entries, max, entry_bytes) {
                let size = entries.iter().map(entry_bytes).sum();
                let removed = Vec::new();
                commands.push((ChangePage { entries, removed }, size));
            }
            for removed in split_by_bytes(page.removed, max, Vec::len) {
                let size = removed.iter().map(Vec::len).sum();
                let entries = Vec::new();
                commands.push((ChangePage { entries, removed }, size));
            }
        }
    }
    if commands.is_empty() {
        commands.push((ChangePage::default(), 0));
    }
    Ok(commands)
}

/// How long an import that has written `imported_bytes` since it started
/// `elapsed` ago waits before its next command, to stay at `bytes_per_second`.
fn pace_wait(imported_bytes: u64, elapsed: Duration, bytes_per_second: u64) -> Duration {
    let due = Duration::from_secs_f64(imported_bytes as f64 / bytes_per_second.max(1) as f64);
    due.saturating_sub(elapsed)
}

/// The pacing of one pull call's imports (`None`: as fast as the store goes).
struct Pacer {
    bytes_per_second: Option<u64>,
    started: Instant,
    queued_bytes: u64,
}

impl Pacer {
    fn new(bytes_per_second: Option<u64>) -> Pacer {
        Pacer {
            bytes_per_second,
            started: Instant::now(),
            queued_bytes: 0,
        }
    }

    /// Queues a command of `size` bytes after those queued so far: when it
    /// is due (when the bytes before it are, at the pace; `None`: at once).
    fn queue(&mut self, size: usize) -> Option<Instant> {
        let due = self
            .bytes_per_second
            .map(|rate| self.started + pace_wait(self.queued_bytes, Duration::ZERO, rate));
        self.queued_bytes += size as u64;
        due
    }
}

/// Writes one page of `pass` for the running move `scope` into this store, in
/// commands of at most `MOVE_IMPORT_COMMAND_BYTES_MAX` bytes, each queued
/// among the other tenants' commands, up to `MOVE_IMPORT_COMMANDS_IN_FLIGHT`
/// of them at once (a page's commands hold different keys, so their order
/// does not matter; the page is durable before the next), paced by `pacer`.
async fn import_page(
    node: &Node,
    tenant: &TenantId,
    scope: &MoveScope,
    pass: Pass,
    bytes: &[u8],
    pacer: &mut Pacer,
) -> Result<u64, ApiError> {
    let commands = import_commands(pass, bytes)?
        .into_iter()
        .map(|(page, size)| {
            let due = pacer.queue(size);
            let (store, operation_id) = (node.store(), scope.operation_id.clone());
            let (epoch, generation) = (scope.epoch, scope.generation);
            async move {
                if let Some(due) = due {
                    tokio::time::sleep_until(due.into()).await;
                }
                // The generation goes with every command: the registry check
                // before the page may be stale by the time it applies.
                let outcome = store
                    .import_page(tenant.clone(), operation_id, epoch, generation, page)
                    .await?;
                Ok::<_, ApiError>(outcome)
            }
        });
    let mut done = futures::stream::iter(commands).buffered(MOVE_IMPORT_COMMANDS_IN_FLIGHT);
    let mut imported = 0;
    while let Some(result) = done.next().await {
        imported += guard_answer(result?)?;
        metrics::counter!("keyhold_move_import_commands_total").increment(1);
    }
    metrics::counter!("keyhold_move_pages_total").increment(1);
    metrics::counter!("keyhold_move_bytes_total").increment(bytes.len() as u64);
    Ok(imported)
}

#[derive(Deserialize)]
struct PullQuery {
    pass: Pass,
    #[serde(default)]
    after: Option<String>,
    /// For the change passes: the old home's `track` mark to copy the changes
    /// after (0: every change since tracking began).
    #[serde(default)]
    since: u64,
}

/// One page of `pass` from the tenant's old home (by this node's registry
/// replica), starting after `after`: its body and the next page's cursor.
async fn fetch_page(
    node: &Node,
    tenant_id: &str,
    pass: Pass,
    since: u64,
    after: Option<&str>,
) -> Result<(axum::body::Bytes, Option<String>), ApiError> {
    let record = node
        .registry()
        .tenant(tenant_id)
        .ok_or_else(|| ApiError::new(Problem::NotFound))?;
    let route = match pass.source() {
        Source::Entries => "export",
        Source::Changes => "changes",
    };
    let mut path = format!(
        "/internal/v1/moves/{tenant_id}/{route}?bytes_max={MOVE_PAGE_BYTES_MAX}&since={since}"
    );
    if let Some(a) = after {
        path.push_str("&after=");
        path.push_str(a);
    }
    // Any node of the old home: one that does not lead its store sends the
    // call on to the leader.
    let old_home = To::Region(&record.home_region);
    page_from(node, old_home, &Call::get(CallKind::MoveStep, path)).await
}

/// The calling side of `page_response`: one page from another node, and its
/// next cursor as sent (`NEXT_CURSOR`, hex). A failure is 503
/// `owner-unreachable`, or the other node's own problem.
pub(super) async fn page_from(
    node: &Node,
    to: To<'_>,
    call: &Call,
) -> Result<(axum::body::Bytes, Option<String>), ApiError> {
    let failed = |e: PeerError| e.into_api(Problem::OwnerUnreachable);
    let response = node.peers().call(to, call).await.map_err(failed)?;
    let next = response
        .headers()
        .get(NEXT_CURSOR)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = node.peers().bytes(to, response).await.map_err(failed)?;
    Ok((body, next))
}

/// On the new home: copy pages of `pass` straight from the old home, starting
/// after `after`, until the pass is done, `MOVE_PULL_PAGES_MAX` pages were
/// copied or `MOVE_PULL_BUDGET_MS` passed; answers what it copied and the
/// cursor to continue from (`null` when the pass is done). The driver calls
/// it again until then, renewing its lease in between. Before each page is
/// imported the move must still run under the caller's lease, so a
/// superseded driver's pull stops. The next page is fetched while one is
/// imported; the first pass imports at `MOVE_COPY_BYTES_PER_SECOND`, the
/// final pass (under the fence) as fast as the store goes.
async fn pull(
    State(node): State<Arc<Node>>,
    Path(tenant_id): Path<String>,
    StrictQuery(scope): StrictQuery<MoveScope>,
    StrictQuery(q): StrictQuery<PullQuery>,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let started = Instant::now();
    let mut pacer = Pacer::new(q.pass.bytes_per_second());
    let (mut copied, mut pages, mut bytes) = (0u64, 0u64, 0u64);
    check_running(&node, &tenant_id, &scope, End::To).await?;
    refuse_unreconciled(&node, &tenant_id)?;
    let mut page = fetch_page(&node, &tenant_id, q.pass, q.since, q.after.as_deref()).await?;
    let after = loop {
        let (body, next) = page;
        check_running(&node, &tenant_id, &scope, End::To).await?;
        pages += 1;
        let spent = started.elapsed() >= Duration::from_millis(MOVE_PULL_BUDGET_MS);
        let more = next
            .as_deref()
            .filter(|_| pages < MOVE_PULL_PAGES_MAX && !spent);
        let prefetch = async {
            match more {
                Some(cursor) => {
                    Some(fetch_page(&node, &tenant_id, q.pass, q.since, Some(cursor)).await)
                }
                None => None,
            }
        };
        let imported = import_page(&node, &tenant, &scope, q.pass, &body, &mut pacer);
        let (imported, prefetched) = tokio::join!(imported, prefetch);
        copied += imported?;
        bytes += body.len() as u64;
        match prefetched {
            Some(fetched) => page = fetched?,
            None => break next,
        }
    };
    let answer = serde_json::json!({
        "copied": copied, "pages": pages, "bytes": bytes, "next": after,
    });
    Ok(ok_json(answer))
}

/// On the new home: write one exported page for the running move.
async fn import(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    StrictQuery(scope): StrictQuery<MoveScope>,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = tenant_param(&tenant_id)?;
    let bytes = read_body(&headers, body, MOVE_IMPORT_BODY_BYTES_MAX).await?;
    check_running(&node, &tenant_id, &scope, End::To).await?;
    refuse_unreconciled(&node, &tenant_id)?;
    let mut unpaced = Pacer::new(None);
    let imported = import_page(&node, &tenant, &scope, Pass::Full, &bytes, &mut unpaced).await?;
    Ok(ok_json(serde_json::json!({ "imported": imported })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8, bytes: usize) -> ExportEntry {
        ExportEntry {
            key: vec![n],
            payload: vec![n; bytes - 1],
        }
    }

    #[test]
    fn runs_are_bounded_by_bytes_keep_order_and_hold_an_oversized_item_alone() {
        let sizes = [40, 50, 20, 200, 10, 90, 5];
        let items: Vec<usize> = sizes.to_vec();
        let runs = split_by_bytes(items, 100, |n| *n);
        assert_eq!(
            runs,
            vec![vec![40, 50], vec![20], vec![200], vec![10, 90], vec![5]]
        );
        assert!(split_by_bytes(Vec::<usize>::new(), 100, |n| *n).is_empty());
    }

    /// A 4 MiB page of the first pass becomes commands of at most
    /// `MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX` bytes that carry every entry
    /// once, in order.
    #[test]
    fn a_page_is_imported_in_commands_bounded_by_bytes() {
        let entries: Vec<ExportEntry> = (0..=255u8).map(|n| entry(n, 16 * 1024)).collect();
        let page = ExportEntry::encode_page(&entries);
        let commands = import_commands(Pass::Full, &page).unwrap();
        assert_eq!(
            commands.len(),
            256 * 16 * 1024 / MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX
        );
        let mut carried = Vec::new();
        for (command, size) in commands {
            assert!(size <= MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX);
            assert!(command.removed.is_empty(), "{command:?}");
            let entries = command.entries;
            assert_eq!(size, entries.iter().map(entry_bytes).sum::<usize>());
            carried.extend(entries);
        }
        assert_eq!(carried, entries);
    }

    /// A change page's entries and removed keys both travel, and an empty
    /// page is still one command (it sets the tenant's guard).
    #[test]
    fn a_change_page_keeps_its_removals_and_an_empty_page_is_one_command() {
        let page = ChangePage {
            entries: vec![entry(1, 100 * 1024), entry(2, 100 * 1024)],
            removed: vec![b"rt1\0a".to_vec(), b"rt1\0b".to_vec()],
        };
        let commands = import_commands(Pass::Changes, &page.encode()).unwrap();
        let mut carried = ChangePage::default();
        for (page, _) in &commands {
            carried.entries.extend(page.entries.clone());
            carried.removed.extend(page.removed.clone());
        }
        assert_eq!(commands.len(), 3);
        assert_eq!(carried, page);
        let empty = ChangePage::default().encode();
        let commands = import_commands(Pass::Changes, &empty).unwrap();
        assert_eq!(commands.len(), 1);
        let empty = ExportEntry::encode_page(&[]);
        let commands = import_commands(Pass::Full, &empty).unwrap();
        assert_eq!(commands.len(), 1);
    }

    #[test]
    fn pacing_waits_until_the_imported_bytes_are_due() {
        let rate = 1024 * 1024;
        // Nothing imported yet: no wait.
        assert_eq!(pace_wait(0, Duration::ZERO, rate), Duration::ZERO);
        // 512 KiB imported at once: due half a second after the start.
        assert_eq!(
            pace_wait(512 * 1024, Duration::from_millis(100), rate),
            Duration::from_millis(400)
        );
        // Behind schedule (the store was slow): go on at once.
        assert_eq!(
            pace_wait(512 * 1024, Duration::from_secs(2), rate),
            Duration::ZERO
        );
        // Only the online passes are paced.
        for online in [Pass::Full, Pass::Catchup] {
            assert_eq!(online.bytes_per_second(), Some(MOVE_COPY_BYTES_PER_SECOND));
        }
        assert_eq!(Pass::Changes.bytes_per_second(), None);
    }
}
