//! The registry state machine on sled (openraft's `RaftStateMachine`): applies committed
//! entries to the in-memory `RegistryState`, writes every changed key together with the
//! last applied log id and membership in one atomic sled batch, builds and installs
//! snapshots of the whole state, and publishes the last applied index on a watch channel
//! so that readers can wait for their replica to catch up.
//!
//! Applied state is not flushed per batch: it is always rebuildable from the durable log
//! (openraft re-applies from `last_applied` on start), and it never runs ahead of the
//! durable log because only committed entries, already flushed in the log's `Db`, are
//! applied. It lives in its own `Db` (see `store`), so it must be flushed before the log
//! behind it may go: a built snapshot and an installed one are flushed before openraft
//! hears of them, because openraft purges the log up to a snapshot after that.

use std::fmt::Debug;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{decode_value, TREE_SNAPSHOT, TREE_STATE};
use crate::codec;
use crate::state::{RegistryState, Request, Response, StateKey};
use crate::types::{
    Entry, LogId, NodeId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const KEY_APPLIED: &[u8] = b"meta/applied";
const KEY_MEMBERSHIP: &[u8] = b"meta/membership";
const PREFIX_REGION: &str = "region/";
const PREFIX_TENANT: &str = "tenant/";
const PREFIX_OPERATION: &str = "operation/";
const PREFIX_DRIVER: &str = "driver/";
const PREFIX_SURVIVAL: &str = "survival/";
const PREFIX_FAILOVER: &str = "failover/";
const PREFIX_FAILOVER_TAIL: &str = "failover-tail/";
const PREFIX_STANDBY_LOST: &str = "standby-lost/";
const PREFIX_NODE: &[u8] = b"node/";
const KEY_SNAPSHOT: &[u8] = b"current";

/// Set in a node's environment (milliseconds) when its replica opens, the
/// replica applies each entry that begins a failover that much later: the one
/// way tests hold a replica that has a committed fence in its log but not in
/// its state (as a newly elected leader has until its first entry commits).
const FAULT_FAILOVER_APPLY_DELAY_MS: &str = "KEYHOLD_FAULT_REGISTRY_FAILOVER_APPLY_DELAY_MS";

/// The last snapshot built or installed, kept so that it survives a restart and can be
/// sent to a lagging follower.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    /// `codec::encode(&RegistryState)`.
    data: Vec<u8>,
}

/// What the state machine holds in memory, always equal to what is in the `state` tree.
#[derive(Debug, Default)]
struct Applied {
    state: RegistryState,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

struct Shared {
    db: sled::Db,
    tree: sled::Tree,
    snapshots: sled::Tree,
    applied: RwLock<Applied>,
    /// Last applied log index (0 before the first entry).
    applied_index: watch::Sender<u64>,
    /// Makes snapshot ids unique within a process; ids only need to differ, not order.
    snapshot_seq: AtomicU64,
    /// `FAULT_FAILOVER_APPLY_DELAY_MS` when the replica opened.
    failover_apply_delay: Option<Duration>,
}

/// The registry's state machine. Cloning is cheap and shares the same state; the
/// `Registry` keeps a clone to serve local reads.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

impl Debug for StateMachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("last_applied", &self.read_applied().last_applied)
            .finish()
    }
}

fn text_key(prefix: &str, id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + id.len());
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(id.as_bytes());
    key
}

fn node_key(id: NodeId) -> Vec<u8> {
    let mut key = PREFIX_NODE.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

type EncodeError = bincode::error::EncodeError;

/// Adds the current value of `key` in `state` to `batch`, or its removal if absent.
fn stage_key(
    batch: &mut sled::Batch,
    state: &RegistryState,
    key: &StateKey,
) -> Result<(), EncodeError> {
    let (db_key, value) = match key {
        StateKey::Region(name) => (
            text_key(PREFIX_REGION, name),
            state.regions.get(name).map(codec::encode).transpose()?,
        ),
        StateKey::Tenant(id) => (
            text_key(PREFIX_TENANT, id),
            state.tenants.get(id).map(codec::encode).transpose()?,
        ),
        StateKey::Operation(id) => (
            text_key(PREFIX_OPERATION, id),
            state.operations.get(id).map(codec::encode).transpose()?,
        ),
        StateKey::Driver(id) => (
            text_key(PREFIX_DRIVER, id),
            state.drivers.get(id).map(codec::encode).transpose()?,
        ),
        StateKey::Survival(id) => (
            text_key(PREFIX_SURVIVAL, id),
            state.survival.get(id).map(codec::encode).transpose()?,
        ),
        StateKey::Failover(id) => (
            text_key(PREFIX_FAILOVER, id),
            state.failovers.get(id).map(codec::encode).transpose()?,
        ),
        StateKey::FailoverTail(id) => (
            text_key(PREFIX_FAILOVER_TAIL, id),
            state
                .failover_tails
                .get(id)
                .map(codec::encode)
                .transpose()?,
        ),
        StateKey::StandbyLost(region) => (
            text_key(PREFIX_STANDBY_LOST, region),
            state
                .standby_lost
                .get(region)
                .map(codec::encode)
                .transpose()?,
        ),
    };
    match value {
        Some(value) => batch.insert(db_key, value),
        None => batch.remove(db_key),
    }
    Ok(())
}

/// Adds every key of `applied` (state, nodes, meta) to `batch`.
fn stage_all(batch: &mut sled::Batch, applied: &Applied) -> Result<(), EncodeError> {
    let state = &applied.state;
    let keys = state
        .regions
        .keys()
        .map(|k| StateKey::Region(k.clone()))
        .chain(state.tenants.keys().map(|k| StateKey::Tenant(k.clone())))
        .chain(
            state
                .operations
                .keys()
                .map(|k| StateKey::Operation(k.clone())),
        )
        .chain(state.drivers.keys().map(|k| StateKey::Driver(k.clone())))
        .chain(state.survival.keys().map(|k| StateKey::Survival(k.clone())))
        .chain(
            state
                .failovers
                .keys()
                .map(|k| StateKey::Failover(k.clone())),
        )
        .chain(
            state
                .failover_tails
                .keys()
                .map(|k| StateKey::FailoverTail(k.clone())),
        )
        .chain(
            state
                .standby_lost
                .keys()
                .map(|k| StateKey::StandbyLost(k.clone())),
        );
    for key in keys {
        stage_key(batch, state, &key)?;
    }
    stage_nodes_and_meta(batch, applied)
}

fn stage_nodes_and_meta(batch: &mut sled::Batch, applied: &Applied) -> Result<(), EncodeError> {
    for (id, node) in &applied.state.nodes {
        batch.insert(node_key(*id), codec::encode(node)?);
    }
    batch.insert(KEY_APPLIED, codec::encode(&applied.last_applied)?);
    batch.insert(KEY_MEMBERSHIP, codec::encode(&applied.membership)?);
    Ok(())
}

/// Rebuilds the in-memory state from the `state` tree.
fn load(tree: &sled::Tree) -> Result<Applied, crate::Error> {
    let mut applied = Applied::default();
    for item in tree.iter() {
        let (key, value) = item?;
        let key = key.as_ref();
        let corrupt = |e: bincode::error::DecodeError| {
            crate::Error::Storage(format!("state key {}: {e}", String::from_utf8_lossy(key)))
        };
        if key == KEY_APPLIED {
            applied.last_applied = decode_value(&value).map_err(corrupt)?;
        } else if key == KEY_MEMBERSHIP {
            applied.membership = decode_value(&value).map_err(corrupt)?;
        } else if let Some(id) = key.strip_prefix(PREFIX_NODE) {
            let id: [u8; 8] = id
                .try_into()
                .map_err(|_| crate::Error::Storage("node key is not 8 bytes".to_string()))?;
            let node = decode_value(&value).map_err(corrupt)?;
            applied.state.nodes.insert(NodeId::from_be_bytes(id), node);
        } else if let Some(name) = key.strip_prefix(PREFIX_REGION.as_bytes()) {
            let name = String::from_utf8_lossy(name).into_owned();
            let record = decode_value(&value).map_err(corrupt)?;
            applied.state.regions.insert(name, record);
        } else if let Some(id) = key.strip_prefix(PREFIX_TENANT.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let record = decode_value(&value).map_err(corrupt)?;
            applied.state.tenants.insert(id, record);
        } else if let Some(id) = key.strip_prefix(PREFIX_OPERATION.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let record = decode_value(&value).map_err(corrupt)?;
            applied.state.operations.insert(id, record);
        } else if let Some(id) = key.strip_prefix(PREFIX_DRIVER.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let lease = decode_value(&value).map_err(corrupt)?;
            applied.state.drivers.insert(id, lease);
        } else if let Some(id) = key.strip_prefix(PREFIX_SURVIVAL.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let survival = decode_value(&value).map_err(corrupt)?;
            applied.state.survival.insert(id, survival);
        } else if let Some(id) = key.strip_prefix(PREFIX_FAILOVER.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let result = decode_value(&value).map_err(corrupt)?;
            applied.state.failovers.insert(id, result);
        } else if let Some(id) = key.strip_prefix(PREFIX_FAILOVER_TAIL.as_bytes()) {
            let id = String::from_utf8_lossy(id).into_owned();
            let tail = decode_value(&value).map_err(corrupt)?;
            applied.state.failover_tails.insert(id, tail);
        } else if let Some(region) = key.strip_prefix(PREFIX_STANDBY_LOST.as_bytes()) {
            let region = String::from_utf8_lossy(region).into_owned();
            let since_ms = decode_value(&value).map_err(corrupt)?;
            applied.state.standby_lost.insert(region, since_ms);
        } else {
            return Err(crate::Error::Storage(format!(
                "unknown state key {}",
                String::from_utf8_lossy(key)
            )));
        }
    }
    Ok(applied)
}

/// `RegistryState` as snapshots before survival and failover encoded it (its
/// first five fields, positionally).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RegistryStateV1 {
    regions: std::collections::BTreeMap<String, crate::state::RegionRecord>,
    nodes: std::collections::BTreeMap<crate::types::NodeId, crate::types::NodeInfo>,
    tenants: std::collections::BTreeMap<String, crate::state::TenantRecord>,
    operations: std::collections::BTreeMap<String, crate::state::Operation>,
    drivers: std::collections::BTreeMap<String, crate::state::DriverLease>,
}

/// `RegistryState` as snapshots before failover tails encoded it (its first
/// seven fields, positionally).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RegistryStateV2 {
    regions: std::collections::BTreeMap<String, crate::state::RegionRecord>,
    nodes: std::collections::BTreeMap<crate::types::NodeId, crate::types::NodeInfo>,
    tenants: std::collections::BTreeMap<String, crate::state::TenantRecord>,
    operations: std::collections::BTreeMap<String, crate::state::Operation>,
    drivers: std::collections::BTreeMap<String, crate::state::DriverLease>,
    survival: std::collections::BTreeMap<String, crate::failover::Survival>,
    failovers: std::collections::BTreeMap<String, crate::failover::FailoverResult>,
}

/// `RegistryState` as snapshots before standby states encoded it (its first
/// eight fields, positionally).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RegistryStateV3 {
    regions: std::collections::BTreeMap<String, crate::state::RegionRecord>,
    nodes: std::collections::BTreeMap<crate::types::NodeId, crate::types::NodeInfo>,
    tenants: std::collections::BTreeMap<String, crate::state::TenantRecord>,
    operations: std::collections::BTreeMap<String, crate::state::Operation>,
    drivers: std::collections::BTreeMap<String, crate::state::DriverLease>,
    survival: std::collections::BTreeMap<String, crate::failover::Survival>,
    failovers: std::collections::BTreeMap<String, crate::failover::FailoverResult>,
    failover_tails: std::collections::BTreeMap<String, keyhold_raftlog::LogTail>,
}

impl From<RegistryStateV3> for RegistryState {
    fn from(v3: RegistryStateV3) -> Self {
        RegistryState {
            regions: v3.regions,
            nodes: v3.nodes,
            tenants: v3.tenants,
            operations: v3.operations,
            drivers: v3.drivers,
            survival: v3.survival,
            failovers: v3.failovers,
            failover_tails: v3.failover_tails,
            ..RegistryState::default()
        }
    }
}

impl From<RegistryStateV1> for RegistryStateV2 {
    fn from(v1: RegistryStateV1) -> Self {
        RegistryStateV2 {
            regions: v1.regions,
            nodes: v1.nodes,
            tenants: v1.tenants,
            operations: v1.operations,
            drivers: v1.drivers,
            survival: Default::default(),
            failovers: Default::default(),
        }
    }
}

impl From<RegistryStateV2> for RegistryState {
    fn from(v2: RegistryStateV2) -> Self {
        RegistryState {
            regions: v2.regions,
            nodes: v2.nodes,
            tenants: v2.tenants,
            operations: v2.operations,
            drivers: v2.drivers,
            survival: v2.survival,
            failovers: v2.failovers,
            ..RegistryState::default()
        }
    }
}

/// A snapshot's state, in today's encoding or in an earlier one (a node that
/// upgraded sends or keeps such a snapshot): before standby states (V3),
/// before failover tails (V2), or
/// before survival and failover (V1), each read as the next one with its new
/// fields empty.
fn decode_snapshot_state(data: &[u8]) -> Result<RegistryState, bincode::error::DecodeError> {
    let current = match codec::decode::<RegistryState>(data) {
        Ok(state) => return Ok(state),
        Err(e) => e,
    };
    if let Ok(v3) = codec::decode::<RegistryStateV3>(data) {
        return Ok(v3.into());
    }
    if let Ok(v2) = codec::decode::<RegistryStateV2>(data) {
        return Ok(v2.into());
    }
    match codec::decode::<RegistryStateV1>(data) {
        Ok(v1) => Ok(RegistryStateV2::from(v1).into()),
        Err(_) => Err(current),
    }
}

/// `FAULT_FAILOVER_APPLY_DELAY_MS` from the environment, if set.
fn failover_apply_delay() -> Option<Duration> {
    let ms = std::env::var(FAULT_FAILOVER_APPLY_DELAY_MS).ok()?;
    ms.parse::<u64>().ok().map(Duration::from_millis)
}

impl StateMachineStore {
    pub(crate) fn new(db: &sled::Db) -> Result<Self, crate::Error> {
        let tree = db.open_tree(TREE_STATE)?;
        let snapshots = db.open_tree(TREE_SNAPSHOT)?;
        let applied = load(&tree)?;
        let index = applied.last_applied.map_or(0, |id| id.index);
        let (applied_index, _) = watch::channel(index);
        Ok(Self {
            shared: Arc::new(Shared {
                db: db.clone(),
                tree,
                snapshots,
                applied: RwLock::new(applied),
                applied_index,
                snapshot_seq: AtomicU64::new(0),
                failover_apply_delay: failover_apply_delay(),
            }),
        })
    }

    /// Waits out `FAULT_FAILOVER_APPLY_DELAY_MS` before `entries` are applied if
    /// one of them begins a failover; nothing when the fault is not set.
    async fn delay_if_faulted(&self, entries: &[Entry]) {
        let Some(delay) = self.shared.failover_apply_delay else {
            return;
        };
        let begins_failover = entries.iter().any(|entry| {
            matches!(
                &entry.payload,
                EntryPayload::Normal(Request::BeginFailover { .. })
            )
        });
        if begins_failover {
            tracing::error!(
                "{FAULT_FAILOVER_APPLY_DELAY_MS} is set: applying a failover's begin {delay:?} late"
            );
            tokio::time::sleep(delay).await;
        }
    }

    // A poisoned lock means a panic while applying; the state itself is still the last
    // fully applied one because every mutation happens under the write lock in one go.
    fn read_applied(&self) -> RwLockReadGuard<'_, Applied> {
        self.shared
            .applied
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_applied(&self) -> RwLockWriteGuard<'_, Applied> {
        self.shared
            .applied
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the current applied state (a consistent view; the lock is held for
    /// the duration of `f`, so keep it short).
    pub fn read<R>(&self, f: impl FnOnce(&RegistryState) -> R) -> R {
        f(&self.read_applied().state)
    }

    /// Last applied log id.
    pub fn last_applied(&self) -> Option<LogId> {
        self.read_applied().last_applied
    }

    /// A receiver of the last applied log index, updated after every applied batch and
    /// installed snapshot.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.applied_index.subscribe()
    }

    /// Makes everything written so far durable (used at shutdown).
    pub async fn flush(&self) -> Result<(), sled::Error> {
        self.shared.db.flush_async().await.map(|_| ())
    }

    fn save_snapshot(&self, snapshot: &StoredSnapshot) -> Result<(), StorageError> {
        let signature = Some(snapshot.meta.signature());
        let bytes = codec::encode(snapshot)
            .map_err(|e| StorageIOError::write_snapshot(signature.clone(), &e))?;
        self.shared
            .snapshots
            .insert(KEY_SNAPSHOT, bytes)
            .map_err(|e| StorageIOError::write_snapshot(signature, &e))?;
        Ok(())
    }

    fn publish(&self, last_applied: Option<LogId>) {
        let index = last_applied.map_or(0, |id| id.index);
        self.shared.applied_index.send_replace(index);
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (data, meta) = {
            let applied = self.read_applied();
            let data = codec::encode(&applied.state)
                .map_err(|e| StorageIOError::read_state_machine(&e))?;
            let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = match applied.last_applied {
                Some(id) => format!("{}-{}-{seq}", id.leader_id, id.index),
                None => format!("--{seq}"),
            };
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
                snapshot_id,
            };
            (data, meta)
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.save_snapshot(&stored)?;
        // Durable before openraft learns of it: it purges the log behind this snapshot
        // next, and the log's `Db` is not the one holding this state.
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.read_applied();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        // Before any lock: local reads go on while the fault holds the apply.
        self.delay_if_faulted(&entries).await;
        let mut responses = Vec::new();
        let mut batch = sled::Batch::default();
        let last_applied = {
            let mut applied = self.write_applied();
            let mut touched = Vec::new();
            let mut membership_changed = false;
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Ok,
                    EntryPayload::Normal(request) => {
                        touched.extend(request.touched_keys(&applied.state));
                        applied.state.apply(&request)
                    }
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                        let membership = applied.membership.clone();
                        applied.state.set_membership(&membership);
                        membership_changed = true;
                        Response::Ok
                    }
                };
                responses.push(response);
            }
            let write_error = |e: EncodeError| StorageIOError::write_state_machine(&e);
            for key in &touched {
                stage_key(&mut batch, &applied.state, key).map_err(write_error)?;
            }
            if membership_changed {
                // Members that left are removed; the current ones are rewritten below.
                for key in self.shared.tree.scan_prefix(PREFIX_NODE).keys() {
                    batch.remove(key.map_err(|e| StorageIOError::write_state_machine(&e))?);
                }
            }
            stage_nodes_and_meta(&mut batch, &applied).map_err(write_error)?;
            applied.last_applied
        };
        self.shared
            .tree
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        self.publish(last_applied);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let signature = Some(meta.signature());
        let data = snapshot.into_inner();
        let mut state = decode_snapshot_state(&data)
            .map_err(|e| StorageIOError::read_snapshot(signature.clone(), &e))?;
        // The membership in the meta is authoritative for the node table.
        state.set_membership(&meta.last_membership);
        let installed = Applied {
            state,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };

        // Replace the whole tree in one atomic batch: delete every old key, write the new.
        let mut batch = sled::Batch::default();
        for key in self.shared.tree.iter().keys() {
            batch.remove(key.map_err(|e| StorageIOError::write_state_machine(&e))?);
        }
        stage_all(&mut batch, &installed).map_err(|e| StorageIOError::write_state_machine(&e))?;
        {
            let mut applied = self.write_applied();
            self.shared
                .tree
                .apply_batch(batch)
                .map_err(|e| StorageIOError::write_state_machine(&e))?;
            *applied = installed;
        }
        self.save_snapshot(&StoredSnapshot {
            meta: meta.clone(),
            data,
        })?;
        // Rare and large: make it durable now rather than rely on log replay, because
        // openraft may purge the log behind the snapshot right after this returns.
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature, &e))?;
        self.publish(meta.last_log_id);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(bytes) = self
            .shared
            .snapshots
            .get(KEY_SNAPSHOT)
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?
        else {
            return Ok(None);
        };
        let stored: StoredSnapshot =
            decode_value(&bytes).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_from_before_survival_and_failover_still_installs() {
        let mut state = RegistryState::default();
        state.apply(&crate::state::Request::AddRegion {
            name: "a".into(),
            now_ms: 1,
        });
        let v1 = RegistryStateV1 {
            regions: state.regions.clone(),
            nodes: Default::default(),
            tenants: Default::default(),
            operations: Default::default(),
            drivers: Default::default(),
        };
        let old = codec::encode(&v1).expect("encodes");
        assert_eq!(decode_snapshot_state(&old).expect("decodes"), state);
        let current = codec::encode(&state).expect("encodes");
        assert_ne!(
            old, current,
            "the encodings differ, so the fallback is exercised"
        );
        assert_eq!(decode_snapshot_state(&current).expect("decodes"), state);
        assert!(decode_snapshot_state(&[7, 7, 7]).is_err());
    }

    #[test]
    fn a_snapshot_from_before_failover_tails_still_installs() {
        let mut state = RegistryState::default();
        state.apply(&crate::state::Request::AddRegion {
            name: "a".into(),
            now_ms: 1,
        });
        state.failovers.insert(
            "f1".into(),
            crate::failover::FailoverResult {
                at: 42,
                estimated_lost: Default::default(),
                tenants: vec!["t1".into()],
            },
        );
        let v2 = RegistryStateV2 {
            regions: state.regions.clone(),
            nodes: Default::default(),
            tenants: Default::default(),
            operations: Default::default(),
            drivers: Default::default(),
            survival: Default::default(),
            failovers: state.failovers.clone(),
        };
        let old = codec::encode(&v2).expect("encodes");
        let decoded = decode_snapshot_state(&old).expect("decodes");
        assert_eq!(decoded, state);
        assert_eq!(
            decoded.failover_tail("f1"),
            Some(keyhold_raftlog::LogTail::confirmed(42)),
            "a failover of an earlier release keeps its position as its cut"
        );
        state
            .failover_tails
            .insert("f1".into(), keyhold_raftlog::LogTail::confirmed(41));
        let current = codec::encode(&state).expect("encodes");
        assert_eq!(decode_snapshot_state(&current).expect("decodes"), state);
    }

    #[test]
    fn a_snapshot_from_before_standby_states_still_installs() {
        let mut state = RegistryState::default();
        state.apply(&crate::state::Request::AddRegion {
            name: "a".into(),
            now_ms: 1,
        });
        state
            .failover_tails
            .insert("f1".into(), keyhold_raftlog::LogTail::confirmed(41));
        let v3 = RegistryStateV3 {
            regions: state.regions.clone(),
            nodes: Default::default(),
            tenants: Default::default(),
            operations: Default::default(),
            drivers: Default::default(),
            survival: Default::default(),
            failovers: Default::default(),
            failover_tails: state.failover_tails.clone(),
        };
        let old = codec::encode(&v3).expect("encodes");
        assert_eq!(decode_snapshot_state(&old).expect("decodes"), state);
        state.apply(&crate::state::Request::MarkStandbyLost {
            region: "a".into(),
            now_ms: 5,
        });
        let current = codec::encode(&state).expect("encodes");
        let decoded = decode_snapshot_state(&current).expect("decodes");
        assert_eq!(decoded, state);
        assert_eq!(
            decoded.standby_state("a"),
            crate::standbys::StandbyState::Lost { since_ms: 5 }
        );
    }
}
