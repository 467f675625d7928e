//! The failover driver: on the leader of a region's store, drives every running
//! failover whose target (`to`) is this region to `done`.
//!
//! `BeginFailover` fenced the failed region in the registry: from its commit on
//! none of that region's nodes can renew its lease (`lease.rs`), so within
//! `REGION_LEASE_MS` it executes nothing more. The driver therefore waits the
//! lease out before it reads any copy: until the end the registry's leader
//! gives for it (`lease::lease_end`: one lease after the region's last
//! contact, which for a killed or cut off region was before the failover
//! began), or else one lease after the driver first saw the failover,
//! whichever comes first, plus `FAILOVER_LEASE_MARGIN_MS` for clock rates and
//! the moment between the registry leader's commit and its apply. From then
//! on no copy can grow, and the region that lost its tenants cannot
//! acknowledge anything new for them. The wait's progress is reported to the
//! registry as the operation's `progress`. Then it asks every node of this
//! region
//! where its copy of the failed region's store stands, has the best one
//! (`choose_copy`: the latest last log id, term first, among the answers of a
//! majority of this region's nodes) promoted and imported into this region's
//! store (`routes::failover`), and
//! commits `CompleteFailoverFrom` with the copy's tail (its position `at` and
//! the leaders of the entries it held without knowing them committed) and
//! `estimated_lost`: the last lag that copy knew, in commands (an estimate),
//! and an upper bound in seconds on how long after the copy's newest command
//! the region acknowledged what the failover lost (`lost_bound`).
//!
//! Every step is idempotent: a new leader of this region runs the failover
//! again from its first step, and the registry answers a second
//! `CompleteFailoverFrom` as the first.
//!
//! With `auto_failover_after` configured, the same leader also watches every
//! region whose standby its region is, and begins a failover of one that
//! still homes tenants once none of its nodes has been ready for that long
//! (`watch`). Off by default: a failover gives up what the lost region
//! acknowledged and its standby lacked, which is an operator's call.

use crate::limits::{
    AUTO_FAILOVER_UNSEEN_MS, FAILOVER_CHECK_MS, FAILOVER_DRIVE_ATTEMPTS_MAX,
    FAILOVER_LEASE_MARGIN_MS, FAILOVER_PROGRESS_STEP, FAILOVER_WAIT_PROGRESS_SHARE,
    LOST_BOUND_MARGIN_MS, REGION_LEASE_MS,
};
use crate::node::{now, Node};
use crate::peers::{Call, CallKind, To};
use keyhold_registry::{LostEstimate, NodeId, Operation, Request, Response as RegistryResponse};
use keyhold_store::LogTail;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long the driver waits after it first sees a failover before it reads a
/// copy: the failed region's lease, and the margin.
pub const FAILOVER_FENCE_WAIT_MS: u64 = REGION_LEASE_MS + FAILOVER_LEASE_MARGIN_MS;

/// Where one node's copy of the failed region's store stands
/// (`GET /internal/v1/failover/{region}/copy`).
#[derive(Debug, Clone, Deserialize)]
pub struct CopyPosition {
    pub node_id: NodeId,
    /// The term of the last entry the copy holds (0 from a node of an earlier
    /// release, which did not say).
    #[serde(default)]
    pub last_log_term: u64,
    /// The last log index the copy holds (durably received, applied or not).
    pub last_log_index: u64,
    /// The last lag of this copy its region's leader reported, if any.
    #[serde(default)]
    pub lag: Option<LostEstimate>,
    /// How long before its answer the copy last heard from the failed region
    /// (`None`: not since it opened, or a node of an earlier release).
    #[serde(default)]
    pub heard_ms_ago: Option<u64>,
    /// How long before its answer the copy's log last grew.
    #[serde(default)]
    pub grew_ms_ago: Option<u64>,
}

/// What the import answered (`POST /internal/v1/failover/{region}/import`).
#[derive(Debug, Deserialize)]
struct Imported {
    at: u64,
    /// Absent from an import by a node of an earlier release.
    #[serde(default)]
    tail: Option<LogTail>,
    #[serde(default)]
    tenants: u64,
    #[serde(default)]
    entries: u64,
    #[serde(default)]
    events: u64,
}

/// Set in a node's environment (tests only): failover operations, by id and
/// comma-separated, that this node's driver leaves alone, so that a test can
/// take their steps by hand (`tests/failover_import.rs`). The driver no
/// longer waits a whole lease after it first sees a failover of a region
/// that is long gone, so timing alone no longer keeps it out of the way.
const FAULT_DRIVER_SKIPS: &str = "KEYHOLD_FAULT_FAILOVER_DRIVER_SKIPS";

/// True if the test environment tells the driver to leave `operation_id` alone.
fn skipped_by_fault(operation_id: &str) -> bool {
    std::env::var(FAULT_DRIVER_SKIPS)
        .is_ok_and(|ids| ids.split(',').any(|id| id.trim() == operation_id))
}

/// What the driver knows of one running failover to its region.
#[derive(Debug)]
struct Tracked {
    /// When this node first saw it; the fence was committed before.
    first_seen: Instant,
    /// When the failed region's lease ends at the latest (margin included),
    /// once the registry's leader said.
    lease_ends: Option<Instant>,
    /// Attempts that failed.
    failures: u32,
    /// The progress last reported to the registry.
    reported: f64,
}

impl Tracked {
    fn new(first_seen: Instant) -> Tracked {
        Tracked {
            first_seen,
            lease_ends: None,
            failures: 0,
            reported: 0.0,
        }
    }

    /// When the failed region certainly executes nothing more: the registry
    /// leader's bound, or one lease and the margin after the first sighting.
    fn wait_over_at(&self) -> Instant {
        let fallback = self.first_seen + Duration::from_millis(FAILOVER_FENCE_WAIT_MS);
        self.lease_ends.map_or(fallback, |end| end.min(fallback))
    }

    /// The share of the whole failover the wait stands for at `now`, if it
    /// moved by a reporting step since the last report.
    fn progress_to_report(&mut self, now: Instant) -> Option<f64> {
        let whole = self
            .wait_over_at()
            .saturating_duration_since(self.first_seen);
        let done = now.saturating_duration_since(self.first_seen);
        let share = if whole.is_zero() {
            1.0
        } else {
            (done.as_secs_f64() / whole.as_secs_f64()).min(1.0)
        };
        let progress = share * FAILOVER_WAIT_PROGRESS_SHARE;
        if progress < self.reported + FAILOVER_PROGRESS_STEP {
            return None;
        }
        self.reported = progress;
        Some(progress)
    }
}

/// Until `stop`: every `FAILOVER_CHECK_MS`, on the leader of this region's
/// store, drives the running failovers to this region whose fence wait is
/// over, one at a time.
pub async fn run(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let mut ticker = crate::Ticker::new(Duration::from_millis(FAILOVER_CHECK_MS), stop);
    let mut seen: HashMap<String, Tracked> = HashMap::new();
    while ticker.tick().await {
        let running = crate::operations::failovers_to(node.registry(), node.region());
        seen.retain(|id, _| running.iter().any(|op| &op.operation_id == id));
        for op in running {
            let tracked = seen
                .entry(op.operation_id.clone())
                .or_insert_with(|| Tracked::new(Instant::now()));
            if !node.leads_region() || skipped_by_fault(&op.operation_id) {
                continue;
            }
            if tracked.lease_ends.is_none() {
                tracked.lease_ends = ask_lease_end(&node, &op.from).await;
            }
            let now = Instant::now();
            if now < tracked.wait_over_at() {
                if let Some(progress) = tracked.progress_to_report(now) {
                    report_progress(&node, &op, progress);
                }
                continue;
            }
            // The wait is over: said once, so that a drill can tell the
            // lease wait from the import (`keyhold drill`'s phases).
            if tracked.reported < FAILOVER_WAIT_PROGRESS_SHARE {
                tracked.reported = FAILOVER_WAIT_PROGRESS_SHARE;
                report_progress(&node, &op, FAILOVER_WAIT_PROGRESS_SHARE);
            }
            match drive(&node, &op).await {
                Ok(()) => {}
                Err(error) if tracked.failures + 1 >= FAILOVER_DRIVE_ATTEMPTS_MAX => {
                    tracing::error!(operation = %op.operation_id, error, "failover failed");
                    fail(&node, &op, error).await;
                }
                Err(error) => {
                    tracing::warn!(operation = %op.operation_id, error, "failover step failed; retrying");
                    tracked.failures += 1;
                }
            }
        }
    }
}

/// When the fenced `region`'s lease ends at the latest, margin included, by
/// the registry's leader (this node or the one it knows); `None` while no
/// leader can say (the driver falls back on the first sighting).
async fn ask_lease_end(node: &Node, region: &str) -> Option<Instant> {
    let end = if node.registry().leader() == Some(node.registry().id()) {
        crate::lease::lease_end(node, region).await.ok()?
    } else {
        let leader = node.registry_leader_api()?;
        let call = Call::get(
            CallKind::LeaseEnd,
            format!("/internal/v1/registry/lease-end?region={region}"),
        );
        node.peers()
            .call_json::<crate::lease::LeaseEnd>(To::Node(&leader), &call)
            .await
            .ok()?
    };
    // Counted from the answer's arrival, later than the leader's reckoning.
    let left = Duration::from_millis(end.holds_ms_max + FAILOVER_LEASE_MARGIN_MS);
    tracing::info!(%region, lease_left_ms = end.holds_ms_max, "failover: the fenced region's lease bound");
    Some(Instant::now() + left)
}

/// Reports a running failover's progress to the registry, in the background:
/// a slow registry never holds the failover up for it.
fn report_progress(node: &Arc<Node>, op: &Operation, progress: f64) {
    let request = Request::UpdateOperation {
        operation_id: op.operation_id.clone(),
        state: op.state,
        progress,
        error: None,
        now_ms: now().0,
    };
    let node = node.clone();
    tokio::spawn(async move {
        if let Err(e) = node.registry().write(request).await {
            tracing::debug!(error = %e, "failover progress not reported");
        }
    });
}

/// One attempt at the whole failover, from the copies to the registry.
async fn drive(node: &Node, op: &Operation) -> Result<(), String> {
    let started = Instant::now();
    let standby_lost = node
        .registry()
        .read(|s| s.standby_state(&op.from).is_lost());
    let (best, positions) = best_copy(node, &op.from).await?;
    let bound = lost_bound(
        &positions,
        &best,
        node.config().max_standby_lag,
        if standby_lost {
            Protection::Unprotected
        } else {
            Protection::MaxStandbyLag
        },
    );
    let imported = import(node, op, best.node_id).await?;
    tracing::info!(
        operation = %op.operation_id, from = %op.from, to = %op.to,
        at = imported.at, tenants = imported.tenants, entries = imported.entries,
        events = imported.events, "failover copy imported"
    );
    let request = Request::CompleteFailoverFrom {
        operation_id: op.operation_id.clone(),
        tail: imported
            .tail
            .unwrap_or_else(|| LogTail::confirmed(imported.at)),
        estimated_lost: LostEstimate {
            commands: best.lag.map_or(0, |l| l.commands),
            seconds: bound.as_secs_f64(),
        },
        now_ms: now().0,
    };
    let written = node
        .registry()
        .write(request)
        .await
        .map_err(|e| format!("registry: {e}"))?;
    match written.response {
        RegistryResponse::OperationUpdated { .. } => {
            metrics::histogram!("keyhold_failover_duration_seconds")
                .record(started.elapsed().as_secs_f64());
            tracing::info!(operation = %op.operation_id, "failover done");
            Ok(())
        }
        RegistryResponse::Rejected { reason } => Err(format!("registry refused: {reason}")),
        other => Err(format!("registry answered {other:?}")),
    }
}

/// The copy of `region` to promote, from the answers of this region's nodes
/// (asked at once; see `choose_copy`).
async fn best_copy(node: &Node, region: &str) -> Result<(CopyPosition, Vec<CopyPosition>), String> {
    let members = node.region_nodes(node.region());
    let call = Call::get(
        CallKind::CopyPosition,
        format!("/internal/v1/failover/{region}/copy"),
    );
    let asks = members.iter().map(|(id, info)| {
        let call = &call;
        async move {
            let to = To::Node(&info.api_addr);
            let answer = node.peers().call_json::<CopyPosition>(to, call).await;
            answer.map_err(|e| format!("node {id}: {e}"))
        }
    });
    let (positions, errors): (Vec<_>, Vec<_>) = futures::future::join_all(asks)
        .await
        .into_iter()
        .partition(Result::is_ok);
    let positions: Vec<CopyPosition> = positions.into_iter().filter_map(Result::ok).collect();
    let errors: Vec<String> = errors.into_iter().filter_map(Result::err).collect();
    let best = choose_copy(&positions, members.len())
        .cloned()
        .map_err(|why| format!("{why} ({}: {})", node.region(), errors.join("; ")))?;
    Ok((best, positions))
}

/// Whether the failed region acknowledged zone writes only within its
/// standby's `max_standby_lag` when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    MaxStandbyLag,
    /// Its standby was recorded lost: it acknowledged without one (a forced
    /// failover to that standby).
    Unprotected,
}

/// An upper bound on how long after the newest command the promoted copy
/// (`best`) holds the failed region acknowledged a write the failover loses
/// (contract section 11: `estimated_lost.seconds`). All ages were read at about
/// the same moment, after the fence wait, when the region acknowledges nothing
/// more (`FAILOVER_FENCE_WAIT_MS`).
///
/// A region's leader acknowledges a zone write at `t` only while a majority of
/// its standby's copies answered an AppendEntries it sent at `t - max_lag` or
/// later (`survival.rs`); `positions` are a majority's answers, so one of them
/// heard from the region at or after `t - max_lag`: `t` is at most the latest
/// `heard` plus `max_lag` (or now, unprotected). A lost write's entry came
/// after the best copy's newest, which that copy received when its log last
/// grew (`grew`), after the region appended it: `LOST_BOUND_MARGIN_MS` covers
/// that delivery and the answers' own transit. A copy that has not grown since
/// it opened bounds from when it last heard instead (its newest command is
/// older, unknown: the figure is then a bound on what was acknowledged after
/// the copy last heard).
pub fn lost_bound(
    positions: &[CopyPosition],
    best: &CopyPosition,
    max_lag: Duration,
    protection: Protection,
) -> Duration {
    let max_lag_ms = max_lag.as_millis() as u64;
    let heard_ago = positions.iter().filter_map(|p| p.heard_ms_ago).min();
    // How long before now the last acknowledgement may have been.
    let acked_ago = match (protection, heard_ago) {
        (Protection::MaxStandbyLag, Some(heard)) => heard.saturating_sub(max_lag_ms),
        _ => 0,
    };
    let newest_ago = best
        .grew_ms_ago
        .or(best.heard_ms_ago)
        .or(heard_ago)
        .unwrap_or(FAILOVER_FENCE_WAIT_MS + max_lag_ms);
    Duration::from_millis(newest_ago.saturating_sub(acked_ago) + LOST_BOUND_MARGIN_MS)
}

/// The copy to promote among `positions`, the answers of this region's
/// `members` nodes: the one with the latest last log id, term first.
///
/// A region-survival write was acknowledged once a majority of the standby's
/// copies held it (`survival.rs`), so only the answers of a majority are sure to
/// include a copy that holds it; with fewer, the failover waits (its driver
/// tries again) rather than silently promote a copy that may lack it (review
/// d44e5cf, N1). Among those answers, the latest last log id holds every entry
/// a majority held: that entry was committed in its region, so every later
/// leader's log holds it, and by log matching so does every copy whose last
/// entry such a leader wrote at or after its index; a copy whose last entry is
/// of the same term and index or later holds it for the same reason. The
/// largest index alone is not enough: a copy may hold a deposed leader's
/// entries that were never committed, at indexes past the committed ones.
pub fn choose_copy(positions: &[CopyPosition], members: usize) -> Result<&CopyPosition, String> {
    let majority = members / 2 + 1;
    if positions.len() < majority {
        return Err(format!(
            "{} of {members} nodes answered where their copy stands; a majority ({majority}) \
             must, so that the copy chosen holds every region-survival write",
            positions.len()
        ));
    }
    Ok(positions
        .iter()
        .max_by_key(|p| (p.last_log_term, p.last_log_index))
        .expect("a majority is at least one answer"))
}

/// Has this region's leader (this node, normally) promote the copy on
/// `source` and import it into this region's store.
async fn import(node: &Node, op: &Operation, source: NodeId) -> Result<Imported, String> {
    let path = format!(
        "/internal/v1/failover/{}/import?operation_id={}&source={source}",
        op.from, op.operation_id
    );
    let call = Call::post(CallKind::FailoverImport, path);
    node.peers()
        .call_json(To::Region(node.region()), &call)
        .await
        .map_err(|e| format!("import: {e}"))
}

/// Fails the operation in the registry: the failed region is no longer fenced
/// and keeps its tenants.
async fn fail(node: &Node, op: &Operation, error: String) {
    let request = Request::FailFailover {
        operation_id: op.operation_id.clone(),
        error,
        now_ms: now().0,
    };
    if let Err(e) = node.registry().write(request).await {
        tracing::error!(operation = %op.operation_id, error = %e, "failover not failed in the registry");
    }
}

/// True when a node of `region` answers `/readyz` with 2xx (its store is
/// healthy and its lease holds) within `FAILOVER_HEALTH_PROBE_MS`
/// (`CallKind::ReadyProbe`).
pub async fn region_is_ready(node: &Node, region: &str) -> bool {
    let call = Call::get(CallKind::ReadyProbe, "/readyz");
    let nodes = node.region_nodes(region);
    let probes = nodes
        .iter()
        .map(|(_, info)| node.peers().call(To::Node(&info.api_addr), &call));
    futures::future::join_all(probes)
        .await
        .into_iter()
        .any(|answer| answer.is_ok())
}

/// Until `stop`, with `auto_failover_after` set: on the leader of this
/// region's store, every `FAILOVER_CHECK_MS`, probes each region this region
/// is the standby of, and begins its failover once it has not been ready for
/// `auto_failover_after` while it still homes tenants and none of its
/// failovers runs. The driver (`run`) takes it from there.
pub async fn watch(node: Arc<Node>, stop: watch::Receiver<bool>) {
    let Some(after) = node.config().auto_failover_after else {
        return;
    };
    let watched: Vec<String> = node
        .config()
        .standbys
        .iter()
        .filter(|(_, standby)| standby.as_str() == node.region())
        .map(|(region, _)| region.clone())
        .collect();
    if watched.is_empty() {
        return;
    }
    let mut ticker = crate::Ticker::new(Duration::from_millis(FAILOVER_CHECK_MS), stop);
    // Since when each watched region has not been ready, as this leader saw it.
    let mut down_since: HashMap<String, Instant> = HashMap::new();
    // The watched regions this node has seen ready since it started.
    let mut seen_ready: HashSet<String> = HashSet::new();
    while ticker.tick().await {
        if !node.leads_region() {
            down_since.clear();
            continue;
        }
        for region in &watched {
            if region_is_ready(&node, region).await {
                down_since.remove(region);
                seen_ready.insert(region.clone());
                continue;
            }
            let since = *down_since
                .entry(region.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < unready_limit(after, seen_ready.contains(region))
                || !worth_failing_over(&node, region)
            {
                continue;
            }
            begin_automatic(&node, region, since.elapsed()).await;
            down_since.remove(region);
        }
    }
}

/// How long a watched region may stay unready before it is failed over:
/// `auto_failover_after` once this node has seen it ready, else at least
/// `AUTO_FAILOVER_UNSEEN_MS`. A whole cluster restarted at once brings its
/// regions up one after the other, seconds apart on a loaded machine; a
/// watcher that just started must not take a region that is still starting
/// for a lost one.
fn unready_limit(after: Duration, seen_ready: bool) -> Duration {
    if seen_ready {
        after
    } else {
        after.max(Duration::from_millis(AUTO_FAILOVER_UNSEEN_MS))
    }
}

/// A region is worth failing over while it homes a live tenant, no failover
/// of it runs, and its standby is not recorded lost (its copy may then lack
/// more than `max_standby_lag`: an operator's call, with `force`).
fn worth_failing_over(node: &Node, region: &str) -> bool {
    crate::operations::failover_from(node.registry(), region).is_none()
        && node.registry().read(|state| {
            state.standby_state(region) == keyhold_registry::standbys::StandbyState::Streaming
                && state
                    .tenants
                    .values()
                    .any(|t| t.home_region == region && !t.is_deleted())
        })
}

async fn begin_automatic(node: &Node, region: &str, down_for: Duration) {
    let operation_id = format!("op_{}", uuid::Uuid::now_v7().simple());
    let request = Request::BeginFailover {
        operation_id: operation_id.clone(),
        region: region.to_owned(),
        to: node.region().to_owned(),
        now_ms: now().0,
    };
    match node.registry().write(request).await {
        Ok(written) if written.response.rejection().is_none() => {
            metrics::counter!("keyhold_failovers_started_total").increment(1);
            metrics::counter!("keyhold_failovers_automatic_total").increment(1);
            tracing::warn!(
                %region, to = %node.region(), operation = %operation_id,
                down_s = down_for.as_secs_f64(),
                "automatic failover begun: the region has not been ready for auto_failover_after"
            );
        }
        Ok(written) => {
            tracing::warn!(%region, answer = ?written.response, "automatic failover refused")
        }
        Err(e) => tracing::warn!(%region, error = %e, "automatic failover not begun"),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        choose_copy, lost_bound, CopyPosition, Protection, Tracked, FAILOVER_FENCE_WAIT_MS,
    };
    use crate::limits::{
        FAILOVER_PROGRESS_STEP, FAILOVER_WAIT_PROGRESS_SHARE, LOST_BOUND_MARGIN_MS,
    };
    use std::time::{Duration, Instant};

    #[test]
    fn a_region_never_seen_ready_since_the_watcher_started_gets_longer() {
        let after = Duration::from_secs(2);
        assert_eq!(super::unready_limit(after, true), after);
        assert_eq!(
            super::unready_limit(after, false),
            Duration::from_millis(crate::limits::AUTO_FAILOVER_UNSEEN_MS)
        );
        let long = Duration::from_secs(600);
        assert_eq!(super::unready_limit(long, false), long);
    }

    #[test]
    fn the_wait_ends_at_the_registry_leader_s_bound_or_one_lease_after_the_first_sighting() {
        let first = Instant::now();
        let mut tracked = Tracked::new(first);
        let fallback = first + Duration::from_millis(FAILOVER_FENCE_WAIT_MS);
        assert_eq!(tracked.wait_over_at(), fallback);
        // A region killed before the failover began: its lease ends sooner.
        tracked.lease_ends = Some(first + Duration::from_millis(1_200));
        assert_eq!(tracked.wait_over_at(), first + Duration::from_millis(1_200));
        // A bound past the fallback (a leader elected late) never delays it.
        tracked.lease_ends = Some(fallback + Duration::from_secs(3));
        assert_eq!(tracked.wait_over_at(), fallback);
    }

    #[test]
    fn the_wait_s_progress_is_reported_in_steps_up_to_its_share() {
        let first = Instant::now();
        let mut tracked = Tracked::new(first);
        tracked.lease_ends = Some(first + Duration::from_millis(4_000));
        let at = |ms| first + Duration::from_millis(ms);
        assert_eq!(tracked.progress_to_report(at(0)), None);
        let half = tracked.progress_to_report(at(2_000)).expect("moved");
        assert!((half - FAILOVER_WAIT_PROGRESS_SHARE / 2.0).abs() < 1e-9);
        // Less than a step further: nothing to report.
        let small = Duration::from_secs_f64(4.0 * FAILOVER_PROGRESS_STEP / 2.0);
        assert_eq!(tracked.progress_to_report(at(2_000) + small), None);
        let end = tracked.progress_to_report(at(9_000)).expect("moved");
        assert!((end - FAILOVER_WAIT_PROGRESS_SHARE).abs() < 1e-9);
        assert_eq!(tracked.progress_to_report(at(10_000)), None);
    }

    fn at(node_id: u64, last_log_term: u64, last_log_index: u64) -> CopyPosition {
        CopyPosition {
            node_id,
            last_log_term,
            last_log_index,
            lag: None,
            heard_ms_ago: None,
            grew_ms_ago: None,
        }
    }

    fn clocked(node_id: u64, heard: Option<u64>, grew: Option<u64>) -> CopyPosition {
        CopyPosition {
            heard_ms_ago: heard,
            grew_ms_ago: grew,
            ..at(node_id, 1, 10)
        }
    }

    /// The region was idle for 5 s after the copy's newest command, and then
    /// cut off from its standby 3 s ago (its copies last heard from it then):
    /// with a 1 s lag it acknowledged nothing after 2 s ago, so what it lost
    /// was acknowledged within 8 s - 2 s of the newest command (plus the
    /// margin). Unprotected, it may have acknowledged until now.
    #[test]
    fn the_bound_runs_from_the_newest_command_to_the_last_answer_plus_the_lag() {
        let lag = Duration::from_millis(1_000);
        let margin = Duration::from_millis(LOST_BOUND_MARGIN_MS);
        let best = clocked(5, Some(3_000), Some(8_000));
        let positions = [clocked(2, Some(3_500), Some(8_100)), best.clone()];
        assert_eq!(
            lost_bound(&positions, &best, lag, Protection::MaxStandbyLag),
            Duration::from_millis(6_000) + margin
        );
        assert_eq!(
            lost_bound(&positions, &best, lag, Protection::Unprotected),
            Duration::from_millis(8_000) + margin
        );
        // Heard within the lag: it may have acknowledged until now.
        let fresh = clocked(5, Some(400), Some(1_000));
        assert_eq!(
            lost_bound(
                std::slice::from_ref(&fresh),
                &fresh,
                lag,
                Protection::MaxStandbyLag
            ),
            Duration::from_millis(1_000) + margin
        );
        // A copy that never grew since it opened bounds from when it heard.
        let quiet = clocked(5, Some(3_000), None);
        assert_eq!(
            lost_bound(
                std::slice::from_ref(&quiet),
                &quiet,
                lag,
                Protection::MaxStandbyLag
            ),
            Duration::from_millis(1_000) + margin
        );
    }

    #[test]
    fn a_copy_is_chosen_only_from_the_answers_of_a_majority() {
        // Review d44e5cf, N1, scenario A: a region-survival write acknowledged
        // at index 10 once nodes 5 and 8 held it; node 2 is at 7. With only
        // node 2 answering, promoting it would lose the write without a trace.
        assert!(choose_copy(&[at(2, 3, 7)], 3).is_err());
        assert!(choose_copy(&[], 1).is_err());
        let answers = [at(2, 3, 7), at(5, 3, 10)];
        assert_eq!(choose_copy(&answers, 3).map(|p| p.node_id), Ok(5));
        assert_eq!(choose_copy(&[at(2, 3, 7)], 1).map(|p| p.node_id), Ok(2));
    }

    #[test]
    fn the_latest_last_log_id_wins_term_first_not_the_largest_index() {
        // Scenario B: node 2 holds entries 101..=105 of the deposed leader of
        // term 4, never committed; nodes 5 and 8 hold 101..=102 of term 5's
        // leader, whose region-survival write at 101 they acknowledged.
        let answers = [at(2, 4, 105), at(5, 5, 102), at(8, 5, 101)];
        assert_eq!(choose_copy(&answers, 3).map(|p| p.node_id), Ok(5));
        // Within one term, the longer copy.
        let answers = [at(2, 5, 99), at(5, 5, 102)];
        assert_eq!(choose_copy(&answers, 3).map(|p| p.node_id), Ok(5));
    }
}
