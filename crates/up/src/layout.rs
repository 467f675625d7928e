//! What a local cluster is made of and where it lives: the node plan (ids,
//! ports, loopback addresses, data dirs, config and log files), the secrets
//! file that lets a restart resume the same cluster, and `cluster.json`.
//!
//! Nodes: with R regions and N nodes per region, node ids `1..=R` are the
//! first node of each region in `--regions` order (so a cluster made with one
//! node per region keeps its ids and data dirs when it grows none), then
//! `R+1..=2R` the second node of each region, and so on: node `k` (0-based,
//! id `k + 1`) belongs to region `k % R`. Every node is a registry voter and a
//! member of its region's group.
//!
//! Files under the data dir `DIR`: `up-secrets.json` (admin token, demo
//! tenants, the layout the cluster was created with), `node-credential`,
//! `cluster.json`, `<region>/` (the data dir of the region's first node),
//! `<region>.node-<id>/` (the data dir of each further node of the region; a
//! dot cannot be part of a region name, so no region's dir is another's),
//! `nodes/node-<id>.toml` (each node's config, written anew at every start),
//! `logs/node-<id>.log` (each node's output, appended across starts) and `psp/`.

use crate::limits::{
    API_PROXY_PORT_OFFSET, NODES_MAX, NODES_PER_REGION_MAX, RAFT_PORT_OFFSET,
    RAFT_PROXY_PORT_OFFSET, REGIONS_MAX,
};
use crate::Error;
use keyhold_clusterfile::TenantEntry;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The file in the data dir holding the cluster's node credential.
pub const NODE_CREDENTIAL_FILE: &str = "node-credential";
pub const SECRETS_FILE: &str = "up-secrets.json";
pub const CLUSTER_FILE: &str = keyhold_clusterfile::FILE_NAME;

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Secrets {
    pub admin_token: String,
    pub tenants: Vec<TenantEntry>,
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

/// One node as planned: who it is, where it listens, where its files are.
#[derive(Debug, Clone)]
pub struct NodePlan {
    pub id: u64,
    pub region: String,
    /// Index of its region in `--regions`.
    pub region_index: usize,
    /// Its place among its region's nodes (0: the region's first node, whose
    /// API is the region's `api_url` in cluster.json).
    pub replica: usize,
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

/// The source address of every outgoing connection of node `k` (its index in
/// the plan, id - 1): one loopback address per node, so that a proxy knows which
/// node (and so which region) calls, and can cut one node off from the others.
pub fn node_ip(k: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, k as u8 + 1))
}

/// The node (index in the plan) that connects from `ip`, if any, of `nodes`.
pub fn node_of(ip: IpAddr, nodes: usize) -> Option<usize> {
    (0..nodes).find(|&k| node_ip(k) == ip)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every node of the cluster, in id order (see the module's first paragraph:
/// node `k` is replica `k / R` of region `k % R`).
pub fn plan(
    data_dir: &Path,
    base_port: u16,
    regions: &[String],
    nodes_per_region: usize,
) -> Vec<NodePlan> {
    (0..regions.len() * nodes_per_region)
        .map(|k| {
            let region_index = k % regions.len();
            let replica = k / regions.len();
            let region = &regions[region_index];
            let id = k as u64 + 1;
            let slot = k as u16;
            let node_dir = if replica == 0 {
                data_dir.join(region)
            } else {
                data_dir.join(format!("{region}.node-{id}"))
            };
            NodePlan {
                id,
                region: region.clone(),
                region_index,
                replica,
                api: loopback(base_port + slot),
                raft: loopback(base_port + RAFT_PORT_OFFSET + slot),
                api_proxy: loopback(base_port + API_PROXY_PORT_OFFSET + slot),
                raft_proxy: loopback(base_port + RAFT_PROXY_PORT_OFFSET + slot),
                data_dir: node_dir,
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
    if !(1..=NODES_PER_REGION_MAX).contains(&nodes_per_region) {
        return Err(Error::Config(format!(
            "--nodes-per-region must be from 1 to {NODES_PER_REGION_MAX}"
        )));
    }
    if regions.len() * nodes_per_region > NODES_MAX {
        // Every node's ports sit inside the cluster's fifty (see limits.rs).
        return Err(Error::Config(format!(
            "{} regions of {nodes_per_region} nodes make {} nodes; a local cluster has at \
             most {NODES_MAX}",
            regions.len(),
            regions.len() * nodes_per_region
        )));
    }
    Ok(())
}

/// Each region's standby: from `--standby a=b,...` (every region may be named
/// once, its standby must be another listed region), else the next region in
/// `regions`, cyclically; none with a single region.
pub fn standbys(
    regions: &[String],
    given: &[String],
) -> Result<std::collections::BTreeMap<String, String>, Error> {
    let mut out = std::collections::BTreeMap::new();
    if given.is_empty() {
        if regions.len() > 1 {
            for (i, r) in regions.iter().enumerate() {
                out.insert(r.clone(), regions[(i + 1) % regions.len()].clone());
            }
        }
        return Ok(out);
    }
    for pair in given {
        let Some((region, standby)) = pair.split_once('=') else {
            return Err(Error::Config(format!(
                "--standby takes region=standby pairs, not {pair:?}"
            )));
        };
        for name in [region, standby] {
            if !regions.iter().any(|r| r == name) {
                return Err(Error::Config(format!(
                    "--standby {pair}: {name:?} is not among --regions"
                )));
            }
        }
        if region == standby {
            return Err(Error::Config(format!(
                "--standby {pair}: a region cannot be its own standby"
            )));
        }
        if out.insert(region.to_owned(), standby.to_owned()).is_some() {
            return Err(Error::Config(format!(
                "--standby names region {region} twice"
            )));
        }
    }
    Ok(out)
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
    fn standbys_default_to_the_next_region_and_given_ones_are_checked() {
        let regions: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let cyclic = standbys(&regions, &[]).unwrap();
        assert_eq!(cyclic["a"], "b");
        assert_eq!(cyclic["c"], "a");
        assert!(standbys(&regions[..1], &[]).unwrap().is_empty());
        let given = standbys(&regions, &["a=c".to_owned()]).unwrap();
        assert_eq!(given.len(), 1);
        assert_eq!(given["a"], "c");
        for bad in ["a", "a=a", "a=z", "z=a"] {
            assert!(standbys(&regions, &[bad.to_owned()]).is_err(), "{bad}");
        }
        assert!(standbys(&regions, &["a=b".to_owned(), "a=c".to_owned()]).is_err());
    }
    use crate::limits::{CONTROL_PORT_OFFSET, PORTS_PER_CLUSTER, PSP_PORT_OFFSET};
    use std::collections::BTreeSet;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    /// Every port of every node, the provider's and the control API's: all
    /// distinct and inside `base .. base + PORTS_PER_CLUSTER`.
    fn assert_ports_distinct_and_in_range(nodes: &[NodePlan], base: u16) {
        let mut ports = BTreeSet::from([base + PSP_PORT_OFFSET, base + CONTROL_PORT_OFFSET]);
        for n in nodes {
            for addr in [n.api, n.raft, n.api_proxy, n.raft_proxy] {
                assert!(
                    (base..base + PORTS_PER_CLUSTER).contains(&addr.port()),
                    "{n:?}"
                );
                assert!(ports.insert(addr.port()), "port {} twice", addr.port());
            }
        }
    }

    #[test]
    fn every_node_has_its_own_source_address_and_ports_stay_in_range() {
        let regions = names(REGIONS_MAX);
        for per_region in [1, NODES_PER_REGION_MAX] {
            let count = (NODES_MAX / per_region).min(REGIONS_MAX);
            let nodes = plan(Path::new("/d"), 7400, &regions[..count], per_region);
            for (k, n) in nodes.iter().enumerate() {
                assert_eq!(node_of(node_ip(k), nodes.len()), Some(k), "{n:?}");
                assert_eq!(n.id, k as u64 + 1);
            }
            assert_ports_distinct_and_in_range(&nodes, 7400);
            assert_eq!(node_of("127.0.0.1".parse().unwrap(), nodes.len()), None);
        }
    }

    #[test]
    fn three_regions_of_three_nodes_keep_the_first_nodes_and_fit_the_ports() {
        let regions = names(3);
        let one = plan(Path::new("/d"), 7400, &regions, 1);
        let nodes = plan(Path::new("/d"), 7400, &regions, 3);
        assert_eq!(nodes.len(), 9);
        // Ids 1..=9 in order; 1..=3 are the first node of each region, with
        // the same ports and data dirs as in a cluster of one node per region.
        for (k, n) in nodes.iter().enumerate() {
            assert_eq!(n.id, k as u64 + 1);
            assert_eq!(n.region, regions[k % 3]);
            assert_eq!(n.replica, k / 3);
        }
        for (first, alone) in nodes.iter().zip(&one) {
            assert_eq!(
                (first.id, first.api, first.raft, &first.data_dir),
                (alone.id, alone.api, alone.raft, &alone.data_dir)
            );
            assert_eq!(first.data_dir, Path::new("/d").join(&first.region));
        }
        // Three nodes in every region, each with its own data dir, config and log.
        for r in &regions {
            assert_eq!(nodes.iter().filter(|n| &n.region == r).count(), 3);
        }
        let files: [fn(&NodePlan) -> PathBuf; 3] = [
            |n| n.data_dir.clone(),
            |n| n.config_file.clone(),
            |n| n.log_file.clone(),
        ];
        for files in files {
            let distinct: BTreeSet<PathBuf> = nodes.iter().map(files).collect();
            assert_eq!(distinct.len(), nodes.len());
        }
        assert_eq!(nodes[3].data_dir, Path::new("/d/r0.node-4"));
        assert_ports_distinct_and_in_range(&nodes, 7400);
        // The largest layout allowed fits too.
        assert_ports_distinct_and_in_range(&plan(Path::new("/d"), 7400, &names(5), 2), 7400);
    }

    #[test]
    fn nodes_per_region_and_names_are_checked() {
        assert!(validate(&names(3), 3).is_ok());
        assert!(validate(&names(1), 1).is_ok());
        for n in [0, NODES_PER_REGION_MAX + 1] {
            let e = validate(&names(1), n).unwrap_err().to_string();
            assert!(e.contains("--nodes-per-region must be from 1 to 3"), "{e}");
        }
        let e = validate(&names(4), 3).unwrap_err().to_string();
        assert!(e.contains("12 nodes") && e.contains("at most 10"), "{e}");
        assert!(validate(&["a".into(), "a".into()], 1).is_err());
        assert!(
            validate(&["a.b".into()], 1).is_err(),
            "a dot would clash with node dirs"
        );
        assert!(validate(&[], 1).is_err());
    }
}
