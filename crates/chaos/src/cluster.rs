//! The cluster under test and the faults done to it: `keyhold up` started as a
//! child process on a data dir and a free port range. The whole cluster is
//! killed with SIGKILL (`up` and, with it, every node) and started again on the
//! same dir and ports; single nodes are killed, started, isolated and healed,
//! and regions isolated and healed, through `up`'s control API. [`Control`] names what the
//! fault layer needs.

use crate::limits::{
    BASE_PORT_END, BASE_PORT_MIN, CONTROL_TIMEOUT_MS, PORTS_PER_CLUSTER, READY_TIMEOUT_MS,
};
use crate::plan::{ClusterOptions, KillTarget};
use crate::Error;
pub use keyhold_clusterfile::ClusterFile;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A region's links to the others, as the fault layer sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Isolated: no connection between its nodes and other regions'.
    Cut,
    Healed,
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
    /// Cut region `REGIONS[region]` off from the others, or heal it.
    fn isolate(
        &mut self,
        region: usize,
        link: Link,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
    /// Cut one node off from every other node, or heal it.
    fn isolate_node(
        &mut self,
        node: u64,
        link: Link,
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

/// A base port whose whole range binds on 127.0.0.1 now, below Linux's
/// ephemeral ports (from 32768): an outgoing connection (a client's, a
/// proxy's) can hold an ephemeral port as its local port for as long as it
/// lives, and a restart of the cluster must bind every one of its ports again.
fn free_base_port(salt: u64) -> Result<u16, Error> {
    let span = u64::from(BASE_PORT_END) - u64::from(BASE_PORT_MIN) - PORTS_PER_CLUSTER as u64;
    let mut x = salt ^ u64::from(std::process::id()).rotate_left(17);
    for _ in 0..200 {
        // xorshift: a different range per try, spread by seed and process.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = BASE_PORT_MIN + (x % span) as u16;
        let held: Result<Vec<TcpListener>, _> = (0..PORTS_PER_CLUSTER)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if held.is_ok() {
            return Ok(base);
        }
    }
    Err(Error::Cluster(format!(
        "no free port range in {BASE_PORT_MIN}..{BASE_PORT_END}"
    )))
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
        let cluster_json = data.join(keyhold_clusterfile::FILE_NAME);
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
        if self.options.nodes_per_region != 1 {
            cmd.arg("--nodes-per-region")
                .arg(self.options.nodes_per_region.to_string());
        }
        if let Some(ms) = self.options.auto_failover_after_ms {
            cmd.arg("--auto-failover-after").arg(format!("{ms}ms"));
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
            // Absent until `up` is ready (it writes the file whole, then renames it).
            if let Ok(info) = ClusterFile::read(&cluster_json) {
                self.info = Some(info);
                self.child = Some(child);
                return Ok(());
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

    /// `POST` to the control API; it answers 200 once the change is done.
    async fn control(&self, path: &str) -> Result<(), Error> {
        let info = self.info()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(CONTROL_TIMEOUT_MS))
            .build()?;
        let answer = http
            .post(format!("{}{path}", info.control_url))
            .bearer_auth(&info.admin_token)
            .send()
            .await?;
        let status = answer.status();
        if status.is_success() {
            return Ok(());
        }
        let body = answer.text().await.unwrap_or_default();
        Err(Error::Cluster(format!(
            "control API {path}: {status} {body}"
        )))
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
            KillTarget::Node(id) => self.control(&format!("/v1/nodes/{id}/kill")).await,
        }
    }

    async fn start(&mut self, target: KillTarget) -> Result<(), Error> {
        match target {
            KillTarget::Cluster => self.boot().await,
            KillTarget::Node(id) => self.control(&format!("/v1/nodes/{id}/start")).await,
        }
    }

    async fn isolate(&mut self, region: usize, link: Link) -> Result<(), Error> {
        let action = match link {
            Link::Cut => "isolate",
            Link::Healed => "heal",
        };
        let name = crate::plan::REGIONS[region];
        self.control(&format!("/v1/regions/{name}/{action}")).await
    }

    async fn isolate_node(&mut self, node: u64, link: Link) -> Result<(), Error> {
        let action = match link {
            Link::Cut => "isolate",
            Link::Healed => "heal",
        };
        self.control(&format!("/v1/nodes/{node}/{action}")).await
    }
}
