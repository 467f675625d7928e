//! What the local registry replica says runs: the one place the node asks
//! which move or failover is running for a tenant or a region, for the jobs
//! (lease, copies, failover driver, mover, reconciliation) and the routes
//! alike. Every answer is this replica's, as applied so far: a caller that
//! needs one at least as new as some entry waits for it first
//! (`Registry::wait_applied`, `Node::catch_up_registry`).
//!
//! Listing every operation for the admin API (`routes::moves`) is a view,
//! not a question of what runs, and stays with its route.
//!
//! It takes the registry replica, not the node: the node's state asks it too
//! (`Node::ensure_owned`), and knows nothing above it.

use keyhold_registry::{Operation, OperationKind, OperationState, Registry, TenantState};
use keyhold_store::LogTail;

/// The running failover of `region`, if any: while it runs, the region is
/// fenced (it renews no lease, its copies may be read for the import).
pub fn failover_from(registry: &Registry, region: &str) -> Option<Operation> {
    registry.read(|state| state.failover_running_from(region).cloned())
}

/// The running failovers whose target is `region`.
pub fn failovers_to(registry: &Registry, region: &str) -> Vec<Operation> {
    registry.read(|state| {
        state
            .operations
            .values()
            .filter(|op| {
                op.kind == OperationKind::Failover && !op.state.is_terminal() && op.to == region
            })
            .cloned()
            .collect()
    })
}

/// The state of `operation_id` when it is a failover to `region`; `None` for
/// anything else.
pub fn failover_to(
    registry: &Registry,
    operation_id: &str,
    region: &str,
) -> Option<OperationState> {
    registry.read(|state| {
        state
            .operations
            .get(operation_id)
            .filter(|op| op.kind == OperationKind::Failover && op.to == region)
            .map(|op| op.state)
    })
}

/// True when `operation_id` is a running failover from `from` to `to`.
pub fn failover_running(registry: &Registry, operation_id: &str, from: &str, to: &str) -> bool {
    registry.read(|state| {
        state.operations.get(operation_id).is_some_and(|op| {
            op.kind == OperationKind::Failover
                && op.state == OperationState::Running
                && op.from == from
                && op.to == to
        })
    })
}

/// A done failover away from a region, as the registry replica holds it.
#[derive(Debug, Clone)]
pub struct DoneFailover {
    pub operation_id: String,
    /// The promoted copy's tail (`tail.last` is its position).
    pub tail: LogTail,
    pub tenants: Vec<String>,
}

/// Every done failover from `region`, oldest first.
pub fn failovers_done_from(registry: &Registry, region: &str) -> Vec<DoneFailover> {
    registry.read(|state| {
        state
            .failovers_from(region)
            .into_iter()
            .filter_map(|op| {
                let result = state.failover_result(&op.operation_id)?;
                Some(DoneFailover {
                    operation_id: op.operation_id.clone(),
                    tail: state.failover_tail(&op.operation_id)?,
                    tenants: result.tenants.clone(),
                })
            })
            .collect()
    })
}

/// A tenant in the middle of a move, as the replica holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moving {
    pub operation_id: String,
    pub epoch: u64,
    pub from: String,
    pub to: String,
    /// The generation of the driver lease the replica holds for the move, if
    /// any.
    pub driver_generation: Option<u64>,
}

/// The move `tenant_id` is in, if it is moving (one read of the replica: the
/// record and the driver's lease as of the same entry).
pub fn move_of(registry: &Registry, tenant_id: &str) -> Option<Moving> {
    registry.read(|state| {
        let record = state.tenants.get(tenant_id)?;
        let TenantState::Moving { to, operation_id } = &record.state else {
            return None;
        };
        Some(Moving {
            operation_id: operation_id.clone(),
            epoch: record.epoch,
            from: record.home_region.clone(),
            to: to.clone(),
            driver_generation: state.drivers.get(operation_id).map(|l| l.generation),
        })
    })
}

/// The move of `op`'s tenant when it is `op` itself (the tenant still moving
/// under it).
pub fn move_running(registry: &Registry, op: &Operation) -> Option<Moving> {
    move_of(registry, &op.tenant_id).filter(|m| m.operation_id == op.operation_id)
}
