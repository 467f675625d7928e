//! What the local registry replica says runs: the one place the node asks
//! which move or failover is running for a tenant or a region, for the jobs
//! (lease, copies, failover driver, mover, reconciliation) and the routes
//! alike. Every answer is this replica's, as applied so far: a caller that
//! needs one at least as new as some entry waits for it first
//! (`Registry::wait_applied`, `Node::catch_up_registry`).
//!
//! Listing every operation for the admin API (`routes::moves`) is a view,
//! not a question of what runs, and stays with its route.

use crate::node::Node;
use keyhold_registry::{Operation, OperationKind, OperationState, TenantState};
use keyhold_store::LogTail;

/// The running failover of `region`, if any: while it runs, the region is
/// fenced (it renews no lease, its copies may be read for the import).
pub fn failover_from(node: &Node, region: &str) -> Option<Operation> {
    node.registry()
        .read(|state| state.failover_running_from(region).cloned())
}

/// The running failovers whose target is this node's region.
pub fn failovers_to_here(node: &Node) -> Vec<Operation> {
    node.registry().read(|state| {
        state
            .operations
            .values()
            .filter(|op| {
                op.kind == OperationKind::Failover
                    && !op.state.is_terminal()
                    && op.to == node.region()
            })
            .cloned()
            .collect()
    })
}

/// The state of `operation_id` when it is a failover to this node's region;
/// `None` for anything else.
pub fn failover_to_here(node: &Node, operation_id: &str) -> Option<OperationState> {
    node.registry().read(|state| {
        state
            .operations
            .get(operation_id)
            .filter(|op| op.kind == OperationKind::Failover && op.to == node.region())
            .map(|op| op.state)
    })
}

/// True when `operation_id` is a running failover from `region` to this
/// node's region.
pub fn failover_running(node: &Node, operation_id: &str, region: &str) -> bool {
    node.registry().read(|state| {
        state.operations.get(operation_id).is_some_and(|op| {
            op.kind == OperationKind::Failover
                && op.state == OperationState::Running
                && op.from == region
                && op.to == node.region()
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
pub fn failovers_done_from(node: &Node, region: &str) -> Vec<DoneFailover> {
    node.registry().read(|state| {
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

/// The move `tenant_id` is in, if it is moving.
pub fn move_of(node: &Node, tenant_id: &str) -> Option<Moving> {
    let record = node.registry().tenant(tenant_id)?;
    let TenantState::Moving { to, operation_id } = &record.state else {
        return None;
    };
    let driver_generation = node
        .registry()
        .read(|s| s.drivers.get(operation_id).map(|l| l.generation));
    Some(Moving {
        operation_id: operation_id.clone(),
        epoch: record.epoch,
        from: record.home_region.clone(),
        to: to.clone(),
        driver_generation,
    })
}

/// The move of `op`'s tenant when it is `op` itself (the tenant still moving
/// under it).
pub fn move_running(node: &Node, op: &Operation) -> Option<Moving> {
    move_of(node, &op.tenant_id).filter(|m| m.operation_id == op.operation_id)
}
