//! The identity every Raft group of keyhold gives its members: a node id unique across
//! all regions and the `NodeInfo` carried in each group's membership. A node holds a
//! replica of the registry and of its region's store under the same id and addresses,
//! so both groups share these types.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Identifies one node; unique across all regions and the same in every group.
pub type NodeId = u64;

/// What a group knows about a member. It travels inside the Raft membership, so
/// every replica can reach every other member and knows which region it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Region the node serves (for example `eu-west`).
    pub region: String,
    /// `host:port` of the node's public API listener.
    pub api_addr: String,
    /// `host:port` of the node's Raft listener (where the Raft routes are mounted).
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
