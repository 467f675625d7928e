//! The task that drives a planned tenant move, and the watchdog that resumes
//! moves whose driver went silent. Drivers are tracked background tasks of the
//! node (`Drivers`): at most one per operation on a node, stopped with it.
//!
//! One driver per move in the whole cluster: a driver first takes the move's
//! lease in the registry (`AcquireDriver`: holder and expiry by the registry
//! leader's clock) and renews it with every progress report. A successor (the
//! registry leader's watchdog) gets the lease only once it expired, with a
//! higher generation; from then on the registry refuses the old driver's
//! reports and its `FinishMove`, and the new home refuses its imports (each
//! import command names the generation, and the store refuses one older than
//! any it took for the move), so a driver that was only slow can no longer
//! write anything. A driver stops at the first renewal that is refused or
//! cannot be written: it may have lost its lease without hearing so.
//!
//! The lease's holder is the node's registry id, which a node keeps across
//! restarts: a node that comes back resumes the moves whose lease it holds at
//! once (`resume_stalled`), under the same generation. Its previous
//! incarnation is dead with its process, so nothing else writes under that
//! generation, and every step is safe to repeat.
//!
//! A move is six steps, each safe to repeat:
//! 1. `BeginMove` in the registry (by the admin endpoint): the tenant is
//!    `moving` at its current epoch. Nodes still place its requests at its old
//!    home, whose store keeps executing them.
//! 2. The old home's store starts the tenant's change index (`track`): every
//!    write or deletion of the tenant's entries from then on is noted with it.
//! 3. The first pass, online: the new home pulls the tenant's records, markers,
//!    order index and orders page by page (pages sized by bytes) straight from
//!    the old home (`pull`), each import scoped by the operation and epoch.
//! 4. The catch-up, online: the old home tracks again, which answers a mark
//!    (the log index of that command; every later change of the tenant is
//!    stamped higher), and the new home pulls what the change index holds:
//!    what changed, or was deleted, since step 2.
//! 5. The old home fences its store for this operation and epoch (through the
//!    apply loop, so no queued command slips past; from here on the tenant
//!    answers 503 `tenant-moving`) and lets its relay deliver the tenant's
//!    events, so order states settle; then the final pass pulls only the
//!    changes stamped after the mark: what changed during the catch-up.
//! 6. `CompleteMove` in the registry: home is the new region, epoch + 1. `done`
//!    is reported by that same committed entry. The old home prunes the
//!    tenant's change index once its replica shows the move ended.
//!
//! A failure aborts the move (`AbortMove`: back to the old home, epoch + 1). A
//! registry rejection of either is a failure, never a success. Nobody calls the
//! old home to lift its fence: every store lifts its own once its registry
//! replica shows it owns the tenant at a later epoch (`cluster::follow_registry`
//! and the placement check), so a node that was down when the move ended lifts
//! it when it comes back.

use crate::limits::{MOVE_DRIVER_RENEWALS_PER_LEASE, MOVE_RESUME_POLL_MS, MOVE_UNLEASED_GRACE_MS};
use crate::node::{now, Node};
use crate::peers::{Call, CallKind, To};
use crate::routes::Pass;
use keyhold_registry::{
    Operation, OperationState, Rejection, Request, Response as RegistryResponse,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Everything a driver needs to know about its move.
#[derive(Debug, Clone)]
pub struct MoveJob {
    pub tenant_id: String,
    pub from: String,
    pub to: String,
    pub operation_id: String,
    /// The tenant's epoch during the move (`BeginMove` does not change it).
    pub epoch: u64,
    /// The registry entry that began the move.
    pub begin_index: u64,
}

/// The move drivers running on this node, by operation id.
#[derive(Default)]
pub struct Drivers {
    running: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl Drivers {
    /// Starts a driver for `job` unless one runs for that operation on this node
    /// already; returns whether it started one.
    pub fn start(&self, node: Arc<Node>, job: MoveJob) -> bool {
        let mut running = self.running.lock().expect("drivers lock");
        running.retain(|_, task| !task.is_finished());
        if running.contains_key(&job.operation_id) {
            return false;
        }
        let operation_id = job.operation_id.clone();
        running.insert(operation_id, tokio::spawn(drive(node, job)));
        true
    }

    /// True while a driver for `operation_id` runs on this node.
    pub fn is_running(&self, operation_id: &str) -> bool {
        let running = self.running.lock().expect("drivers lock");
        running.get(operation_id).is_some_and(|t| !t.is_finished())
    }

    /// Stops every driver (node shutdown). A stopped driver's move stays
    /// running in the registry: this node resumes it when it starts again
    /// (it still holds the lease), or the registry leader's node once the
    /// lease expired.
    pub fn stop_all(&self) {
        for (_, task) in self.running.lock().expect("drivers lock").drain() {
            task.abort();
        }
    }
}

/// The job of a running move operation, from the local registry replica.
fn job_of(node: &Node, op: &Operation, begin_index: u64) -> Option<MoveJob> {
    let moving = crate::operations::move_running(node.registry(), op)?;
    Some(MoveJob {
        tenant_id: op.tenant_id.clone(),
        from: op.from.clone(),
        to: op.to.clone(),
        operation_id: op.operation_id.clone(),
        epoch: moving.epoch,
        begin_index,
    })
}

/// The lease of a move's driver, and how often it is renewed.
fn lease_ms(node: &Node) -> u64 {
    node.config().move_driver_lease.as_millis() as u64
}

fn renew_every(node: &Node) -> Duration {
    Duration::from_millis(lease_ms(node) / MOVE_DRIVER_RENEWALS_PER_LEASE)
}

/// Which running moves this node should drive now, by its registry replica at
/// `at_ms`: every non-terminal move whose lease this node holds but that no
/// driver here runs (its driver died with a previous incarnation of the node,
/// or gave up on a registry error), and, on the registry leader's node only,
/// every move whose driver's lease expired (it died with another node, or
/// stalled). A restarted node so resumes its own moves as soon as its replica
/// knows a leader, not after the lease ran out; the registry grants the lease
/// to a successor on another node only once it really expired by the leader's
/// clock.
fn moves_to_drive(node: &Node, at_ms: u64) -> Vec<Operation> {
    let registry = node.registry();
    let me = registry.id();
    let leading = registry.leader() == Some(me);
    registry.read(|s| {
        s.operations
            .values()
            .filter(|op| !op.state.is_terminal())
            .filter(|op| match s.drivers.get(&op.operation_id) {
                Some(lease) if lease.holder == me => !node.drivers.is_running(&op.operation_id),
                Some(lease) => leading && lease.expires_at_ms <= at_ms,
                // Never leased: its first driver may still be starting on the
                // node that accepted it, or died with that node before taking
                // the lease. Past a short grace the leader's node starts one
                // too; the registry grants the free lease to one of them.
                None => {
                    leading
                        && at_ms.saturating_sub(op.updated_at_ms)
                            > MOVE_UNLEASED_GRACE_MS.min(lease_ms(node))
                }
            })
            .cloned()
            .collect()
    })
}

/// Resumes the moves `moves_to_drive` names, at start-up and then every
/// `MOVE_RESUME_POLL_MS`, until the node stops.
pub async fn resume_stalled(node: Arc<Node>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        // Without a known leader no lease can be written: look again later.
        if node.registry().leader().is_some() {
            for op in moves_to_drive(&node, now().0) {
                let Some(job) = job_of(&node, &op, node.registry().applied_index()) else {
                    continue;
                };
                if node.drivers.start(node.clone(), job) {
                    tracing::warn!(operation = %op.operation_id, tenant = %op.tenant_id, "resuming a move whose driver is gone");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(MOVE_RESUME_POLL_MS)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Set in a node's environment (milliseconds), its drivers stall that long
/// after the fence without renewing their lease: the one way tests make a
/// driver that is alive but lost its lease.
const FAULT_DRIVER_PAUSE_MS: &str = "KEYHOLD_FAULT_DRIVER_PAUSE_MS";

/// The share of a move's progress its first pass stands for.
const FIRST_PASS_SHARE: f64 = 0.9;

/// A driver holding the lease of one move at `generation`.
struct Driver<'a> {
    node: &'a Node,
    job: MoveJob,
    generation: u64,
    /// The registry entry that granted the lease.
    lease_index: u64,
    /// When the old home was fenced (the tenant's requests answer 503 from
    /// then until the registry commit).
    fenced_at: Option<Instant>,
    /// A renewal could not be written: this driver may have lost the lease
    /// without hearing so, and stops without finishing the move.
    lease_unknown: bool,
}

/// What one renewal of a driver's lease (a progress report) tells it.
#[derive(Debug, PartialEq)]
enum Renewal {
    Renewed,
    /// The registry refused it: the lease is another driver's, or the move
    /// ended. The driver stops and its `FinishMove` is refused likewise.
    Refused(String),
    /// The write failed (no leader, a timeout): the lease may run out
    /// unrenewed while this driver goes on, and a successor may take the
    /// move over meanwhile. The driver stops and leaves the move running:
    /// the watchdog resumes it (this node's at once, under the lease it
    /// still holds; the registry leader's once the lease expired).
    Unknown(String),
}

/// The renewal a progress report's registry write amounts to.
fn renewal(written: Result<RegistryResponse, String>) -> Renewal {
    match written {
        Ok(response) => match response.rejection() {
            Some(reason @ Rejection::NotDriver { .. }) => {
                Renewal::Refused(format!("this driver lost the lease: {reason}"))
            }
            Some(reason) => Renewal::Refused(format!("the operation ended: {reason}")),
            None => Renewal::Renewed,
        },
        Err(e) => Renewal::Unknown(format!("the lease was not renewed: {e}")),
    }
}

/// Set in a node's environment (milliseconds), its drivers wait that long
/// before taking their lease: the one way tests make a node die between
/// accepting a move and driving it.
const FAULT_DRIVER_START_DELAY_MS: &str = "KEYHOLD_FAULT_DRIVER_START_DELAY_MS";

/// Takes the move's lease; `None` when another driver holds it (or the move
/// ended, or the registry cannot be written: the watchdog tries again).
async fn acquire(node: &Node, job: MoveJob) -> Option<Driver<'_>> {
    if let Some(ms) = std::env::var(FAULT_DRIVER_START_DELAY_MS)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        tracing::error!("{FAULT_DRIVER_START_DELAY_MS} is set: waiting {ms} ms before the lease");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let request = Request::AcquireDriver {
        operation_id: job.operation_id.clone(),
        holder: node.registry().id(),
        lease_ms: lease_ms(node),
        now_ms: now().0,
    };
    let written = match node.registry().write(request).await {
        Ok(written) => written,
        Err(e) => {
            tracing::warn!(operation = %job.operation_id, error = %e, "driver lease not taken");
            return None;
        }
    };
    match written.response {
        RegistryResponse::DriverLeased { lease } => {
            if lease.generation > 1 {
                metrics::counter!("keyhold_move_driver_takeovers_total").increment(1);
            }
            Some(Driver {
                node,
                job,
                generation: lease.generation,
                lease_index: written.log_index,
                fenced_at: None,
                lease_unknown: false,
            })
        }
        other => {
            tracing::info!(operation = %job.operation_id, ?other, "another driver holds the move");
            None
        }
    }
}

/// Drives one move to `done`, or aborts it, if it gets the move's lease.
async fn drive(node: Arc<Node>, job: MoveJob) {
    let Some(mut driver) = acquire(&node, job).await else {
        return;
    };
    let started = Instant::now();
    metrics::gauge!("keyhold_moves_running").increment(1.0);
    let result = driver.copy().await;
    let job = &driver.job;
    if driver.lease_unknown {
        let error = result.err().unwrap_or_default();
        tracing::error!(tenant = %job.tenant_id, operation = %job.operation_id, error, "move driver stopped; the watchdog resumes the move");
        metrics::gauge!("keyhold_moves_running").decrement(1.0);
        return;
    }
    if let Err(error) = &result {
        tracing::error!(tenant = %job.tenant_id, from = %job.from, to = %job.to, error, "tenant move failed; aborting");
        metrics::counter!("keyhold_moves_failed_total").increment(1);
    }
    let request = Request::FinishMove {
        tenant_id: job.tenant_id.clone(),
        operation_id: job.operation_id.clone(),
        generation: driver.generation,
        error: result.err(),
        now_ms: now().0,
    };
    match node.registry().write(request).await {
        Ok(written) => match written.response {
            RegistryResponse::MoveUpdated { operation, .. } => {
                // The tenant answered 503 tenant-moving from the fence on.
                if let Some(fenced_at) = driver.fenced_at {
                    metrics::histogram!("keyhold_move_fenced_seconds")
                        .record(fenced_at.elapsed().as_secs_f64());
                }
                if operation.state == OperationState::Done {
                    metrics::histogram!("keyhold_move_duration_seconds")
                        .record(started.elapsed().as_secs_f64());
                    tracing::info!(tenant = %job.tenant_id, from = %job.from, to = %job.to, "tenant moved");
                }
            }
            RegistryResponse::Rejected { reason } => {
                // Another driver took the move over (or finished it): this
                // one's work is void, and it must not report success.
                metrics::counter!("keyhold_move_driver_superseded_total").increment(1);
                tracing::error!(tenant = %job.tenant_id, %reason, "the registry refused to finish the move");
            }
            other => {
                tracing::error!(tenant = %job.tenant_id, ?other, "unexpected registry answer")
            }
        },
        // The operation stays running; the watchdog resumes it once the
        // lease expired.
        Err(e) => {
            tracing::error!(tenant = %job.tenant_id, error = %e, "move not finished in the registry")
        }
    }
    metrics::gauge!("keyhold_moves_running").decrement(1.0);
}

impl Driver<'_> {
    /// Reports progress and renews the lease; anything but a renewal stops
    /// the driver (`Renewal`).
    async fn report(&mut self, fraction: f64) -> Result<(), String> {
        let request = Request::ReportMove {
            operation_id: self.job.operation_id.clone(),
            generation: self.generation,
            progress: fraction.clamp(0.0, 0.99),
            lease_ms: lease_ms(self.node),
            now_ms: now().0,
        };
        let written = self.node.registry().write(request).await;
        match renewal(written.map(|w| w.response).map_err(|e| e.to_string())) {
            Renewal::Renewed => Ok(()),
            Renewal::Refused(reason) => Err(reason),
            Renewal::Unknown(reason) => {
                self.lease_unknown = true;
                Err(reason)
            }
        }
    }

    async fn copy(&mut self) -> Result<(), String> {
        self.report(0.0).await?;
        let job = self.job.clone();
        let (old, new) = (job.from.as_str(), job.to.as_str());
        let (t, op, epoch) = (&job.tenant_id, &job.operation_id, job.epoch);
        // The lease was granted after the move began: waiting for it covers both.
        let scope = format!(
            "operation_id={op}&epoch={epoch}&generation={}&registry_index={}",
            self.generation,
            self.lease_index.max(job.begin_index)
        );
        // 1. The old home starts the tenant's change index and keeps serving it.
        let track_path = format!("/internal/v1/moves/{t}/track?{scope}");
        let tracked = self
            .post_json(old, track_path.clone(), CallKind::MoveStep)
            .await?;
        let estimate = tracked["entries"].as_u64().unwrap_or(0).max(1) as f64;
        // 2. The first pass, online: the new home pulls every entry.
        let pull_path = format!("/internal/v1/moves/{t}/pull?{scope}");
        let copied = self
            .pull(new, &pull_path, Pass::Full, |copied| {
                FIRST_PASS_SHARE * copied as f64 / estimate
            })
            .await?;
        // 3. The catch-up, online: what the tenant changed while the first
        // pass ran (a tenant writing hundreds of orders a second changes
        // megabytes meanwhile). Tracking again first gives its mark: every
        // change after it is stamped higher, so the fenced pass carries only
        // what changed during the catch-up, and the 503s last that long.
        let tracked = self.post_json(old, track_path, CallKind::MoveStep).await?;
        let mark = tracked["mark"]
            .as_u64()
            .ok_or("the old home answered no mark")?;
        let caught_up = self
            .pull(new, &pull_path, Pass::Catchup, |_| FIRST_PASS_SHARE)
            .await?;
        // 4. The fence, which includes letting the old home's relay deliver the
        // tenant's events. From here on the tenant answers 503 tenant-moving.
        self.fenced_at = Some(Instant::now());
        let fence_path = format!("/internal/v1/moves/{t}/fence?{scope}");
        self.post_json(old, fence_path, CallKind::MoveFence).await?;
        if let Some(ms) = std::env::var(FAULT_DRIVER_PAUSE_MS)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            tracing::error!("{FAULT_DRIVER_PAUSE_MS} is set: stalling {ms} ms without renewing");
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        // 5. The final pass: only what changed since the catch-up's mark.
        let final_path = format!("{pull_path}&since={mark}");
        let changed = self
            .pull(new, &final_path, Pass::Changes, |_| FIRST_PASS_SHARE)
            .await?;
        tracing::info!(tenant = %t, copied, caught_up, changed, "tenant data copied");
        Ok(())
    }

    /// Has the new home pull every page of `pass` (call after call, renewing
    /// the lease with a progress report after each); returns how many entries
    /// it copied. `progress` maps entries copied so far to the fraction done.
    async fn pull(
        &mut self,
        region: &str,
        pull_path: &str,
        pass: Pass,
        progress: impl Fn(u64) -> f64,
    ) -> Result<u64, String> {
        let mut after: Option<String> = None;
        let mut copied = 0u64;
        loop {
            let mut path = format!("{pull_path}&pass={}", pass.as_str());
            if let Some(a) = &after {
                path.push_str("&after=");
                path.push_str(a);
            }
            let answer = self.post_json(region, path, CallKind::MovePull).await?;
            copied += answer["copied"].as_u64().unwrap_or(0);
            self.report(progress(copied)).await?;
            match answer["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return Ok(copied),
            }
        }
    }

    /// POSTs `path` to a node of `region` while renewing the lease; the JSON
    /// answer. Any node of the region: one that does not lead the region's
    /// store sends the call on to the leader.
    async fn post_json(
        &mut self,
        region: &str,
        path: String,
        kind: CallKind,
    ) -> Result<serde_json::Value, String> {
        let node = self.node;
        let call = Call::post(kind, path);
        let sent = async {
            let to = To::Region(region);
            let answer = node.peers().call_json(to, &call).await;
            answer.map_err(|e| e.to_string())
        };
        self.alive_while(sent).await
    }

    /// Runs `step`, renewing the lease meanwhile, so that no successor takes over
    /// while it runs.
    async fn alive_while<T>(
        &mut self,
        step: impl std::future::Future<Output = Result<T, String>>,
    ) -> Result<T, String> {
        tokio::pin!(step);
        loop {
            tokio::select! {
                out = &mut step => return out,
                _ = tokio::time::sleep(renew_every(self.node)) => self.report(0.0).await?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal the registry did not take stops the driver like a refused
    /// one (defect N6 of review-d44e5cf: it counted as renewed, so a driver
    /// cut off from the registry kept driving past its lease, beside the
    /// successor the registry gave the move to).
    #[test]
    fn a_renewal_that_was_not_written_stops_the_driver() {
        let failed = renewal(Err("no leader after 3 attempts".into()));
        assert!(matches!(failed, Renewal::Unknown(_)), "{failed:?}");
        assert_eq!(
            renewal(Ok(RegistryResponse::Ok)),
            Renewal::Renewed,
            "an accepted report renews"
        );
        let lost = renewal(Ok(RegistryResponse::Rejected {
            reason: Rejection::NotDriver {
                operation_id: "op".into(),
                generation: 1,
            },
        }));
        assert!(matches!(lost, Renewal::Refused(_)), "{lost:?}");
    }
}
