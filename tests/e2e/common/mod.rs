//! The end-to-end harness shared by every `tests/e2e/*.rs` file: it starts the
//! real `keyhold up` binary on a free loopback port range in a fresh temporary
//! directory, waits for `cluster.json`, and kills the process when dropped (so no
//! process outlives a test, passing or failing). It also owns the HTTP helpers:
//! [`Api`] sends requests to one node and checks the rules that hold for *every*
//! response (the `Keyhold-Region` header, problem+json error bodies, `Retry-After`
//! on 409 `request-in-progress`, 429 and 503), so each test gets those checks for
//! free on every request it makes.

#![allow(dead_code)]

pub mod drill;
pub mod load;
pub mod raw;

use reqwest::blocking::{Client, RequestBuilder};
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The binary under test.
pub const KEYHOLD: &str = env!("CARGO_BIN_EXE_keyhold");
/// How long `keyhold up` may take to write `cluster.json`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// ... with several nodes per region (three times the processes, and every
/// region group elects a leader): `up`'s own limit.
pub const REPLICATED_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How much longer than `up`'s own wait for its nodes (`NODE_STOP_WAIT_MS`)
/// `Cluster::terminate` waits for `up` to exit: its SIGKILL of a late node
/// and its own exit.
const TERMINATE_SLACK_MS: u64 = 10_000;
/// Ports `keyhold up` may use from its base port (contract section 9).
pub const PORTS_PER_CLUSTER: u16 = 50;

/// A random `u64` from the standard library's per-process random hasher keys.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

/// A short unique name, safe for keys, client_order_ids and tenant ids.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:012x}", random_u64() & 0xffff_ffff_ffff)
}

/// `keyhold up` puts its fake payment provider at the base port plus this.
pub const PSP_PORT_OFFSET: u16 = 40;
/// ... its control API here ...
pub const CONTROL_PORT_OFFSET: u16 = 41;
/// ... each node's Raft listener at the base port plus this plus its index ...
pub const RAFT_PORT_OFFSET: u16 = 10;
/// ... and the proxies in front of each node's API and Raft listeners here.
pub const API_PROXY_PORT_OFFSET: u16 = 20;
pub const RAFT_PROXY_PORT_OFFSET: u16 = 30;

/// Every port offset a cluster of `count` nodes uses (and a margin of API
/// ports, up to the first Raft port: an offset listed twice could never bind).
fn cluster_ports(count: u16) -> impl Iterator<Item = u16> {
    (0..(count + 2).min(RAFT_PORT_OFFSET))
        .chain((0..count).map(|i| RAFT_PORT_OFFSET + i))
        .chain((0..count).map(|i| API_PROXY_PORT_OFFSET + i))
        .chain((0..count).map(|i| RAFT_PROXY_PORT_OFFSET + i))
        .chain([PSP_PORT_OFFSET, CONTROL_PORT_OFFSET])
}

/// A base port whose ports for `count` nodes bind on 127.0.0.1 now, below
/// Linux's ephemeral ports (from 32768): an outgoing connection can hold an
/// ephemeral port for as long as it lives, and a restart binds them all again.
pub fn free_base_port(count: u16) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (random_u64() % (32_768 - 20_000 - PORTS_PER_CLUSTER as u64)) as u16;
        let mut held = Vec::new();
        let mut ports = cluster_ports(count);
        let ok = ports.all(|i| match TcpListener::bind(("127.0.0.1", base + i)) {
            Ok(l) => {
                held.push(l);
                true
            }
            Err(_) => false,
        });
        if ok {
            return base;
        }
    }
    panic!("no free port range found in 20000..32768");
}

#[derive(Debug, Clone)]
pub struct Region {
    pub name: String,
    pub api_url: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

/// One node process of `keyhold up` (cluster.json's `nodes`).
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub node_id: u64,
    pub region: String,
    pub api_url: String,
    /// `None` while the node is down.
    pub pid: Option<u32>,
}

/// `DIR/cluster.json`, parsed; `raw` keeps the whole document for shape checks.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    pub raw: Value,
    pub admin_token: String,
    pub regions: Vec<Region>,
    pub tenants: Vec<Tenant>,
    pub control_url: String,
    pub nodes: Vec<NodeInfo>,
}

impl ClusterInfo {
    fn parse(raw: Value) -> ClusterInfo {
        let s = |v: &Value, k: &str| -> String {
            v[k].as_str()
                .unwrap_or_else(|| panic!("cluster.json: {k} must be a string in {v}"))
                .to_owned()
        };
        let regions = raw["regions"]
            .as_array()
            .expect("cluster.json: regions must be an array")
            .iter()
            .map(|r| Region {
                name: s(r, "name"),
                api_url: s(r, "api_url"),
            })
            .collect();
        let tenants = raw["tenants"]
            .as_array()
            .expect("cluster.json: tenants must be an array")
            .iter()
            .map(|t| Tenant {
                tenant_id: s(t, "tenant_id"),
                home_region: s(t, "home_region"),
                token: s(t, "token"),
            })
            .collect();
        let nodes = raw["nodes"]
            .as_array()
            .expect("cluster.json: nodes must be an array")
            .iter()
            .map(|n| NodeInfo {
                node_id: n["node_id"].as_u64().expect("cluster.json: node_id"),
                region: s(n, "region"),
                api_url: s(n, "api_url"),
                pid: n["pid"].as_u64().map(|p| p as u32),
            })
            .collect();
        ClusterInfo {
            admin_token: s(&raw, "admin_token"),
            control_url: s(&raw, "control_url"),
            regions,
            tenants,
            nodes,
            raw,
        }
    }
}

/// One running `keyhold up` process over a temporary data dir.
pub struct Cluster {
    tmp: tempfile::TempDir,
    child: Option<Child>,
    pub base_port: u16,
    regions: Vec<String>,
    extra: Vec<String>,
    /// Environment variables set on the next start (fault injection).
    pub env: Vec<(String, String)>,
    starts: u32,
    pub info: ClusterInfo,
}

/// Why one start attempt did not give a ready cluster.
enum StartError {
    /// The process exited before writing cluster.json.
    Exited(ExitStatus, String),
}

impl Cluster {
    /// Waits until region `region`'s standby lags by no command (cluster view
    /// through region c).
    pub fn standby_caught_up(&self, region: &str) {
        poll(Duration::from_secs(20), "the standby caught up", || {
            let view = self
                .api("c")
                .get("/admin/v1/cluster", Some(&self.info.admin_token))
                .json();
            let lag = view["regions"]
                .as_array()?
                .iter()
                .find(|r| r["name"] == region)?["replication_lag"]
                .clone();
            (lag["commands"] == 0).then_some(())
        });
    }

    /// `keyhold up --regions <regions> <extra...>` on a fresh dir and free ports.
    pub fn start(regions: &str, extra: &[&str]) -> Cluster {
        let tmp = tempfile::Builder::new()
            .prefix("keyhold-e2e-")
            .tempdir()
            .expect("tempdir");
        let regions: Vec<String> = regions.split(',').map(str::to_owned).collect();
        let mut cluster = Cluster {
            tmp,
            child: None,
            base_port: 0,
            regions,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            starts: 0,
            info: ClusterInfo {
                raw: Value::Null,
                admin_token: String::new(),
                regions: Vec::new(),
                tenants: Vec::new(),
                control_url: String::new(),
                nodes: Vec::new(),
            },
        };
        cluster.boot(None);
        cluster
    }

    pub fn data_dir(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    /// `--nodes-per-region` as given in the extra arguments (1 without it).
    fn nodes_per_region(&self) -> u16 {
        self.extra
            .iter()
            .position(|a| a == "--nodes-per-region")
            .and_then(|i| self.extra.get(i + 1))
            .map_or(1, |n| n.parse().expect("--nodes-per-region takes a number"))
    }

    /// How many node processes the cluster has.
    fn node_count(&self) -> u16 {
        self.regions.len() as u16 * self.nodes_per_region()
    }

    fn ready_timeout(&self) -> Duration {
        if self.nodes_per_region() > 1 {
            REPLICATED_READY_TIMEOUT
        } else {
            READY_TIMEOUT
        }
    }

    fn log_path(&self, n: u32, stream: &str) -> PathBuf {
        self.tmp.path().join(format!("up-{n}.{stream}.log"))
    }

    /// Starts `up` (retrying on port clashes) and waits for cluster.json.
    fn boot(&mut self, port: Option<u16>) {
        let mut port = port;
        let mut last = String::new();
        for _ in 0..5 {
            let base = port
                .take()
                .unwrap_or_else(|| free_base_port(self.node_count()));
            match self.try_boot(base) {
                Ok(()) => return,
                Err(StartError::Exited(status, stderr)) => {
                    last = format!("exit {status}: {stderr}");
                    if !stderr.contains("listen") {
                        break;
                    }
                }
            }
        }
        panic!("keyhold up did not start: {last}");
    }

    fn try_boot(&mut self, base: u16) -> Result<(), StartError> {
        self.starts += 1;
        let n = self.starts;
        let data = self.data_dir();
        // A stale cluster.json must not be mistaken for readiness.
        let cluster_json = data.join("cluster.json");
        let _ = std::fs::remove_file(&cluster_json);
        let stdout = File::create(self.log_path(n, "stdout")).expect("log file");
        let stderr = File::create(self.log_path(n, "stderr")).expect("log file");
        let mut cmd = Command::new(KEYHOLD);
        cmd.arg("up")
            .arg("--data-dir")
            .arg(&data)
            .arg("--base-port")
            .arg(base.to_string())
            .arg("--regions")
            .arg(self.regions.join(","))
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let mut child = cmd.spawn().expect("spawn keyhold up");
        let ready_timeout = self.ready_timeout();
        let deadline = Instant::now() + ready_timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                let err = std::fs::read_to_string(self.log_path(n, "stderr")).unwrap_or_default();
                return Err(StartError::Exited(status, err));
            }
            if let Ok(bytes) = std::fs::read(&cluster_json) {
                if let Ok(raw) = serde_json::from_slice::<Value>(&bytes) {
                    self.info = ClusterInfo::parse(raw);
                    self.base_port = base;
                    self.child = Some(child);
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "keyhold up wrote no cluster.json within {ready_timeout:?}; stderr:\n{}",
                    self.stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole stderr log of the current process so far.
    pub fn stderr_log(&self) -> String {
        std::fs::read_to_string(self.log_path(self.starts, "stderr")).unwrap_or_default()
    }

    /// The last part of the current process's stderr log.
    pub fn stderr_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.log_path(self.starts, "stderr")).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    /// Waits (bounded) for the process to exit by itself; returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: the process gets no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (bounded) for a clean exit; returns its status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        // `up` gives its nodes NODE_STOP_WAIT_MS to stop before it kills
        // them: the bound here must outlast that, or a node that takes its
        // whole allowance on a loaded machine fails the test while `up` is
        // still doing what it promises (seen once in CI: 15 s against 15 s).
        let allowed = Duration::from_millis(keyhold_up::limits::NODE_STOP_WAIT_MS)
            + Duration::from_millis(TERMINATE_SLACK_MS);
        let deadline = Instant::now() + allowed;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("keyhold up did not exit within {allowed:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `up` again on the same data dir (after `kill9` or `terminate`),
    /// on the same base port when it is free again, else on another.
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "stop the cluster before restarting it"
        );
        // The registry knows the nodes by their addresses, so a cluster restarts
        // on the ports it was created with; wait (bounded) for them to be free.
        let same = self.base_port;
        let n = self.node_count();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cluster_ports(n).all(|i| TcpListener::bind(("127.0.0.1", same + i)).is_ok()) {
            assert!(Instant::now() < deadline, "ports of the cluster stay busy");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.boot(Some(same));
    }

    /// Reads cluster.json again (`up` rewrites it when a node's pid changes).
    pub fn reload_info(&mut self) {
        let bytes = std::fs::read(self.data_dir().join("cluster.json")).expect("cluster.json");
        self.info = ClusterInfo::parse(serde_json::from_slice(&bytes).expect("cluster.json"));
    }

    /// The node of `region`, as cluster.json last read says.
    pub fn node(&self, region: &str) -> NodeInfo {
        self.info
            .nodes
            .iter()
            .find(|n| n.region == region)
            .unwrap_or_else(|| panic!("no node of region {region} in cluster.json"))
            .clone()
    }

    /// Every node of `region` (its first node first), as cluster.json last read says.
    pub fn nodes_of(&self, region: &str) -> Vec<NodeInfo> {
        self.info
            .nodes
            .iter()
            .filter(|n| n.region == region)
            .cloned()
            .collect()
    }

    /// Every running process of the cluster: `up` and its nodes.
    pub fn pids(&self) -> Vec<u32> {
        let nodes = self.info.nodes.iter().filter_map(|n| n.pid);
        self.child.iter().map(Child::id).chain(nodes).collect()
    }

    /// `POST` to the control API with the admin token (or `token`); the
    /// answer's status and JSON body, after checking that errors are problem+json.
    pub fn control_as(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut rb = Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client")
            .post(format!("{}{path}", self.info.control_url));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let r = rb.send().expect("control API answers");
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body: Value = r.json().expect("control API answers JSON");
        if status >= 400 {
            assert_eq!(content_type, "application/problem+json", "{body}");
            assert_eq!(body["status"], status, "{body}");
        }
        (status, body)
    }

    #[track_caller]
    pub fn control(&self, path: &str) -> Value {
        let (status, body) = self.control_as(path, Some(&self.info.admin_token.clone()));
        assert_eq!(status, 200, "control {path}: {body}");
        body
    }

    /// Waits (bounded) until `up` reports the node of `region` down (it exited
    /// and was reaped), and rereads cluster.json.
    pub fn wait_node_down(&mut self, region: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.reload_info();
            if self.node(region).pid.is_none() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the node of {region} still runs after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The log file of the node of `region`.
    pub fn node_log(&self, region: &str) -> String {
        let id = self.node(region).node_id;
        let path = self.data_dir().join("logs").join(format!("node-{id}.log"));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    pub fn region(&self, name: &str) -> &Region {
        self.info
            .regions
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name} in cluster.json"))
    }

    /// An API client for one region's node.
    pub fn api(&self, region: &str) -> Api {
        let r = self.region(region);
        Api::new(&r.api_url, &r.name)
    }

    /// The demo tenant homed in `region`.
    pub fn tenant(&self, region: &str) -> Tenant {
        self.info
            .tenants
            .iter()
            .find(|t| t.home_region == region)
            .unwrap_or_else(|| panic!("no demo tenant homed in {region}"))
            .clone()
    }

    /// Creates a tenant through the admin API of its home region's node.
    pub fn create_tenant(&self, home_region: &str, extra: Value) -> Tenant {
        let api = self.api(home_region);
        let tenant_id = unique("t");
        let mut body = serde_json::json!({"tenant_id": tenant_id, "home_region": home_region});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                body[k] = v;
            }
        }
        let r = api.post_json(
            "/admin/v1/tenants",
            Some(&self.info.admin_token),
            &body.to_string(),
        );
        assert_eq!(r.status, 201, "create tenant: {}", r.text());
        let j = r.json();
        assert_eq!(j["tenant_id"], tenant_id.as_str());
        Tenant {
            tenant_id,
            home_region: home_region.to_owned(),
            token: j["token"]
                .as_str()
                .expect("token shown at creation")
                .to_owned(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "--- keyhold up stderr (tail, {}) ---\n{}",
                self.tmp.path().display(),
                self.stderr_tail()
            );
        }
        self.kill9();
        // A failed run's data dir (node logs, stores) kept for reading.
        if std::thread::panicking() && std::env::var_os(KEEP_FAILED_ENV).is_some() {
            let dir = std::mem::replace(&mut self.tmp, tempfile::tempdir().expect("tempdir"));
            eprintln!("kept {} ({KEEP_FAILED_ENV} is set)", dir.keep().display());
        }
    }
}

/// Set, a failed test's cluster data dir is kept rather than removed.
const KEEP_FAILED_ENV: &str = "KEYHOLD_E2E_KEEP_FAILED";

/// Runs `keyhold <args>` to completion (bounded) and returns its status and stderr.
pub fn run_to_exit(args: &[&str], timeout: Duration) -> (ExitStatus, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let err_path = tmp.path().join("stderr.log");
    let mut child = Command::new(KEYHOLD)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).expect("log"))
        .spawn()
        .expect("spawn keyhold");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return (
                status,
                std::fs::read_to_string(&err_path).unwrap_or_default(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "keyhold {args:?} still running after {timeout:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A whole HTTP response, read eagerly.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        let mut all = self.headers.get_all(name).iter();
        let first = all.next()?;
        assert!(all.next().is_none(), "header {name} given more than once");
        Some(first.to_str().expect("visible ASCII header").to_owned())
    }

    pub fn content_type(&self) -> String {
        self.header("content-type").unwrap_or_default()
    }

    /// The problem slug (last segment of `type`) of an error response.
    pub fn slug(&self) -> Option<String> {
        if !self.content_type().starts_with("application/problem+json") {
            return None;
        }
        let j: Value = serde_json::from_slice(&self.body).ok()?;
        Some(j["type"].as_str()?.rsplit('/').next()?.to_owned())
    }

    /// Asserts an RFC 9457 problem with this status and slug; returns its body.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(
            (self.status, self.slug().as_deref()),
            (status, Some(slug)),
            "expected {status} {slug}, got {} {}",
            self.status,
            self.text()
        );
        self.json()
    }

    #[track_caller]
    pub fn assert_status(&self, status: u16) -> &Resp {
        assert_eq!(self.status, status, "body: {}", self.text());
        self
    }

    /// `errors[].pointer` of an `invalid-request` problem.
    pub fn error_pointers(&self) -> Vec<String> {
        self.json()["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("problem has no errors array: {}", self.text()))
            .iter()
            .map(|e| {
                e["pointer"]
                    .as_str()
                    .unwrap_or_else(|| panic!("error without pointer: {e}"))
                    .to_owned()
            })
            .collect()
    }
}

/// Checks every rule that holds for every response of a node.
#[track_caller]
pub fn check_common(resp: &Resp, region: &str) {
    assert_eq!(
        resp.header("keyhold-region").as_deref(),
        Some(region),
        "every response carries Keyhold-Region (status {}, body {})",
        resp.status,
        resp.text()
    );
    if resp.status >= 400 {
        assert!(
            resp.content_type().starts_with("application/problem+json"),
            "error {} must be application/problem+json, is {:?}: {}",
            resp.status,
            resp.content_type(),
            resp.text()
        );
        let j: Value = serde_json::from_slice(&resp.body)
            .unwrap_or_else(|e| panic!("problem body is not JSON ({e}): {}", resp.text()));
        let type_uri = j["type"].as_str().expect("problem has a type");
        assert!(
            type_uri.starts_with("https://") || type_uri.starts_with("http://"),
            "problem type is a URI: {type_uri}"
        );
        assert!(
            !type_uri.ends_with('/') && type_uri.rsplit('/').next().is_some_and(|s| !s.is_empty()),
            "problem type ends with a slug: {type_uri}"
        );
        assert!(
            j["title"].as_str().is_some_and(|t| !t.is_empty()),
            "problem has a title: {j}"
        );
        assert_eq!(
            j["status"].as_u64(),
            Some(resp.status as u64),
            "problem status: {j}"
        );
        let retryable = resp.status == 429
            || resp.status == 503
            || resp.slug().as_deref() == Some("request-in-progress");
        if retryable {
            let ra = resp.header("retry-after").unwrap_or_else(|| {
                panic!("{} {} must carry Retry-After", resp.status, resp.text())
            });
            assert!(
                ra.parse::<u64>().is_ok(),
                "Retry-After is delay-seconds: {ra:?}"
            );
        }
    }
}

/// A client for one node; every response goes through [`check_common`].
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub region: String,
    pub client: Client,
}

impl Api {
    pub fn new(base: &str, region: &str) -> Api {
        Api {
            base: base.trim_end_matches('/').to_owned(),
            region: region.to_owned(),
            client: Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str) -> RequestBuilder {
        self.client.post(self.url(path))
    }

    pub fn get_rb(&self, path: &str) -> RequestBuilder {
        self.client.get(self.url(path))
    }

    /// Sends, reads the whole answer, checks the common rules.
    #[track_caller]
    pub fn send(&self, rb: RequestBuilder) -> Resp {
        self.try_send(rb)
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    }

    /// Sends without panicking on transport errors (for crash tests); the common
    /// checks still apply to any answer.
    pub fn try_send(&self, rb: RequestBuilder) -> Result<Resp, reqwest::Error> {
        let r = rb.send()?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.bytes()?.to_vec();
        let resp = Resp {
            status,
            headers,
            body,
        };
        check_common(&resp, &self.region);
        Ok(resp)
    }

    #[track_caller]
    pub fn get(&self, path: &str, token: Option<&str>) -> Resp {
        let mut rb = self.get_rb(path);
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        self.send(rb)
    }

    #[track_caller]
    pub fn post_json(&self, path: &str, token: Option<&str>, body: &str) -> Resp {
        let mut rb = self
            .post(path)
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        self.send(rb)
    }

    /// `POST /v1/orders` with a token, an `Idempotency-Key` and a JSON body.
    pub fn order_rb(&self, token: &str, key: &str, body: &str) -> RequestBuilder {
        self.post("/v1/orders")
            .bearer_auth(token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
    }

    #[track_caller]
    pub fn create_order(&self, token: &str, key: &str, body: &str) -> Resp {
        self.send(self.order_rb(token, key, body))
    }

    #[track_caller]
    pub fn get_order(&self, token: &str, order_id: &str) -> Resp {
        self.get(&format!("/v1/orders/{order_id}"), Some(token))
    }

    #[track_caller]
    pub fn find_order(&self, token: &str, client_order_id: &str) -> Resp {
        self.get(
            &format!("/v1/orders?client_order_id={client_order_id}"),
            Some(token),
        )
    }
}

/// A minimal valid order body (compact JSON).
pub fn order_body(client_order_id: &str, amount: u64) -> String {
    serde_json::json!({
        "client_order_id": client_order_id,
        "cart_id": "cart-1",
        "amount": amount,
        "currency": "EUR",
    })
    .to_string()
}

/// Checks a fresh order answer (201 or 200) and returns its body.
#[track_caller]
pub fn assert_order(resp: &Resp, status: u16, client_order_id: &str, amount: u64) -> Value {
    resp.assert_status(status);
    let j = resp.json();
    for field in [
        "order_id",
        "client_order_id",
        "cart_id",
        "amount",
        "currency",
        "status",
        "home_region",
        "created_at",
    ] {
        assert!(j.get(field).is_some(), "order body lacks {field}: {j}");
    }
    assert_eq!(j["client_order_id"], client_order_id);
    let status = j["status"].as_str().unwrap_or_default();
    assert!(ORDER_STATUSES.contains(&status), "order status {status:?}");
    assert_eq!(j["amount"].as_u64(), Some(amount));
    let order_id = j["order_id"].as_str().expect("order_id is a string");
    assert_eq!(
        resp.header("location").as_deref(),
        Some(format!("/v1/orders/{order_id}").as_str()),
        "Location of the order"
    );
    j
}

/// `sha256:` + 64 lowercase hex digits.
pub fn is_sha256_fingerprint(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
/// The leader of a region's store as the first of `nodes` that answers reports
/// it (`GET /admin/v1/cluster`, `store.leader`).
pub fn region_leader(cluster: &Cluster, nodes: &[NodeInfo]) -> Option<u64> {
    let http = Client::new();
    nodes.iter().find_map(|node| {
        let view: Value = http
            .get(format!("{}/admin/v1/cluster", node.api_url))
            .bearer_auth(&cluster.info.admin_token)
            .timeout(Duration::from_secs(2))
            .send()
            .ok()?
            .json()
            .ok()?;
        view["store"]["leader"].as_u64()
    })
}

/// Waits (bounded) until the node answers `/readyz` with 200.
pub fn wait_ready(node: &NodeInfo, timeout: Duration) {
    let http = Client::new();
    poll(timeout, &format!("node {} ready", node.node_id), || {
        http.get(format!("{}/readyz", node.api_url))
            .timeout(Duration::from_secs(2))
            .send()
            .ok()
            .filter(|r| r.status().as_u16() == 200)
            .map(|_| ())
    });
}

pub fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads a file under a path for diagnostics.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The TCP sockets a process listens on, as `(local address in /proc hex, port)`,
/// from `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}` (Linux only).
#[cfg(target_os = "linux")]
pub fn listening_sockets(pid: u32) -> Vec<(String, u16)> {
    let mut inodes = std::collections::HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read /proc/<pid>/fd") {
        let Ok(entry) = entry else { continue };
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = read(Path::new(&format!("/proc/{pid}/net/{table}")));
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (addr, port) = f[1].split_once(':').expect("addr:port");
            out.push((
                addr.to_owned(),
                u16::from_str_radix(port, 16).expect("hex port"),
            ));
        }
    }
    out
}

/// One `keyhold serve --config FILE` process; killed when dropped.
pub struct ServeNode {
    tmp: tempfile::TempDir,
    child: Child,
    pub api: Api,
    pub admin_token: String,
}

impl ServeNode {
    /// Writes a config (`region = "<region>"`, a fresh data dir, a free port, an
    /// admin token, plus `extra_toml`) and waits for `/readyz`.
    pub fn start(region: &str, extra_toml: &str) -> ServeNode {
        let tmp = tempfile::Builder::new()
            .prefix("keyhold-serve-")
            .tempdir()
            .expect("tempdir");
        let admin_token = format!("admin-{:016x}{:016x}", random_u64(), random_u64());
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_base_port(1);
            let config = tmp.path().join("node.toml");
            std::fs::write(
                &config,
                format!(
                    "region = \"{region}\"\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{port}\"\nadmin_token = \"{admin_token}\"\n{extra_toml}",
                    tmp.path().join("data").display()
                ),
            )
            .expect("write config");
            let err_path = tmp.path().join("serve.stderr.log");
            let mut child = Command::new(KEYHOLD)
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&err_path).expect("log"))
                .spawn()
                .expect("spawn keyhold serve");
            let api = Api::new(&format!("http://127.0.0.1:{port}"), region);
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    last = format!("exit {status}: {}", read(&err_path));
                    break;
                }
                // Ready, not just alive: the registry has a leader and the regions.
                let up = api
                    .client
                    .get(api.url("/readyz"))
                    .send()
                    .is_ok_and(|r| r.status().as_u16() == 200);
                if up {
                    return ServeNode {
                        tmp,
                        child,
                        api,
                        admin_token,
                    };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "keyhold serve not healthy within {READY_TIMEOUT:?}: {}",
                        read(&err_path)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !last.contains("listen") {
                break;
            }
        }
        panic!("keyhold serve did not start: {last}");
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The order statuses of contract section 4.
pub const ORDER_STATUSES: [&str; 3] = ["CONFIRMED", "PAID", "PAYMENT_FAILED"];

/// Asserts that `current` is the same order as `created`, whose `status` may
/// have moved on since creation (CONFIRMED, then PAID or PAYMENT_FAILED).
#[track_caller]
pub fn assert_same_order(current: &Value, created: &Value) {
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().expect("order object").remove("status");
        v
    };
    assert_eq!(strip(current), strip(created), "the same order");
    let status = current["status"].as_str().unwrap_or_default();
    assert!(ORDER_STATUSES.contains(&status), "order status {status:?}");
}

/// Checks the rules of [`check_common`] for an answer whose `Keyhold-Region` may
/// be any of `allowed` (forwarded answers name the home, local refusals the node
/// itself); returns the region it names.
#[track_caller]
pub fn check_common_any(resp: &Resp, allowed: &[&str]) -> String {
    let region = resp.header("keyhold-region").unwrap_or_else(|| {
        panic!(
            "every response carries Keyhold-Region (status {}, body {})",
            resp.status,
            resp.text()
        )
    });
    assert!(
        allowed.contains(&region.as_str()),
        "Keyhold-Region {region:?} is not one of {allowed:?} (status {}, body {})",
        resp.status,
        resp.text()
    );
    check_common(resp, &region);
    region
}

impl Api {
    /// Like [`Api::try_send`], but the answer's `Keyhold-Region` may be any of
    /// `allowed` (see [`check_common_any`]).
    pub fn try_send_any(
        &self,
        rb: RequestBuilder,
        allowed: &[&str],
    ) -> Result<Resp, reqwest::Error> {
        let r = rb.send()?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.bytes()?.to_vec();
        let resp = Resp {
            status,
            headers,
            body,
        };
        check_common_any(&resp, allowed);
        Ok(resp)
    }

    /// The same node, but expecting answers executed in `region` (a request
    /// forwarded to its home region carries the home's `Keyhold-Region`).
    pub fn expecting(&self, region: &str) -> Api {
        Api {
            base: self.base.clone(),
            region: region.to_owned(),
            client: self.client.clone(),
        }
    }
}

/// One member of a [`ServeCluster`]: a `keyhold serve --config` process.
pub struct ServeMember {
    pub node_id: u64,
    pub region: String,
    pub api_addr: String,
    pub raft_addr: String,
    dir: PathBuf,
    child: Option<Child>,
    starts: u32,
    stopped: bool,
    /// Environment variables set on this member's next start (fault injection).
    pub env: Vec<(String, String)>,
}

impl ServeMember {
    fn config_path(&self) -> PathBuf {
        self.dir.join("node.toml")
    }

    fn log_path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("serve-{n}.stderr.log"))
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let stderr = File::create(self.log_path(self.starts)).expect("log file");
        let child = Command::new(KEYHOLD)
            .arg("serve")
            .arg("--config")
            .arg(self.config_path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn keyhold serve");
        self.child = Some(child);
        self.stopped = false;
    }

    /// The last part of the current process's stderr log.
    pub fn stderr_tail(&self) -> String {
        let text = read(&self.log_path(self.starts));
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

/// N `keyhold serve --config` processes forming one cluster: one node per region,
/// node ids 1..=N, every member listed in every config, one admin token, a data
/// dir each. Nodes can be SIGKILLed and restarted on the same data dir, or frozen
/// with SIGSTOP and thawed with SIGCONT. Every process is killed when dropped.
pub struct ServeCluster {
    tmp: tempfile::TempDir,
    pub admin_token: String,
    /// The cluster's node credential (in every config's `node_credential_file`).
    pub node_credential: String,
    pub members: Vec<ServeMember>,
}

/// `count` distinct loopback ports that were free a moment ago.
fn free_ports(count: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)).expect("bind an ephemeral port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

impl ServeCluster {
    /// Starts one node per region (`extra_toml` is added to every config's
    /// top-level keys) and waits until every node's `/readyz` is 200.
    pub fn start(regions: &[&str], extra_toml: &str) -> ServeCluster {
        let tmp = tempfile::Builder::new()
            .prefix("keyhold-serve-cluster-")
            .tempdir()
            .expect("tempdir");
        let admin_token = format!("admin-{:016x}{:016x}", random_u64(), random_u64());
        let node_credential = format!("node-{:016x}{:016x}", random_u64(), random_u64());
        std::fs::write(tmp.path().join("node-credential"), &node_credential)
            .expect("write the node credential");
        let mut cluster = ServeCluster {
            tmp,
            admin_token,
            node_credential,
            members: Vec::new(),
        };
        let mut last = String::new();
        for attempt in 0..4 {
            cluster.configure(regions, extra_toml, attempt);
            for m in &mut cluster.members {
                m.spawn();
            }
            match cluster.wait_all_ready(READY_TIMEOUT) {
                Ok(()) => return cluster,
                Err(e) => {
                    last = e;
                    for m in &mut cluster.members {
                        if let Some(mut child) = m.child.take() {
                            let _ = child.kill();
                            let _ = child.wait();
                        }
                    }
                    // Only a port clash is worth another try on fresh ports.
                    if !last.contains("listen") {
                        break;
                    }
                }
            }
        }
        panic!("the serve cluster did not start: {last}");
    }

    /// Writes every member's config on fresh ports (attempt `n`: fresh dirs too).
    fn configure(&mut self, regions: &[&str], extra_toml: &str, n: u32) {
        let ports = free_ports(regions.len() * 2);
        let members: Vec<(u64, String, String, String)> = regions
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    i as u64 + 1,
                    r.to_string(),
                    format!("127.0.0.1:{}", ports[2 * i]),
                    format!("127.0.0.1:{}", ports[2 * i + 1]),
                )
            })
            .collect();
        let regions_toml = regions
            .iter()
            .map(|r| format!("\"{r}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut members_toml = String::new();
        for (id, region, api, raft) in &members {
            members_toml.push_str(&format!(
                "\n[[members]]\nid = {id}\nregion = \"{region}\"\napi_addr = \"{api}\"\nraft_addr = \"{raft}\"\n"
            ));
        }
        self.members.clear();
        for (id, region, api, raft) in members {
            let dir = self.tmp.path().join(format!("try{n}-node{id}-{region}"));
            std::fs::create_dir_all(&dir).expect("node dir");
            let config = format!(
                "region = \"{region}\"\nregions = [{regions_toml}]\ndata_dir = \"{}\"\nlisten = \"{api}\"\nnode_id = {id}\nraft_listen = \"{raft}\"\nadmin_token = \"{}\"\nnode_credential_file = \"{}\"\n{extra_toml}\n{members_toml}",
                dir.join("data").display(),
                self.admin_token,
                self.tmp.path().join("node-credential").display(),
            );
            std::fs::write(dir.join("node.toml"), config).expect("write config");
            self.members.push(ServeMember {
                node_id: id,
                region,
                api_addr: api,
                raft_addr: raft,
                dir,
                child: None,
                starts: 0,
                stopped: false,
                env: Vec::new(),
            });
        }
    }

    fn wait_all_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ready = true;
            for i in 0..self.members.len() {
                if let Some(status) = self.exited(i) {
                    let m = &self.members[i];
                    return Err(format!(
                        "node {} ({}) exited {status}: {}",
                        m.node_id,
                        m.region,
                        m.stderr_tail()
                    ));
                }
                ready &= self.is_ready(i);
            }
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let tails: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| format!("node {}: {}", m.node_id, m.stderr_tail()))
                    .collect();
                return Err(format!(
                    "not every node was ready within {timeout:?}:\n{}",
                    tails.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn exited(&mut self, i: usize) -> Option<ExitStatus> {
        let child = self.members[i].child.as_mut()?;
        child.try_wait().expect("try_wait")
    }

    /// The member index of a region's node.
    pub fn index(&self, region: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.region == region)
            .unwrap_or_else(|| panic!("no node in region {region}"))
    }

    /// The member index of a node id.
    pub fn index_of_id(&self, node_id: u64) -> usize {
        self.members
            .iter()
            .position(|m| m.node_id == node_id)
            .unwrap_or_else(|| panic!("no node with id {node_id}"))
    }

    /// A client for member `i`, expecting answers from its own region.
    pub fn api(&self, i: usize) -> Api {
        let m = &self.members[i];
        Api::new(&format!("http://{}", m.api_addr), &m.region)
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.members[i]
            .child
            .as_ref()
            .expect("node is running")
            .id()
    }

    /// `GET /readyz` is 200 (false on any transport error, a frozen node included).
    pub fn is_ready(&self, i: usize) -> bool {
        let api = self.api(i);
        api.client
            .get(api.url("/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .is_ok_and(|r| r.status().as_u16() == 200)
    }

    /// Polls `/readyz` of member `i` until 200, panicking after `timeout`.
    pub fn wait_ready(&mut self, i: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.is_ready(i) {
            if let Some(status) = self.exited(i) {
                panic!(
                    "node {} exited {status}: {}",
                    self.members[i].node_id,
                    self.members[i].stderr_tail()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "node {} not ready within {timeout:?}: {}",
                    self.members[i].node_id,
                    self.members[i].stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /admin/v1/cluster` on member `i`; `None` on a transport error or a
    /// non-200 answer.
    pub fn cluster_view(&self, i: usize) -> Option<Value> {
        let api = self.api(i);
        let rb = api
            .get_rb("/admin/v1/cluster")
            .bearer_auth(&self.admin_token)
            .timeout(Duration::from_secs(2));
        let r = api.try_send(rb).ok()?;
        (r.status == 200).then(|| r.json())
    }

    /// The registry leader member `i` knows of, if any.
    pub fn leader_seen_by(&self, i: usize) -> Option<u64> {
        self.cluster_view(i)?["registry"]["leader"].as_u64()
    }

    /// Creates a tenant homed in `home_region` through the admin API of member `via`.
    pub fn create_tenant(&self, via: usize, home_region: &str) -> Tenant {
        let tenant_id = unique("t");
        let body = serde_json::json!({"tenant_id": tenant_id, "home_region": home_region});
        let r = self.api(via).post_json(
            "/admin/v1/tenants",
            Some(&self.admin_token),
            &body.to_string(),
        );
        assert_eq!(r.status, 201, "create tenant: {}", r.text());
        Tenant {
            tenant_id,
            home_region: home_region.to_owned(),
            token: r.json()["token"]
                .as_str()
                .expect("token shown at creation")
                .to_owned(),
        }
    }

    /// SIGKILL member `i`: no chance to flush or clean up.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on the same config and data dir, without waiting.
    pub fn restart(&mut self, i: usize) {
        assert!(
            self.members[i].child.is_none(),
            "kill the node before restarting it"
        );
        self.members[i].spawn();
    }

    /// SIGSTOP member `i`: it keeps its sockets but answers nothing.
    pub fn freeze(&mut self, i: usize) {
        self.members[i].signal("-STOP");
        self.members[i].stopped = true;
    }

    /// SIGCONT member `i` after [`ServeCluster::freeze`].
    pub fn thaw(&mut self, i: usize) {
        self.members[i].signal("-CONT");
        self.members[i].stopped = false;
    }

    /// Every member's stderr tail, for failure reports.
    pub fn stderr_tails(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- node {} ({}) stderr tail ---\n{}",
                    m.node_id,
                    m.region,
                    m.stderr_tail()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ServeCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- serve cluster ({}) ---\n{}",
                self.tmp.path().display(),
                self.stderr_tails()
            );
        }
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                if m.stopped {
                    let _ = Command::new("kill")
                        .arg("-CONT")
                        .arg(child.id().to_string())
                        .status();
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
