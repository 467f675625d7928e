//! The expiry sweeper: physically deletes expired records, markers and
//! delivered outbox events in small batches (`Store::sweep`: the store's
//! `Sweep` walks its outbox and its expiry index, then a paced scan of the
//! leader's records and markers lists the due ones in `SweepKeys`, so that
//! writing an order adds no index entries for them).
//!
//! Reads already treat expired entries as absent, so the sweeper only reclaims
//! space; each sweep command is one short apply in the region state machine, so
//! writers are never blocked for long.

use crate::limits::SWEEP_COMMANDS_PER_ROUND_MAX;
use crate::node::{now, Node};
use keyhold_store::limits::SWEEP_ENTRIES_MAX;
use std::sync::Arc;
use tokio::sync::watch;

pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let mut ticker = crate::Ticker::new(node.config().sweep_interval, stop);
    while ticker.tick().await {
        // One sweeper per region: its store's leader.
        if !node.leads_region() {
            continue;
        }
        for _ in 0..SWEEP_COMMANDS_PER_ROUND_MAX {
            let consumers = crate::downstream::consumers(&node);
            let sweep = node
                .store()
                .sweep(now(), SWEEP_ENTRIES_MAX as u32, consumers);
            match sweep.await {
                Ok(out) => {
                    metrics::counter!("keyhold_sweeper_deleted_total", "kind" => "record")
                        .increment(out.records);
                    metrics::counter!("keyhold_sweeper_deleted_total", "kind" => "marker")
                        .increment(out.markers);
                    metrics::counter!("keyhold_sweeper_deleted_total", "kind" => "event")
                        .increment(out.events);
                    metrics::counter!("keyhold_sweeper_deleted_total", "kind" => "processed")
                        .increment(out.processed);
                    metrics::counter!("keyhold_sweeper_deferred_total").increment(out.deferred);
                    metrics::counter!("keyhold_sweeper_stale_index_total")
                        .increment(out.stale_index);
                    let total = out.records
                        + out.markers
                        + out.events
                        + out.processed
                        + out.deferred
                        + out.stale_index;
                    if total < SWEEP_ENTRIES_MAX as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "sweep failed; will retry");
                    break;
                }
            }
        }
    }
}
