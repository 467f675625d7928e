//! When the home region's leader may give an answer, as its standby allows
//! (contract sections 10, "Survival per tenant", and 11, "Bounded loss" and
//! "Losing the standby"). Every write answer passes `hold` after its command
//! was applied, and so does a replay read straight from the store (it waits
//! for the entry that wrote the record), so a retry after a first attempt that
//! was refused here never acknowledges what the rule does not allow.
//!
//! - A `"zone"` tenant's answer waits until the standby's copies (a majority
//!   of the standby region's nodes, the learners of the region group,
//!   `standby.rs`) hold every command of the region older than
//!   `max_standby_lag`; so after any fault, a failover loses only what was
//!   acknowledged within `max_standby_lag` of the standby's last confirmation.
//!   While the registry records the standby lost (`standby_watch` below), zone
//!   answers do not wait: the region runs unprotected.
//! - A `"region"` tenant's answer waits until a majority of the standby's
//!   copies hold the entry that carried its command (openraft counts a
//!   member's match only once its log flushed the entry); it survives the loss
//!   of its whole home region with nothing lost, at the price of one
//!   inter-region round trip per write. While the standby is recorded lost,
//!   it is refused at once: such a tenant never runs unprotected.
//!
//! A wait is bounded (`STANDBY_LAG_WAIT_MS`, `SURVIVAL_WAIT_MS`); past it the
//! answer is 503 `standby-unreachable` with `Retry-After`: the command stays
//! executed, and a retry with the same key replays it once allowed.
//!
//! `standby_watch` runs on the region's leader: it asks the registry to record
//! the standby lost once it has confirmed nothing older than `max_standby_lag`
//! for `STANDBY_LOST_AFTER_MS`, and streaming again once it holds the whole
//! log. The registry decides: a region cut off from the registry majority
//! cannot record its standby lost, so it stays protected.

use crate::limits::{
    STANDBY_LAG_WAIT_MS, STANDBY_LOST_AFTER_MS, STANDBY_WATCH_MS, SURVIVAL_WAIT_MS,
};
use crate::node::{now, Node};
use crate::problem::ApiError;
use crate::tenants::Tenant;
use keyhold_core::Problem;
use keyhold_registry::standbys::StandbyState;
use keyhold_registry::{NodeId, Request, Survival};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Returns once the answer the entry at `index` carries may be given for
/// `tenant` (see the module docs), or 503 `standby-unreachable`.
pub async fn hold(node: &Node, tenant: &Tenant, index: u64) -> Result<(), ApiError> {
    let (survival, standby_state) = node.registry().read(|s| {
        (
            s.survival_of(tenant.id().as_str()),
            s.standby_state(node.region()),
        )
    });
    let Some(standby) = node.config().standbys.get(node.region()) else {
        if survival != Survival::Region {
            return Ok(());
        }
        // Refused at creation; a configuration that dropped the standby since
        // cannot keep the promise, so it does not acknowledge.
        metrics::counter!("keyhold_survival_waits_total", "outcome" => "no_standby").increment(1);
        return Err(ApiError::new(Problem::StandbyUnreachable).detail(format!(
            "tenant {} survives the loss of its region, but region {} has no standby",
            tenant.id().as_str(),
            node.region()
        )));
    };
    let replicas = standby_replicas(node, standby);
    match (survival, standby_state) {
        (Survival::Region, StandbyState::Lost { .. }) => {
            metrics::counter!("keyhold_survival_waits_total", "outcome" => "standby_lost")
                .increment(1);
            Err(ApiError::new(Problem::StandbyUnreachable).detail(format!(
                "executed, but standby region {standby} is recorded lost, and this tenant \
                 survives the loss of its region: a retry with the same key answers once the \
                 standby streams again"
            )))
        }
        (Survival::Region, StandbyState::Streaming) => {
            hold_region_tenant(node, tenant, standby, &replicas, index).await
        }
        (Survival::Zone, StandbyState::Lost { .. }) => Ok(()),
        (Survival::Zone, StandbyState::Streaming) => {
            hold_zone_tenant(node, standby, &replicas).await
        }
    }
}

/// The ids of `standby`'s nodes, the copies a region's leader counts.
fn standby_replicas(node: &Node, standby: &str) -> Vec<NodeId> {
    node.region_nodes(standby)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

async fn hold_zone_tenant(node: &Node, standby: &str, replicas: &[NodeId]) -> Result<(), ApiError> {
    if replicas.is_empty() {
        // A standby region without nodes holds no copy to wait for.
        return Ok(());
    }
    let group = node.store().group();
    let max_lag = node.config().max_standby_lag;
    if group.standby_confirms_within(replicas, max_lag) {
        return Ok(());
    }
    let started = Instant::now();
    let held = group
        .wait_standby_confirms_within(
            replicas,
            max_lag,
            Duration::from_millis(STANDBY_LAG_WAIT_MS),
        )
        .await;
    metrics::histogram!("keyhold_standby_lag_wait_seconds").record(started.elapsed().as_secs_f64());
    let outcome = if held { "held" } else { "timed_out" };
    metrics::counter!("keyhold_standby_lag_waits_total", "outcome" => outcome).increment(1);
    if held {
        return Ok(());
    }
    Err(ApiError::new(Problem::StandbyUnreachable).detail(format!(
        "executed, but standby region {standby} has not confirmed this region's commands older \
         than max_standby_lag ({} ms); a retry with the same key answers once it does, or once \
         the registry records it lost",
        max_lag.as_millis()
    )))
}

async fn hold_region_tenant(
    node: &Node,
    tenant: &Tenant,
    standby: &str,
    replicas: &[NodeId],
    index: u64,
) -> Result<(), ApiError> {
    let group = node.store().group();
    // A value migrated from storage format 1 carries an old batch number that may
    // exceed the log's indexes; everything it holds is in the log up to the end.
    let last = group.raft().metrics().borrow().last_log_index.unwrap_or(0);
    let index = index.min(last);
    let started = Instant::now();
    let held = group
        .wait_matched(replicas, index, Duration::from_millis(SURVIVAL_WAIT_MS))
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
    Err(ApiError::new(Problem::StandbyUnreachable).detail(format!(
        "executed, but standby region {standby} does not hold it yet; \
         a retry with the same key answers once it does"
    )))
}

/// Until `stop`: on the region's leader, every `STANDBY_WATCH_MS`, records the
/// standby lost in the registry once it has confirmed nothing older than
/// `max_standby_lag` for `STANDBY_LOST_AFTER_MS`, and streaming again once a
/// majority of its copies hold the whole log.
pub async fn standby_watch(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let Some(standby) = node.config().standbys.get(node.region()).cloned() else {
        return;
    };
    let mut ticker = crate::Ticker::new(Duration::from_millis(STANDBY_WATCH_MS), stop);
    // Since when the standby has not confirmed within the lag, as this leader saw it.
    let mut behind_since: Option<Instant> = None;
    while ticker.tick().await {
        if !node.leads_region() {
            behind_since = None;
            continue;
        }
        let replicas = standby_replicas(&node, &standby);
        if replicas.is_empty() {
            continue;
        }
        let state = node.registry().read(|s| s.standby_state(node.region()));
        let group = node.store().group();
        let confirmed = group.standby_confirms_within(&replicas, node.config().max_standby_lag);
        metrics::gauge!("keyhold_standby_lost").set(match state {
            StandbyState::Lost { .. } => 1.0,
            StandbyState::Streaming => 0.0,
        });
        match state {
            StandbyState::Streaming if confirmed => behind_since = None,
            StandbyState::Streaming => {
                let since = *behind_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(STANDBY_LOST_AFTER_MS) {
                    record(
                        &node,
                        Request::MarkStandbyLost {
                            region: node.region().to_owned(),
                            now_ms: now().0,
                        },
                    )
                    .await;
                }
            }
            StandbyState::Lost { .. } => {
                behind_since = None;
                if group.standby_caught_up(&replicas, node.config().max_standby_lag) {
                    record(
                        &node,
                        Request::MarkStandbyStreaming {
                            region: node.region().to_owned(),
                        },
                    )
                    .await;
                }
            }
        }
    }
}

async fn record(node: &Node, request: Request) {
    let what = request.to_string();
    match node.registry().write(request).await {
        Ok(written) if written.response.rejection().is_none() => {
            tracing::warn!(region = %node.region(), change = %what, "standby state recorded");
        }
        Ok(written) => {
            tracing::warn!(change = %what, answer = ?written.response, "standby state refused")
        }
        Err(e) => tracing::warn!(change = %what, error = %e, "standby state not recorded yet"),
    }
}
