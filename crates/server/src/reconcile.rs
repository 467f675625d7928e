//! Return and reconciliation of a region after a failover away from it.
//!
//! A failover re-homes every tenant of region r in `to` from the standby's copy
//! of r's log up to a position. When r comes back (restarted or healed) its
//! store still holds what it applied beyond the copy for those tenants: the
//! acknowledged orders and claims the failover lost. "Beyond the copy" is
//! above the *cut*, `at` below (`Store::failover_cut`): the last index up to
//! which the copy holds the same entries as r. That is the copy's position
//! unless a leader the copy never heard from wrote r's entries at indexes
//! where the copy holds a deposed leader's unconfirmed ones: r's entries
//! there are not in the copy, whatever their index. r already forwards the
//! tenants (the registry homes them in `to` at a higher epoch). This task, on
//! r's region leader, works off every done failover from r that r's store has
//! not reconciled, each step safe to repeat (a new leader starts over):
//!
//! 1. fence each lost tenant in r's store under the failover's operation id
//!    (through the apply loop: from then on nothing of theirs can change here,
//!    so the orphans read next are final even on a stale registry replica);
//! 2. mark each tenant lost at `at` (`MarkLost`): from then on r's consumers
//!    take no new effect for an event of theirs written before the mark. One
//!    the copy held (written at or below `at`) was carried to `to`, which
//!    delivers it; reserving or charging it here too would be a second effect
//!    (a second reservation in r's ledger, a second charge wherever the
//!    provider's key dedupe does not reach: another provider account, a key
//!    retention shorter than r's absence). One written above `at` is an
//!    orphan's: its order exists nowhere any more, and a person compensates
//!    it from the report, so nothing is reserved or charged for it now; its
//!    payment is only looked up at the provider by its key, so `charged`
//!    says whether an attempt before the loss went through. Until the mark
//!    the relays hold the tenants' events back (`unmarked_losses`; the relay
//!    runs only under the region lease, so the registry replica it reads
//!    knows the failover);
//! 3. wait until this region's consumers have settled the tenants' outbox
//!    events (so `charged` is final: a charge in flight when r went down is
//!    found by its key and put on the order), then read the orphans
//!    (of the zone-survival tenants: a region-survival tenant's suffix was
//!    never acknowledged) (`Store::orphans`: records stamped above `at`) and ask
//!    the tenant's new home, from its business markers, which orders it holds
//!    under the orphans' client order ids (`duplicate_of`: a client's retry
//!    created the order again there);
//! 4. store the report by commands of r's log (its orphans in pages, then the
//!    report listing them, `Store::record_reconciliation`: a full report is
//!    larger than a log entry; the first one stays, so a leader that starts
//!    over after the erasure began cannot replace it with a shorter one);
//! 5. release the reservations r made twice: r's relays stop only with its
//!    lease, so in an isolation's last moments they may handle an event the
//!    copy holds after the last entry the copy received; the copy carried it
//!    unhandled and `to` reserved it too. Those reservations of r's (an event
//!    at or below `at`, handled above it) go (`ReleaseCarriedReservations`,
//!    in pages; the payment is one charge by the event's key);
//! 6. erase everything of the lost tenants from r's store with the deleted
//!    tenants' erasure (`EraseTenant`, in pages): the tenants live in `to` now,
//!    and a planned move back must start from an empty store;
//! 7. mark the report done (`FinishReconciliation`).
//!
//! Until the report is done, r's store refuses to import those tenants
//! (`import_blocked`): a move back that began before the erasure would have its
//! copy erased, or stale entries left beside it.

use crate::limits::{RECONCILE_MARKER_IDS_MAX, RECONCILE_RETRY_MS};
use crate::node::Node;
use crate::operations::DoneFailover;
use crate::peers::{Call, CallKind, To};
use keyhold_core::TenantId;
use keyhold_registry::Survival;
use keyhold_store::limits::ERASE_ENTRIES_MAX;
use keyhold_store::{GuardOutcome, OrphanKind, Reconciliation};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The body of the new home's marker lookup (`routes::reconcile::markers`).
#[derive(Debug, Serialize, Deserialize)]
pub struct MarkerQuery {
    pub client_order_ids: Vec<String>,
}

/// Its answer: per client order id, the order the new home holds, or null.
#[derive(Debug, Serialize, Deserialize)]
pub struct MarkerAnswer {
    pub orders: BTreeMap<String, Option<String>>,
}

/// Runs until `stop`: after every registry change (and every
/// `RECONCILE_RETRY_MS` while something is left), reconciles what this region
/// has not.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let retry = Duration::from_millis(RECONCILE_RETRY_MS);
    crate::on_registry_change(node, stop, retry, |node| async move {
        reconcile_pending(&node).await
    })
    .await;
}

/// Reconciles every done failover from this region that its store has not;
/// true when none is left (false: try again later).
async fn reconcile_pending(node: &Node) -> bool {
    // The region store's leader reconciles; a follower looks again later, so
    // that after a change of leader the new one finishes (every step repeats).
    if !node.leads_region() {
        return false;
    }
    let mut settled = true;
    for failover in crate::operations::failovers_done_from(node.registry(), node.region()) {
        match node.store().reconciliation(&failover.operation_id) {
            Ok(Some(report)) if report.done => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the reconciliation report");
                settled = false;
                continue;
            }
        }
        if let Err(e) = reconcile(node, &failover).await {
            tracing::warn!(operation = %failover.operation_id, error = %e, "reconciliation incomplete; will retry");
            settled = false;
        }
    }
    settled
}

async fn reconcile(node: &Node, failover: &DoneFailover) -> Result<(), String> {
    let store = node.store();
    let op = &failover.operation_id;
    let mut tenants = Vec::with_capacity(failover.tenants.len());
    for id in &failover.tenants {
        tenants.push(TenantId::parse(id).map_err(|e| format!("tenant {id:?}: {e}"))?);
    }
    let recorded = store.reconciliation(op).map_err(|e| e.to_string())?;
    if recorded.is_none() {
        for tenant in &tenants {
            fence(node, tenant, op).await?;
        }
    }
    // After the fences: every record of the lost tenants precedes them, so
    // every pass finds the same cut for them.
    let at = match &recorded {
        Some(report) => report.at,
        None => store
            .failover_cut(&failover.tail)
            .map_err(|e| e.to_string())?,
    };
    if at < failover.tail.last {
        tracing::warn!(
            operation = %op, position = failover.tail.last, cut = at,
            "the promoted copy's last entries are not this region's: its records from the cut on are orphans"
        );
    }
    // Behind the fence nothing of theirs is written here any more: every
    // event of theirs in this outbox is before the mark, and this region's
    // consumers settle each without an effect (`Disposition`). Until the
    // mark the relays hold those events back (`unmarked_losses`).
    for tenant in &tenants {
        store
            .mark_lost(tenant.clone(), op.clone(), at)
            .await
            .map_err(|e| e.to_string())?;
    }
    let report = match recorded {
        Some(report) => report,
        None => {
            for tenant in &tenants {
                events_settled(node, tenant).await?;
            }
            // A region-survival tenant's answers wait until its standby holds
            // the command, so the promoted copy (the best one) holds all it
            // acknowledged: what this region wrote for it after `at` was never
            // acknowledged, and is no orphan. Its data is erased all the same.
            let acknowledged_only_here: Vec<TenantId> = node.registry().read(|state| {
                tenants
                    .iter()
                    .filter(|t| state.survival_of(t.as_str()) != Survival::Region)
                    .cloned()
                    .collect()
            });
            let (mut orphans, omitted) = store
                .orphans(&acknowledged_only_here, at)
                .map_err(|e| e.to_string())?;
            find_duplicates(node, &mut orphans).await?;
            let computed = Reconciliation {
                operation_id: op.clone(),
                at,
                tenants: tenants.clone(),
                orphans,
                omitted,
                done: false,
            };
            let stored = store
                .record_reconciliation(computed.clone())
                .await
                .map_err(|e| e.to_string())?;
            if stored == computed {
                let found = stored.orphans.len() as u64 + stored.omitted;
                metrics::counter!("keyhold_reconciliation_orphans_total").increment(found);
                tracing::info!(operation = %op, at, orphans = found, "failover reconciled: orphans recorded");
            }
            stored
        }
    };
    for tenant in &report.tenants {
        release_carried(node, tenant, op).await?;
        erase(node, tenant).await?;
    }
    store
        .finish_reconciliation(op.clone())
        .await
        .map_err(|e| e.to_string())?;
    metrics::counter!("keyhold_reconciliations_done_total").increment(1);
    tracing::info!(operation = %op, tenants = report.tenants.len(), "failover reconciled: the lost tenants' data is erased");
    Ok(())
}

/// Fences `tenant` in this store under the failover: nothing of theirs executes
/// here again (the registry already places them elsewhere; this holds even on a
/// replica that lags). The fence's epoch is one below the tenant's epoch now, so
/// a planned move back (at that epoch or later) imports over it. A guard that
/// already stops execution (a move's fence when the failover came) stays.
async fn fence(node: &Node, tenant: &TenantId, operation_id: &str) -> Result<(), String> {
    let store = node.store();
    let current = store.guard(tenant).map_err(|e| e.to_string())?;
    if current.as_ref().is_some_and(|g| !g.executes()) {
        return Ok(());
    }
    let Some(record) = node.registry().tenant(tenant.as_str()) else {
        return Ok(());
    };
    let epoch = record.epoch.saturating_sub(1);
    let outcome = store
        .fence(tenant.clone(), operation_id.to_owned(), epoch)
        .await
        .map_err(|e| e.to_string())?;
    match outcome {
        GuardOutcome::Accepted { .. } => Ok(()),
        // Owned at a later epoch: this region owns the tenant again (moved
        // back), which the import block rules out before reconciliation.
        GuardOutcome::Refused { current } => Err(format!(
            "tenant {} not fenced: the store's guard is {current:?}",
            tenant.as_str()
        )),
        // Only an import answers it, never a fence.
        GuardOutcome::Superseded { generation } => Err(format!(
            "tenant {} not fenced: imported by a driver of generation {generation}",
            tenant.as_str()
        )),
    }
}

/// Ok once every consumer of this region has handled `tenant`'s newest outbox
/// event, so the orders' payment results (`charged`) are final; else the pass
/// is tried again later (a payment provider that is down keeps the report
/// pending). Nothing new of the tenant's enters the outbox behind the fence.
async fn events_settled(node: &Node, tenant: &TenantId) -> Result<(), String> {
    let store = node.store();
    let head = store
        .tenant_last_event_seq(tenant)
        .map_err(|e| e.to_string())?;
    for consumer in crate::downstream::consumers(node) {
        let cursor = store.cursor(consumer).await.map_err(|e| e.to_string())?;
        if cursor < head {
            return Err(format!(
                "consumer {consumer} has not handled tenant {}'s events yet ({cursor} < {head})",
                tenant.as_str()
            ));
        }
    }
    Ok(())
}

/// Fills `duplicate_of` of every orphan order with a client order id, asking
/// each tenant's new home (by the registry replica) in batches.
async fn find_duplicates(node: &Node, orphans: &mut [keyhold_store::Orphan]) -> Result<(), String> {
    let mut wanted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for orphan in orphans.iter() {
        if let (OrphanKind::Order, Some(coid)) = (orphan.kind, &orphan.client_order_id) {
            wanted
                .entry(orphan.tenant_id.as_str().to_owned())
                .or_default()
                .push(coid.clone());
        }
    }
    let mut found: BTreeMap<(String, String), String> = BTreeMap::new();
    for (tenant_id, ids) in wanted {
        // A tenant the registry no longer knows has no new home to ask.
        let Some(record) = node.registry().tenant(&tenant_id) else {
            continue;
        };
        for chunk in ids.chunks(RECONCILE_MARKER_IDS_MAX) {
            let answer = ask_markers(node, &record.home_region, &tenant_id, chunk).await?;
            for (coid, order_id) in answer.orders {
                if let Some(order_id) = order_id {
                    found.insert((tenant_id.clone(), coid), order_id);
                }
            }
        }
    }
    for orphan in orphans.iter_mut() {
        if let Some(coid) = &orphan.client_order_id {
            let key = (orphan.tenant_id.as_str().to_owned(), coid.clone());
            // The orphan itself never reached the new home, so an order there
            // under its client order id is another order.
            orphan.duplicate_of = found
                .get(&key)
                .filter(|id| orphan.order_id.as_ref() != Some(*id))
                .cloned();
        }
    }
    Ok(())
}

async fn ask_markers(
    node: &Node,
    region: &str,
    tenant_id: &str,
    client_order_ids: &[String],
) -> Result<MarkerAnswer, String> {
    let query = MarkerQuery {
        client_order_ids: client_order_ids.to_vec(),
    };
    let path = format!("/internal/v1/reconcile/{tenant_id}/markers");
    let call = Call::post(CallKind::ReconcileMarkers, path).json(&query);
    node.peers()
        .call_json(To::Region(region), &call)
        .await
        .map_err(|e| format!("the marker lookup: {e}"))
}

/// Releases, page by page, the inventory reservations this region made for
/// `tenant` after the copy's position for events the copy held: the new home
/// made them again (`ReleaseCarriedReservations`). Only an isolation's last
/// moments leave any: the region's relays stop with its lease.
async fn release_carried(node: &Node, tenant: &TenantId, operation_id: &str) -> Result<(), String> {
    loop {
        let released = node
            .store()
            .release_carried_reservations(
                tenant.clone(),
                operation_id.to_owned(),
                ERASE_ENTRIES_MAX as u32,
            )
            .await
            .map_err(|e| e.to_string())?;
        metrics::counter!("keyhold_reconciliation_reservations_released_total")
            .increment(released.entries);
        if !released.more {
            return Ok(());
        }
    }
}

/// Erases everything of `tenant` from this store, page by page, unless the
/// registry places it here again (then its data here is the live one).
async fn erase(node: &Node, tenant: &TenantId) -> Result<(), String> {
    let homed_here = node
        .registry()
        .tenant(tenant.as_str())
        .is_some_and(|r| r.home_region == node.region());
    if homed_here {
        return Err(format!(
            "tenant {} is homed here again before its stale data was erased",
            tenant.as_str()
        ));
    }
    loop {
        let consumers = crate::downstream::consumers(node);
        let erased = node
            .store()
            .erase_tenant(tenant.clone(), ERASE_ENTRIES_MAX as u32, consumers)
            .await
            .map_err(|e| e.to_string())?;
        if !erased.more {
            return Ok(());
        }
    }
}

/// The tenants a done failover took away from this region whose loss this
/// store has not marked yet (`Command::MarkLost`), while that failover's
/// reconciliation is not done: the relays deliver none of their events until
/// the mark says whose each one is. (Once a reconciliation is done, the lost
/// tenants' undelivered events are erased, and any later event of theirs is
/// this region's again after a move back.)
pub fn unmarked_losses(node: &Node) -> Result<HashSet<String>, String> {
    let store = node.store();
    let mut out = HashSet::new();
    for failover in crate::operations::failovers_done_from(node.registry(), node.region()) {
        let done = store
            .reconciliation(&failover.operation_id)
            .map_err(|e| e.to_string())?
            .is_some_and(|r| r.done);
        if done {
            continue;
        }
        for id in failover.tenants {
            let tenant = TenantId::parse(&id).map_err(|e| format!("tenant {id:?}: {e}"))?;
            let marked = store
                .lost_marked(&tenant, &failover.operation_id)
                .map_err(|e| e.to_string())?;
            if !marked {
                out.insert(id);
            }
        }
    }
    Ok(out)
}

/// Why this store must not import `tenant_id` yet (a move back into this
/// region), or `None`: a failover from this region re-homed the tenant, and its
/// stale data here is not erased yet. The move's import fails and the move is
/// aborted with this reason; once reconciliation is done it can be started again.
pub fn import_blocked(node: &Node, tenant_id: &str) -> Option<String> {
    for failover in crate::operations::failovers_done_from(node.registry(), node.region()) {
        if !failover.tenants.iter().any(|t| t == tenant_id) {
            continue;
        }
        let done = node
            .store()
            .reconciliation(&failover.operation_id)
            .ok()
            .flatten()
            .is_some_and(|r| r.done);
        if !done {
            return Some(format!(
                "region {} has not reconciled failover {} yet; move the tenant back once \
                 GET /admin/v1/regions/{}/reconciliation is done",
                node.region(),
                failover.operation_id,
                node.region()
            ));
        }
    }
    None
}

/// The contract's view of one stored report.
pub fn view(report: Option<&Reconciliation>, operation_id: &str) -> serde_json::Value {
    let Some(report) = report else {
        return serde_json::json!({
            "state": "pending",
            "failover_operation_id": operation_id,
            "orphans": [],
        });
    };
    let orphans: Vec<serde_json::Value> = report
        .orphans
        .iter()
        .map(|o| {
            serde_json::json!({
                "tenant_id": o.tenant_id.as_str(),
                "kind": o.kind.as_str(),
                "idempotency_key": o.idempotency_key,
                "order_id": o.order_id,
                "client_order_id": o.client_order_id,
                "created_at": o.created_at.to_rfc3339(),
                "charged": o.charged,
                "duplicate_of": o.duplicate_of,
            })
        })
        .collect();
    let mut out = serde_json::json!({
        "state": if report.done { "done" } else { "pending" },
        "failover_operation_id": report.operation_id,
        "at": report.at,
        "orphans": orphans,
    });
    if report.omitted > 0 {
        out["orphans_omitted"] = report.omitted.into();
    }
    out
}
