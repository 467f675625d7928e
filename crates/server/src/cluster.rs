//! The node's side of the registry: creating the group on first start, and
//! keeping the tenant directory in step with the local replica.

use crate::limits::{MOVE_PRUNE_ENTRIES_MAX, READY_QUORUM_ACK_MS_MAX, REGISTRY_BOOTSTRAP_WAIT_MS};
use crate::node::{now, Node, Placement};
use keyhold_registry::{NodeInfo, OperationState, Request, TenantState};
use keyhold_store::limits::ERASE_ENTRIES_MAX;
use keyhold_store::{EraseOutcome, TenantGuard};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The registry's first voters: the configured members, or this node alone.
pub fn members(node: &Node) -> BTreeMap<u64, NodeInfo> {
    let config = node.config();
    if config.members.is_empty() {
        return [(config.node_id, node.registry().node().clone())].into();
    }
    config
        .members
        .iter()
        .map(|m| {
            (
                m.id,
                NodeInfo::new(m.region.clone(), m.api_addr.clone(), m.raft_addr.clone()),
            )
        })
        .collect()
}

/// On the member with the lowest id: creates the registry group (a no-op when it
/// exists) and registers every configured region. Other members only wait to be
/// reached by the leader. Retries until done or `REGISTRY_BOOTSTRAP_WAIT_MS`.
pub async fn bootstrap(node: Arc<Node>) {
    let members = members(&node);
    let first = members.keys().next().copied();
    // A joining node (a replacement, even of the first member) never creates
    // the registry: it is added to the existing one.
    if first != Some(node.config().node_id) || node.config().start == crate::config::Start::Join {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(REGISTRY_BOOTSTRAP_WAIT_MS);
    while let Err(e) = node.registry().initialize(members.clone()).await {
        if Instant::now() > deadline {
            tracing::error!(error = %e, "registry initialize failed; giving up");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for region in &node.config().regions {
        let known = node.registry().regions().iter().any(|r| &r.name == region);
        if known {
            continue;
        }
        loop {
            let request = Request::AddRegion {
                name: region.clone(),
                now_ms: now().0,
            };
            match node.registry().write(request).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "waiting for a registry leader");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, region, "cannot register region; giving up");
                    return;
                }
            }
        }
    }
    tracing::debug!("registry bootstrapped");
}

/// Rebuilds the tenant directory whenever the local replica applies an entry,
/// and lets the store own the tenants the registry gives this region.
pub async fn follow_registry(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    let mut applied = node.registry().subscribe();
    loop {
        node.refresh_tenants();
        // The region store's leader keeps its guards and change indexes in step;
        // `upkeep_on_leadership` does the same when a node becomes leader.
        if node.leads_region() {
            reconcile_guards(&node).await;
            end_tracking(&node).await;
        }
        tokio::select! {
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Each time this node becomes its region store's leader, it brings the
/// store's guards and change indexes in step with the registry once, as
/// `follow_registry` does after every registry entry: a fence lifted or a
/// change index pruned by nobody while the old leader went down is not left
/// behind.
pub async fn upkeep_on_leadership(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    loop {
        if !node.wait_to_lead_region(&mut stop).await {
            return;
        }
        reconcile_guards(&node).await;
        end_tracking(&node).await;
        if !node.wait_to_leave_region(&mut stop).await {
            return;
        }
    }
}

/// The store lifts its own fences: every guard that does not execute (a fence,
/// an import) gives way once the registry replica shows this region owning the
/// tenant at a later epoch (the move was aborted, or completed towards here),
/// and a failover's import at the epoch the done failover gave it. A failed
/// failover's import is erased instead (`abandon_import`).
/// Runs at start and after every applied registry entry, so a node that was
/// down when a move ended lifts the fence as soon as it is back.
async fn reconcile_guards(node: &Node) {
    let guards = match node.store().guards() {
        Ok(guards) => guards,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the store's tenant guards");
            return;
        }
    };
    for (tenant, guard) in guards {
        if guard.executes() {
            continue;
        }
        if let TenantGuard::Importing { operation_id, .. } = &guard {
            if crate::operations::failover_to(node.registry(), operation_id, node.region())
                == Some(OperationState::Failed)
            {
                abandon_import(node, &tenant, operation_id).await;
                continue;
            }
        }
        let Some(record) = node.registry().tenant(tenant.as_str()) else {
            continue;
        };
        if node.placement(&record) != Placement::Local || record.epoch < guard.epoch() {
            continue;
        }
        // At the guard's own epoch only a failover's import gives way (a
        // failover imports at the epoch its completion gives; a move below).
        let failover_import = matches!(&guard, TenantGuard::Importing { operation_id, .. }
            if crate::operations::failover_to(node.registry(), operation_id, node.region()) == Some(OperationState::Done));
        if record.epoch == guard.epoch() && !failover_import {
            continue;
        }
        if let Err(e) = node.ensure_owned(&tenant, record.epoch).await {
            tracing::warn!(tenant = %tenant.as_str(), error = %e, "fence not lifted yet");
        }
    }
}

/// The failover that imported `tenant` here failed (the tenant stays in the
/// region that was to be failed over): this store erases what it imported
/// and drops the failover's guard, page by page, so a later failover or move
/// of the tenant to this region starts clean (its guard would otherwise
/// refuse them: a failover imports at the epoch its completion would have
/// given, and a failed one gives none).
async fn abandon_import(node: &Node, tenant: &keyhold_core::TenantId, operation_id: &str) {
    let consumers = crate::downstream::consumers(node);
    loop {
        let page = node.store().abandon_import(
            tenant.clone(),
            operation_id.to_owned(),
            ERASE_ENTRIES_MAX as u32,
            consumers.clone(),
        );
        match page.await {
            Ok(EraseOutcome { more: true, .. }) => continue,
            Ok(_) => {
                metrics::counter!("keyhold_failover_imports_abandoned_total").increment(1);
                tracing::info!(tenant = %tenant.as_str(), operation_id, "a failed failover's import erased");
                return;
            }
            Err(e) => {
                tracing::warn!(tenant = %tenant.as_str(), error = %e, "failed failover's import not erased yet");
                return;
            }
        }
    }
}

/// A store stops tracking a tenant's changes, and prunes its change index,
/// once the registry replica no longer shows the move that started it running
/// (done, aborted, or the tenant gone). Runs at start and after every applied
/// registry entry, like `reconcile_guards`.
async fn end_tracking(node: &Node) {
    let tracked = match node.store().tracked_tenants() {
        Ok(tracked) => tracked,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the store's tracked tenants");
            return;
        }
    };
    for (tenant, tracking) in tracked {
        let running = node.registry().tenant(tenant.as_str()).is_some_and(|r| {
            matches!(&r.state, TenantState::Moving { operation_id, .. } if *operation_id == tracking.operation_id)
        });
        if running {
            continue;
        }
        loop {
            let operation_id = tracking.operation_id.clone();
            let pruned =
                node.store()
                    .end_tracking(tenant.clone(), operation_id, MOVE_PRUNE_ENTRIES_MAX);
            match pruned.await {
                Ok(EraseOutcome { more: true, .. }) => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(tenant = %tenant.as_str(), error = %e, "change index not pruned yet");
                    break;
                }
            }
        }
    }
}

/// True once this replica knows a live leader and every configured region. A
/// leader counts as live for itself only while a quorum acknowledged it within
/// `READY_QUORUM_ACK_MS_MAX`: openraft keeps a leader cut off from every other
/// voter in place, but it can no longer commit anything.
pub fn is_ready(node: &Node) -> bool {
    let registry = node.registry();
    let metrics = registry.metrics();
    let leader_live = match metrics.current_leader {
        None => false,
        Some(leader) if leader == metrics.id => metrics
            .millis_since_quorum_ack
            .is_some_and(|ms| ms <= READY_QUORUM_ACK_MS_MAX),
        Some(_) => true,
    };
    let regions = registry.regions();
    leader_live
        && node
            .config()
            .regions
            .iter()
            .all(|r| regions.iter().any(|k| &k.name == r))
}
