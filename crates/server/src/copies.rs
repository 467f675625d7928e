//! The standby copies a node keeps (`node::StandbyCopy`), on the standby's
//! side: what each copy knows of its own lag, and the reset of a copy that a
//! failover promoted.
//!
//! **Lag.** Every `STANDBY_CHECK_MS`, each copy asks its region's leader for the
//! standby's lag (`standby::lag_of_region`) and keeps the last answer: once the
//! region has failed, that is the best estimate of what a failover from the
//! copy loses (`GET /internal/v1/failover/{r}/copy` reports it).
//!
//! **Reset.** A promoted copy (`Store::promote`) applied entries its region may
//! never have committed and took no part in its group since: it must not stay
//! there with a log that may disagree with the region's. Once no failover from
//! its region runs any more (done, or failed), the copy is deleted and created
//! again empty: it joins the region's group as a learner afresh when the
//! region is back, and the region's leader streams it a snapshot. The old copy
//! is first renamed aside (`standby-<r>.reset`), which is atomic, then removed;
//! a crash in between leaves it aside, and the node removes it on its next
//! start (`remove_set_aside`) before opening the new copy. A crash before the
//! rename leaves the copy promoted, and it is reset after the restart.

use crate::config::Config;
use crate::limits::STANDBY_CHECK_MS;
use crate::node::{standby_copy_dir, Node, StandbyCopy};
use crate::standby::LagFigures;
use crate::Error;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Until `stop`: keeps each copy's last known lag, and resets the copies a
/// finished failover promoted.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let regions: Vec<String> = node
        .config()
        .standbys
        .iter()
        .filter(|(_, standby)| *standby == node.region())
        .map(|(region, _)| region.clone())
        .collect();
    if regions.is_empty() {
        return;
    }
    let mut ticker = crate::Ticker::new(Duration::from_millis(STANDBY_CHECK_MS), stop);
    while ticker.tick().await {
        for region in &regions {
            let Some(copy) = node.standby_copy(region) else {
                // A reset that could not open the new copy: try again.
                if let Err(e) = node.reopen_standby_copy(region).await {
                    tracing::warn!(region, error = %e, "standby copy not reopened yet");
                }
                continue;
            };
            match copy.store.promoted() {
                Ok(None) => record_lag(&node, &copy).await,
                // While the failover runs its import may still read the copy.
                Ok(Some(_))
                    if crate::operations::failover_from(node.registry(), region).is_some() => {}
                Ok(Some(at)) => {
                    tracing::info!(region, at, "resetting the standby copy a failover promoted");
                    if let Err(e) = reset(&node, region).await {
                        tracing::warn!(region, error = %e, "standby copy not reset yet");
                    }
                }
                Err(e) => tracing::warn!(region, error = %e, "cannot read the standby copy"),
            }
        }
    }
}

/// Asks the copy's region for its standby lag and keeps it; an unreachable
/// region (the case that matters) leaves the last answer in place.
async fn record_lag(node: &Node, copy: &StandbyCopy) {
    let Some(answer) = crate::standby::lag_of_region(node, &copy.region).await else {
        return;
    };
    let Some(figures) = answer
        .get("lag")
        .and_then(|lag| serde_json::from_value::<Option<LagFigures>>(lag.clone()).ok())
        .flatten()
    else {
        return;
    };
    *copy.lag.lock().expect("not poisoned") = Some(figures);
}

/// Where a copy being reset is set aside before it is removed.
fn set_aside_dir(config: &Config, region: &str) -> std::path::PathBuf {
    config.data_dir.join(format!("standby-{region}.reset"))
}

/// Removes a copy a reset set aside, if any (at start, before the copy opens).
pub fn remove_set_aside(config: &Config, region: &str) -> Result<(), Error> {
    let aside = set_aside_dir(config, region);
    if aside.exists() {
        std::fs::remove_dir_all(&aside)?;
    }
    Ok(())
}

/// Deletes this node's copy of `region` and opens a new, empty one.
pub async fn reset(node: &Node, region: &str) -> Result<(), Error> {
    if let Some(old) = node.take_standby_copy(region) {
        if let Err(e) = old.store.shutdown().await {
            tracing::warn!(region, error = %e, "promoted copy shutdown");
        }
    }
    let config = node.config();
    remove_set_aside(config, region)?;
    let dir = standby_copy_dir(config, region);
    if dir.exists() {
        std::fs::rename(&dir, set_aside_dir(config, region))?;
        remove_set_aside(config, region)?;
    }
    node.reopen_standby_copy(region).await?;
    metrics::counter!("keyhold_standby_copy_resets_total").increment(1);
    tracing::info!(region, "standby copy created again, empty");
    Ok(())
}
