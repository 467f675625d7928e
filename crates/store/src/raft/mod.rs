//! The region store as the state machine of its own openraft group: the group's type
//! configuration (an entry carries a batch of `Command`s and answers with each one's
//! `Applied` outcome), its log (`keyhold-raftlog`'s sled log store) and its state machine
//! (`state_machine.rs`, applying each entry through `Machine::apply`'s staging with
//! the last applied log id in the same sled batch), and snapshots streamed from and
//! into the region tree (`snapshot.rs`), a build reading a cut of the tree while
//! entries go on being applied (`cut.rs`).
//!
//! Directory layout of one replica of a region group (`open`):
//! - `log/`: a sled `Db` holding the group's Raft log (`{group}/raft_log`,
//!   `{group}/raft_meta`); flushed on every append and vote; a small fixed sled
//!   cache (`keyhold_raftlog::limits::LOG_DB_CACHE_BYTES`).
//! - `db/`: the region's sled `Db`, tree `region` (the same tree the store has always
//!   used); never flushed per entry, because the log carries durability: it is
//!   flushed when a snapshot is built (before openraft may purge the log behind it)
//!   and when one is installed. Its sled cache is `GroupOptions::tree_cache_bytes`
//!   (the node's `store_cache_bytes`): sled's default of 1 GiB per `Db` let a
//!   node's memory grow with the stored data.
//! - `snapshots/`: `current.snap`, the last snapshot built or installed, and
//!   `install.pending` while an installation is under way.
//!
//! **Architecture Invariant:** each command's effect and the record of having applied
//! it (how far its entry got) reach the region tree in one atomic sled batch, so a
//! crash at any point re-applies exactly the commands whose effects are missing.

mod confirmed;
mod cut;
mod election;
mod group;
mod snapshot;
mod state_machine;

use std::path::Path;

use keyhold_raftlog::{LogTrees, NodeId, NodeInfo};
use serde::{Deserialize, Serialize};

pub use self::group::{Bootstrap, GroupOptions, Lag, Leadership, NoPeers, Purge, RegionGroup};
pub use self::state_machine::{RegionStateMachine, SnapshotPolicy};
use crate::command::{Applied, Command};
use crate::limits::{REGION_TREE_CACHE_BYTES_MIN, SLED_FLUSH_EVERY_MS};
use crate::Error;

/// The payload of one region log entry: the commands one group commit gathered,
/// applied in order.
///
/// Batches, not single commands, because openraft 0.9 makes every `client_write` its
/// own log append and waits for that append's flush before it handles the next
/// request (`RaftCore::append_to_log` awaits the `LogFlushed` callback): one command
/// per entry would cost one fsync per command. A writer that gathers the waiting
/// commands into one entry keeps group commit's economy, one fsync for many
/// commands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandBatch {
    pub commands: Vec<Command>,
}

/// What one entry of a region log produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EntryOutcome {
    /// The answer of each command of a `CommandBatch`, in order; a refusal
    /// (`Applied::Rejected`) is an answer too and replays identically.
    Commands(Vec<Applied>),
    /// A blank or membership entry: Raft's own, without an answer.
    Raft,
}

openraft::declare_raft_types!(
    /// Type configuration of a region's Raft group.
    pub RegionConfig:
        D = CommandBatch,
        R = EntryOutcome,
        NodeId = NodeId,
        Node = NodeInfo,
        SnapshotData = tokio::fs::File,
);

/// A region group's Raft instance.
pub type RegionRaft = openraft::Raft<RegionConfig>;
/// A region group's log.
pub type RegionLogStore = keyhold_raftlog::LogStore<RegionConfig>;
/// One entry of a region log.
pub type Entry = openraft::Entry<RegionConfig>;
/// Position of an entry in a region log.
pub type LogId = openraft::LogId<NodeId>;
/// Membership with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeInfo>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeInfo>;
/// Error type of every storage method.
pub type StorageError = openraft::StorageError<NodeId>;

/// Who a replica is: the Raft group it belongs to (for example `region-eu`) and
/// its identity there, the node's id and addresses in every group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub group: String,
    pub node: NodeId,
    pub info: NodeInfo,
}

/// The name of the Raft group of region `region`: `region-<region>`, also the
/// segment of its Raft routes (`/raft/region-<region>/...`).
pub fn group_name(region: &str) -> String {
    format!("region-{region}")
}

/// The name of the region tree in the region's `Db`.
pub const REGION_TREE: &str = "region";

/// Opens (or creates) one replica of the Raft group `group` (for example
/// `region-eu`) in `dir`: its log store and its state machine, ready for
/// `openraft::Raft::new`. Blocking; recovers an interrupted snapshot installation.
pub fn open(dir: &Path, group: &str) -> Result<(RegionLogStore, RegionStateMachine), Error> {
    open_with(dir, group, GroupOptions::default())
}

/// `open` with the region tree's sled cache of `options` (`tree_cache_bytes`); the
/// log's `Db` always has the small fixed cache of `keyhold_raftlog::log_db_config`.
pub fn open_with(
    dir: &Path,
    group: &str,
    options: GroupOptions,
) -> Result<(RegionLogStore, RegionStateMachine), Error> {
    assert!(
        options.tree_cache_bytes >= REGION_TREE_CACHE_BYTES_MIN,
        "the region tree's cache is at least REGION_TREE_CACHE_BYTES_MIN"
    );
    std::fs::create_dir_all(dir).map_err(Error::Io)?;
    let log_db = keyhold_raftlog::open_db(&keyhold_raftlog::log_db_config(&dir.join("log")))?;
    let log = RegionLogStore::open(&log_db, &LogTrees::for_group(group))?;
    let db = keyhold_raftlog::open_db(
        &sled::Config::new()
            .path(dir.join("db"))
            .cache_capacity(options.tree_cache_bytes)
            .flush_every_ms(Some(SLED_FLUSH_EVERY_MS)),
    )?;
    let tree = db.open_tree(REGION_TREE)?;
    let state_machine = RegionStateMachine::open(db, tree, &dir.join("snapshots"))?;
    state_machine.set_snapshot_policy(SnapshotPolicy {
        entries: options.snapshot_entries,
        written_percent: options.snapshot_written_percent,
    });
    Ok((log, state_machine))
}
