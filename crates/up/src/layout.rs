//! What a local cluster is made of and where it lives: the node plan (ids,
//! ports, loopback addresses, data dirs, config and log files), the secrets
//! file that lets a restart resume the same cluster, and `cluster.json`.
//!
//! Files under the data dir `DIR`: `up-secrets.json` (admin token, demo
//! tenants, the layout the cluster was created with), `node-credential`,
//! `cluster.json`, `<region>/` (the region's store node), `nodes/node-<id>.toml`
//! (each node's config, written anew at every start), `logs/node-<id>.log`
//! (each node's output, appended across starts) and `psp/`.

use crate::limits::{
    API_PROXY_PORT_OFFSET, NODES_MAX, RAFT_PORT_OFFSET, RAFT_PROXY_PORT_OFFSET, REGIONS_MAX,
};
use crate::Error;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The file in the data dir holding the cluster's node credential.
pub const NODE_CREDENTIAL_FILE: &str = "node-credential";
pub const SECRETS_FILE: &str = "up-secrets.json";
pub const CLUSTER_FILE: &str = "cluster.json";

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Secrets {
    pub admin_token: String,
    pub tenants: Vec<TenantSecret>,
    /// The layout the cluster was created with. The registry's membership holds
    /// every node's address, so a restart must use the same ports and nodes.
    #[serde(default)]
    pub layout: Option<Layout>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub base_port: u16,
    pub regions: Vec<String>,
    pub nodes_per_region: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantSecret {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

/// `DIR/cluster.json` (contract sections 9 and 10).
#[derive(Debug, Clone, Serialize)]
pub struct ClusterFile {
    pub admin_token: String,
    pub regions: Vec<RegionEntry>,
    /// The fake payment provider's origin.
    pub psp_url: String,
    /// The control API's origin (kill, start, isolate, heal).
    pub control_url: String,
    pub tenants: Vec<TenantSecret>,
    pub nodes: Vec<NodeEntry>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RegionEntry {
    pub name: String,
    pub api_url: String,
}

/// One node of the cluster (cluster.json's `nodes`).
#[derive(Debug, Clone, Serialize)]
pub struct NodeEntry {
    pub node_id: u64,
    pub region: String,
    pub api_url: String,
    /// `store`: owns the region's store and votes in the registry.
    pub role: &'static str,
    /// The node's process id; `null` while it is down.
    pub pid: Option<u32>,
}

/// One node as planned: who it is, where it listens, where its files are.
#[derive(Debug, Clone)]
pub struct NodePlan {
    pub id: u64,
    pub region: String,
    /// Index of its region in `--regions`.
    pub region_index: usize,
    pub api: SocketAddr,
    pub raft: SocketAddr,
    pub api_proxy: SocketAddr,
    pub raft_proxy: SocketAddr,
    pub data_dir: PathBuf,
    pub config_file: PathBuf,
    pub log_file: PathBuf,
}

impl NodePlan {
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api)
    }
}

/// The source address of every outgoing connection of a region's nodes: one
/// loopback address per region, so that a proxy knows which region calls.
pub fn region_ip(region_index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, region_index as u8 + 1))
}

/// The region whose nodes connect from `ip`, if any.
pub fn region_of(ip: IpAddr, regions: usize) -> Option<usize> {
    (0..regions).find(|&i| region_ip(i) == ip)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Node `k` (0-based) of the cluster: the first node of every region comes
/// first (ids `1..=R`, the registry's voters, each owning its region's store
/// in `DIR/<region>`); room is left for more per region (`NODES_MAX`).
pub fn plan(data_dir: &Path, base_port: u16, regions: &[String]) -> Vec<NodePlan> {
    regions
        .iter()
        .enumerate()
        .map(|(k, region)| {
            let id = k as u64 + 1;
            let slot = k as u16;
            NodePlan {
                id,
                region: region.clone(),
                region_index: k,
                api: loopback(base_port + slot),
                raft: loopback(base_port + RAFT_PORT_OFFSET + slot),
                api_proxy: loopback(base_port + API_PROXY_PORT_OFFSET + slot),
                raft_proxy: loopback(base_port + RAFT_PROXY_PORT_OFFSET + slot),
                data_dir: data_dir.join(region),
                config_file: data_dir.join("nodes").join(format!("node-{id}.toml")),
                log_file: data_dir.join("logs").join(format!("node-{id}.log")),
            }
        })
        .collect()
}

pub fn validate(regions: &[String], nodes_per_region: usize) -> Result<(), Error> {
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
    if nodes_per_region != 1 || regions.len() > NODES_MAX {
        // Extra API nodes joined the registry as learners added from inside the
        // one `up` process; with a process per node they come back with the
        // replicated region store (issue 11).
        return Err(Error::Config(
            "--nodes-per-region must be 1 for now: several nodes per region come with the \
             replicated region store"
                .into(),
        ));
    }
    Ok(())
}

pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), Error> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    write_atomically(path, &bytes)
}

/// Reads the secrets of an earlier run (or makes new ones) and checks that the
/// cluster is restarted with the layout it was created with.
pub fn load_secrets(data_dir: &Path, layout: Layout) -> Result<Secrets, Error> {
    let path = data_dir.join(SECRETS_FILE);
    let mut secrets: Secrets = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config(format!("{} is not readable: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Secrets {
            admin_token: keyhold_server::tenants::new_token(),
            tenants: Vec::new(),
            layout: None,
        },
        Err(e) => return Err(e.into()),
    };
    match &secrets.layout {
        Some(old) if old != &layout => {
            return Err(Error::Config(format!(
                "{} holds a cluster created with --base-port {} --regions {} \
                 --nodes-per-region {}; restart it with the same options (the registry \
                 knows its nodes by those addresses), or use an empty --data-dir",
                data_dir.display(),
                old.base_port,
                old.regions.join(","),
                old.nodes_per_region,
            )))
        }
        _ => secrets.layout = Some(layout),
    }
    write_json(&path, &secrets)?;
    Ok(secrets)
}

/// The cluster's node credential, made once and kept across restarts.
pub fn node_credential(data_dir: &Path) -> Result<PathBuf, Error> {
    let path = data_dir.join(NODE_CREDENTIAL_FILE);
    if !path.exists() {
        write_atomically(
            &path,
            format!("{}\n", keyhold_server::tenants::new_token()).as_bytes(),
        )?;
        // A secret: readable by the cluster's user only.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_region_has_its_own_source_address_and_ports_stay_in_range() {
        let regions: Vec<String> = (0..REGIONS_MAX).map(|i| format!("r{i}")).collect();
        let nodes = plan(Path::new("/d"), 7400, &regions);
        for (i, n) in nodes.iter().enumerate() {
            assert_eq!(region_of(region_ip(n.region_index), regions.len()), Some(i));
            for addr in [n.api, n.raft, n.api_proxy, n.raft_proxy] {
                assert!(addr.port() < 7400 + crate::limits::PORTS_PER_CLUSTER);
            }
        }
        assert_eq!(region_of("127.0.0.1".parse().unwrap(), regions.len()), None);
    }

    #[test]
    fn more_than_one_node_per_region_is_refused_for_now() {
        let e = validate(&["a".into()], 2).unwrap_err().to_string();
        assert!(e.contains("--nodes-per-region"), "{e}");
        assert!(validate(&["a".into(), "a".into()], 1).is_err());
        assert!(validate(&["a".into(), "b".into()], 1).is_ok());
    }
}
