//! The openraft type configuration of the registry group and the aliases built on it:
//! node ids, the `NodeInfo` every member carries in the Raft membership, and the
//! concrete error and message types the rest of the crate names.

use std::fmt;
// `declare_raft_types!` names `Cursor` unqualified as the default snapshot data type.
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::state::{Request, Response};

/// Identifies one member of the registry group; unique across all regions.
pub type NodeId = u64;

/// What the cluster knows about a member. It travels inside the Raft membership, so
/// every replica can reach every other member and knows which region it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Region the node serves (for example `eu-west`).
    pub region: String,
    /// `host:port` of the node's public API listener.
    pub api_addr: String,
    /// `host:port` of the node's Raft listener (where `raft_router` is mounted).
    pub raft_addr: String,
}

impl NodeInfo {
    /// Builds a `NodeInfo` from its three parts.
    pub fn new(
        region: impl Into<String>,
        api_addr: impl Into<String>,
        raft_addr: impl Into<String>,
    ) -> Self {
        Self {
            region: region.into(),
            api_addr: api_addr.into(),
            raft_addr: raft_addr.into(),
        }
    }
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{region: {}, api: {}, raft: {}}}",
            self.region, self.api_addr, self.raft_addr
        )
    }
}

openraft::declare_raft_types!(
    /// Type configuration of the registry Raft group.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = NodeInfo,
        SnapshotData = Cursor<Vec<u8>>,
);

/// The registry's Raft instance.
pub type Raft = openraft::Raft<TypeConfig>;
/// One log entry of the registry group.
pub type Entry = openraft::Entry<TypeConfig>;
/// Position of an entry in the log.
pub type LogId = openraft::LogId<NodeId>;
/// A persisted vote.
pub type Vote = openraft::Vote<NodeId>;
/// Membership with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeInfo>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeInfo>;
/// Error type of every storage method.
pub type StorageError = openraft::StorageError<NodeId>;
/// Raft metrics of the registry group.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, NodeInfo>;

/// Error returned by a Raft API call, with `E` the call's own error.
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
/// Error of one outgoing Raft RPC.
pub type RpcError<E = openraft::error::Infallible> =
    openraft::error::RPCError<NodeId, NodeInfo, RaftError<E>>;
/// Error of `client_write` and membership changes.
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, NodeInfo>;
/// Error of `initialize`.
pub type InitializeError = openraft::error::InitializeError<NodeId, NodeInfo>;
/// What a member returns for a Raft write when it is not the leader.
pub type ForwardToLeader = openraft::error::ForwardToLeader<NodeId, NodeInfo>;
