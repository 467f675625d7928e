//! The cluster under test and the faults done to it: `keyhold up` started as a
//! child process on a data dir and a free port range, killed with SIGKILL and
//! started again on the same dir and ports.
//!
//! Today `up` runs every node in one process, so a kill takes the whole cluster
//! down. [`Control`] names what the fault layer needs (kill a target, start
//! it); `UpProcess` answers `Unsupported` for a single node until `up` runs
//! nodes as processes with a control API, and the plan schedules only
//! whole-cluster kills until then. Isolation (`Fault::Isolate`) will go
//! through the same control API; today it answers `Unsupported` too.

use crate::limits::{PORTS_PER_CLUSTER, READY_TIMEOUT_MS};
use crate::plan::{ClusterOptions, KillTarget};
use crate::Error;
use serde::Deserialize;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `cluster.json`, the parts a run needs.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterFile {
    pub admin_token: String,
    pub regions: Vec<RegionEntry>,
    pub psp_url: String,
    pub tenants: Vec<TenantEntry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RegionEntry {
    pub name: String,
    pub api_url: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TenantEntry {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

/// What the fault layer can do to a cluster.
pub trait Control {
    /// SIGKILL the target: no flush, no clean shutdown.
    fn kill(
        &mut self,
        target: KillTarget,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
    /// Start the target again on its data dir.
    fn start(
        &mut self,
        target: KillTarget,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

/// `keyhold up` as one child process.
pub struct UpProcess {
    keyhold: PathBuf,
    dir: PathBuf,
    base_port: u16,
    options: ClusterOptions,
    child: Option<tokio::process::Child>,
    starts: u32,
    pub info: Option<ClusterFile>,
}

/// A base port whose whole range binds on 127.0.0.1 now.
fn free_base_port(salt: u64) -> Result<u16, Error> {
    let span = 60_000 - 20_000 - PORTS_PER_CLUSTER as u64;
    let mut x = salt ^ u64::from(std::process::id()).rotate_left(17);
    for _ in 0..200 {
        // xorshift: a different range per try, spread by seed and process.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = 20_000 + (x % span) as u16;
        let held: Result<Vec<TcpListener>, _> = (0..PORTS_PER_CLUSTER)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if held.is_ok() {
            return Ok(base);
        }
    }
    Err(Error::Cluster("no free port range in 20000..60000".into()))
}

impl UpProcess {
    /// A cluster over `dir` (its data in `dir/data`, logs beside it); not started.
    pub fn new(
        keyhold: &Path,
        dir: &Path,
        options: ClusterOptions,
        salt: u64,
    ) -> Result<Self, Error> {
        Ok(UpProcess {
            keyhold: keyhold.to_owned(),
            dir: dir.to_owned(),
            base_port: free_base_port(salt)?,
            options,
            child: None,
            starts: 0,
            info: None,
        })
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn info(&self) -> Result<&ClusterFile, Error> {
        self.info
            .as_ref()
            .ok_or_else(|| Error::Cluster("the cluster never started".into()))
    }

    fn log(&self, n: u32, stream: &str) -> PathBuf {
        self.dir.join(format!("up-{n}.{stream}.log"))
    }

    /// Starts `up` and waits for its cluster.json.
    async fn boot(&mut self) -> Result<(), Error> {
        self.starts += 1;
        let n = self.starts;
        let data = self.data_dir();
        std::fs::create_dir_all(&data)?;
        let cluster_json = data.join("cluster.json");
        let _ = std::fs::remove_file(&cluster_json);
        let mut cmd = tokio::process::Command::new(&self.keyhold);
        cmd.arg("up")
            .arg("--data-dir")
            .arg(&data)
            .arg("--base-port")
            .arg(self.base_port.to_string())
            .arg("--regions")
            .arg(crate::plan::REGIONS.join(","))
            .arg("--psp-drop-response-rate")
            .arg(self.options.psp_drop_response_rate.to_string())
            .arg("--psp-decline-rate")
            .arg(self.options.psp_decline_rate.to_string());
        if let Some(ms) = self.options.inter_region_rtt_ms {
            cmd.arg("--inter-region-rtt").arg(format!("{ms}ms"));
        }
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(self.log(n, "stdout"))?)
            .stderr(std::fs::File::create(self.log(n, "stderr"))?)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(Error::Cluster(format!(
                    "keyhold up exited with {status} before it was ready; see {}",
                    self.log(n, "stderr").display()
                )));
            }
            if let Ok(bytes) = std::fs::read(&cluster_json) {
                if let Ok(info) = serde_json::from_slice::<ClusterFile>(&bytes) {
                    self.info = Some(info);
                    self.child = Some(child);
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(Error::Cluster(format!(
                    "keyhold up was not ready within {READY_TIMEOUT_MS} ms; see {}",
                    self.log(n, "stderr").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the cluster for good: SIGKILL (the run's verdict is already in).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

impl Control for UpProcess {
    async fn kill(&mut self, target: KillTarget) -> Result<(), Error> {
        match target {
            KillTarget::Cluster => {
                self.stop().await;
                Ok(())
            }
            KillTarget::Node(id) => Err(Error::Unsupported(format!(
                "kill node {id}: `keyhold up` runs every node in one process"
            ))),
        }
    }

    async fn start(&mut self, target: KillTarget) -> Result<(), Error> {
        match target {
            KillTarget::Cluster => self.boot().await,
            KillTarget::Node(id) => Err(Error::Unsupported(format!(
                "start node {id}: `keyhold up` runs every node in one process"
            ))),
        }
    }
}
