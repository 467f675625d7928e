//! `DIR/cluster.json`: what `keyhold up` tells the tools that drive its
//! cluster (contract sections 9 and 10) — the admin token, each region's API
//! origin, the fake payment provider, the control API, the demo tenants with
//! their tokens, and every node with its process id.
//!
//! One type for the writer (`keyhold up`) and the readers (`keyhold drill`,
//! `keyhold chaos`), so a field renamed on one side cannot silently go missing
//! on the other. Readers ignore fields they do not know: a newer `up` may add
//! some.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a cluster.json could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a cluster.json: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// The file's name in `keyhold up`'s data dir.
pub const FILE_NAME: &str = "cluster.json";

/// `DIR/cluster.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    pub admin_token: String,
    pub regions: Vec<RegionEntry>,
    /// The fake payment provider's origin.
    pub psp_url: String,
    /// The control API's origin (kill, start, isolate, heal).
    pub control_url: String,
    pub tenants: Vec<TenantEntry>,
    pub nodes: Vec<NodeEntry>,
    /// Every region's `max_standby_lag` in milliseconds (absent from a file of
    /// an earlier release: the default, 1 s).
    #[serde(default = "default_max_standby_lag_ms")]
    pub max_standby_lag_ms: u64,
}

/// `max_standby_lag`'s default (the node's `MAX_STANDBY_LAG_MS_DEFAULT`).
pub fn default_max_standby_lag_ms() -> u64 {
    1_000
}

/// A region and the API origin clients of that region use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionEntry {
    pub name: String,
    pub api_url: String,
}

/// A demo tenant: its id, its home region and its API token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantEntry {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub node_id: u64,
    pub region: String,
    pub api_url: String,
    /// `store`: holds a replica of its region's store (a member of the
    /// region's group) and votes in the registry.
    pub role: String,
    /// The node's process id; `null` while it is down.
    pub pid: Option<u32>,
}

impl ClusterFile {
    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<ClusterFile, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// The API origin clients of `region` use.
    pub fn region_url(&self, region: &str) -> Option<&str> {
        self.regions
            .iter()
            .find(|r| r.name == region)
            .map(|r| r.api_url.as_str())
    }

    /// The demo tenants homed in `region`.
    pub fn tenants_of<'a>(&'a self, region: &'a str) -> impl Iterator<Item = &'a TenantEntry> {
        self.tenants.iter().filter(move |t| t.home_region == region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClusterFile {
        ClusterFile {
            admin_token: "adm".into(),
            regions: vec![
                RegionEntry {
                    name: "a".into(),
                    api_url: "http://127.0.0.1:7000".into(),
                },
                RegionEntry {
                    name: "b".into(),
                    api_url: "http://127.0.0.1:7010".into(),
                },
            ],
            psp_url: "http://127.0.0.1:7090".into(),
            control_url: "http://127.0.0.1:7091".into(),
            tenants: vec![TenantEntry {
                tenant_id: "demo-b".into(),
                home_region: "b".into(),
                token: "tok".into(),
            }],
            nodes: vec![NodeEntry {
                node_id: 1,
                region: "a".into(),
                api_url: "http://127.0.0.1:7000".into(),
                role: "store".into(),
                pid: None,
            }],
            max_standby_lag_ms: 1_000,
        }
    }

    #[test]
    fn what_up_writes_reads_back_and_unknown_fields_are_ignored() {
        let file = sample();
        let mut json = serde_json::to_value(&file).unwrap();
        json["added_by_a_newer_up"] = serde_json::json!(true);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, json.to_string()).unwrap();
        let read = ClusterFile::read(&path).unwrap();
        assert_eq!(read, file);
        assert_eq!(read.region_url("b"), Some("http://127.0.0.1:7010"));
        assert_eq!(read.region_url("z"), None);
        let homed: Vec<_> = read.tenants_of("b").map(|t| &t.tenant_id).collect();
        assert_eq!(homed, ["demo-b"]);
        assert_eq!(read.tenants_of("a").count(), 0);
    }

    #[test]
    fn a_missing_or_malformed_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let missing = ClusterFile::read(&path).unwrap_err();
        assert!(matches!(missing, Error::Read { .. }), "{missing}");
        assert!(missing.to_string().contains("cluster.json"), "{missing}");

        std::fs::write(&path, r#"{"admin_token": "adm"}"#).unwrap();
        let malformed = ClusterFile::read(&path).unwrap_err();
        assert!(matches!(malformed, Error::Parse { .. }), "{malformed}");
        assert!(malformed.to_string().contains("is not a cluster.json"));
    }
}
