//! The task that drives a planned tenant move, and the watchdog that resumes
//! moves whose driver went silent. Drivers are tracked background tasks of the
//! node (`Drivers`): at most one per operation on a node, stopped with it.
//!
//! A move is four steps, each safe to repeat:
//! 1. `BeginMove` in the registry (by the admin endpoint): the tenant is
//!    `moving` at its current epoch, so no node places requests for it (503
//!    `tenant-moving`).
//! 2. The old home fences its store for this operation and epoch (through the
//!    apply loop, so no queued command slips past) and lets its relay deliver
//!    the tenant's events, so order states settle before they travel.
//! 3. The tenant's records, markers and orders travel page by page (pages sized
//!    by bytes) from the old home's store into the new home's, each import
//!    scoped by the operation and epoch.
//! 4. `CompleteMove` in the registry: home is the new region, epoch + 1. `done`
//!    is reported by that same committed entry.
//!
//! A failure aborts the move (`AbortMove`: back to the old home, epoch + 1). A
//! registry rejection of either is a failure, never a success. Nobody calls the
//! old home to lift its fence: every store lifts its own once its registry
//! replica shows it owns the tenant at a later epoch (`cluster::follow_registry`
//! and the placement check), so a node that was down when the move ended lifts
//! it when it comes back.

use crate::limits::{
    MOVE_CALL_TIMEOUT_MS, MOVE_DRAIN_WAIT_MS, MOVE_HEARTBEAT_MS, MOVE_PAGE_BYTES_MAX,
    MOVE_PROGRESS_EVERY_PAGES, MOVE_STALL_MS, MOVE_WATCH_INTERVAL_MS,
};
use crate::node::{now, Node};
use crate::routes::NEXT_CURSOR;
use keyhold_registry::{
    Operation, OperationState, Request, Response as RegistryResponse, TenantState,
    NODE_CREDENTIAL_HEADER,
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

    /// Stops every driver (node shutdown). A stopped driver's move stays
    /// running in the registry; the watchdog of the registry leader's node
    /// resumes it.
    pub fn stop_all(&self) {
        for (_, task) in self.running.lock().expect("drivers lock").drain() {
            task.abort();
        }
    }
}

/// The job of a running move operation, from the local registry replica.
fn job_of(node: &Node, op: &Operation, begin_index: u64) -> Option<MoveJob> {
    let record = node.registry().tenant(&op.tenant_id)?;
    match &record.state {
        TenantState::Moving { operation_id, .. } if operation_id == &op.operation_id => {
            Some(MoveJob {
                tenant_id: op.tenant_id.clone(),
                from: op.from.clone(),
                to: op.to.clone(),
                operation_id: op.operation_id.clone(),
                epoch: record.epoch,
                begin_index,
            })
        }
        _ => None,
    }
}

/// On the registry leader's node: re-drives moves whose driver went silent
/// (it may have died with its node). Every step of a move is safe to repeat.
pub async fn resume_stalled(node: Arc<Node>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(MOVE_WATCH_INTERVAL_MS)) => {}
            _ = stop.changed() => return,
        }
        let registry = node.registry();
        if registry.leader() != Some(registry.id()) {
            continue;
        }
        let at = now().0;
        let stalled: Vec<Operation> = registry.read(|s| {
            s.operations
                .values()
                .filter(|op| !op.state.is_terminal())
                .filter(|op| at.saturating_sub(op.updated_at_ms) > MOVE_STALL_MS)
                .cloned()
                .collect()
        });
        for op in stalled {
            let Some(job) = job_of(&node, &op, registry.applied_index()) else {
                continue;
            };
            if node.drivers.start(node.clone(), job) {
                tracing::warn!(operation = %op.operation_id, tenant = %op.tenant_id, "resuming a stalled move");
                metrics::counter!("keyhold_move_driver_takeovers_total").increment(1);
            }
        }
    }
}

/// Drives one move to `done`, or aborts it.
async fn drive(node: Arc<Node>, job: MoveJob) {
    let started = Instant::now();
    metrics::gauge!("keyhold_moves_running").increment(1.0);
    let result = copy(&node, &job).await;
    let registry = node.registry();
    let (request, what) = match result {
        Ok(()) => (
            Request::CompleteMove {
                tenant_id: job.tenant_id.clone(),
                operation_id: job.operation_id.clone(),
                now_ms: now().0,
            },
            "complete",
        ),
        Err(error) => {
            tracing::error!(tenant = %job.tenant_id, from = %job.from, to = %job.to, error, "tenant move failed; aborting");
            metrics::counter!("keyhold_moves_failed_total").increment(1);
            (
                Request::AbortMove {
                    tenant_id: job.tenant_id.clone(),
                    operation_id: job.operation_id.clone(),
                    error,
                    now_ms: now().0,
                },
                "abort",
            )
        }
    };
    match registry.write(request).await {
        Ok(written) => match written.response {
            RegistryResponse::MoveUpdated { operation, .. } => {
                // The tenant was fenced (503 tenant-moving) from BeginMove on.
                metrics::histogram!("keyhold_move_fenced_seconds")
                    .record(started.elapsed().as_secs_f64());
                if operation.state == OperationState::Done {
                    metrics::histogram!("keyhold_move_duration_seconds")
                        .record(started.elapsed().as_secs_f64());
                    tracing::info!(tenant = %job.tenant_id, from = %job.from, to = %job.to, "tenant moved");
                }
            }
            RegistryResponse::Rejected { reason } => {
                // Another driver finished the move first (or the other way):
                // this one's work is void, and it must not report success.
                metrics::counter!("keyhold_move_driver_superseded_total").increment(1);
                tracing::error!(tenant = %job.tenant_id, %reason, what, "the registry refused to finish the move");
            }
            other => {
                tracing::error!(tenant = %job.tenant_id, ?other, what, "unexpected registry answer")
            }
        },
        // The operation stays running; the watchdog resumes it.
        Err(e) => {
            tracing::error!(tenant = %job.tenant_id, error = %e, what, "move not finished in the registry")
        }
    }
    metrics::gauge!("keyhold_moves_running").decrement(1.0);
}

/// One call to another node with the node credential; non-2xx is an error.
async fn call(
    node: &Node,
    builder: reqwest::RequestBuilder,
    timeout_ms: u64,
) -> Result<reqwest::Response, String> {
    let response = builder
        .header(NODE_CREDENTIAL_HEADER, node.credentials().current())
        .timeout(Duration::from_millis(timeout_ms))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    Err(format!("{status}: {text}"))
}

/// Reports progress; a refusal means the operation ended under this driver
/// (another one finished it), which stops the copy.
async fn progress(node: &Node, operation_id: &str, fraction: f64) -> Result<(), String> {
    let request = Request::UpdateOperation {
        operation_id: operation_id.to_owned(),
        state: OperationState::Running,
        progress: fraction.clamp(0.0, 0.99),
        error: None,
        now_ms: now().0,
    };
    match node.registry().write(request).await {
        Ok(written) => match written.response.rejection() {
            Some(reason) => Err(format!("the operation ended: {reason}")),
            None => Ok(()),
        },
        Err(e) => {
            tracing::warn!(operation_id, error = %e, "progress not recorded");
            Ok(())
        }
    }
}

async fn copy(node: &Node, job: &MoveJob) -> Result<(), String> {
    progress(node, &job.operation_id, 0.0).await?;
    let (_, old) = node
        .store_node_of(&job.from)
        .ok_or(format!("no node of region {}", job.from))?;
    let (_, new) = node
        .store_node_of(&job.to)
        .ok_or(format!("no node of region {}", job.to))?;
    let (t, op, epoch) = (&job.tenant_id, &job.operation_id, job.epoch);
    let scope = format!("operation_id={op}&epoch={epoch}");
    let fence_url = format!(
        "http://{}/internal/v1/moves/{t}/fence?{scope}&registry_index={}",
        old.api_addr, job.begin_index
    );
    // Fencing includes letting the old home's relay deliver the tenant's events.
    let fence = call(
        node,
        node.http().post(fence_url),
        MOVE_DRAIN_WAIT_MS + MOVE_CALL_TIMEOUT_MS,
    );
    let fenced: serde_json::Value = alive_while(node, op, fence)
        .await?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let estimate = fenced["entries"].as_u64().unwrap_or(0).max(1) as f64;
    let import_url = format!(
        "http://{}/internal/v1/moves/{t}/import?{scope}",
        new.api_addr
    );
    let mut cursor: Option<String> = None;
    let (mut copied, mut pages) = (0u64, 0u64);
    loop {
        let mut url = format!(
            "http://{}/internal/v1/moves/{t}/export?bytes_max={MOVE_PAGE_BYTES_MAX}",
            old.api_addr
        );
        if let Some(c) = &cursor {
            url.push_str("&after=");
            url.push_str(c);
        }
        let page = call(node, node.http().get(url), MOVE_CALL_TIMEOUT_MS).await?;
        let next = page
            .headers()
            .get(NEXT_CURSOR)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = page.bytes().await.map_err(|e| e.to_string())?;
        let imported: serde_json::Value = call(
            node,
            node.http().post(&import_url).body(bytes),
            MOVE_CALL_TIMEOUT_MS,
        )
        .await?
        .json()
        .await
        .map_err(|e| e.to_string())?;
        copied += imported["imported"].as_u64().unwrap_or(0);
        pages += 1;
        // A registry write per page would cost a Raft round trip each.
        if pages.is_multiple_of(MOVE_PROGRESS_EVERY_PAGES) {
            progress(node, op, copied as f64 / estimate).await?;
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    tracing::info!(tenant = %t, copied, pages, "tenant data copied");
    Ok(())
}

/// Runs `step`, reporting progress 0 every `MOVE_HEARTBEAT_MS` meanwhile, so the
/// leader's watchdog knows this driver is alive.
async fn alive_while<T>(
    node: &Node,
    operation_id: &str,
    step: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::pin!(step);
    loop {
        tokio::select! {
            out = &mut step => return out,
            _ = tokio::time::sleep(Duration::from_millis(MOVE_HEARTBEAT_MS)) => {
                progress(node, operation_id, 0.0).await?;
            }
        }
    }
}
