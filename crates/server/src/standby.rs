//! Standby streaming: every region may have a standby region (config
//! `standbys`), each of whose nodes keeps a copy of the region's store as a learner
//! of the region's group (`node::StandbyCopy`). The region's leader adds the
//! standby's nodes as learners (at once, without waiting for them to catch up:
//! from then on it streams the log, or a snapshot, to them like to any member)
//! and samples how far the best copy trails: in commands and in the age of the
//! oldest command it lacks (`keyhold_standby_lag_commands`,
//! `keyhold_standby_lag_seconds`, and the cluster view's `replication_lag`).
//! A learner never votes: the standby adds no latency to an answer.

use crate::limits::{STANDBY_CHECK_MS, STANDBY_MATCHED_RECORD_ENTRIES};
use crate::node::Node;
use crate::peers::{Call, CallKind, To};
use keyhold_store::raft::Lag;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A region's standby and how far its copy trails, as the region's leader
/// knows it.
#[derive(Debug, Clone, Serialize)]
pub struct StandbyLag {
    pub standby: Option<String>,
    /// `None` when there is no standby, or none of its nodes is streamed to yet.
    pub lag: Option<LagFigures>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LagFigures {
    pub commands: u64,
    pub seconds: f64,
    pub matched_index: u64,
}

impl From<Lag> for LagFigures {
    fn from(lag: Lag) -> Self {
        LagFigures {
            commands: lag.commands,
            seconds: lag.seconds,
            matched_index: lag.matched_index,
        }
    }
}

/// On this region's leader: its standby and that standby's lag.
pub fn lag(node: &Node) -> StandbyLag {
    let standby = node.config().standbys.get(node.region()).cloned();
    let lag = standby.as_ref().and_then(|s| {
        let ids: Vec<_> = node.region_nodes(s).into_iter().map(|(id, _)| id).collect();
        node.store().group().lag_of(&ids).map(LagFigures::from)
    });
    StandbyLag { standby, lag }
}

/// Until `stop`: on the region's leader, every `STANDBY_CHECK_MS`, adds the
/// standby region's nodes that are not members of the region group yet as
/// learners, and records the standby's lag.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let Some(standby) = node.config().standbys.get(node.region()).cloned() else {
        return;
    };
    let mut ticker = crate::Ticker::new(Duration::from_millis(STANDBY_CHECK_MS), stop);
    while ticker.tick().await {
        if !node.leads_region() {
            // Only the leader knows the lag; a former leader's figure would go stale.
            metrics::gauge!("keyhold_standby_lag_commands").set(0.0);
            metrics::gauge!("keyhold_standby_lag_seconds").set(0.0);
            continue;
        }
        let group = node.store().group();
        let (_, members) = group.members();
        for (id, info) in node.region_nodes(&standby) {
            if members.contains_key(&id) {
                continue;
            }
            match group.add_streaming_learner(id, info).await {
                Ok(()) => tracing::info!(node_id = id, standby, "standby node streams the region"),
                Err(e) => tracing::warn!(node_id = id, error = %e, "standby node not added yet"),
            }
        }
        if let Some(figures) = lag(&node).lag {
            metrics::gauge!("keyhold_standby_lag_commands").set(figures.commands as f64);
            metrics::gauge!("keyhold_standby_lag_seconds").set(figures.seconds);
            record_matched(&node, figures.matched_index).await;
        }
    }
}

/// On the leader: records in the region's log how far the standby holds it,
/// once it got `STANDBY_MATCHED_RECORD_ENTRIES` further than recorded (the
/// record is itself an entry, which the standby then lacks).
async fn record_matched(node: &Node, matched: u64) {
    let recorded = match node.store().standby_matched() {
        Ok(i) => i,
        Err(e) => return tracing::warn!(error = %e, "cannot read the standby's recorded index"),
    };
    if matched < recorded + STANDBY_MATCHED_RECORD_ENTRIES {
        return;
    }
    if let Err(e) = node.store().record_standby_matched(matched).await {
        tracing::debug!(error = %e, "standby's index not recorded this time");
    }
}

/// Until `stop`, on every replica of a region with a standby: purges the log
/// behind the last snapshot (keeping `region_snapshot_entries` entries, as
/// openraft does for a region without a standby), but never past what the
/// standby is recorded to hold, so that a region that comes back after a
/// failover still holds the commands its standby lacked.
pub async fn purge_behind_standby(node: Arc<Node>, stop: watch::Receiver<bool>) {
    if !node.config().standbys.contains_key(node.region()) {
        return;
    }
    let keep = node.config().region_snapshot_entries;
    let mut ticker = crate::Ticker::new(Duration::from_millis(STANDBY_CHECK_MS), stop);
    while ticker.tick().await {
        let Ok(allowed) = node.store().standby_matched() else {
            continue;
        };
        let metrics = node.store().group().raft().metrics().borrow().clone();
        let snapshot = metrics.snapshot.map_or(0, |l| l.index);
        let purged = metrics.purged.map_or(0, |l| l.index);
        let upto = snapshot.saturating_sub(keep).min(allowed);
        if upto > purged {
            if let Err(e) = node.store().group().purge_upto(upto).await {
                tracing::warn!(error = %e, "region log not purged");
            }
        }
    }
}

/// `region`'s standby lag as its leader reports it (here, when this node leads
/// it; else by a node of the region, which sends the call on to its leader).
/// `None` when the region cannot say within `STANDBY_LAG_CALL_TIMEOUT_MS`
/// (`CallKind::StandbyLag`).
pub async fn lag_of_region(node: &Node, region: &str) -> Option<serde_json::Value> {
    if region == node.region() && node.leads_region() {
        return serde_json::to_value(lag(node)).ok();
    }
    let call = Call::get(CallKind::StandbyLag, "/internal/v1/standby/lag");
    node.peers().call_json(To::Region(region), &call).await.ok()
}
