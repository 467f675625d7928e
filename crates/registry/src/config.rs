//! `RegistryConfig`: who this replica is, where it keeps its data, and the Raft timing.
//! Defaults come from `limits.rs`; `raft_config` turns it into openraft's `Config`.

use std::path::PathBuf;
use std::time::Duration;

use crate::credential::NodeCredentials;
use crate::limits::{
    ELECTION_TIMEOUT_MAX_MS_DEFAULT, ELECTION_TIMEOUT_MIN_MS_DEFAULT,
    HEARTBEAT_INTERVAL_MS_DEFAULT, INSTALL_SNAPSHOT_TIMEOUT_MS_DEFAULT, RPC_TIMEOUT_MS_DEFAULT,
    SNAPSHOT_CHUNK_BYTES_MAX, SNAPSHOT_LOGS_KEPT_MAX, SNAPSHOT_LOGS_SINCE_LAST_DEFAULT,
    WRITE_FORWARD_TIMEOUT_MS_DEFAULT, WRITE_TIMEOUT_MS_DEFAULT,
};
use crate::types::{NodeId, NodeInfo};
use crate::Error;

/// Name of the registry's Raft group in RPC paths (`/raft/registry/...`). Other groups
/// in the same process use other names on the same listener.
pub const GROUP: &str = "registry";

/// Configuration of one registry replica.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Unique across the whole cluster, never reused for a wiped node.
    pub node_id: NodeId,
    /// This node's region and addresses, as the other members will see them.
    pub node: NodeInfo,
    /// Directory of this replica's sled database (created if missing, owned alone).
    pub data_dir: PathBuf,
    /// The cluster's node credential: sent on every Raft RPC and forwarded write,
    /// required on every request the Raft router serves.
    pub credentials: NodeCredentials,
    /// How often the leader sends heartbeats (the registry's own ticker).
    pub heartbeat_interval_ms: u64,
    /// Timeout of one Raft RPC (AppendEntries, heartbeats and votes).
    pub rpc_timeout_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub install_snapshot_timeout_ms: u64,
    /// Timeout of one write forwarded from a follower to the leader.
    pub write_forward_timeout_ms: u64,
    /// Overall bound of one `Registry::write`, retries and forwarding included.
    pub write_timeout_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_logs_since_last: u64,
}

impl RegistryConfig {
    /// A configuration with the default timing of `limits.rs`.
    pub fn new(
        node_id: NodeId,
        node: NodeInfo,
        data_dir: impl Into<PathBuf>,
        credentials: NodeCredentials,
    ) -> Self {
        Self {
            node_id,
            node,
            data_dir: data_dir.into(),
            credentials,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            rpc_timeout_ms: RPC_TIMEOUT_MS_DEFAULT,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_MS_DEFAULT,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS_DEFAULT,
            install_snapshot_timeout_ms: INSTALL_SNAPSHOT_TIMEOUT_MS_DEFAULT,
            write_forward_timeout_ms: WRITE_FORWARD_TIMEOUT_MS_DEFAULT,
            write_timeout_ms: WRITE_TIMEOUT_MS_DEFAULT,
            snapshot_logs_since_last: SNAPSHOT_LOGS_SINCE_LAST_DEFAULT,
        }
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    pub(crate) fn write_forward_timeout(&self) -> Duration {
        Duration::from_millis(self.write_forward_timeout_ms)
    }

    pub(crate) fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    /// The openraft configuration, validated.
    pub(crate) fn raft_config(&self) -> Result<openraft::Config, Error> {
        if self.node.raft_addr.is_empty() {
            return Err(Error::Config("node.raft_addr is empty".to_string()));
        }
        if self.write_timeout_ms == 0 || self.write_forward_timeout_ms == 0 {
            return Err(Error::Config("write timeouts must be positive".to_string()));
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_interval_ms >= self.rpc_timeout_ms {
            return Err(Error::Config(format!(
                "heartbeat_interval_ms ({}) must be positive and below rpc_timeout_ms ({})",
                self.heartbeat_interval_ms, self.rpc_timeout_ms
            )));
        }
        if self.snapshot_logs_since_last == 0 {
            return Err(Error::Config(
                "snapshot_logs_since_last must be positive".to_string(),
            ));
        }
        let config = openraft::Config {
            cluster_name: GROUP.to_string(),
            // openraft 0.9 uses its heartbeat interval as the timeout of every
            // AppendEntries and vote RPC; the heartbeats themselves come from the
            // registry's ticker every `heartbeat_interval_ms`.
            heartbeat_interval: self.rpc_timeout_ms,
            enable_heartbeat: false,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            install_snapshot_timeout: self.install_snapshot_timeout_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: SNAPSHOT_LOGS_KEPT_MAX,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES_MAX,
            ..Default::default()
        };
        config.validate().map_err(|e| Error::Config(e.to_string()))
    }
}
