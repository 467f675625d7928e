//! The sled-backed storage of the registry group: two sled `Db`s per registry replica,
//! one holding the Raft log (`keyhold-raftlog`'s generic log store, in the trees below)
//! and one holding the applied state machine with its snapshot (`state_machine.rs`).
//! This module lays out the replica's directory, migrates the older one-`Db` layout,
//! checks the format version and names the trees and keys; the layout is described in
//! the crate README.
//!
//! Two `Db`s because a sled flush is an fsync of everything dirty in its `Db`: with the
//! state in the log's `Db`, every append (which must be flushed before openraft hears
//! of it) also wrote out the applied state and snapshots, making the registry's
//! heartbeat-critical appends as slow as the largest state write (review defect 10).
//! The state's `Db` is flushed by sled in the background, and explicitly when a
//! snapshot is built or installed, because openraft may purge the log behind it.
//!
//! Directory `path/`:
//! - `log/` (a sled `Db`): tree `raft_log`: 8-byte big-endian log index and 4-byte
//!   big-endian chunk number → that chunk of the bincode `Entry` (big-endian so that
//!   sled's byte order is log order; see `keyhold_raftlog::LogTrees`); tree `raft_meta`:
//!   `format` (u32 BE), `vote`, `committed`, `last_purged` → bincode.
//! - `state/` (a sled `Db`): tree `state`: `meta/applied`, `meta/membership`,
//!   `region/{name}`, `tenant/{id}`, `operation/{id}`, `node/{u64 BE}` → bincode; tree
//!   `snapshot`: `current` → bincode `StoredSnapshot` (meta + encoded state).
//!
//! Format 1 kept all four trees in one `Db` directly in `path/`; `open` migrates it.

// openraft's storage traits fix the error type (`StorageError`, > 200 bytes); helpers
// returning it directly are clearer than boxing and unboxing at every trait method.
#![allow(clippy::result_large_err)]

mod state_machine;

use std::path::Path;

pub use self::state_machine::StateMachineStore;
use keyhold_raftlog::LogTrees;

use crate::codec;
use crate::limits::{DB_CACHE_BYTES, STORAGE_FORMAT_VERSION};
use crate::types::TypeConfig;
use crate::Error;

/// The registry's Raft log: the shared sled log store in the trees `raft_log` and
/// `raft_meta` of the replica's log `Db`.
pub type LogStore = keyhold_raftlog::LogStore<TypeConfig>;

pub(crate) const TREE_LOG: &str = "raft_log";
pub(crate) const TREE_META: &str = "raft_meta";
pub(crate) const TREE_STATE: &str = "state";
pub(crate) const TREE_SNAPSHOT: &str = "snapshot";

/// Subdirectories of a replica's directory holding its two `Db`s.
const DIR_LOG: &str = "log";
const DIR_STATE: &str = "state";

const KEY_FORMAT: &[u8] = b"format";

/// The format that kept log and state in one `Db` directly in the replica's directory.
const FORMAT_ONE_DB: u32 = 1;
/// sled's configuration file: present in a directory that is itself a sled `Db`, so
/// its presence marks the one-`Db` layout. Removed first once a migration is durable.
const ONE_DB_MARKER: &str = "conf";
/// The other files sled keeps directly in its directory (besides `snap.*` files).
const ONE_DB_LEFTOVERS: [&str; 2] = ["db", "blobs"];

// Migration only knows how to read the format before the current one.
const _: () = assert!(STORAGE_FORMAT_VERSION == FORMAT_ONE_DB + 1);

/// Opens (or creates) the registry's storage in the directory `path` and returns its
/// log store and state machine, ready to hand to `openraft::Raft::new`. The directory
/// belongs to this replica alone: sled locks both `Db`s while open. A directory in the
/// older one-`Db` format is migrated first.
///
/// Blocking (call it from `spawn_blocking` in async code). If a previous instance in
/// this process was just dropped, sled's flusher thread may still hold the directory
/// lock for a moment; `keyhold_raftlog::open_db` retries for a while.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore), Error> {
    if path.join(ONE_DB_MARKER).is_file() {
        migrate_one_db(path)?;
    }
    remove_one_db_leftovers(path)?;
    let log_db = open_db(&path.join(DIR_LOG))?;
    let state_db = open_db(&path.join(DIR_STATE))?;
    check_format(&log_db)?;
    let log = LogStore::open(&log_db, &log_trees()).map_err(|e| Error::Storage(e.to_string()))?;
    let state_machine = StateMachineStore::new(&state_db)?;
    Ok((log, state_machine))
}

fn log_trees() -> LogTrees {
    LogTrees {
        log: TREE_LOG.to_string(),
        meta: TREE_META.to_string(),
    }
}

/// Opens one of the replica's `Db`s with sled's cache bounded to
/// `DB_CACHE_BYTES` (sled's default, 1 GiB per `Db`, would let a node's memory
/// grow with the registry's log and state up to that much each).
fn open_db(path: &Path) -> Result<sled::Db, Error> {
    keyhold_raftlog::open_db(
        &sled::Config::new()
            .path(path)
            .cache_capacity(DB_CACHE_BYTES),
    )
    .map_err(|e| Error::Storage(format!("{}: {e}", path.display())))
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("{}: {e}", path.display()))
}

/// Copies a format-1 directory (one `Db` in `path` itself) into the two-`Db` layout.
///
/// Crash safety: the new `Db`s are rebuilt from scratch on every attempt and flushed
/// before the old `Db`'s `conf` file is removed; that removal is the commit point, so a
/// crash before it repeats the migration and a crash after it only leaves old files,
/// which `remove_one_db_leftovers` deletes.
fn migrate_one_db(path: &Path) -> Result<(), Error> {
    for dir in [DIR_LOG, DIR_STATE] {
        let dir = path.join(dir);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        }
    }
    {
        let old = open_db(path)?;
        let format = old.open_tree(TREE_META)?.get(KEY_FORMAT)?;
        let expected = FORMAT_ONE_DB.to_be_bytes();
        if format.as_deref() != Some(expected.as_slice()) {
            return Err(Error::Storage(format!(
                "registry data in {} has format {:?}, which this version can neither read nor migrate",
                path.display(),
                format.as_deref()
            )));
        }
        let log_db = open_db(&path.join(DIR_LOG))?;
        let state_db = open_db(&path.join(DIR_STATE))?;
        for (name, to) in [
            (TREE_LOG, &log_db),
            (TREE_META, &log_db),
            (TREE_STATE, &state_db),
            (TREE_SNAPSHOT, &state_db),
        ] {
            copy_tree(&old.open_tree(name)?, &to.open_tree(name)?)?;
        }
        log_db
            .open_tree(TREE_META)?
            .insert(KEY_FORMAT, &STORAGE_FORMAT_VERSION.to_be_bytes())?;
        state_db.flush()?;
        log_db.flush()?;
    }
    let marker = path.join(ONE_DB_MARKER);
    std::fs::remove_file(&marker).map_err(|e| io_error(&marker, e))?;
    tracing::info!(
        dir = %path.display(),
        "registry storage migrated from one sled Db to separate log and state Dbs"
    );
    Ok(())
}

fn copy_tree(from: &sled::Tree, to: &sled::Tree) -> Result<(), Error> {
    let mut batch = sled::Batch::default();
    for pair in from.iter() {
        let (key, value) = pair?;
        batch.insert(key, value);
    }
    to.apply_batch(batch)?;
    Ok(())
}

/// Deletes the files a format-1 `Db` kept in the replica's directory once its `conf`
/// is gone (a migration finished; nothing reads them any more).
fn remove_one_db_leftovers(path: &Path) -> Result<(), Error> {
    let Ok(entries) = std::fs::read_dir(path) else {
        // A new replica: the directory does not exist yet.
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error(path, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let leftover = ONE_DB_LEFTOVERS.contains(&name.as_ref()) || name.starts_with("snap.");
        if !leftover {
            continue;
        }
        let target = entry.path();
        let removed = if target.is_dir() {
            std::fs::remove_dir_all(&target)
        } else {
            std::fs::remove_file(&target)
        };
        removed.map_err(|e| io_error(&target, e))?;
    }
    Ok(())
}

/// Stamps a new log `Db` with `STORAGE_FORMAT_VERSION` and refuses one written in
/// another format, rather than misreading it.
fn check_format(db: &sled::Db) -> Result<(), Error> {
    let meta = db.open_tree(TREE_META)?;
    let expected = STORAGE_FORMAT_VERSION.to_be_bytes();
    match meta.get(KEY_FORMAT)? {
        Some(found) if found.as_ref() == expected => Ok(()),
        Some(found) => Err(Error::Storage(format!(
            "registry data format {:?} is not the supported version {STORAGE_FORMAT_VERSION}",
            found.as_ref()
        ))),
        None => {
            meta.insert(KEY_FORMAT, &expected)?;
            db.flush()?;
            Ok(())
        }
    }
}

/// Decodes a stored value; a failure means corruption or a format mismatch.
pub(crate) fn decode_value<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, bincode::error::DecodeError> {
    codec::decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Entry, LogId, Vote};
    use crate::{RegistryState, Request};
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
    use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader, RaftSnapshotBuilder};

    fn entry(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::AddRegion {
                name: format!("region-{index}"),
                now_ms: 1,
            }),
        }
    }

    /// Writes a replica in format 1 (every tree in one `Db` directly in `path`), the
    /// way earlier versions did: entries 1..=6 appended, applied, snapshotted at 6.
    async fn write_one_db_replica(path: &Path) -> RegistryState {
        let db = open_db(path).expect("open one Db");
        db.open_tree(TREE_META)
            .expect("meta")
            .insert(KEY_FORMAT, &FORMAT_ONE_DB.to_be_bytes())
            .expect("stamp format 1");
        let mut log = LogStore::open(&db, &log_trees()).expect("log");
        let mut state_machine = StateMachineStore::new(&db).expect("state machine");
        log.save_vote(&Vote::new_committed(1, 1))
            .await
            .expect("vote");
        let entries: Vec<Entry> = (1..=6).map(entry).collect();
        log.blocking_append(entries.clone()).await.expect("append");
        state_machine.apply(entries).await.expect("apply");
        state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        db.flush().expect("flush");
        state_machine.read(Clone::clone)
    }

    async fn assert_migrated(path: &Path, expected: &RegistryState) {
        let (mut log, mut state_machine) = open(path).expect("open migrated");
        assert!(!path.join(ONE_DB_MARKER).exists(), "old conf removed");
        for leftover in ONE_DB_LEFTOVERS {
            assert!(!path.join(leftover).exists(), "old {leftover} removed");
        }
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(Vote::new_committed(1, 1))
        );
        let entries = log.try_get_log_entries(1..=6).await.expect("entries");
        assert_eq!(entries.len(), 6);
        assert_eq!(&state_machine.read(Clone::clone), expected);
        assert_eq!(state_machine.last_applied().map(|id| id.index), Some(6));
        let snapshot = state_machine
            .get_current_snapshot()
            .await
            .expect("read snapshot")
            .expect("the snapshot moved too");
        assert_eq!(snapshot.meta.last_log_id.map(|id| id.index), Some(6));
        drop((log, state_machine));
        let log_db = open_db(&path.join(DIR_LOG)).expect("log Db");
        let format = log_db
            .open_tree(TREE_META)
            .unwrap()
            .get(KEY_FORMAT)
            .unwrap();
        assert_eq!(
            format.as_deref(),
            Some(STORAGE_FORMAT_VERSION.to_be_bytes().as_slice())
        );
    }

    #[tokio::test]
    async fn a_one_db_replica_is_migrated_with_its_log_state_and_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let expected = write_one_db_replica(dir.path()).await;
        assert!(dir.path().join(ONE_DB_MARKER).is_file());
        assert_migrated(dir.path(), &expected).await;
        // Opening again is a plain open of the new layout.
        assert_migrated(dir.path(), &expected).await;
    }

    #[tokio::test]
    async fn an_interrupted_migration_starts_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let expected = write_one_db_replica(dir.path()).await;
        // A crash mid-copy leaves a partial new log Db beside the intact old one.
        {
            let partial = open_db(&dir.path().join(DIR_LOG)).expect("partial");
            partial
                .open_tree(TREE_LOG)
                .unwrap()
                .insert(b"junk", b"junk")
                .unwrap();
            partial.flush().unwrap();
        }
        assert_migrated(dir.path(), &expected).await;
    }

    #[tokio::test]
    async fn a_one_db_replica_of_an_unknown_format_is_refused_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = open_db(dir.path()).expect("open");
            db.open_tree(TREE_META)
                .unwrap()
                .insert(KEY_FORMAT, &7u32.to_be_bytes())
                .unwrap();
            db.flush().unwrap();
        }
        let error = open(dir.path()).expect_err("format 7 is not migrated");
        let message = error.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(dir.path().join(ONE_DB_MARKER).is_file(), "old data kept");
    }
}
