//! `keyhold up`: a whole local multi-region cluster for demos, development,
//! drills and the acceptance suite, with `up` in the foreground as the
//! supervisor of one OS process per node.
//!
//! `run` lays the cluster out (`layout`: `--nodes-per-region` nodes in every
//! region, each region's nodes the members of its group), starts the fake
//! payment provider in its own process, a routed proxy in front of every
//! node's API and Raft listener (`links`: inter-region delay and isolation),
//! every node as
//! `keyhold serve --config FILE` (`nodes`), brings the cluster to ready through
//! the nodes' HTTP API (`bootstrap`), writes `DIR/cluster.json` and serves the
//! control API (`control`) until told to stop, when it stops every node cleanly.
//!
//! **Architecture Invariant:** `up` reaches its nodes only through processes,
//! files and HTTP, as an operator would; the server crate knows nothing of `up`.

mod bootstrap;
mod control;
pub mod layout;
pub mod limits;
mod links;
mod nodes;

pub use keyhold_clusterfile::{ClusterFile, NodeEntry, RegionEntry, TenantEntry};
pub use nodes::{follow_supervisor, SUPERVISOR_PID_ENV};

use crate::limits::{CLUSTER_READY_WAIT_MS, CONTROL_PORT_OFFSET, PSP_PORT_OFFSET};
use keyhold_server::config::{Downstream, Member};
use keyhold_server::Config;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// The one error type of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("node: {0}")]
    Node(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl From<keyhold_server::Error> for Error {
    fn from(e: keyhold_server::Error) -> Error {
        Error::Config(e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct UpConfig {
    /// The `keyhold` binary each node runs as `keyhold serve --config FILE`.
    pub keyhold: PathBuf,
    /// Arguments given to that binary before `serve` (the log format).
    pub node_args: Vec<String>,
    pub data_dir: PathBuf,
    pub base_port: u16,
    pub regions: Vec<String>,
    pub response_ttl: Option<Duration>,
    pub marker_ttl: Option<Duration>,
    pub processed_ttl: Option<Duration>,
    /// The payment provider's key retention (`Config::psp_key_retention`).
    pub psp_key_retention: Option<Duration>,
    /// Probability that the fake provider loses an answer after committing.
    pub psp_drop_response_rate: f64,
    /// Probability that the fake provider declines a charge.
    pub psp_decline_rate: f64,
    /// `Config::auto_failover_after` of every node (unset: failover by hand).
    pub auto_failover_after: Option<Duration>,
    /// `Config::max_standby_lag` of every node (unset: the node's default, 1 s).
    pub max_standby_lag: Option<Duration>,
    /// Served at `/demo` by every node (see `Config::demo_dir`).
    pub demo_dir: Option<PathBuf>,
    /// Simulated round trip between regions (added by the proxies); none: zero.
    pub inter_region_rtt: Option<Duration>,
    /// Nodes per region (`1..=NODES_PER_REGION_MAX`): each region's store is
    /// replicated to that many nodes, all of them members of its group.
    pub nodes_per_region: usize,
    /// `region=standby` pairs; empty: each region's standby is the next region,
    /// cyclically.
    pub standby: Vec<String>,
    /// `Config::downstream` of every node: `Off` runs no outbox relay (ingest
    /// only, for benchmarks); the payment provider runs all the same.
    pub downstream: Downstream,
}

/// Runs the cluster until `shutdown` resolves, then stops every node.
pub async fn run(
    up: UpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    layout::validate(&up.regions, up.nodes_per_region)?;
    let dir = up.data_dir.clone();
    prepare_data_dir(&dir)?;
    let mut secrets = layout::load_secrets(
        &dir,
        layout::Layout {
            base_port: up.base_port,
            regions: up.regions.clone(),
            nodes_per_region: up.nodes_per_region,
        },
    )?;
    let credential = layout::node_credential(&dir)?;
    let plans = layout::plan(&dir, up.base_port, &up.regions, up.nodes_per_region);

    let psp_listener = bind(port(up.base_port + PSP_PORT_OFFSET)).await?;
    let psp_url = format!("http://{}", psp_listener.local_addr()?);
    let control_listener = bind(port(up.base_port + CONTROL_PORT_OFFSET)).await?;
    let control_url = format!("http://{}", control_listener.local_addr()?);
    let links = links::Links::start(
        &plans,
        up.regions.len(),
        up.inter_region_rtt.unwrap_or_default(),
    )
    .await?;
    write_node_configs(&up, &plans, &secrets.admin_token, &psp_url, &credential)?;

    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let psp = start_psp(&up, psp_listener, &stop_tx);

    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
    let nodes = nodes::Nodes::new(&up.keyhold, &up.node_args, plans.clone(), http.clone());
    let cluster_file = cluster_file(&up, &plans, &secrets.admin_token, psp_url, control_url);
    let mut cluster = control::Cluster::new(
        nodes,
        links,
        cluster_file,
        dir.join(layout::CLUSTER_FILE),
        up.regions.clone(),
    );

    let booted = boot(&cluster, &http, &mut secrets, &up).await;
    match booted {
        Ok(live) => cluster.file.tenants = live,
        Err(e) => {
            cluster.nodes.stop_all().await;
            let _ = stop_tx.send(());
            return Err(e);
        }
    }
    log_ready(&cluster, &dir);
    cluster.publish()?;
    supervise(Arc::new(cluster), control_listener, stop_tx, psp, shutdown).await;
    Ok(())
}

/// Makes the data dir's `nodes` and `logs` and removes the `cluster.json`
/// of an earlier run.
fn prepare_data_dir(dir: &Path) -> Result<(), Error> {
    for sub in ["nodes", "logs"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    // A cluster.json from an earlier run must not be mistaken for readiness.
    match std::fs::remove_file(dir.join(layout::CLUSTER_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    Ok(())
}

/// Writes every node's config file, each validated first.
fn write_node_configs(
    up: &UpConfig,
    plans: &[layout::NodePlan],
    admin_token: &str,
    psp_url: &str,
    credential: &Path,
) -> Result<(), Error> {
    // Every node reaches every other through the proxy in front of it: those
    // are the addresses the registry's membership holds. Every node is listed
    // in every node's config: the nodes of one region make its group.
    let members: Vec<Member> = plans
        .iter()
        .map(|p| Member {
            id: p.id,
            region: p.region.clone(),
            api_addr: p.api_proxy.to_string(),
            raft_addr: p.raft_proxy.to_string(),
        })
        .collect();
    let standbys = layout::standbys(&up.regions, &up.standby)?;
    for plan in plans {
        let mut config = Config::new(&plan.region, plan.data_dir.clone(), admin_token.to_owned());
        config.regions = up.regions.clone();
        config.standbys = standbys.clone();
        config.node_id = plan.id;
        config.members = members.clone();
        config.listen = plan.api.to_string();
        config.raft_listen = plan.raft.to_string();
        config.outbound_ip = Some(layout::node_ip((plan.id - 1) as usize));
        config.psp_url = Some(psp_url.to_owned());
        config.downstream = up.downstream;
        config.node_credential_file = Some(credential.to_path_buf());
        if let Some(d) = up.response_ttl {
            config.response_ttl = d;
        }
        if let Some(d) = up.marker_ttl {
            config.marker_ttl = d;
        }
        if let Some(d) = up.processed_ttl {
            config.processed_ttl = d;
        }
        config.psp_key_retention = up.psp_key_retention;
        config.auto_failover_after = up.auto_failover_after;
        if let Some(lag) = up.max_standby_lag {
            config.max_standby_lag = lag;
        }
        config.demo_dir.clone_from(&up.demo_dir);
        config.validate()?;
        layout::write_atomically(&plan.config_file, config.to_toml()?.as_bytes())?;
    }
    Ok(())
}

/// Starts the fake payment provider on `listener`, until `stop` sends.
fn start_psp(
    up: &UpConfig,
    listener: TcpListener,
    stop: &tokio::sync::broadcast::Sender<()>,
) -> tokio::task::JoinHandle<Result<(), keyhold_fakepsp::Error>> {
    let mut psp_stop = stop.subscribe();
    let psp_config = keyhold_fakepsp::PspConfig {
        data_dir: up.data_dir.join("psp"),
        drop_response_rate: up.psp_drop_response_rate,
        decline_rate: up.psp_decline_rate,
        refuse_replay_rate: 0.0,
    };
    tokio::spawn(async move {
        keyhold_fakepsp::run(psp_config, listener, async move {
            let _ = psp_stop.recv().await;
        })
        .await
    })
}

/// The cluster's `cluster.json` as it is before the nodes are up: no tenants
/// yet, no pids.
fn cluster_file(
    up: &UpConfig,
    plans: &[layout::NodePlan],
    admin_token: &str,
    psp_url: String,
    control_url: String,
) -> ClusterFile {
    ClusterFile {
        admin_token: admin_token.to_owned(),
        // A region's entry names its first node; the others are in `nodes`.
        regions: plans
            .iter()
            .filter(|p| p.replica == 0)
            .map(|p| RegionEntry {
                name: p.region.clone(),
                api_url: p.api_url(),
            })
            .collect(),
        psp_url,
        control_url,
        tenants: Vec::new(),
        nodes: plans
            .iter()
            .map(|p| NodeEntry {
                node_id: p.id,
                region: p.region.clone(),
                api_url: p.api_url(),
                role: "store".to_owned(),
                pid: None,
            })
            .collect(),
        max_standby_lag_ms: up
            .max_standby_lag
            .map_or(keyhold_server::limits::MAX_STANDBY_LAG_MS_DEFAULT, |lag| {
                lag.as_millis() as u64
            }),
    }
}

/// Logs that the cluster is ready, with where everything is.
fn log_ready(cluster: &control::Cluster, dir: &Path) {
    // The one summary an operator needs after the per-node lines: where to
    // point a browser, a client and the admin tools. Logged before cluster.json
    // is written, so whoever waits for that file finds the line already there.
    let first_api = &cluster.file.regions[0].api_url;
    tracing::info!(
        regions = %cluster
            .file
            .regions
            .iter()
            .map(|r| format!("{}={}", r.name, r.api_url))
            .collect::<Vec<_>>()
            .join(" "),
        demo = %format!("{first_api}/demo/"),
        admin = %format!("{first_api}/admin/"),
        psp = %cluster.file.psp_url,
        control = %cluster.file.control_url,
        logs = %dir.join("logs").display(),
        cluster_json = %cluster.file_path.display(),
        "cluster ready"
    );
}

/// Keeps `cluster.json` current as nodes restart and serves the control API
/// until `shutdown` resolves; then stops the control API, every node and the
/// payment provider.
async fn supervise(
    cluster: Arc<control::Cluster>,
    control_listener: TcpListener,
    stop_tx: tokio::sync::broadcast::Sender<()>,
    psp: tokio::task::JoinHandle<Result<(), keyhold_fakepsp::Error>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let watched = cluster.clone();
    let watcher = tokio::spawn(async move {
        let publisher = watched.clone();
        watched
            .nodes
            .watch(move || {
                if let Err(e) = publisher.publish() {
                    tracing::warn!(error = %e, "cannot rewrite cluster.json");
                }
            })
            .await;
    });
    let mut control_stop = stop_tx.subscribe();
    let app = control::router(cluster.clone());
    let control = tokio::spawn(async move {
        axum::serve(control_listener, app)
            .with_graceful_shutdown(async move {
                let _ = control_stop.recv().await;
            })
            .await
    });

    shutdown.await;
    watcher.abort();
    let _ = stop_tx.send(());
    let _ = control.await;
    cluster.nodes.stop_all().await;
    match psp.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "payment provider failed"),
        Err(e) => tracing::error!(error = %e, "payment provider task failed"),
    }
}

/// Starts every node and waits until the cluster is ready with its demo
/// tenants; returns the live ones (what the registry says, not the secrets file).
async fn boot(
    cluster: &control::Cluster,
    http: &reqwest::Client,
    secrets: &mut layout::Secrets,
    up: &UpConfig,
) -> Result<Vec<TenantEntry>, Error> {
    let deadline = Instant::now() + Duration::from_millis(CLUSTER_READY_WAIT_MS);
    // All at once: a node of a region group may wait for its peers before it
    // listens, so starting one after another could wait on a node not started
    // yet (and a restart of `up` starts every node again).
    let starts = (0..cluster.nodes.plans().len()).map(|i| cluster.nodes.start(i));
    futures::future::try_join_all(starts).await?;
    bootstrap::wait_ready(&cluster.nodes, deadline).await?;
    let plans = cluster.nodes.plans();
    let mut registry =
        bootstrap::registry_tenants(http, &plans[0], &secrets.admin_token, deadline).await?;
    bootstrap::demo_tenants(http, plans, secrets, &mut registry, &up.data_dir, deadline).await?;
    let live = bootstrap::live_demo_tenants(secrets, &registry);
    bootstrap::wait_tenants_known(http, plans, &live, deadline).await?;
    Ok(live)
}

fn port(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))
}
