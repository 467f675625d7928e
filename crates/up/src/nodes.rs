//! The node processes: each node is `keyhold serve --config FILE` (the binary
//! `up` was given), started, watched, killed and started again by `up`.
//!
//! Nodes die with their supervisor: `up` puts `KEYHOLD_SUPERVISOR_PID` in each
//! node's environment, and the node, first thing, asks the kernel for SIGKILL
//! when its parent dies (`follow_supervisor`, `prctl(PR_SET_PDEATHSIG)`), then
//! checks that its parent is still that process (closing the race with a
//! supervisor that died in between). This happens in the child rather than in a
//! `pre_exec` hook because the workspace forbids unsafe code. Nodes also stay in
//! `up`'s process group, so a signal to the group reaches them all.
//!
//! The kernel sends the death signal when the *thread* that spawned the child
//! exits: nodes are spawned from the runtime's worker threads, which live as
//! long as `up` does (never from `spawn_blocking`).

use crate::layout::NodePlan;
use crate::limits::{
    EXIT_POLL_MS, LOG_TAIL_BYTES_MAX, NODE_PORTS_FREE_WAIT_MS, NODE_START_WAIT_MS,
    NODE_STOP_WAIT_MS, PROBE_TIMEOUT_MS, READY_POLL_MS,
};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Child;
use tokio::sync::Mutex;

/// The environment variable naming the supervisor's pid in a node's environment.
pub const SUPERVISOR_PID_ENV: &str = "KEYHOLD_SUPERVISOR_PID";

/// Called by `keyhold serve` before anything else: when started by `up`, die
/// (SIGKILL) as soon as `up` dies, and refuse to run if it is already gone.
pub fn follow_supervisor() -> Result<(), Error> {
    let Ok(text) = std::env::var(SUPERVISOR_PID_ENV) else {
        return Ok(());
    };
    let supervisor: i32 = text
        .parse()
        .map_err(|_| Error::Config(format!("{SUPERVISOR_PID_ENV}={text:?} is not a pid")))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| Error::Config(format!("prctl(PR_SET_PDEATHSIG): {e}")))?;
    if nix::unistd::getppid().as_raw() != supervisor {
        return Err(Error::Config(format!(
            "the supervisor (pid {supervisor}) is gone; not starting"
        )));
    }
    Ok(())
}

/// Whether a node is running, as the control API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Running {
    Yes { pid: u32 },
    No,
}

/// Every node process of the cluster.
pub struct Nodes {
    keyhold: PathBuf,
    /// Arguments before `serve` (the log format).
    args: Vec<String>,
    plans: Vec<NodePlan>,
    /// One slot per node; the lock is held across a whole kill or start, so
    /// that the two never interleave on one node.
    children: Vec<Mutex<Option<Child>>>,
    http: reqwest::Client,
}

impl Nodes {
    pub fn new(
        keyhold: &Path,
        args: &[String],
        plans: Vec<NodePlan>,
        http: reqwest::Client,
    ) -> Nodes {
        let children = plans.iter().map(|_| Mutex::new(None)).collect();
        Nodes {
            keyhold: keyhold.to_owned(),
            args: args.to_vec(),
            plans,
            children,
            http,
        }
    }

    pub fn plans(&self) -> &[NodePlan] {
        &self.plans
    }

    /// The node with this id, by index.
    pub fn index_of(&self, node_id: u64) -> Option<usize> {
        self.plans.iter().position(|p| p.id == node_id)
    }

    /// Each node's pid, or `None` while it is down (or being started or killed).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.children
            .iter()
            .map(|slot| slot.try_lock().ok().and_then(|c| c.as_ref()?.id()))
            .collect()
    }

    /// Starts node `i` unless it runs, and waits until it answers `/healthz`.
    pub async fn start(&self, i: usize) -> Result<Running, Error> {
        let mut slot = self.children[i].lock().await;
        if let Some(pid) = alive(&mut slot) {
            return Ok(Running::Yes { pid });
        }
        let plan = &self.plans[i];
        wait_ports_free(plan).await?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&plan.log_file)?;
        let mut child = tokio::process::Command::new(&self.keyhold)
            .args(&self.args)
            .arg("serve")
            .arg("--config")
            .arg(&plan.config_file)
            .env(SUPERVISOR_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Error::Node(format!(
                    "cannot start {} serve: {e}",
                    self.keyhold.display()
                ))
            })?;
        let pid = child.id().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_millis(NODE_START_WAIT_MS);
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(Error::Node(format!(
                    "node {} exited with {status} while starting; its log {} ends:\n{}",
                    plan.id,
                    plan.log_file.display(),
                    log_tail(&plan.log_file)
                )));
            }
            if self.answers(&format!("{}/healthz", plan.api_url())).await {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(Error::Node(format!(
                    "node {} did not listen within {NODE_START_WAIT_MS} ms; see {}",
                    plan.id,
                    plan.log_file.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
        }
        tracing::info!(
            node_id = plan.id,
            region = %plan.region,
            api = %plan.api_url(),
            pid,
            log = %plan.log_file.display(),
            // The node's own line, repeated on `up`'s log with its pid and log file.
            "keyhold node listening"
        );
        *slot = Some(child);
        Ok(Running::Yes { pid })
    }

    /// SIGKILL node `i` (no clean shutdown) and reap it; a node that is down
    /// already stays down.
    pub async fn kill(&self, i: usize) -> Result<Running, Error> {
        let mut slot = self.children[i].lock().await;
        if let Some(mut child) = slot.take() {
            child.kill().await?;
            tracing::info!(node_id = self.plans[i].id, "node killed");
        }
        Ok(Running::No)
    }

    /// SIGTERM every running node, wait for them to finish, SIGKILL the rest.
    pub async fn stop_all(&self) {
        let mut running = Vec::new();
        for (i, slot) in self.children.iter().enumerate() {
            let mut slot = slot.lock().await;
            if let Some(child) = slot.take() {
                if let Some(pid) = child.id() {
                    let pid = nix::unistd::Pid::from_raw(pid as i32);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                }
                running.push((i, child));
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(NODE_STOP_WAIT_MS);
        for (i, mut child) in running {
            let id = self.plans[i].id;
            match tokio::time::timeout_at(deadline, child.wait()).await {
                Ok(Ok(status)) if status.success() => tracing::info!(node_id = id, "node stopped"),
                Ok(Ok(status)) => tracing::warn!(node_id = id, %status, "node stopped"),
                Ok(Err(e)) => tracing::warn!(node_id = id, error = %e, "node wait"),
                Err(_) => {
                    tracing::warn!(node_id = id, "node did not stop in time; SIGKILL");
                    let _ = child.kill().await;
                }
            }
        }
    }

    /// Reaps nodes that exit by themselves (a crash): each is logged, and
    /// stays down until the control API starts it. Calls `changed` after each.
    pub async fn watch(&self, changed: impl Fn()) {
        loop {
            tokio::time::sleep(Duration::from_millis(EXIT_POLL_MS)).await;
            for (i, slot) in self.children.iter().enumerate() {
                let Ok(mut slot) = slot.try_lock() else {
                    continue;
                };
                let exited = match slot.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => Some(status.to_string()),
                    Some(Err(e)) => Some(e.to_string()),
                    Some(Ok(None)) | None => None,
                };
                if let Some(how) = exited {
                    *slot = None;
                    let plan = &self.plans[i];
                    tracing::warn!(
                        node_id = plan.id,
                        region = %plan.region,
                        exit = %how,
                        log = %plan.log_file.display(),
                        "node exited unexpectedly; it stays down until started"
                    );
                    changed();
                }
            }
        }
    }

    /// True when `url` answers 200.
    pub async fn answers(&self, url: &str) -> bool {
        let sent = self
            .http
            .get(url)
            .timeout(Duration::from_millis(PROBE_TIMEOUT_MS))
            .send()
            .await;
        matches!(sent, Ok(r) if r.status().is_success())
    }

    /// A GET's status and body text, or why it got none.
    pub async fn probe(&self, url: &str) -> Result<(u16, String), String> {
        let r = self
            .http
            .get(url)
            .timeout(Duration::from_millis(PROBE_TIMEOUT_MS))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        Ok((status, r.text().await.unwrap_or_default()))
    }
}

/// The child's pid when it still runs; clears a slot whose child has exited.
fn alive(slot: &mut Option<Child>) -> Option<u32> {
    let child = slot.as_mut()?;
    match child.try_wait() {
        Ok(None) => child.id(),
        _ => {
            *slot = None;
            None
        }
    }
}

/// A node of an `up` that was just killed may still be exiting; its ports
/// free up within moments.
async fn wait_ports_free(plan: &NodePlan) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_millis(NODE_PORTS_FREE_WAIT_MS);
    loop {
        let free = [plan.api, plan.raft]
            .iter()
            .all(|addr| std::net::TcpListener::bind(addr).is_ok());
        if free {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Node(format!(
                "the ports of node {} ({} and {}) stay busy",
                plan.id, plan.api, plan.raft
            )));
        }
        tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES_MAX);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}
