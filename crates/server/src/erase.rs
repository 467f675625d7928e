//! Erasure of deleted tenants. A deletion is one registry write (a tombstone);
//! this task, on every region's store node, notices tombstones its region has
//! not erased yet, deletes the tenant's records, markers, orders and pending
//! outbox events from the local store in bounded pages (`Command::EraseTenant`),
//! then reports `TenantErased` to the registry. Driven by the replicated
//! tombstone rather than by the node that took the request, a region that was
//! down during the deletion erases when it comes back.

use crate::limits::ERASE_RETRY_MS;
use crate::node::Node;
use keyhold_core::TenantId;
use keyhold_registry::{Request, TenantState};
use keyhold_store::limits::ERASE_ENTRIES_MAX;
use keyhold_store::EraseOutcome;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Runs until `stop`: after every registry change (and every `ERASE_RETRY_MS`
/// while something is left), erases what this region still holds.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let retry = Duration::from_millis(ERASE_RETRY_MS);
    crate::on_registry_change(node, stop, retry, |node| async move {
        erase_pending(&node).await
    })
    .await;
}

/// Erases every deleted tenant this region has not reported; true when none is
/// left (false: try again later).
async fn erase_pending(node: &Node) -> bool {
    let region = node.region().to_owned();
    // The region store's leader erases; a follower looks again later, so that
    // after a change of leader the new one finishes what is left (erasure is
    // idempotent).
    if !node.leads_region() {
        return false;
    }
    let pending: Vec<String> = node.registry().read(|state| {
        state
            .tenants
            .values()
            .filter(|t| {
                matches!(&t.state, TenantState::Deleted { erased_in, .. } if !erased_in.contains(&region))
            })
            .map(|t| t.tenant_id.clone())
            .collect()
    });
    let mut settled = true;
    for tenant_id in pending {
        if let Err(e) = erase(node, &tenant_id, &region).await {
            tracing::warn!(tenant = %tenant_id, error = %e, "tenant erasure incomplete; will retry");
            settled = false;
        }
    }
    settled
}

async fn erase(node: &Node, tenant_id: &str, region: &str) -> Result<(), String> {
    let tenant = TenantId::parse(tenant_id).map_err(|e| e.to_string())?;
    let mut erased = 0;
    loop {
        let consumers = crate::downstream::consumers(node);
        let erasure =
            node.store()
                .erase_tenant(tenant.clone(), ERASE_ENTRIES_MAX as u32, consumers);
        match erasure.await {
            Ok(EraseOutcome { entries, more }) => {
                erased += entries;
                if !more {
                    break;
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    node.registry()
        .write(Request::TenantErased {
            tenant_id: tenant_id.to_owned(),
            region: region.to_owned(),
        })
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(tenant = %tenant_id, region, erased, "deleted tenant erased");
    Ok(())
}
