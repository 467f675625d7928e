//! The Prometheus recorder. `metrics` has one global recorder per process, so
//! every node in the process (tests start several) shares it; series carry no
//! tenant ids, only routes and outcomes.

use keyhold_registry::types::RaftMetrics;
use keyhold_registry::NodeId;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use openraft::ServerState;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Seconds buckets from 100 µs to 10 s, for request and fsync latencies.
const SECONDS_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0,
];
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .expect("buckets are not empty")
            .set_buckets_for_metric(
                Matcher::Full("keyhold_store_batch_commands".into()),
                &BATCH_BUCKETS,
            )
            .expect("buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may be installed already (an embedding program's);
        // then this handle renders only what it saw, which is nothing. Say so.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
        }
        handle
    })
}

/// The roles a Raft member can have, as `keyhold_raft_role{role}` labels.
const RAFT_ROLES: [(ServerState, &str); 4] = [
    (ServerState::Leader, "leader"),
    (ServerState::Follower, "follower"),
    (ServerState::Candidate, "candidate"),
    (ServerState::Learner, "learner"),
];

/// The term each group had at the previous scrape, per node (tests run several
/// nodes in one process), so that elections can be counted from term increases.
static TERMS_SEEN: Mutex<BTreeMap<(NodeId, String), u64>> = Mutex::new(BTreeMap::new());

/// Gauges of one Raft group this node is a member of (the registry, its region's
/// store), sampled when scraped; every series carries `group`:
/// `keyhold_raft_role{role}` (1 for this member's role, 0 for the others),
/// `keyhold_raft_term`, `keyhold_raft_last_log_index`, `keyhold_raft_applied_index`,
/// `keyhold_raft_purged_index`, `keyhold_raft_has_leader`,
/// `keyhold_raft_replication_lag_entries{follower}` (on the leader: entries each
/// other member has not matched; 0 elsewhere, so a former leader leaves no stale
/// value), and the counter `keyhold_raft_elections_total` (term increases seen
/// between scrapes: every election raises the term at least once).
pub fn record_raft_group(group: &str, raft: &RaftMetrics, members: impl Iterator<Item = NodeId>) {
    let group = group.to_owned();
    for (state, role) in RAFT_ROLES {
        let on = if raft.state == state { 1.0 } else { 0.0 };
        metrics::gauge!("keyhold_raft_role", "group" => group.clone(), "role" => role).set(on);
    }
    metrics::gauge!("keyhold_raft_term", "group" => group.clone()).set(raft.current_term as f64);
    let last = raft.last_log_index.unwrap_or(0);
    metrics::gauge!("keyhold_raft_last_log_index", "group" => group.clone()).set(last as f64);
    let applied = raft.last_applied.map_or(0, |id| id.index);
    metrics::gauge!("keyhold_raft_applied_index", "group" => group.clone()).set(applied as f64);
    let purged = raft.purged.map_or(0, |id| id.index);
    metrics::gauge!("keyhold_raft_purged_index", "group" => group.clone()).set(purged as f64);
    let has_leader = if raft.current_leader.is_some() {
        1.0
    } else {
        0.0
    };
    metrics::gauge!("keyhold_raft_has_leader", "group" => group.clone()).set(has_leader);
    for member in members.filter(|id| *id != raft.id) {
        let lag = match raft.replication.as_ref().and_then(|m| m.get(&member)) {
            Some(m) => last.saturating_sub(m.map_or(0, |l| l.index)),
            None => 0,
        };
        metrics::gauge!(
            "keyhold_raft_replication_lag_entries",
            "group" => group.clone(),
            "follower" => member.to_string()
        )
        .set(lag as f64);
    }
    let elections = {
        let mut seen = TERMS_SEEN
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = seen.insert((raft.id, group.clone()), raft.current_term);
        // The first scrape after start-up has nothing to compare with.
        previous.map_or(0, |term| raft.current_term.saturating_sub(term))
    };
    metrics::counter!("keyhold_raft_elections_total", "group" => group).increment(elections);
}
