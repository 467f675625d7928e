//! The region group's state machine (openraft's `RaftStateMachine`): applies each
//! committed entry's commands through the region's `Machine`, the whole entry's
//! effect in one atomic sled batch with the entry's log id as last applied (a
//! membership entry's with the membership), each command decided on the tree with
//! the entry's earlier changes over it. An entry whose changes outgrow
//! `ENTRY_BATCH_BYTES_MAX` is written in several batches, each but the last with
//! the record of how far the entry got (`KEY_PARTIAL`, which stores written by
//! earlier releases, one batch per command, also hold), so that a crash mid-entry
//! re-applies exactly the commands whose effects are missing; builds snapshots by
//! streaming the region tree to a file and
//! installs them by streaming a file back into the tree; publishes the last applied
//! index on a watch channel.
//!
//! A snapshot is a consistent cut of the tree (`cut::Cut`) taken under the apply
//! lock and then streamed to disk while entries go on being applied: each write
//! records the old values of the keys it changes first. Memory stays bounded by
//! those records (`SNAPSHOT_CUT_RECORDED_BYTES_MAX`, past which the build holds
//! the apply lock for its rest), one entry and an I/O buffer when building, and
//! by one install batch (`SNAPSHOT_INSTALL_BATCH_BYTES_MAX`) when installing.
//!
//! Installing is made crash-safe by a marker file: the received snapshot becomes
//! `current.snap` (synced, renamed), `install.pending` is created, the tree is
//! cleared and refilled, the last applied id and membership are written last, the
//! `Db` is flushed, and the marker removed. Opening a state machine that finds the
//! marker runs the refill again from `current.snap`.

// openraft's storage traits fix the error type (`StorageError`, > 200 bytes); helpers
// returning it directly are clearer than boxing and unboxing at every trait method.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use keyhold_raftlog::tail::Leader;
use keyhold_raftlog::{LeaderRun, LogTail};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::cut::Cut;
use super::snapshot;
use super::{
    CommandBatch, Entry, EntryOutcome, LogId, RegionConfig, SnapshotMeta, StorageError,
    StoredMembership,
};
use crate::limits::{
    ENTRY_BATCH_BYTES_MAX, EPOCH_COLLECTS_PER_ENTRY, REGION_SNAPSHOT_LOGS_SINCE_LAST,
    REGION_SNAPSHOT_WRITTEN_PERCENT, SNAPSHOT_CUT_RECORDED_BYTES_MAX,
    SNAPSHOT_INSTALL_BATCH_BYTES_MAX,
};
use crate::machine::Machine;
use crate::overlay::Changes;
use crate::Error;

/// The last applied log id (`Option<LogId>`), in the region tree with the effects.
const KEY_APPLIED: &[u8] = b"sraft:applied";
/// The last applied membership (`StoredMembership`).
const KEY_MEMBERSHIP: &[u8] = b"sraft:membership";
/// Present while an entry is applied in part (`Partial`): how many of its commands
/// are in the tree. Written only for an entry larger than `ENTRY_BATCH_BYTES_MAX`
/// (before this release, for every command but an entry's last).
const KEY_PARTIAL: &[u8] = b"sraft:partial";
/// Present once the replica was promoted (`RegionStateMachine::promote`): the
/// last log index it applied (`u64`). From then on it applies nothing more.
const KEY_PROMOTED: &[u8] = b"sraft:promoted";
/// Written when the replica's promotion begins (before it applies anything
/// beyond its applied index) and kept: the replica's `LogTail` then, the log
/// it held beyond what it knew committed. Absent in a replica promoted by an
/// earlier release, whose tail counts as all committed.
const KEY_PROMOTED_TAIL: &[u8] = b"sraft:promoted-tail";
/// Followed by a log index (8 bytes, big-endian): the leader
/// (`keyhold_raftlog::tail::Leader`) of the entry applied there and of every
/// entry after it up to the next such key. Written with the first entry each
/// new leader's entries bring (and the first entry a tree from an earlier
/// release applies), so there is one per change of leader: it tells which
/// entries a promoted copy of this region holds alike (`leader_runs`).
const KEY_LEADER_PREFIX: &[u8] = b"sraft:leader:";
const CURRENT_SNAPSHOT: &str = "current.snap";
const INSTALL_PENDING: &str = "install.pending";
/// Prefixes of files that only live while a snapshot is built or received.
/// Frees what sled replaced while applying an entry, as far as no reader still
/// sees it.
///
/// sled 0.34 never frees a replaced tree node (every write replaces its leaf)
/// at once: it hands it to crossbeam-epoch's global collector, which frees at
/// most 8 bags of 64 objects per 128 pins of a thread. One sled batch of
/// thousands of writes (an import page, a large group commit) hands over
/// thousands of nodes under a few pins, so the garbage outgrew its collection
/// and the process's memory grew with the data written, whatever sled's cache
/// (issue 13). Each `flush` collects up to 8 more bags; the loop is bounded, and
/// cheap when nothing is left.
fn collect_replaced_nodes() {
    for _ in 0..EPOCH_COLLECTS_PER_ENTRY {
        crossbeam_epoch::pin().flush();
    }
}

const TEMPORARY_PREFIXES: [&str; 3] = ["building-", "incoming-", "installing-"];

/// How far the entry being applied got.
#[derive(Serialize, Deserialize)]
struct Partial {
    log_id: LogId,
    commands: u32,
}

struct Shared {
    db: sled::Db,
    machine: Machine,
    snapshots: PathBuf,
    /// Held while applying, installing and promoting, and while a build takes
    /// its cut: no write is half done at a cut, and an installation never
    /// interleaves with an apply.
    applying: Mutex<()>,
    /// Held for a whole build, and while installing or promoting: the tree is
    /// not replaced (installing) or made final (promoting) under a build's
    /// reader, and one build runs at a time.
    building: Mutex<()>,
    /// The cut a build is reading, if one is: every write of an entry records
    /// what it changes here first.
    cut: Cut,
    /// Last applied log index (0 before the first entry).
    applied_index: watch::Sender<u64>,
    /// Makes temporary file names and snapshot ids unique within a process.
    seq: AtomicU64,
    /// Set once the replica is promoted: an entry openraft still hands over
    /// afterwards (its apply task may outlive the core by a moment) is refused,
    /// never applied a second time.
    promoted: AtomicBool,
    /// `ENTRY_BATCH_BYTES_MAX`, or another bound in tests.
    entry_batch_bytes_max: usize,
    /// The leader of the newest `KEY_LEADER_PREFIX` key in the tree (`None`
    /// while there is none): an entry by another leader writes a new one.
    last_leader: Mutex<Option<Leader>>,
    /// What was applied since the last snapshot's cut, and whether that
    /// calls for the next one.
    since_snapshot: Mutex<SinceSnapshot>,
}

/// When a replica builds its next snapshot: once, since the last one's cut,
/// it applied at least `entries` entries and they wrote at least
/// `written_percent` percent of the last snapshot's bytes to the tree. The
/// second condition keeps the cost of building (a pass over the whole
/// region) in proportion to what was written, whatever the region's size: by
/// entries alone, a region of millions of orders streamed gigabytes every
/// `entries` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    pub entries: u64,
    pub written_percent: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            entries: REGION_SNAPSHOT_LOGS_SINCE_LAST,
            written_percent: REGION_SNAPSHOT_WRITTEN_PERCENT,
        }
    }
}

impl SnapshotPolicy {
    /// Whether a replica that applied `entries` entries writing `written`
    /// bytes since its last snapshot, of `snapshot_bytes`, builds one now.
    pub fn due(&self, entries: u64, written: u64, snapshot_bytes: u64) -> bool {
        entries >= self.entries
            && u128::from(written) * 100
                >= u128::from(snapshot_bytes) * u128::from(self.written_percent)
    }
}

#[derive(Debug, Default)]
struct SinceSnapshot {
    policy: SnapshotPolicy,
    entries: u64,
    /// Key and value bytes written to the tree.
    written: u64,
    /// Size of the last snapshot built or installed (0 before the first).
    snapshot_bytes: u64,
    /// The policy says build, and nobody took that up yet (`snapshot_wanted`).
    wanted: bool,
}

impl SinceSnapshot {
    /// A new cut: what is applied from here on counts toward the next.
    fn restart(&mut self) {
        self.entries = 0;
        self.written = 0;
    }

    fn check(&mut self) {
        if self
            .policy
            .due(self.entries, self.written, self.snapshot_bytes)
        {
            self.wanted = true;
        }
    }
}

fn leader_key(index: u64) -> Vec<u8> {
    let mut key = KEY_LEADER_PREFIX.to_vec();
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn is_bookkeeping(key: &[u8]) -> bool {
    [
        KEY_APPLIED,
        KEY_MEMBERSHIP,
        KEY_PARTIAL,
        KEY_PROMOTED,
        KEY_PROMOTED_TAIL,
    ]
    .contains(&key)
        || key.starts_with(KEY_LEADER_PREFIX)
}

/// One replica's region state machine. Cloning is cheap and shares the same state.
#[derive(Clone)]
pub struct RegionStateMachine {
    shared: Arc<Shared>,
}

impl Debug for RegionStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionStateMachine")
            .field("applied_index", &*self.shared.applied_index.borrow())
            .finish()
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    keyhold_raftlog::codec::encode(value).map_err(|e| Error::Corrupt(e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    keyhold_raftlog::codec::decode(bytes).map_err(|e| Error::Corrupt(e.to_string()))
}

fn io(context: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Snapshot(format!("{context}: {e}"))
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync snapshot directory"))
}

fn write_error(e: Error) -> StorageError {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

fn read_error(e: Error) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

impl RegionStateMachine {
    /// Opens the state machine over `tree` of `db`, keeping snapshots in `snapshots`.
    /// Blocking. Finishes an installation a crash interrupted and removes temporary
    /// files a crash left behind.
    pub fn open(db: sled::Db, tree: sled::Tree, snapshots: &Path) -> Result<Self, Error> {
        Self::open_with_entry_batch_bytes_max(db, tree, snapshots, ENTRY_BATCH_BYTES_MAX)
    }

    /// `open`, writing an entry's changes in batches of about `bytes` instead of
    /// `ENTRY_BATCH_BYTES_MAX`; 0 writes each command in its own batch with the
    /// entry's progress, as releases before one batch per entry did: for tests
    /// of entries applied in part.
    #[doc(hidden)]
    pub fn open_with_entry_batch_bytes_max(
        db: sled::Db,
        tree: sled::Tree,
        snapshots: &Path,
        bytes: usize,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(snapshots).map_err(Error::Io)?;
        let shared = Shared {
            db,
            machine: Machine::new(tree),
            snapshots: snapshots.to_path_buf(),
            applying: Mutex::new(()),
            building: Mutex::new(()),
            cut: Cut::default(),
            applied_index: watch::channel(0).0,
            seq: AtomicU64::new(0),
            promoted: AtomicBool::new(false),
            entry_batch_bytes_max: bytes,
            last_leader: Mutex::new(None),
            since_snapshot: Mutex::new(SinceSnapshot::default()),
        };
        if shared.snapshots.join(INSTALL_PENDING).exists() {
            tracing::warn!("finishing a snapshot installation a crash interrupted");
            shared.refill_from_current()?;
        }
        shared.remove_temporary_files()?;
        shared.machine.migrate_legacy_fences()?;
        shared.load_last_leader()?;
        let (applied, _) = shared.applied_state()?;
        let applied_index = applied.map_or(0, |id| id.index);
        shared.applied_index.send_replace(applied_index);
        // What was written since the last snapshot is not kept: a restart
        // counts the entries since it, and its size as written, so that a
        // replica restarted often still builds one.
        {
            let current = shared.current()?;
            let mut since = shared.since();
            let snapshot_index = current
                .as_ref()
                .and_then(|(meta, _)| meta.last_log_id)
                .map_or(0, |id| id.index);
            since.entries = applied_index.saturating_sub(snapshot_index);
            since.snapshot_bytes = match &current {
                Some((_, file)) => file.metadata().map_err(Error::Io)?.len(),
                None => 0,
            };
            since.written = since.snapshot_bytes;
        }
        if shared.machine.tree().contains_key(KEY_PROMOTED)? {
            shared.promoted.store(true, Ordering::SeqCst);
        }
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Builds snapshots as `policy` says from now on (the default is
    /// `SnapshotPolicy::default`).
    pub fn set_snapshot_policy(&self, policy: SnapshotPolicy) {
        self.shared.since().policy = policy;
    }

    /// Whether the snapshot policy called for a snapshot since the last call;
    /// the region group asks on every tick and has openraft build one.
    pub fn take_snapshot_wanted(&self) -> bool {
        std::mem::take(&mut self.shared.since().wanted)
    }

    /// A receiver of the last applied log index, updated after every applied batch
    /// of entries and every installed snapshot.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.applied_index.subscribe()
    }

    /// The region tree as applied so far: every value in it belongs to a committed
    /// entry (applying follows committing), so reads need not wait for anything.
    pub(crate) fn tree(&self) -> &sled::Tree {
        self.shared.machine.tree()
    }

    /// Makes everything applied so far durable (at shutdown).
    pub async fn flush(&self) -> Result<(), Error> {
        self.shared.db.flush_async().await?;
        Ok(())
    }

    /// Every entry of the region tree but the group's own bookkeeping (last applied
    /// id, membership, progress in an entry, leaders, promotion), as stored (with
    /// their stamps), in key order: for tests that compare replicas.
    #[doc(hidden)]
    pub fn entries_for_tests(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.shared
            .machine
            .tree()
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| !is_bookkeeping(k))
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    }

    /// The last log index this replica applied when it was promoted; `None`
    /// while it is an ordinary replica.
    pub fn promoted(&self) -> Result<Option<u64>, Error> {
        match self.shared.machine.tree().get(KEY_PROMOTED)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The log this replica held when its promotion began (its `LogTail`);
    /// `None` while it is an ordinary replica. A replica promoted by an
    /// earlier release, which kept no tail, answers its promoted index as all
    /// committed.
    pub fn promoted_tail(&self) -> Result<Option<LogTail>, Error> {
        let tree = self.shared.machine.tree();
        let Some(at) = self.promoted()? else {
            return Ok(None);
        };
        match tree.get(KEY_PROMOTED_TAIL)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(Some(LogTail::confirmed(at))),
        }
    }

    /// The leaders of the entries this replica applied from `from` to `to`
    /// (see `KEY_LEADER_PREFIX`): the run covering `from`, if one was
    /// recorded, then every later one up to `to`.
    pub fn leader_runs(&self, from: u64, to: u64) -> Result<Vec<LeaderRun>, Error> {
        let tree = self.shared.machine.tree();
        let run = |item: sled::Result<(sled::IVec, sled::IVec)>| -> Result<LeaderRun, Error> {
            let (key, value) = item?;
            let index: [u8; 8] = key[KEY_LEADER_PREFIX.len()..]
                .try_into()
                .map_err(|_| Error::Corrupt("a leader key without its index".into()))?;
            Ok(LeaderRun {
                from_index: u64::from_be_bytes(index),
                leader: decode(&value)?,
            })
        };
        let mut runs = Vec::new();
        if let Some(first) = tree
            .range(KEY_LEADER_PREFIX.to_vec()..=leader_key(from))
            .next_back()
        {
            runs.push(run(first)?);
        }
        if from < to {
            for item in tree.range(leader_key(from + 1)..=leader_key(to)) {
                runs.push(run(item)?);
            }
        }
        Ok(runs)
    }

    /// The last applied log index, as the tree records it.
    pub fn applied_index(&self) -> Result<u64, Error> {
        Ok(self.shared.applied_state()?.0.map_or(0, |id| id.index))
    }

    /// Makes this replica final: applies `entries` (read from its own log after
    /// its group's Raft instance stopped) beyond what it applied, in order, and
    /// records the promotion with the last index applied, which it returns. A
    /// replica promoted before answers that index and applies nothing. Each
    /// entry goes in its own atomic batch with the applied id, as openraft's
    /// applies do, and the promotion is recorded (and the `Db` flushed) last:
    /// a crash midway leaves an ordinary replica that applied a prefix, and
    /// promoting it again applies the rest and reaches the same index.
    pub async fn promote(&self, entries: Vec<Entry>) -> Result<u64, Error> {
        let at = self
            .spawn_blocking(move |shared| shared.promote(entries))
            .await?;
        self.shared.applied_index.send_replace(at);
        Ok(at)
    }

    /// openraft's `build_snapshot`, calling `after_entry` with the number of
    /// entries streamed so far after each one, and holding the apply lock for
    /// the rest of the build once the cut's records reach `recorded_bytes_max`
    /// (`SNAPSHOT_CUT_RECORDED_BYTES_MAX` in a node): for tests that pause a
    /// build midway.
    #[doc(hidden)]
    pub async fn build_snapshot_with(
        &self,
        recorded_bytes_max: usize,
        after_entry: impl FnMut(u64) + Send + 'static,
    ) -> Result<(SnapshotMeta, File), Error> {
        self.spawn_blocking(move |shared| shared.build_with(recorded_bytes_max, after_entry))
            .await
    }

    fn spawn_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared) -> Result<T, Error> + Send + 'static,
    ) -> impl std::future::Future<Output = Result<T, Error>> {
        let shared = self.shared.clone();
        async move {
            tokio::task::spawn_blocking(move || f(&shared))
                .await
                .map_err(|e| Error::Snapshot(format!("snapshot task failed: {e}")))?
        }
    }
}

impl Shared {
    // A poisoned lock means a panic while applying; each entry's batch is atomic, so
    // the tree still holds whole entries with a matching last applied id.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.applying
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn since(&self) -> MutexGuard<'_, SinceSnapshot> {
        self.since_snapshot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_building(&self) -> MutexGuard<'_, ()> {
        self.building
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes `changes` to the tree in one atomic batch, after recording what
    /// they replace for a build's cut.
    fn write(&self, changes: Changes) -> Result<(), Error> {
        let tree = self.machine.tree();
        self.cut.record(tree, changes.keys())?;
        let bytes = changes.bytes() as u64;
        tree.apply_batch(changes.into_batch())?;
        self.since().written += bytes;
        Ok(())
    }

    fn applied_state(&self) -> Result<(Option<LogId>, StoredMembership), Error> {
        let tree = self.machine.tree();
        let applied = match tree.get(KEY_APPLIED)? {
            Some(bytes) => decode(&bytes)?,
            None => None,
        };
        let membership = match tree.get(KEY_MEMBERSHIP)? {
            Some(bytes) => decode(&bytes)?,
            None => StoredMembership::default(),
        };
        Ok((applied, membership))
    }

    /// Applies entries in order, each in one atomic sled batch with the record
    /// that it is applied (`KEY_APPLIED`), or for a large one in several batches
    /// that record how far it got (`KEY_PARTIAL`).
    fn apply(&self, entries: impl IntoIterator<Item = Entry>) -> Result<Vec<EntryOutcome>, Error> {
        let _applying = self.lock();
        if self.promoted.load(Ordering::SeqCst) {
            return Err(Error::Raft(
                "the replica was promoted: it applies no more entries".into(),
            ));
        }
        let outcomes = self.apply_locked(entries)?;
        let mut since = self.since();
        since.entries += outcomes.len() as u64;
        since.check();
        drop(since);
        Ok(outcomes)
    }

    /// Reads the newest leader key into `last_leader`.
    fn load_last_leader(&self) -> Result<(), Error> {
        let tree = self.machine.tree();
        let newest = tree
            .scan_prefix(KEY_LEADER_PREFIX)
            .next_back()
            .transpose()?;
        let leader = newest.map(|(_, value)| decode(&value)).transpose()?;
        *self.last_leader.lock().unwrap_or_else(|p| p.into_inner()) = leader;
        Ok(())
    }

    /// `apply`, with the lock held by the caller.
    fn apply_locked(
        &self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<Vec<EntryOutcome>, Error> {
        let mut outcomes = Vec::new();
        for entry in entries {
            let started = Instant::now();
            let log_id = entry.log_id;
            let outcome = match entry.payload {
                EntryPayload::Blank => {
                    self.finish_entry(Changes::default(), log_id, None)?;
                    EntryOutcome::Raft
                }
                EntryPayload::Normal(batch) => self.apply_commands(log_id, &batch)?,
                EntryPayload::Membership(membership) => {
                    let membership = StoredMembership::new(Some(log_id), membership);
                    self.finish_entry(Changes::default(), log_id, Some(&membership))?;
                    EntryOutcome::Raft
                }
            };
            outcomes.push(outcome);
            collect_replaced_nodes();
            // The part of an entry's time (`keyhold_store_fsync_seconds` on the
            // leader) spent here rather than in the log or in Raft's own path.
            metrics::histogram!("keyhold_store_apply_seconds")
                .record(started.elapsed().as_secs_f64());
        }
        Ok(outcomes)
    }

    fn apply_commands(&self, log_id: LogId, batch: &CommandBatch) -> Result<EntryOutcome, Error> {
        let tree = self.machine.tree();
        // Commands of this entry applied before a crash are not written again.
        let done = match tree.get(KEY_PARTIAL)? {
            Some(bytes) => match decode::<Partial>(&bytes)? {
                Partial {
                    log_id: at,
                    commands,
                } if at == log_id => commands as usize,
                _ => 0,
            },
            None => 0,
        };
        let count = batch.commands.len();
        let mut answers = Vec::with_capacity(count);
        // The changes of this entry's commands not yet in the tree: each command
        // is decided on the tree with them over it.
        let mut pending = Changes::default();
        for (position, command) in batch.commands.iter().enumerate() {
            // The log index is the batch number stamped on every value: it only
            // grows, as batch numbers must.
            let (applied, writes) = self.machine.stage(&pending, command, log_id.index)?;
            answers.push(applied);
            if position < done {
                // Its answer is decided again on the state it produced; nobody
                // waits for it any more (the process that took it is gone).
                continue;
            }
            if let Some(writes) = writes {
                pending.absorb(writes);
            }
            if position + 1 < count && pending.bytes() >= self.entry_batch_bytes_max {
                let mut writes = std::mem::take(&mut pending);
                let partial = Partial {
                    log_id,
                    commands: (position + 1) as u32,
                };
                writes.insert(KEY_PARTIAL, encode(&partial)?);
                self.write(writes)?;
                collect_replaced_nodes();
            }
        }
        self.finish_entry(pending, log_id, None)?;
        Ok(EntryOutcome::Commands(answers))
    }

    /// Applies `batch` with the record that entry `log_id` is applied in full.
    fn finish_entry(
        &self,
        mut batch: Changes,
        log_id: LogId,
        membership: Option<&StoredMembership>,
    ) -> Result<(), Error> {
        batch.insert(KEY_APPLIED, encode(&Some(log_id))?);
        batch.remove(KEY_PARTIAL);
        if let Some(membership) = membership {
            batch.insert(KEY_MEMBERSHIP, encode(membership)?);
        }
        let mut last_leader = self.last_leader.lock().unwrap_or_else(|p| p.into_inner());
        let new_leader = *last_leader != Some(log_id.leader_id);
        if new_leader {
            batch.insert(leader_key(log_id.index), encode(&log_id.leader_id)?);
        }
        self.write(batch)?;
        if new_leader {
            *last_leader = Some(log_id.leader_id);
        }
        Ok(())
    }

    /// `RegionStateMachine::promote` under the lock: entries at or below the
    /// applied index are skipped (applied meanwhile, or before a crash), the
    /// rest must follow it without a gap.
    fn promote(&self, entries: Vec<Entry>) -> Result<u64, Error> {
        let _building = self.lock_building();
        let _applying = self.lock();
        let tree = self.machine.tree();
        if let Some(bytes) = tree.get(KEY_PROMOTED)? {
            self.promoted.store(true, Ordering::SeqCst);
            return decode(&bytes);
        }
        let applied = self.applied_state()?.0.map_or(0, |id| id.index);
        let mut at = applied;
        let mut beyond = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            if index <= at {
                continue;
            }
            if index != at + 1 {
                return Err(Error::Raft(format!(
                    "promotion: the log has no entry {} (next is {index})",
                    at + 1
                )));
            }
            at = index;
            beyond.push(entry);
        }
        // The tail is written before anything beyond the applied index is
        // applied, and kept: promoting again after a crash midway finds a
        // higher applied index, which is no longer what was known committed.
        if !tree.contains_key(KEY_PROMOTED_TAIL)? {
            let tail = LogTail::of(applied, beyond.iter().map(|entry| entry.log_id));
            tree.insert(KEY_PROMOTED_TAIL, encode(&tail)?)?;
        }
        self.apply_locked(beyond)?;
        tree.insert(KEY_PROMOTED, encode(&at)?)?;
        self.promoted.store(true, Ordering::SeqCst);
        self.db.flush()?;
        Ok(at)
    }

    fn current_path(&self) -> PathBuf {
        self.snapshots.join(CURRENT_SNAPSHOT)
    }

    fn temporary_path(&self, prefix: &str) -> PathBuf {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.snapshots.join(format!("{prefix}{seq}.snap"))
    }

    fn remove_temporary_files(&self) -> Result<(), Error> {
        for item in std::fs::read_dir(&self.snapshots).map_err(Error::Io)? {
            let path = item.map_err(Error::Io)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if TEMPORARY_PREFIXES.iter().any(|p| name.starts_with(p)) {
                std::fs::remove_file(&path).map_err(Error::Io)?;
            }
        }
        Ok(())
    }

    /// Streams a cut of the tree into a new `current.snap`; returns it open.
    fn build(&self) -> Result<(SnapshotMeta, File), Error> {
        self.build_with(SNAPSHOT_CUT_RECORDED_BYTES_MAX, |_| {})
    }

    /// `build`, holding the apply lock for the rest of the stream once the
    /// cut's records reach `recorded_bytes_max`, and calling `after_entry` with
    /// the count of entries streamed after each (tests pause a build there).
    fn build_with(
        &self,
        recorded_bytes_max: usize,
        mut after_entry: impl FnMut(u64),
    ) -> Result<(SnapshotMeta, File), Error> {
        let started = Instant::now();
        let _building = self.lock_building();
        let (meta, reading) = {
            let _applying = self.lock();
            let (last_log_id, last_membership) = self.applied_state()?;
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = match last_log_id {
                Some(id) => format!("{}-{}-{seq}", id.leader_id, id.index),
                None => format!("--{seq}"),
            };
            let reading = self.cut.begin();
            self.since().restart();
            let meta = SnapshotMeta {
                last_log_id,
                last_membership,
                snapshot_id,
            };
            (meta, reading)
        };
        let building = self.temporary_path("building-");
        let mut streamed = 0u64;
        let mut held = None;
        let entries = self.cut.entries(self.machine.tree()).inspect(|_| {
            streamed += 1;
            after_entry(streamed);
            if held.is_none() && self.cut.recorded_bytes() >= recorded_bytes_max {
                tracing::warn!(
                    streamed,
                    "a snapshot's cut recorded {recorded_bytes_max} bytes of changes: \
                     entries wait for the rest of the build"
                );
                held = Some(self.lock());
            }
        });
        snapshot::write(&building, &meta, entries)?;
        drop(held);
        drop(reading);
        // The state the snapshot covers must be durable before openraft may purge
        // the log behind it: a restart re-applies from the tree's last applied id.
        self.db.flush()?;
        let current = self.current_path();
        std::fs::rename(&building, &current).map_err(io("rename snapshot"))?;
        sync_dir(&self.snapshots)?;
        let file = File::open(&current).map_err(io("open snapshot"))?;
        self.snapshot_made(file.metadata().map_err(Error::Io)?.len());
        metrics::histogram!("keyhold_store_snapshot_build_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok((meta, file))
    }

    fn current(&self) -> Result<Option<(SnapshotMeta, File)>, Error> {
        let mut file = match File::open(self.current_path()) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open snapshot")(e)),
        };
        let meta = snapshot::Reader::open(file.try_clone().map_err(Error::Io)?)?
            .meta()
            .clone();
        file.seek(SeekFrom::Start(0))
            .map_err(io("rewind snapshot"))?;
        Ok(Some((meta, file)))
    }

    /// Makes the received snapshot `current.snap`, then refills the tree from it.
    fn install(&self, meta: &SnapshotMeta, mut received: File) -> Result<(), Error> {
        let _building = self.lock_building();
        let _applying = self.lock();
        let installing = self.temporary_path("installing-");
        {
            received
                .seek(SeekFrom::Start(0))
                .map_err(io("rewind received snapshot"))?;
            let mut copy = File::create(&installing).map_err(io("create snapshot copy"))?;
            std::io::copy(&mut received, &mut copy).map_err(io("copy received snapshot"))?;
            copy.sync_all().map_err(io("sync snapshot copy"))?;
        }
        // Read to the end before touching the tree: a snapshot cut short or corrupt
        // is refused while the replica still holds its previous state.
        let copied = File::open(&installing).map_err(io("open snapshot copy"))?;
        let found = snapshot::verify(copied)?;
        if &found != meta {
            return Err(Error::Snapshot(format!(
                "received snapshot {} does not match its meta {}",
                found.snapshot_id, meta.snapshot_id
            )));
        }
        let bytes = File::open(&installing)
            .and_then(|f| f.metadata())
            .map_err(io("size of snapshot copy"))?
            .len();
        std::fs::rename(&installing, self.current_path()).map_err(io("rename snapshot"))?;
        File::create(self.snapshots.join(INSTALL_PENDING))
            .and_then(|f| f.sync_all())
            .map_err(io("create install marker"))?;
        sync_dir(&self.snapshots)?;
        self.refill_from_current()?;
        self.since().restart();
        self.snapshot_made(bytes);
        self.remove_temporary_files()
    }

    /// A snapshot of `bytes` was built or installed: the next one waits for
    /// the policy again (a request made while this one was built is dropped,
    /// the next apply asks afresh).
    fn snapshot_made(&self, bytes: u64) {
        let mut since = self.since();
        since.snapshot_bytes = bytes;
        since.wanted = false;
    }

    /// Replaces the tree's contents with `current.snap`'s entries and then its last
    /// applied id and membership, flushes, and removes the install marker.
    fn refill_from_current(&self) -> Result<(), Error> {
        let file = File::open(self.current_path()).map_err(io("open snapshot"))?;
        let mut reader = snapshot::Reader::open(file)?;
        let meta = reader.meta().clone();
        let tree = self.machine.tree();
        tree.clear()?;
        let mut batch = sled::Batch::default();
        let mut batch_bytes = 0usize;
        while let Some((key, value)) = reader.next_entry()? {
            batch_bytes += key.len() + value.len();
            batch.insert(key, value);
            if batch_bytes >= SNAPSHOT_INSTALL_BATCH_BYTES_MAX {
                tree.apply_batch(std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
        }
        // The bookkeeping last: the snapshot's own copies of it are overwritten by
        // the meta, which is what openraft holds the state machine to.
        batch.insert(KEY_APPLIED, encode(&meta.last_log_id)?);
        batch.insert(KEY_MEMBERSHIP, encode(&meta.last_membership)?);
        tree.apply_batch(batch)?;
        // A snapshot from a replica of an older build may hold pre-guard fences.
        self.machine.migrate_legacy_fences()?;
        self.load_last_leader()?;
        self.db.flush()?;
        std::fs::remove_file(self.snapshots.join(INSTALL_PENDING))
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(io("remove install marker"))?;
        sync_dir(&self.snapshots)?;
        self.applied_index
            .send_replace(meta.last_log_id.map_or(0, |id| id.index));
        Ok(())
    }
}

impl RaftSnapshotBuilder<RegionConfig> for RegionStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<RegionConfig>, StorageError> {
        let (meta, file) = self
            .spawn_blocking(Shared::build)
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        })
    }
}

impl RaftStateMachine<RegionConfig> for RegionStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        self.shared.applied_state().map_err(read_error)
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<EntryOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut last = None;
        let entries = entries
            .into_iter()
            .inspect(|entry| last = Some(entry.log_id.index));
        let outcomes = self.shared.apply(entries).map_err(write_error)?;
        if let Some(index) = last {
            self.shared.applied_index.send_replace(index);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.shared.temporary_path("incoming-");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let signature = Some(meta.signature());
        let received = snapshot.into_std().await;
        let owned = meta.clone();
        self.spawn_blocking(move |shared| shared.install(&owned, received))
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature, AnyError::new(&e)))?;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<RegionConfig>>, StorageError> {
        let current = self
            .spawn_blocking(Shared::current)
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, AnyError::new(&e)))?;
        Ok(current.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::TenantGuard;
    use crate::test_common::new_order;
    use keyhold_core::TenantId;
    use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder};
    use std::collections::BTreeSet;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// A snapshot built by a replica whose tree still holds a fence from
    /// before guards (an older build's replica) installs it as the guard it
    /// stands for, so that a guard read needs one lookup on every replica.
    #[tokio::test]
    async fn a_snapshot_holding_a_fence_from_before_guards_installs_a_guard() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_, mut leader) = crate::raft::open(a.path(), "region-eu").unwrap();
        let entries = [
            Entry {
                log_id: log_id(1),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1u64])],
                    None,
                )),
            },
            Entry {
                log_id: log_id(2),
                payload: EntryPayload::Normal(CommandBatch {
                    commands: vec![new_order(2)],
                }),
            },
        ];
        leader.apply(entries).await.unwrap();
        let mut legacy = crate::keys::LEGACY_FENCE_PREFIX.to_vec();
        legacy.extend_from_slice(b"t9");
        leader
            .tree()
            .insert(&legacy, crate::codec::encode(2, &true))
            .unwrap();
        let mut snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let mut bytes = Vec::new();
        snapshot.snapshot.read_to_end(&mut bytes).await.unwrap();

        let (_, mut replica) = crate::raft::open(b.path(), "region-eu").unwrap();
        let mut receiving = replica.begin_receiving_snapshot().await.unwrap();
        receiving.write_all(&bytes).await.unwrap();
        receiving.flush().await.unwrap();
        replica
            .install_snapshot(&snapshot.meta, receiving)
            .await
            .unwrap();
        let tenant = TenantId::parse("t9").unwrap();
        let fence = TenantGuard::Fenced {
            operation_id: String::new(),
            epoch: 0,
        };
        assert_eq!(replica.shared.machine.guard(&tenant).unwrap(), Some(fence));
        assert!(!replica.tree().contains_key(&legacy).unwrap());
    }
}
