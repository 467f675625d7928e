//! `keyhold up`: a whole local cluster in one process, for demos, development and
//! the acceptance suite.
//!
//! One node per region on consecutive loopback ports from the base port, each with
//! its own store under `DIR/<region>`, a shared admin token and one demo tenant
//! homed in each region. Secrets (the admin token and the demo tenants' tokens)
//! are kept in `DIR/up-secrets.json` so that a restart on the same data dir
//! resumes the same cluster; `DIR/cluster.json` is written when every node is
//! listening. The cluster's node credential (the secret of every inter-node
//! call) is generated once into `DIR/node-credential` and kept across restarts;
//! every node reads it through `node_credential_file`. A fake payment provider (`keyhold-fakepsp`) runs beside the nodes on
//! `base_port + PSP_PORT_OFFSET`, and every node's payments consumer charges it.

use crate::config::{Config, Member};
use crate::limits::DEMO_TENANT_REQUESTS_PER_SECOND;
use crate::limits::REGISTRY_BOOTSTRAP_WAIT_MS;
use crate::node::Node;
use crate::tenants::new_token;
use crate::Error;
use keyhold_core::TenantId;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Ports `keyhold up` may use: `base_port .. base_port + PORTS_PER_CLUSTER`.
pub const PORTS_PER_CLUSTER: u16 = 50;
/// Regions one local cluster may have (one API port each).
pub const REGIONS_MAX: usize = 8;
/// The file in the data dir holding the cluster's node credential.
pub const NODE_CREDENTIAL_FILE: &str = "node-credential";
/// The fake payment provider's port, relative to the base port.
pub const PSP_PORT_OFFSET: u16 = 40;
/// Each node's Raft listener: base port + this + the node's index.
pub const RAFT_PORT_OFFSET: u16 = 10;
/// With `--inter-region-rtt`: the delaying proxies in front of each node's API
/// and Raft listeners.
pub const API_PROXY_PORT_OFFSET: u16 = 20;
pub const RAFT_PROXY_PORT_OFFSET: u16 = 30;
const _: () = assert!(RAFT_PORT_OFFSET as usize + NODES_MAX <= API_PROXY_PORT_OFFSET as usize);
const _: () =
    assert!(API_PROXY_PORT_OFFSET as usize + NODES_MAX <= RAFT_PROXY_PORT_OFFSET as usize);
const _: () = assert!(RAFT_PROXY_PORT_OFFSET as usize + NODES_MAX <= PSP_PORT_OFFSET as usize);
const _: () = assert!(NODES_MAX <= RAFT_PORT_OFFSET as usize);
const _: () = assert!(REGIONS_MAX <= NODES_MAX);
const _: () = assert!(PSP_PORT_OFFSET < PORTS_PER_CLUSTER);

#[derive(Debug, Clone)]
pub struct UpConfig {
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
    /// Served at `/demo` by every node (see `Config::demo_dir`).
    pub demo_dir: Option<PathBuf>,
    /// Simulated round trip between regions (nodes talk through delaying proxies).
    pub inter_region_rtt: Option<Duration>,
    /// Nodes per region: the first owns the region's store and votes in the
    /// registry; the others are registry learners that serve the API.
    pub nodes_per_region: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct Secrets {
    admin_token: String,
    tenants: Vec<TenantSecret>,
    /// The layout the cluster was created with. The registry's membership holds
    /// every node's address, so a restart must use the same ports and nodes.
    #[serde(default)]
    layout: Option<Layout>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Layout {
    base_port: u16,
    regions: Vec<String>,
    nodes_per_region: usize,
    inter_region_rtt_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantSecret {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

#[derive(Debug, Serialize)]
pub struct ClusterFile {
    pub admin_token: String,
    pub regions: Vec<RegionEntry>,
    /// The fake payment provider's origin.
    pub psp_url: String,
    pub tenants: Vec<TenantSecret>,
    pub nodes: Vec<NodeEntry>,
}

/// Every node of the cluster, for operators (cluster.json's `nodes`).
#[derive(Debug, Serialize)]
pub struct NodeEntry {
    pub node_id: u64,
    pub region: String,
    pub api_url: String,
    /// `store` (owns the region's store, registry voter) or `api` (forwards).
    pub role: &'static str,
}

#[derive(Debug, Serialize)]
pub struct RegionEntry {
    pub name: String,
    pub api_url: String,
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Nodes one local cluster may have in all (one API and one Raft port each).
pub const NODES_MAX: usize = 8;

fn validate_regions(regions: &[String]) -> Result<(), Error> {
    if regions.is_empty() || regions.len() > REGIONS_MAX {
        return Err(Error::Config(format!(
            "--regions needs 1 to {REGIONS_MAX} region names"
        )));
    }
    for (i, r) in regions.iter().enumerate() {
        let ok = !r.is_empty()
            && r.len() <= 32
            && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(Error::Config(format!(
                "region name {r:?} must be 1 to 32 of [A-Za-z0-9-]"
            )));
        }
        if regions[..i].contains(r) {
            return Err(Error::Config(format!("region {r:?} is listed twice")));
        }
    }
    Ok(())
}

/// Runs the cluster until `shutdown` resolves.
pub async fn run(
    up: UpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    validate_regions(&up.regions)?;
    if up.nodes_per_region == 0 || up.regions.len() * up.nodes_per_region > NODES_MAX {
        return Err(Error::Config(format!(
            "--nodes-per-region must be at least 1, with at most {NODES_MAX} nodes in all"
        )));
    }
    std::fs::create_dir_all(&up.data_dir)?;
    // A cluster.json from an earlier run must not be mistaken for readiness.
    match std::fs::remove_file(up.data_dir.join("cluster.json")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let secrets_path = up.data_dir.join("up-secrets.json");
    let mut secrets: Secrets = match std::fs::read(&secrets_path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            Error::Config(format!("{} is not readable: {e}", secrets_path.display()))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Secrets {
            admin_token: new_token(),
            tenants: Vec::new(),
            layout: None,
        },
        Err(e) => return Err(e.into()),
    };
    let layout = Layout {
        base_port: up.base_port,
        regions: up.regions.clone(),
        nodes_per_region: up.nodes_per_region,
        inter_region_rtt_ms: up.inter_region_rtt.map(|d| d.as_millis() as u64),
    };
    match &secrets.layout {
        Some(old) if old != &layout => {
            return Err(Error::Config(format!(
                "{} holds a cluster created with --base-port {} --regions {} \
                 --nodes-per-region {}{}; restart it with the same options (the registry \
                 knows its nodes by those addresses), or use an empty --data-dir",
                up.data_dir.display(),
                old.base_port,
                old.regions.join(","),
                old.nodes_per_region,
                old.inter_region_rtt_ms
                    .map_or(String::new(), |ms| format!(" --inter-region-rtt {ms}ms")),
            )))
        }
        _ => secrets.layout = Some(layout),
    }
    write_atomically(
        &secrets_path,
        &serde_json::to_vec_pretty(&secrets).expect("json"),
    )?;

    let credential_path = up.data_dir.join(NODE_CREDENTIAL_FILE);
    if !credential_path.exists() {
        write_atomically(&credential_path, format!("{}\n", new_token()).as_bytes())?;
        // A secret: readable by the cluster's user only.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&credential_path, std::fs::Permissions::from_mode(0o600))?;
    }

    let psp_listener = bind(up.base_port + PSP_PORT_OFFSET).await?;
    let psp_url = format!("http://{}", psp_listener.local_addr()?);
    let psp_config = keyhold_fakepsp::PspConfig {
        data_dir: up.data_dir.join("psp"),
        drop_response_rate: up.psp_drop_response_rate,
        decline_rate: up.psp_decline_rate,
        refuse_replay_rate: 0.0,
    };

    // The nodes: first one store-owning registry voter per region (ids 1..=R),
    // then the extra nodes of each region, which join as registry learners and
    // serve the API by forwarding to their region's store node.
    let layout: Vec<(u64, String)> = (0..up.nodes_per_region)
        .flat_map(|j| up.regions.iter().map(move |r| (j, r.clone())))
        .enumerate()
        .map(|(k, (_, region))| (k as u64 + 1, region))
        .collect();
    // Bind every listener first: the registry's membership names the addresses.
    let mut listeners = Vec::new();
    for k in 0..layout.len() as u16 {
        let api = bind(up.base_port + k).await?;
        let raft = bind(up.base_port + RAFT_PORT_OFFSET + k).await?;
        listeners.push((api, raft));
    }
    // With a simulated inter-region round trip, nodes reach each other (API
    // forwards and Raft alike) only through delaying proxies, whose addresses are
    // what the registry advertises; clients still reach their region directly.
    let mut proxies = Vec::new();
    let mut everyone = Vec::new();
    for (i, (id, region)) in layout.iter().enumerate() {
        let (api, raft) = &listeners[i];
        let (api_addr, raft_addr) = match up.inter_region_rtt {
            None => (api.local_addr()?, raft.local_addr()?),
            Some(rtt) => {
                let one_way = rtt / 2;
                let api_proxy = keyhold_netem::Proxy::start(
                    bind(up.base_port + API_PROXY_PORT_OFFSET + i as u16).await?,
                    api.local_addr()?,
                    one_way,
                )?;
                let raft_proxy = keyhold_netem::Proxy::start(
                    bind(up.base_port + RAFT_PROXY_PORT_OFFSET + i as u16).await?,
                    raft.local_addr()?,
                    one_way,
                )?;
                let addrs = (api_proxy.addr(), raft_proxy.addr());
                proxies.push(api_proxy);
                proxies.push(raft_proxy);
                addrs
            }
        };
        everyone.push(Member {
            id: *id,
            region: region.clone(),
            api_addr: api_addr.to_string(),
            raft_addr: raft_addr.to_string(),
        });
    }
    let members: Vec<Member> = everyone[..up.regions.len()].to_vec();

    let mut nodes = Vec::new();
    let mut region_entries = Vec::new();
    let mut node_entries = Vec::new();
    for (i, ((api, raft), (id, region))) in listeners.into_iter().zip(&layout).enumerate() {
        let store_node = i < up.regions.len();
        let dir = if store_node {
            up.data_dir.join(region)
        } else {
            up.data_dir.join(format!("{region}-node{id}"))
        };
        let mut config = Config::new(region, dir, secrets.admin_token.clone());
        config.regions = up.regions.clone();
        config.node_id = *id;
        config.members = members.clone();
        config.listen = api.local_addr()?.to_string();
        config.raft_listen = raft.local_addr()?.to_string();
        config.psp_url = Some(psp_url.clone());
        config.node_credential_file = Some(credential_path.clone());
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
        config.demo_dir.clone_from(&up.demo_dir);
        config.validate()?;
        let advertised = &everyone[i];
        let node = Arc::new(
            Node::open(
                config,
                advertised.api_addr.parse().expect("a socket address"),
                advertised.raft_addr.parse().expect("a socket address"),
            )
            .await?,
        );
        let api_url = format!("http://{}", api.local_addr()?);
        if store_node {
            region_entries.push(RegionEntry {
                name: region.clone(),
                api_url: api_url.clone(),
            });
        }
        node_entries.push(NodeEntry {
            node_id: *id,
            region: region.clone(),
            api_url,
            role: if store_node { "store" } else { "api" },
        });
        nodes.push((node, api, raft));
    }

    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut stop = stop_tx.subscribe();
    let psp = tokio::spawn(async move {
        keyhold_fakepsp::run(psp_config, psp_listener, async move {
            let _ = stop.recv().await;
        })
        .await
    });
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for (node, api, raft) in nodes {
        let mut stop = stop_tx.subscribe();
        handles.push(node.clone());
        tasks.push(tokio::spawn(crate::serve(node, api, raft, async move {
            let _ = stop.recv().await;
        })));
    }

    // The registry must have a leader and know every region before tenants exist.
    let deadline = Instant::now() + Duration::from_millis(REGISTRY_BOOTSTRAP_WAIT_MS);
    let voters = &handles[..up.regions.len()];
    while !voters.iter().all(|n| crate::cluster::is_ready(n)) {
        if Instant::now() > deadline {
            let _ = stop_tx.send(());
            return Err(Error::Config(
                "the registry did not elect a leader and register the regions in time".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Extra nodes join as learners, added by whichever voter leads.
    for extra in &everyone[up.regions.len()..] {
        let info = keyhold_registry::NodeInfo::new(
            extra.region.clone(),
            extra.api_addr.clone(),
            extra.raft_addr.clone(),
        );
        loop {
            let leader = voters
                .iter()
                .find(|n| n.registry().leader() == Some(n.registry().id()));
            let added = match leader {
                Some(n) => n.registry().add_learner(extra.id, info.clone()).await,
                None => Err(keyhold_registry::Error::NoLeader {
                    attempts: 0,
                    last_error: "no voter leads yet".into(),
                }),
            };
            match added {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => {
                    let _ = stop_tx.send(());
                    return Err(Error::Config(format!("cannot add node {}: {e}", extra.id)));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    while !handles.iter().all(|n| crate::cluster::is_ready(n)) {
        if Instant::now() > deadline {
            let _ = stop_tx.send(());
            return Err(Error::Config(
                "the registry did not elect a leader and register the regions in time".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // One demo tenant homed in each region, created once and kept across restarts.
    for node in &handles {
        let id = format!("demo-{}", node.region());
        if secrets.tenants.iter().any(|t| t.tenant_id == id) {
            continue;
        }
        let tenant_id = TenantId::parse(&id).expect("demo ids are valid");
        let created = handles[0]
            .create_tenant(
                tenant_id,
                node.region(),
                DEMO_TENANT_REQUESTS_PER_SECOND,
                DEMO_TENANT_REQUESTS_PER_SECOND,
            )
            .await;
        let (_, token) = match created {
            Ok(created) => created,
            Err(e) => {
                let _ = stop_tx.send(());
                return Err(Error::Config(format!(
                    "cannot create demo tenant {id}: {e:?} (if the data dir's secrets file lost \
                     its tokens, start from an empty --data-dir)"
                )));
            }
        };
        secrets.tenants.push(TenantSecret {
            tenant_id: id,
            home_region: node.region().to_owned(),
            token,
        });
        write_atomically(
            &secrets_path,
            &serde_json::to_vec_pretty(&secrets).expect("json"),
        )?;
    }
    // Every replica knows every demo tenant before anyone is told the cluster is up.
    let target = handles[0].registry().applied_index();
    for node in &handles {
        let waited = node
            .registry()
            .wait_applied(target, Duration::from_millis(REGISTRY_BOOTSTRAP_WAIT_MS))
            .await;
        if let Err(e) = waited {
            let _ = stop_tx.send(());
            return Err(Error::Config(format!(
                "registry replica did not catch up: {e}"
            )));
        }
        node.refresh_tenants();
    }

    let cluster = ClusterFile {
        admin_token: secrets.admin_token.clone(),
        regions: region_entries,
        psp_url,
        tenants: secrets.tenants.clone(),
        nodes: node_entries,
    };
    write_atomically(
        &up.data_dir.join("cluster.json"),
        &serde_json::to_vec_pretty(&cluster).expect("json"),
    )?;
    // The one summary an operator needs after the per-node lines: where to
    // point a browser, a client and the admin tools.
    let first_api = &cluster.regions[0].api_url;
    tracing::info!(
        regions = %cluster
            .regions
            .iter()
            .map(|r| format!("{}={}", r.name, r.api_url))
            .collect::<Vec<_>>()
            .join(" "),
        demo = %format!("{first_api}/demo/"),
        admin = %format!("{first_api}/admin/"),
        psp = %cluster.psp_url,
        cluster_json = %up.data_dir.join("cluster.json").display(),
        "cluster ready"
    );

    shutdown.await;
    drop(proxies);
    let _ = stop_tx.send(());
    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(e) => tracing::error!(error = %e, "node task failed"),
        }
    }
    match psp.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "payment provider failed"),
        Err(e) => tracing::error!(error = %e, "payment provider task failed"),
    }
    Ok(())
}

async fn bind(port: u16) -> Result<TcpListener, Error> {
    TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| Error::Config(format!("cannot listen on 127.0.0.1:{port}: {e}")))
}
