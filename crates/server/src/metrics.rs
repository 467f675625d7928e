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

/// Every counter a node exports without labels. Each is registered at 0 when
/// the node starts ([`register_node`]): a counter that appears only at its
/// first event cannot be seen rising by `increase()` (the handler-panic alert
/// would miss a node's first panic). A unit test keeps this list equal to the
/// unlabelled `counter!` calls of the node's sources.
pub const UNLABELLED_COUNTERS: [&str; 36] = [
    "keyhold_failover_calls_refused_total",
    "keyhold_failover_guards_lifted_total",
    "keyhold_failover_imports_abandoned_total",
    "keyhold_failover_imports_total",
    "keyhold_failovers_automatic_total",
    "keyhold_failovers_started_total",
    "keyhold_forward_failures_total",
    "keyhold_forward_misdirected_total",
    "keyhold_forwarded_total",
    "keyhold_handler_panics_total",
    "keyhold_http_request_timeouts_total",
    "keyhold_http_unread_body_closes_total",
    "keyhold_lease_refused_total",
    "keyhold_move_bytes_total",
    "keyhold_move_calls_refused_total",
    "keyhold_move_driver_superseded_total",
    "keyhold_move_driver_takeovers_total",
    "keyhold_move_guards_lifted_total",
    "keyhold_move_import_commands_total",
    "keyhold_move_pages_total",
    "keyhold_moves_failed_total",
    "keyhold_moves_started_total",
    "keyhold_node_credential_refused_total",
    "keyhold_outbox_unreadable_total",
    "keyhold_psp_refusals_total",
    "keyhold_psp_retries_total",
    "keyhold_reconciliation_orphans_total",
    "keyhold_reconciliation_reservations_released_total",
    "keyhold_reconciliations_done_total",
    "keyhold_region_hop_not_leader_total",
    "keyhold_region_hops_total",
    "keyhold_region_unconfirmed_refusals_total",
    "keyhold_standby_copy_resets_total",
    "keyhold_sweeper_deferred_total",
    "keyhold_sweeper_stale_index_total",
    "keyhold_token_waits_skipped_total",
];

/// Called once a node starts: `keyhold_node_info{node_id, region}` 1 (what
/// joins a scrape target to its node and region), every unlabelled counter at
/// 0, and `keyhold_http_problems_total{status, problem}` at 0 for every slug.
pub fn register_node(node_id: u64, region: &str) {
    handle();
    metrics::gauge!(
        "keyhold_node_info",
        "node_id" => node_id.to_string(),
        "region" => region.to_owned()
    )
    .set(1.0);
    for name in UNLABELLED_COUNTERS {
        metrics::counter!(name).increment(0);
    }
    for problem in keyhold_core::Problem::ALL {
        count_problem(problem, 0);
    }
}

/// `keyhold_http_problems_total{status, problem}`: error answers by slug
/// (503s by kind: `store-unavailable`, `owner-unreachable`, `tenant-moving`,
/// `standby-unreachable`).
pub fn count_problem(problem: keyhold_core::Problem, n: u64) {
    metrics::counter!(
        "keyhold_http_problems_total",
        "status" => problem.status().to_string(),
        "problem" => problem.slug()
    )
    .increment(n);
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

#[cfg(test)]
mod tests {
    use super::UNLABELLED_COUNTERS;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("readable dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).expect("readable source"));
            }
        }
    }

    /// The counters registered at 0 are exactly those the node's crates
    /// increment without labels: a new counter left out of the list would
    /// appear only at its first event again.
    #[test]
    fn every_unlabelled_counter_is_registered_at_zero() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut texts = Vec::new();
        for name in ["server", "registry", "store"] {
            sources(&crates.join(name).join("src"), &mut texts);
        }
        let mut found = BTreeSet::new();
        for text in &texts {
            for (at, _) in text.match_indices("counter!(") {
                let rest = text[at + "counter!(".len()..].trim_start();
                let Some(rest) = rest.strip_prefix('"') else {
                    continue;
                };
                let Some((name, after)) = rest.split_once('"') else {
                    continue;
                };
                if name.starts_with("keyhold_") && after.trim_start().starts_with(')') {
                    found.insert(name.to_owned());
                }
            }
        }
        let listed: BTreeSet<String> = UNLABELLED_COUNTERS.iter().map(|s| s.to_string()).collect();
        assert_eq!(found, listed);
    }
}
