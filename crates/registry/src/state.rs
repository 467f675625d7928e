//! The registry's replicated state and its deterministic transition function: regions,
//! member nodes, tenants (home region, epoch, token hash, limits, move state) and
//! tenant-move operations, and the tenant lifecycle (token rotation with a grace
//! period for the old token, limit changes, deletion leaving a tombstone so the
//! id is never reused). `RegistryState::apply` never reads a clock or does I/O;
//! callers put the time into the `Request`, so every replica computes the same result.
//!
//! Every request is safe to apply twice: `Registry::write` retries a forwarded write
//! whose answer was lost, so a replayed request that already took effect answers as the
//! first one did instead of failing or bumping an epoch a second time.

use std::collections::BTreeMap;
use std::fmt;

use keyhold_raftlog::LogTail;
use serde::{Deserialize, Serialize};

pub use crate::failover::{FailoverResult, LostEstimate, Survival};
use crate::limits::NAME_BYTES_MAX;
use crate::types::{NodeId, NodeInfo, StoredMembership};

/// A region tenants can live in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    pub name: String,
    /// Time of the `AddRegion` request that created it, as given by its caller.
    pub created_at_ms: u64,
}

/// Whether a tenant is served by its home region or being moved away from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantState {
    /// The home region executes the tenant's requests.
    Active,
    /// Fenced: no region executes the tenant's requests until the move completes or is
    /// aborted (both bump the epoch).
    Moving { to: String, operation_id: String },
    /// Deleted: no token authenticates, no region executes, every store erases
    /// the tenant's data, and the id is never given to a new tenant.
    /// `erased_in` lists the regions whose store has erased the tenant's data.
    Deleted {
        deleted_at_ms: u64,
        erased_in: Vec<String>,
    },
}

/// A token replaced by a rotation, still accepted until `valid_until_ms` so
/// that clients can roll the new one out without an outage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredToken {
    pub token_sha256: String,
    pub valid_until_ms: u64,
}

/// Everything the cluster knows about one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub tenant_id: String,
    /// The only region that executes the tenant's requests (while `Active`).
    pub home_region: String,
    /// Increases whenever ownership may have changed (move completed or aborted); a
    /// node receiving a forwarded request with another epoch refuses it.
    pub epoch: u64,
    /// Lowercase hex SHA-256 of the tenant's API token; the token itself is never stored.
    pub token_sha256: String,
    pub requests_per_second: u32,
    pub new_keys_per_second: u32,
    pub state: TenantState,
    pub created_at_ms: u64,
    /// The token the last rotation replaced, while (and after) its grace period.
    pub previous_token: Option<RetiredToken>,
}

impl TenantRecord {
    /// True when the home region may execute requests for this tenant.
    pub fn is_active(&self) -> bool {
        matches!(self.state, TenantState::Active)
    }

    pub fn is_deleted(&self) -> bool {
        matches!(self.state, TenantState::Deleted { .. })
    }
}

/// What an operation does; the enum keeps the wire name in one place. New kinds
/// go last: the position is the encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationKind {
    #[serde(rename = "tenant-move")]
    TenantMove,
    /// An unplanned failover of a whole region (`tenant_id` is empty, `from`
    /// is the failed region). Its result is `RegistryState::failovers[id]`.
    #[serde(rename = "failover")]
    Failover,
}

impl OperationKind {
    /// The name used in the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::TenantMove => "tenant-move",
            OperationKind::Failover => "failover",
        }
    }
}

/// Progress of an operation as reported by the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    Pending,
    Running,
    Done,
    Failed,
}

impl OperationState {
    /// The name used in the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::Pending => "pending",
            OperationState::Running => "running",
            OperationState::Done => "done",
            OperationState::Failed => "failed",
        }
    }

    /// Done and failed operations never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, OperationState::Done | OperationState::Failed)
    }
}

/// A long-running administrative operation (today: moving a tenant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    pub operation_id: String,
    pub kind: OperationKind,
    pub tenant_id: String,
    pub from: String,
    pub to: String,
    pub state: OperationState,
    /// Fraction done, 0.0 to 1.0.
    pub progress: f64,
    pub error: Option<String>,
    pub updated_at_ms: u64,
}

/// Who drives a move operation, and until when (by the clock of the registry
/// leader that granted it). A successor may take over only after it expired,
/// and then gets a higher generation: writes naming an older one are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverLease {
    pub holder: NodeId,
    pub generation: u64,
    pub expires_at_ms: u64,
}

/// The whole replicated state. Snapshots carry exactly this value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryState {
    pub regions: BTreeMap<String, RegionRecord>,
    /// Mirrors the latest applied Raft membership (voters and learners).
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    pub tenants: BTreeMap<String, TenantRecord>,
    pub operations: BTreeMap<String, Operation>,
    /// The driver lease of each move operation that has had a driver.
    pub drivers: BTreeMap<String, DriverLease>,
    /// Tenants whose survival is not the default `Zone`. Kept beside
    /// `TenantRecord` (not in it) so that records and log entries written
    /// before survival existed still decode.
    pub survival: BTreeMap<String, Survival>,
    /// The result of each done failover operation, by operation id (beside
    /// `Operation` for the same reason).
    pub failovers: BTreeMap<String, FailoverResult>,
    /// The log tail of the copy each done failover promoted (beside
    /// `FailoverResult`, which entries and values of earlier releases encode
    /// without it); absent for a failover completed by `CompleteFailover`.
    pub failover_tails: BTreeMap<String, LogTail>,
    /// The regions whose standby is recorded lost, with the time it was first
    /// reported (`standbys.rs`); every other region's standby streams.
    pub standby_lost: BTreeMap<String, u64>,
}

/// A change to the registry, replicated through the Raft log. Times are inputs, never
/// read by the state machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Makes a region available as a home. Adding an existing region is a no-op.
    AddRegion { name: String, now_ms: u64 },
    /// Registers a tenant. Fails if the id is taken by a different record or the home
    /// region is unknown; the record must be `Active`.
    CreateTenant { record: TenantRecord },
    /// Fences an active tenant for a move to `to` and opens operation `operation_id`
    /// (state pending). The epoch does not change: the old home stops executing because
    /// the tenant is no longer `Active`.
    BeginMove {
        tenant_id: String,
        to: String,
        operation_id: String,
        now_ms: u64,
    },
    /// Reports progress of a running operation (without a driver lease: kept for
    /// entries already in logs; drivers send `ReportMove`). Only `pending` and `running` are
    /// accepted here: `done` and `failed` go through `CompleteMove` / `AbortMove` so the
    /// tenant changes in the same entry.
    UpdateOperation {
        operation_id: String,
        state: OperationState,
        progress: f64,
        error: Option<String>,
        now_ms: u64,
    },
    /// Activates the tenant in the new home: `home_region = to`, `epoch + 1`, and the
    /// operation becomes `done`. (Without a driver lease: drivers send `FinishMove`.)
    CompleteMove {
        tenant_id: String,
        operation_id: String,
        now_ms: u64,
    },
    /// Returns the tenant to `Active` in its old home with `epoch + 1` (so any node that
    /// saw it fenced refreshes), and fails the operation with `error`.
    AbortMove {
        tenant_id: String,
        operation_id: String,
        error: String,
        now_ms: u64,
    },
    /// Makes `token_sha256` the tenant's token; the one it replaces stays valid
    /// until `previous_valid_until_ms`. Replaying it (same new hash) changes nothing.
    RotateToken {
        tenant_id: String,
        token_sha256: String,
        previous_valid_until_ms: u64,
    },
    /// Sets the tenant's rate limits (each at least 1).
    SetLimits {
        tenant_id: String,
        requests_per_second: u32,
        new_keys_per_second: u32,
    },
    /// Marks the tenant deleted (a tombstone). Refused while it moves; a replay
    /// (same `now_ms`) answers as the first, a second deletion is refused.
    DeleteTenant { tenant_id: String, now_ms: u64 },
    /// `region`'s store has erased the deleted tenant's data. Idempotent.
    TenantErased { tenant_id: String, region: String },
    /// Takes or renews the lease on driving move `operation_id` for `holder`,
    /// `lease_ms` from `now_ms` (the registry leader stamps its own clock). Granted
    /// when nobody holds it, when `holder` holds it (a renewal), or when it expired;
    /// a new holder gets the next generation.
    AcquireDriver {
        operation_id: String,
        holder: NodeId,
        lease_ms: u64,
        now_ms: u64,
    },
    /// Progress of a running move, by the driver holding lease `generation`;
    /// renews the lease for `lease_ms` from `now_ms` (stamped by the leader).
    ReportMove {
        operation_id: String,
        generation: u64,
        progress: f64,
        lease_ms: u64,
        now_ms: u64,
    },
    /// `CompleteMove` (no `error`) or `AbortMove` by the driver holding lease
    /// `generation`; any other driver is refused.
    FinishMove {
        tenant_id: String,
        operation_id: String,
        generation: u64,
        error: Option<String>,
        now_ms: u64,
    },
    /// `CreateTenant` with a survival other than the default, in one entry.
    CreateTenantWith {
        record: TenantRecord,
        survival: Survival,
    },
    /// Changes a live tenant's survival.
    SetSurvival {
        tenant_id: String,
        survival: Survival,
    },
    /// Opens failover `operation_id` of `region` to `to` (running). From then
    /// on `region` is fenced: none of its nodes may count a registry contact,
    /// so it stops executing within its lease (see `failover_running_from`).
    BeginFailover {
        operation_id: String,
        region: String,
        to: String,
        now_ms: u64,
    },
    /// `CompleteFailoverFrom` with a copy's position alone (its whole log
    /// taken as committed): kept for entries already in logs.
    CompleteFailover {
        operation_id: String,
        at: u64,
        estimated_lost: LostEstimate,
        now_ms: u64,
    },
    /// Fails the failover; the region is no longer fenced and keeps its tenants.
    FailFailover {
        operation_id: String,
        error: String,
        now_ms: u64,
    },
    /// Re-homes every tenant of the failed region in `to` with epoch + 1 (a
    /// move out of it fails) and finishes the operation with its result and
    /// the tail of the copy it promoted (up to `tail.last`), which tells the
    /// failed region which of its entries the copy holds.
    CompleteFailoverFrom {
        operation_id: String,
        tail: LogTail,
        estimated_lost: LostEstimate,
        now_ms: u64,
    },
    /// Records `region`'s standby as lost since `now_ms` (its leader saw the
    /// standby confirm nothing for too long): the region acknowledges its zone
    /// tenants' writes without it. A region recorded lost keeps its first time.
    MarkStandbyLost { region: String, now_ms: u64 },
    /// Records `region`'s standby as streaming again (it caught up).
    MarkStandbyStreaming { region: String },
}

/// The result of applying one `Request` (or of a blank/membership entry: `Ok`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Applied (or already in effect) with nothing further to report.
    Ok,
    /// The tenant exists with exactly this record (new, or an identical replay).
    TenantCreated { record: TenantRecord },
    /// A move step took effect (or had already); the tenant and operation after it.
    MoveUpdated {
        record: TenantRecord,
        operation: Operation,
    },
    /// A lifecycle change (rotation, limits, deletion) took effect; the tenant after it.
    TenantUpdated { record: TenantRecord },
    /// `UpdateOperation` took effect.
    OperationUpdated { operation: Operation },
    /// `AcquireDriver` (or `ReportMove`) granted or renewed this lease.
    DriverLeased { lease: DriverLease },
    /// The request was valid Raft input but refused by the registry's rules; nothing
    /// changed.
    Rejected { reason: Rejection },
}

/// Why the state machine refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("tenant {tenant_id} already exists")]
    TenantExists { tenant_id: String },
    #[error("unknown region {region}")]
    UnknownRegion { region: String },
    #[error("unknown tenant {tenant_id}")]
    UnknownTenant { tenant_id: String },
    #[error("unknown operation {operation_id}")]
    UnknownOperation { operation_id: String },
    #[error("operation {operation_id} already exists")]
    OperationExists { operation_id: String },
    #[error("tenant {tenant_id} is already moving (operation {operation_id})")]
    TenantMoving {
        tenant_id: String,
        operation_id: String,
    },
    #[error("tenant {tenant_id} is not moving under operation {operation_id}")]
    NotMoving {
        tenant_id: String,
        operation_id: String,
    },
    #[error("tenant {tenant_id} already lives in {region}")]
    AlreadyHome { tenant_id: String, region: String },
    #[error("operation {operation_id} is already {}", state.as_str())]
    OperationFinished {
        operation_id: String,
        state: OperationState,
    },
    #[error("tenant {tenant_id} was deleted")]
    TenantDeleted { tenant_id: String },
    #[error("invalid request: {reason}")]
    Invalid { reason: String },
    #[error("operation {operation_id} is driven by node {holder} until {expires_at_ms}")]
    DriverLeaseHeld {
        operation_id: String,
        holder: NodeId,
        expires_at_ms: u64,
    },
    #[error("operation {operation_id}: driver generation {generation} no longer holds the lease")]
    NotDriver {
        operation_id: String,
        generation: u64,
    },
    #[error("region {region} is failing over (operation {operation_id})")]
    RegionFailingOver {
        region: String,
        operation_id: String,
    },
}

impl Response {
    fn rejected(reason: Rejection) -> Self {
        Response::Rejected { reason }
    }

    /// The rejection, if the request was refused.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Response::Rejected { reason } => Some(reason),
            _ => None,
        }
    }
}

/// A key of the state touched by a request; the store rewrites exactly these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StateKey {
    Region(String),
    Tenant(String),
    Operation(String),
    Driver(String),
    Survival(String),
    Failover(String),
    FailoverTail(String),
    StandbyLost(String),
}

impl Request {
    /// Keys this request may change, whether or not it is accepted, given the
    /// state before it applies.
    pub(crate) fn touched_keys(&self, state: &RegistryState) -> Vec<StateKey> {
        match self {
            Request::AddRegion { name, .. } => vec![StateKey::Region(name.clone())],
            Request::CreateTenant { record } => vec![StateKey::Tenant(record.tenant_id.clone())],
            Request::RotateToken { tenant_id, .. }
            | Request::SetLimits { tenant_id, .. }
            | Request::DeleteTenant { tenant_id, .. }
            | Request::TenantErased { tenant_id, .. } => vec![StateKey::Tenant(tenant_id.clone())],
            Request::UpdateOperation { operation_id, .. } => {
                vec![StateKey::Operation(operation_id.clone())]
            }
            Request::BeginMove {
                tenant_id,
                operation_id,
                ..
            }
            | Request::CompleteMove {
                tenant_id,
                operation_id,
                ..
            }
            | Request::AbortMove {
                tenant_id,
                operation_id,
                ..
            } => vec![
                StateKey::Tenant(tenant_id.clone()),
                StateKey::Operation(operation_id.clone()),
            ],
            Request::AcquireDriver { operation_id, .. } => {
                vec![StateKey::Driver(operation_id.clone())]
            }
            Request::ReportMove { operation_id, .. } => vec![
                StateKey::Operation(operation_id.clone()),
                StateKey::Driver(operation_id.clone()),
            ],
            Request::FinishMove {
                tenant_id,
                operation_id,
                ..
            } => vec![
                StateKey::Tenant(tenant_id.clone()),
                StateKey::Operation(operation_id.clone()),
            ],
            Request::CreateTenantWith { record, .. } => vec![
                StateKey::Tenant(record.tenant_id.clone()),
                StateKey::Survival(record.tenant_id.clone()),
            ],
            Request::SetSurvival { tenant_id, .. } => vec![StateKey::Survival(tenant_id.clone())],
            Request::BeginFailover { operation_id, .. }
            | Request::FailFailover { operation_id, .. } => {
                vec![StateKey::Operation(operation_id.clone())]
            }
            Request::CompleteFailover { operation_id, .. }
            | Request::CompleteFailoverFrom { operation_id, .. } => {
                state.failover_touched_keys(operation_id)
            }
            Request::MarkStandbyLost { region, .. } | Request::MarkStandbyStreaming { region } => {
                vec![StateKey::StandbyLost(region.clone())]
            }
        }
    }

    /// Puts the registry leader's clock into a request whose meaning depends on
    /// when the leader applied it (driver leases), so that every lease is
    /// measured by one clock. Other requests keep their caller's time.
    pub(crate) fn stamp_leader_time(&mut self, leader_now_ms: u64) {
        match self {
            Request::AcquireDriver { now_ms, .. } | Request::ReportMove { now_ms, .. } => {
                *now_ms = leader_now_ms
            }
            _ => {}
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::AddRegion { name, .. } => write!(f, "AddRegion({name})"),
            Request::CreateTenant { record } => write!(
                f,
                "CreateTenant({} in {})",
                record.tenant_id, record.home_region
            ),
            Request::BeginMove {
                tenant_id,
                to,
                operation_id,
                ..
            } => write!(f, "BeginMove({tenant_id} -> {to}, {operation_id})"),
            Request::UpdateOperation {
                operation_id,
                state,
                ..
            } => write!(f, "UpdateOperation({operation_id}, {})", state.as_str()),
            Request::CompleteMove {
                tenant_id,
                operation_id,
                ..
            } => write!(f, "CompleteMove({tenant_id}, {operation_id})"),
            Request::AbortMove {
                tenant_id,
                operation_id,
                ..
            } => write!(f, "AbortMove({tenant_id}, {operation_id})"),
            Request::RotateToken { tenant_id, .. } => write!(f, "RotateToken({tenant_id})"),
            Request::SetLimits {
                tenant_id,
                requests_per_second,
                new_keys_per_second,
            } => write!(
                f,
                "SetLimits({tenant_id}, {requests_per_second}/s, {new_keys_per_second} new keys/s)"
            ),
            Request::DeleteTenant { tenant_id, .. } => write!(f, "DeleteTenant({tenant_id})"),
            Request::TenantErased { tenant_id, region } => {
                write!(f, "TenantErased({tenant_id} in {region})")
            }
            Request::AcquireDriver {
                operation_id,
                holder,
                ..
            } => write!(f, "AcquireDriver({operation_id}, node {holder})"),
            Request::ReportMove {
                operation_id,
                generation,
                ..
            } => write!(f, "ReportMove({operation_id}, generation {generation})"),
            Request::FinishMove {
                tenant_id,
                operation_id,
                generation,
                error,
                ..
            } => write!(
                f,
                "FinishMove({tenant_id}, {operation_id}, generation {generation}, {})",
                if error.is_some() { "abort" } else { "complete" }
            ),
            Request::CreateTenantWith { record, survival } => write!(
                f,
                "CreateTenant({} in {}, survival {})",
                record.tenant_id,
                record.home_region,
                survival.as_str()
            ),
            Request::SetSurvival {
                tenant_id,
                survival,
            } => write!(f, "SetSurvival({tenant_id}, {})", survival.as_str()),
            Request::BeginFailover {
                operation_id,
                region,
                to,
                ..
            } => write!(f, "BeginFailover({region} -> {to}, {operation_id})"),
            Request::CompleteFailover {
                operation_id, at, ..
            } => write!(f, "CompleteFailover({operation_id}, at {at})"),
            Request::CompleteFailoverFrom {
                operation_id, tail, ..
            } => write!(
                f,
                "CompleteFailoverFrom({operation_id}, at {}, committed {})",
                tail.last, tail.committed
            ),
            Request::FailFailover { operation_id, .. } => {
                write!(f, "FailFailover({operation_id})")
            }
            Request::MarkStandbyLost { region, .. } => write!(f, "MarkStandbyLost({region})"),
            Request::MarkStandbyStreaming { region } => {
                write!(f, "MarkStandbyStreaming({region})")
            }
        }
    }
}

pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Rejection::Invalid {
            reason: format!("{what} must be 1 to {NAME_BYTES_MAX} bytes"),
        });
    }
    Ok(())
}

fn check_sha256_hex(hex: &str) -> Result<(), Rejection> {
    let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(Rejection::Invalid {
            reason: "token_sha256 must be 64 lowercase hex digits".to_string(),
        });
    }
    Ok(())
}

impl RegistryState {
    /// Applies one request. Deterministic; a refused request changes nothing.
    pub fn apply(&mut self, request: &Request) -> Response {
        let result = match request {
            Request::AddRegion { name, now_ms } => self.add_region(name, *now_ms),
            Request::CreateTenant { record } => self.create_tenant(record),
            Request::BeginMove {
                tenant_id,
                to,
                operation_id,
                now_ms,
            } => self.begin_move(tenant_id, to, operation_id, *now_ms),
            Request::UpdateOperation {
                operation_id,
                state,
                progress,
                error,
                now_ms,
            } => self.update_operation(operation_id, *state, *progress, error, *now_ms),
            Request::CompleteMove {
                tenant_id,
                operation_id,
                now_ms,
            } => self.finish_move(tenant_id, operation_id, None, *now_ms),
            Request::AbortMove {
                tenant_id,
                operation_id,
                error,
                now_ms,
            } => self.finish_move(tenant_id, operation_id, Some(error), *now_ms),
            Request::RotateToken {
                tenant_id,
                token_sha256,
                previous_valid_until_ms,
            } => self.rotate_token(tenant_id, token_sha256, *previous_valid_until_ms),
            Request::SetLimits {
                tenant_id,
                requests_per_second,
                new_keys_per_second,
            } => self.set_limits(tenant_id, *requests_per_second, *new_keys_per_second),
            Request::DeleteTenant { tenant_id, now_ms } => self.delete_tenant(tenant_id, *now_ms),
            Request::TenantErased { tenant_id, region } => self.tenant_erased(tenant_id, region),
            Request::AcquireDriver {
                operation_id,
                holder,
                lease_ms,
                now_ms,
            } => self.acquire_driver(operation_id, *holder, *lease_ms, *now_ms),
            Request::ReportMove {
                operation_id,
                generation,
                progress,
                lease_ms,
                now_ms,
            } => self
                .check_driver(operation_id, *generation)
                .and_then(|lease| {
                    self.update_operation(
                        operation_id,
                        OperationState::Running,
                        *progress,
                        &None,
                        *now_ms,
                    )?;
                    Ok(self.renew(operation_id, lease, *lease_ms, *now_ms))
                }),
            Request::FinishMove {
                tenant_id,
                operation_id,
                generation,
                error,
                now_ms,
            } => self
                .check_driver(operation_id, *generation)
                .and_then(|_| self.finish_move(tenant_id, operation_id, error.as_ref(), *now_ms)),
            Request::CreateTenantWith { record, survival } => {
                self.create_tenant_with(record, *survival)
            }
            Request::SetSurvival {
                tenant_id,
                survival,
            } => self.set_survival(tenant_id, *survival),
            Request::BeginFailover {
                operation_id,
                region,
                to,
                now_ms,
            } => self.begin_failover(operation_id, region, to, *now_ms),
            Request::CompleteFailover {
                operation_id,
                at,
                estimated_lost,
                now_ms,
            } => self.complete_failover(operation_id, *at, None, estimated_lost, *now_ms),
            Request::CompleteFailoverFrom {
                operation_id,
                tail,
                estimated_lost,
                now_ms,
            } => {
                self.complete_failover(operation_id, tail.last, Some(tail), estimated_lost, *now_ms)
            }
            Request::FailFailover {
                operation_id,
                error,
                now_ms,
            } => self.fail_failover(operation_id, error, *now_ms),
            Request::MarkStandbyLost { region, now_ms } => self.mark_standby_lost(region, *now_ms),
            Request::MarkStandbyStreaming { region } => self.mark_standby_streaming(region),
        };
        result.unwrap_or_else(Response::rejected)
    }

    /// Replaces the node table with the members (voters and learners) of `membership`.
    pub fn set_membership(&mut self, membership: &StoredMembership) {
        self.nodes = membership
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect();
    }

    fn add_region(&mut self, name: &str, now_ms: u64) -> Result<Response, Rejection> {
        check_name("region name", name)?;
        self.regions
            .entry(name.to_string())
            .or_insert_with(|| RegionRecord {
                name: name.to_string(),
                created_at_ms: now_ms,
            });
        Ok(Response::Ok)
    }

    pub(crate) fn create_tenant(&mut self, record: &TenantRecord) -> Result<Response, Rejection> {
        check_name("tenant_id", &record.tenant_id)?;
        check_sha256_hex(&record.token_sha256)?;
        if let Some(existing) = self.tenants.get(&record.tenant_id) {
            // An identical record is a replay of this very request.
            if existing == record {
                return Ok(Response::TenantCreated {
                    record: existing.clone(),
                });
            }
            return Err(Rejection::TenantExists {
                tenant_id: record.tenant_id.clone(),
            });
        }
        if !self.regions.contains_key(&record.home_region) {
            return Err(Rejection::UnknownRegion {
                region: record.home_region.clone(),
            });
        }
        self.check_not_failing_over(&record.home_region)?;
        if !record.is_active() {
            return Err(Rejection::Invalid {
                reason: "a new tenant must be Active".to_string(),
            });
        }
        self.tenants
            .insert(record.tenant_id.clone(), record.clone());
        Ok(Response::TenantCreated {
            record: record.clone(),
        })
    }

    /// The live (not deleted) tenant a lifecycle request names.
    pub(crate) fn live_tenant(&mut self, tenant_id: &str) -> Result<&mut TenantRecord, Rejection> {
        let tenant = self
            .tenants
            .get_mut(tenant_id)
            .ok_or_else(|| Rejection::UnknownTenant {
                tenant_id: tenant_id.to_string(),
            })?;
        if tenant.is_deleted() {
            return Err(Rejection::TenantDeleted {
                tenant_id: tenant_id.to_string(),
            });
        }
        Ok(tenant)
    }

    fn rotate_token(
        &mut self,
        tenant_id: &str,
        token_sha256: &str,
        previous_valid_until_ms: u64,
    ) -> Result<Response, Rejection> {
        check_sha256_hex(token_sha256)?;
        let tenant = self.live_tenant(tenant_id)?;
        // A replay finds its own token in place and changes nothing.
        if tenant.token_sha256 != token_sha256 {
            tenant.previous_token = Some(RetiredToken {
                token_sha256: std::mem::replace(&mut tenant.token_sha256, token_sha256.to_string()),
                valid_until_ms: previous_valid_until_ms,
            });
        }
        Ok(Response::TenantUpdated {
            record: tenant.clone(),
        })
    }

    fn set_limits(
        &mut self,
        tenant_id: &str,
        requests_per_second: u32,
        new_keys_per_second: u32,
    ) -> Result<Response, Rejection> {
        if requests_per_second == 0 || new_keys_per_second == 0 {
            return Err(Rejection::Invalid {
                reason: "rate limits must be at least 1 per second".to_string(),
            });
        }
        let tenant = self.live_tenant(tenant_id)?;
        tenant.requests_per_second = requests_per_second;
        tenant.new_keys_per_second = new_keys_per_second;
        Ok(Response::TenantUpdated {
            record: tenant.clone(),
        })
    }

    fn delete_tenant(&mut self, tenant_id: &str, now_ms: u64) -> Result<Response, Rejection> {
        let tenant = self
            .tenants
            .get_mut(tenant_id)
            .ok_or_else(|| Rejection::UnknownTenant {
                tenant_id: tenant_id.to_string(),
            })?;
        match &tenant.state {
            // The retried write of this very deletion answers as the first did.
            TenantState::Deleted { deleted_at_ms, .. } if *deleted_at_ms == now_ms => {}
            TenantState::Deleted { .. } => {
                return Err(Rejection::TenantDeleted {
                    tenant_id: tenant_id.to_string(),
                })
            }
            TenantState::Moving { operation_id, .. } => {
                return Err(Rejection::TenantMoving {
                    tenant_id: tenant_id.to_string(),
                    operation_id: operation_id.clone(),
                })
            }
            TenantState::Active => {
                tenant.state = TenantState::Deleted {
                    deleted_at_ms: now_ms,
                    erased_in: Vec::new(),
                };
                // No token of a deleted tenant may authenticate, the old one
                // in its grace period included.
                tenant.previous_token = None;
            }
        }
        Ok(Response::TenantUpdated {
            record: tenant.clone(),
        })
    }

    fn tenant_erased(&mut self, tenant_id: &str, region: &str) -> Result<Response, Rejection> {
        let tenant = self
            .tenants
            .get_mut(tenant_id)
            .ok_or_else(|| Rejection::UnknownTenant {
                tenant_id: tenant_id.to_string(),
            })?;
        let TenantState::Deleted { erased_in, .. } = &mut tenant.state else {
            return Err(Rejection::Invalid {
                reason: format!("tenant {tenant_id} is not deleted"),
            });
        };
        if !erased_in.iter().any(|r| r == region) {
            erased_in.push(region.to_string());
            erased_in.sort();
        }
        Ok(Response::TenantUpdated {
            record: tenant.clone(),
        })
    }

    fn begin_move(
        &mut self,
        tenant_id: &str,
        to: &str,
        operation_id: &str,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        check_name("operation_id", operation_id)?;
        let tenant = self
            .tenants
            .get(tenant_id)
            .ok_or_else(|| Rejection::UnknownTenant {
                tenant_id: tenant_id.to_string(),
            })?;
        if let TenantState::Moving {
            to: moving_to,
            operation_id: moving_op,
        } = &tenant.state
        {
            if moving_op == operation_id && moving_to == to {
                return Ok(self.move_response(tenant_id, operation_id));
            }
            return Err(Rejection::TenantMoving {
                tenant_id: tenant_id.to_string(),
                operation_id: moving_op.clone(),
            });
        }
        if tenant.is_deleted() {
            return Err(Rejection::TenantDeleted {
                tenant_id: tenant_id.to_string(),
            });
        }
        if self.operations.contains_key(operation_id) {
            return Err(Rejection::OperationExists {
                operation_id: operation_id.to_string(),
            });
        }
        if !self.regions.contains_key(to) {
            return Err(Rejection::UnknownRegion {
                region: to.to_string(),
            });
        }
        if tenant.home_region == to {
            return Err(Rejection::AlreadyHome {
                tenant_id: tenant_id.to_string(),
                region: to.to_string(),
            });
        }
        self.check_not_failing_over(&tenant.home_region)?;
        self.check_not_failing_over(to)?;
        let operation = Operation {
            operation_id: operation_id.to_string(),
            kind: OperationKind::TenantMove,
            tenant_id: tenant_id.to_string(),
            from: tenant.home_region.clone(),
            to: to.to_string(),
            state: OperationState::Pending,
            progress: 0.0,
            error: None,
            updated_at_ms: now_ms,
        };
        self.operations.insert(operation_id.to_string(), operation);
        if let Some(tenant) = self.tenants.get_mut(tenant_id) {
            tenant.state = TenantState::Moving {
                to: to.to_string(),
                operation_id: operation_id.to_string(),
            };
        }
        Ok(self.move_response(tenant_id, operation_id))
    }

    fn update_operation(
        &mut self,
        operation_id: &str,
        state: OperationState,
        progress: f64,
        error: &Option<String>,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        if state.is_terminal() {
            return Err(Rejection::Invalid {
                reason: "done and failed are set by CompleteMove and AbortMove".to_string(),
            });
        }
        if !(0.0..=1.0).contains(&progress) {
            return Err(Rejection::Invalid {
                reason: "progress must be within 0.0..=1.0".to_string(),
            });
        }
        self.running(operation_id)?;
        let Some(operation) = self.operations.get_mut(operation_id) else {
            return Err(Rejection::UnknownOperation {
                operation_id: operation_id.to_string(),
            });
        };
        operation.state = state;
        operation.progress = progress;
        operation.error = error.clone();
        operation.updated_at_ms = now_ms;
        Ok(Response::OperationUpdated {
            operation: operation.clone(),
        })
    }

    /// `CompleteMove` when `abort_error` is `None`, `AbortMove` otherwise.
    fn finish_move(
        &mut self,
        tenant_id: &str,
        operation_id: &str,
        abort_error: Option<&String>,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        let operation =
            self.operations
                .get(operation_id)
                .ok_or_else(|| Rejection::UnknownOperation {
                    operation_id: operation_id.to_string(),
                })?;
        let tenant = self
            .tenants
            .get(tenant_id)
            .ok_or_else(|| Rejection::UnknownTenant {
                tenant_id: tenant_id.to_string(),
            })?;
        let not_moving = || Rejection::NotMoving {
            tenant_id: tenant_id.to_string(),
            operation_id: operation_id.to_string(),
        };
        if operation.tenant_id != tenant_id {
            return Err(not_moving());
        }
        let wanted = if abort_error.is_some() {
            OperationState::Failed
        } else {
            OperationState::Done
        };
        if operation.state.is_terminal() {
            // A replay of the request that finished the operation answers the same;
            // finishing it the other way is refused.
            if operation.state == wanted {
                return Ok(self.move_response(tenant_id, operation_id));
            }
            return Err(Rejection::OperationFinished {
                operation_id: operation_id.to_string(),
                state: operation.state,
            });
        }
        match &tenant.state {
            TenantState::Moving {
                operation_id: moving_op,
                ..
            } if moving_op == operation_id => {}
            _ => return Err(not_moving()),
        }
        let new_home = if abort_error.is_some() {
            operation.from.clone()
        } else {
            operation.to.clone()
        };
        if let Some(tenant) = self.tenants.get_mut(tenant_id) {
            tenant.home_region = new_home;
            tenant.epoch += 1;
            tenant.state = TenantState::Active;
        }
        if let Some(operation) = self.operations.get_mut(operation_id) {
            operation.state = wanted;
            if abort_error.is_none() {
                operation.progress = 1.0;
            }
            operation.error = abort_error.cloned();
            operation.updated_at_ms = now_ms;
        }
        Ok(self.move_response(tenant_id, operation_id))
    }

    /// The operation, unless it is unknown or finished.
    pub(crate) fn running(&self, operation_id: &str) -> Result<&Operation, Rejection> {
        let operation =
            self.operations
                .get(operation_id)
                .ok_or_else(|| Rejection::UnknownOperation {
                    operation_id: operation_id.to_string(),
                })?;
        if operation.state.is_terminal() {
            return Err(Rejection::OperationFinished {
                operation_id: operation_id.to_string(),
                state: operation.state,
            });
        }
        Ok(operation)
    }

    fn acquire_driver(
        &mut self,
        operation_id: &str,
        holder: NodeId,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Response, Rejection> {
        self.running(operation_id)?;
        let lease = match self.drivers.get(operation_id) {
            None => DriverLease {
                holder,
                generation: 1,
                expires_at_ms: 0,
            },
            Some(lease) if lease.holder == holder => *lease,
            Some(lease) if lease.expires_at_ms <= now_ms => DriverLease {
                holder,
                generation: lease.generation + 1,
                expires_at_ms: 0,
            },
            Some(lease) => {
                return Err(Rejection::DriverLeaseHeld {
                    operation_id: operation_id.to_string(),
                    holder: lease.holder,
                    expires_at_ms: lease.expires_at_ms,
                })
            }
        };
        Ok(self.renew(operation_id, lease, lease_ms, now_ms))
    }

    /// The lease of `operation_id`, if `generation` still holds it.
    fn check_driver(&self, operation_id: &str, generation: u64) -> Result<DriverLease, Rejection> {
        match self.drivers.get(operation_id) {
            Some(lease) if lease.generation == generation => Ok(*lease),
            _ => Err(Rejection::NotDriver {
                operation_id: operation_id.to_string(),
                generation,
            }),
        }
    }

    fn renew(
        &mut self,
        operation_id: &str,
        lease: DriverLease,
        lease_ms: u64,
        now_ms: u64,
    ) -> Response {
        let lease = DriverLease {
            expires_at_ms: lease.expires_at_ms.max(now_ms.saturating_add(lease_ms)),
            ..lease
        };
        self.drivers.insert(operation_id.to_string(), lease);
        Response::DriverLeased { lease }
    }

    fn move_response(&self, tenant_id: &str, operation_id: &str) -> Response {
        match (
            self.tenants.get(tenant_id),
            self.operations.get(operation_id),
        ) {
            (Some(record), Some(operation)) => Response::MoveUpdated {
                record: record.clone(),
                operation: operation.clone(),
            },
            // Callers only build this response after finding both.
            _ => Response::Ok,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    /// An active tenant of `home` at epoch 1.
    pub(crate) fn tenant(id: &str, home: &str) -> TenantRecord {
        TenantRecord {
            tenant_id: id.to_string(),
            home_region: home.to_string(),
            epoch: 1,
            token_sha256: TOKEN.to_string(),
            requests_per_second: 100,
            new_keys_per_second: 10,
            state: TenantState::Active,
            created_at_ms: 5,
            previous_token: None,
        }
    }

    fn two_regions() -> RegistryState {
        let mut state = RegistryState::default();
        for name in ["eu", "us"] {
            let response = state.apply(&Request::AddRegion {
                name: name.to_string(),
                now_ms: 1,
            });
            assert_eq!(response, Response::Ok);
        }
        state
    }

    fn begin(tenant_id: &str, to: &str, op: &str) -> Request {
        Request::BeginMove {
            tenant_id: tenant_id.to_string(),
            to: to.to_string(),
            operation_id: op.to_string(),
            now_ms: 10,
        }
    }

    fn complete(tenant_id: &str, op: &str) -> Request {
        Request::CompleteMove {
            tenant_id: tenant_id.to_string(),
            operation_id: op.to_string(),
            now_ms: 20,
        }
    }

    fn abort(tenant_id: &str, op: &str) -> Request {
        Request::AbortMove {
            tenant_id: tenant_id.to_string(),
            operation_id: op.to_string(),
            error: "copy failed".to_string(),
            now_ms: 20,
        }
    }

    #[test]
    fn add_region_is_idempotent_and_keeps_first_time() {
        let mut state = two_regions();
        let response = state.apply(&Request::AddRegion {
            name: "eu".to_string(),
            now_ms: 99,
        });
        assert_eq!(response, Response::Ok);
        assert_eq!(state.regions["eu"].created_at_ms, 1);
    }

    #[test]
    fn create_tenant_rejects_unknown_region_and_conflicts_but_replays() {
        let mut state = two_regions();
        let response = state.apply(&Request::CreateTenant {
            record: tenant("t1", "ap"),
        });
        assert_eq!(
            response.rejection(),
            Some(&Rejection::UnknownRegion {
                region: "ap".to_string()
            })
        );

        let record = tenant("t1", "eu");
        let first = state.apply(&Request::CreateTenant {
            record: record.clone(),
        });
        assert_eq!(
            first,
            Response::TenantCreated {
                record: record.clone()
            }
        );
        let replay = state.apply(&Request::CreateTenant {
            record: record.clone(),
        });
        assert_eq!(replay, first);

        let mut other = record;
        other.home_region = "us".to_string();
        let conflict = state.apply(&Request::CreateTenant { record: other });
        assert_eq!(
            conflict.rejection(),
            Some(&Rejection::TenantExists {
                tenant_id: "t1".to_string()
            })
        );
    }

    #[test]
    fn create_tenant_validates_token_hash() {
        let mut state = two_regions();
        let mut record = tenant("t1", "eu");
        record.token_sha256 = "ABC".to_string();
        let response = state.apply(&Request::CreateTenant { record });
        assert!(matches!(
            response.rejection(),
            Some(Rejection::Invalid { .. })
        ));
        assert!(state.tenants.is_empty());
    }

    #[test]
    fn move_fences_then_completes_with_epoch_bump_once() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });

        let began = state.apply(&begin("t1", "us", "op1"));
        let Response::MoveUpdated { record, operation } = began else {
            panic!("unexpected {began:?}");
        };
        assert_eq!(record.epoch, 1);
        assert_eq!(
            record.state,
            TenantState::Moving {
                to: "us".to_string(),
                operation_id: "op1".to_string()
            }
        );
        assert_eq!(operation.state, OperationState::Pending);
        assert_eq!(operation.from, "eu");

        // A second move while the first runs is refused; a replay of the first is not.
        let second = state.apply(&begin("t1", "us", "op2"));
        assert!(matches!(
            second.rejection(),
            Some(Rejection::TenantMoving { .. })
        ));
        assert!(state.apply(&begin("t1", "us", "op1")).rejection().is_none());

        let progress = state.apply(&Request::UpdateOperation {
            operation_id: "op1".to_string(),
            state: OperationState::Running,
            progress: 0.5,
            error: None,
            now_ms: 15,
        });
        assert!(matches!(progress, Response::OperationUpdated { .. }));

        let done = state.apply(&complete("t1", "op1"));
        let Response::MoveUpdated { record, operation } = done.clone() else {
            panic!("unexpected {done:?}");
        };
        assert_eq!(record.home_region, "us");
        assert_eq!(record.epoch, 2);
        assert!(record.is_active());
        assert_eq!(operation.state, OperationState::Done);
        assert_eq!(operation.progress, 1.0);

        // Replaying the completion must not bump the epoch again.
        assert_eq!(state.apply(&complete("t1", "op1")), done);
        assert_eq!(state.tenants["t1"].epoch, 2);
        // Nor may the finished operation be aborted or updated.
        assert!(matches!(
            state.apply(&abort("t1", "op1")).rejection(),
            Some(Rejection::OperationFinished { .. })
        ));
    }

    #[test]
    fn abort_returns_home_with_epoch_bump() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });
        state.apply(&begin("t1", "us", "op1"));
        let aborted = state.apply(&abort("t1", "op1"));
        let Response::MoveUpdated { record, operation } = aborted else {
            panic!("unexpected {aborted:?}");
        };
        assert_eq!(record.home_region, "eu");
        assert_eq!(record.epoch, 2);
        assert!(record.is_active());
        assert_eq!(operation.state, OperationState::Failed);
        assert_eq!(operation.error.as_deref(), Some("copy failed"));
        assert!(state.apply(&abort("t1", "op1")).rejection().is_none());
        assert_eq!(state.tenants["t1"].epoch, 2);
    }

    #[test]
    fn move_preconditions() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });
        let cases = [
            (begin("nope", "us", "op"), "UnknownTenant"),
            (begin("t1", "ap", "op"), "UnknownRegion"),
            (begin("t1", "eu", "op"), "AlreadyHome"),
            (complete("t1", "missing"), "UnknownOperation"),
        ];
        for (request, expected) in cases {
            let response = state.apply(&request);
            let reason = response.rejection().expect("rejected");
            assert!(
                format!("{reason:?}").starts_with(expected),
                "{request}: {reason:?}"
            );
        }
        // Completing a move of a tenant that is not moving under that operation.
        state.apply(&Request::CreateTenant {
            record: tenant("t2", "eu"),
        });
        state.apply(&begin("t2", "us", "op2"));
        assert!(matches!(
            state.apply(&complete("t1", "op2")).rejection(),
            Some(Rejection::NotMoving { .. })
        ));
        assert!(matches!(
            state
                .apply(&Request::UpdateOperation {
                    operation_id: "op2".to_string(),
                    state: OperationState::Done,
                    progress: 1.0,
                    error: None,
                    now_ms: 1,
                })
                .rejection(),
            Some(Rejection::Invalid { .. })
        ));
    }

    const OTHER: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    fn delete(tenant_id: &str, now_ms: u64) -> Request {
        Request::DeleteTenant {
            tenant_id: tenant_id.to_string(),
            now_ms,
        }
    }

    #[test]
    fn lifecycle_rotation_limits_and_deletion() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });
        let rotate = Request::RotateToken {
            tenant_id: "t1".to_string(),
            token_sha256: OTHER.to_string(),
            previous_valid_until_ms: 99,
        };
        let Response::TenantUpdated { record } = state.apply(&rotate) else {
            panic!("rotation applies");
        };
        assert_eq!(record.token_sha256, OTHER);
        let retired = RetiredToken {
            token_sha256: TOKEN.to_string(),
            valid_until_ms: 99,
        };
        assert_eq!(record.previous_token, Some(retired.clone()));
        // A replayed rotation keeps the retired token as it was.
        state.apply(&rotate);
        assert_eq!(state.tenants["t1"].previous_token, Some(retired));

        let limits = |rps, nkps| Request::SetLimits {
            tenant_id: "t1".to_string(),
            requests_per_second: rps,
            new_keys_per_second: nkps,
        };
        assert!(matches!(
            state.apply(&limits(0, 5)).rejection(),
            Some(Rejection::Invalid { .. })
        ));
        state.apply(&limits(7, 5));
        assert_eq!(
            (
                state.tenants["t1"].requests_per_second,
                state.tenants["t1"].new_keys_per_second
            ),
            (7, 5)
        );

        let Response::TenantUpdated { record } = state.apply(&delete("t1", 50)) else {
            panic!("deletion applies");
        };
        assert_eq!(
            record.state,
            TenantState::Deleted {
                deleted_at_ms: 50,
                erased_in: vec![]
            }
        );
        assert_eq!(record.previous_token, None, "no grace after deletion");
        // The retried write answers as the first; a second deletion is refused,
        // and so is every other change, a move and the id's reuse.
        assert!(state.apply(&delete("t1", 50)).rejection().is_none());
        for request in [
            delete("t1", 51),
            limits(1, 1),
            rotate.clone(),
            begin("t1", "us", "op9"),
        ] {
            assert!(
                matches!(
                    state.apply(&request).rejection(),
                    Some(Rejection::TenantDeleted { .. })
                ),
                "{request}"
            );
        }
        assert!(matches!(
            state
                .apply(&Request::CreateTenant {
                    record: tenant("t1", "eu"),
                })
                .rejection(),
            Some(Rejection::TenantExists { .. })
        ));
        assert!(matches!(
            state.apply(&delete("nobody", 1)).rejection(),
            Some(Rejection::UnknownTenant { .. })
        ));
        // Each region reports its erasure once, however often it says so.
        for region in ["us", "eu", "us"] {
            state.apply(&Request::TenantErased {
                tenant_id: "t1".to_string(),
                region: region.to_string(),
            });
        }
        assert!(matches!(
            &state.tenants["t1"].state,
            TenantState::Deleted { erased_in, .. } if erased_in == &["eu", "us"]
        ));
        // A moving tenant is not deleted under its move.
        state.apply(&Request::CreateTenant {
            record: tenant("t2", "eu"),
        });
        state.apply(&begin("t2", "us", "op2"));
        assert!(matches!(
            state.apply(&delete("t2", 1)).rejection(),
            Some(Rejection::TenantMoving { .. })
        ));
    }

    fn acquire(op: &str, holder: NodeId, now_ms: u64) -> Request {
        Request::AcquireDriver {
            operation_id: op.to_string(),
            holder,
            lease_ms: 100,
            now_ms,
        }
    }

    fn lease_of(response: &Response) -> DriverLease {
        match response {
            Response::DriverLeased { lease } => *lease,
            other => panic!("no lease: {other:?}"),
        }
    }

    #[test]
    fn one_driver_at_a_time_and_a_successor_fences_the_old_one_out() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });
        state.apply(&begin("t1", "us", "op1"));
        let first = lease_of(&state.apply(&acquire("op1", 1, 1_000)));
        assert_eq!(
            (first.holder, first.generation, first.expires_at_ms),
            (1, 1, 1_100)
        );
        // Held: another node is refused until it expires; the holder renews.
        assert!(matches!(
            state.apply(&acquire("op1", 2, 1_050)).rejection(),
            Some(Rejection::DriverLeaseHeld { holder: 1, .. })
        ));
        let report = Request::ReportMove {
            operation_id: "op1".to_string(),
            generation: 1,
            progress: 0.5,
            lease_ms: 100,
            now_ms: 1_080,
        };
        assert_eq!(lease_of(&state.apply(&report)).expires_at_ms, 1_180);
        assert_eq!(state.operations["op1"].progress, 0.5);
        // Expired: node 2 takes over with the next generation.
        let second = lease_of(&state.apply(&acquire("op1", 2, 1_180)));
        assert_eq!((second.holder, second.generation), (2, 2));
        // The old driver's writes are refused and change nothing.
        let before = state.clone();
        assert!(matches!(
            state.apply(&report).rejection(),
            Some(Rejection::NotDriver { generation: 1, .. })
        ));
        let stale_finish = Request::FinishMove {
            tenant_id: "t1".to_string(),
            operation_id: "op1".to_string(),
            generation: 1,
            error: None,
            now_ms: 1_200,
        };
        assert!(matches!(
            state.apply(&stale_finish).rejection(),
            Some(Rejection::NotDriver { .. })
        ));
        assert_eq!(state, before);
        // The successor finishes; a replay answers alike; nobody drives a done move.
        let finish = Request::FinishMove {
            tenant_id: "t1".to_string(),
            operation_id: "op1".to_string(),
            generation: 2,
            error: None,
            now_ms: 1_200,
        };
        let done = state.apply(&finish);
        assert!(matches!(done, Response::MoveUpdated { .. }), "{done:?}");
        assert_eq!(state.apply(&finish), done);
        assert_eq!(state.tenants["t1"].home_region, "us");
        assert!(matches!(
            state.apply(&acquire("op1", 3, 5_000)).rejection(),
            Some(Rejection::OperationFinished { .. })
        ));
    }

    #[test]
    fn state_round_trips_through_the_storage_codec() {
        let mut state = two_regions();
        state.apply(&Request::CreateTenant {
            record: tenant("t1", "eu"),
        });
        state.apply(&begin("t1", "us", "op1"));
        state.apply(&Request::AcquireDriver {
            operation_id: "op1".to_string(),
            holder: 3,
            lease_ms: 10,
            now_ms: 5,
        });
        let bytes = crate::codec::encode(&state).expect("encode");
        let back: RegistryState = crate::codec::decode(&bytes).expect("decode");
        assert_eq!(back, state);
    }
}
