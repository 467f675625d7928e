//! The openraft type configuration of the registry group and the aliases built on it:
//! the concrete error and message types the rest of the crate names. Node ids and the
//! `NodeInfo` every member carries come from `keyhold-raftlog`, shared by every group.

// `declare_raft_types!` names `Cursor` unqualified as the default snapshot data type.
use std::io::Cursor;

use crate::state::{Request, Response};

// The node identity is shared with the region groups (a node is a member of both
// under the same id and addresses).
pub use keyhold_raftlog::{NodeId, NodeInfo};

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
