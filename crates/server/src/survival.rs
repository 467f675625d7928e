//! Region survival (contract section 10, "Survival per tenant"): a tenant created
//! with `"survival": "region"` is answered only once its home region's standby
//! also holds, durably, the log entry its answer comes from. It then survives the
//! loss of its whole home region with nothing lost, at the price of one
//! inter-region round trip per write.
//!
//! On the home region's leader, after a command: a majority of the standby
//! region's nodes (the learners of the region group, `standby.rs`) must have
//! matched at least the index of the entry that carried the command (openraft
//! counts a member's match only once its log flushed the entry). A replay read
//! straight from the store waits for the entry that wrote the record, so a retry
//! after a first attempt that timed out here never acknowledges what the standby
//! lacks. The wait is bounded by `SURVIVAL_WAIT_MS`; past it the answer is 503
//! `store-unavailable` with `Retry-After`: the command stays executed, and a
//! retry with the same key replays it once the standby has it. A `"zone"`
//! tenant never waits.

use crate::limits::SURVIVAL_WAIT_MS;
use crate::node::Node;
use crate::problem::ApiError;
use crate::tenants::Tenant;
use keyhold_core::Problem;
use keyhold_registry::Survival;
use std::time::{Duration, Instant};

/// Returns once the answer the entry at `index` carries may be given for
/// `tenant`: at once for a zone tenant; for a region tenant once the standby
/// holds the entry, or 503 `store-unavailable` when it does not within
/// `SURVIVAL_WAIT_MS`.
pub async fn hold(node: &Node, tenant: &Tenant, index: u64) -> Result<(), ApiError> {
    let survival = node
        .registry()
        .read(|s| s.survival_of(tenant.id().as_str()));
    if survival != Survival::Region {
        return Ok(());
    }
    let Some(standby) = node.config().standbys.get(node.region()) else {
        // Refused at creation; a configuration that dropped the standby since
        // cannot keep the promise, so it does not acknowledge.
        metrics::counter!("keyhold_survival_waits_total", "outcome" => "no_standby").increment(1);
        return Err(ApiError::new(Problem::StoreUnavailable).detail(format!(
            "tenant {} survives the loss of its region, but region {} has no standby",
            tenant.id().as_str(),
            node.region()
        )));
    };
    let group = node.store().group();
    // A value migrated from storage format 1 carries an old batch number that may
    // exceed the log's indexes; everything it holds is in the log up to the end.
    let last = group.raft().metrics().borrow().last_log_index.unwrap_or(0);
    let index = index.min(last);
    let replicas: Vec<_> = node
        .region_nodes(standby)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let started = Instant::now();
    let held = group
        .wait_matched(&replicas, index, Duration::from_millis(SURVIVAL_WAIT_MS))
        .await;
    metrics::histogram!("keyhold_survival_wait_seconds").record(started.elapsed().as_secs_f64());
    let outcome = if held { "held" } else { "timed_out" };
    metrics::counter!("keyhold_survival_waits_total", "outcome" => outcome).increment(1);
    if held {
        return Ok(());
    }
    tracing::warn!(
        tenant = %tenant.id().as_str(),
        index,
        standby,
        "the standby did not hold a region-survival command in time"
    );
    Err(ApiError::new(Problem::StoreUnavailable).detail(format!(
        "executed, but standby region {standby} does not hold it yet; \
         a retry with the same key answers once it does"
    )))
}
