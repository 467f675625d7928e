//! The sled-backed storage of the registry group: one sled `Db` per registry replica
//! holding the Raft log (`keyhold-raftlog`'s generic log store, in the trees below) and
//! the applied state machine with its snapshot (`state_machine.rs`). This module opens the database, checks its format version and
//! names the trees and keys; the layout is described in the crate README.
//!
//! Trees:
//! - `raft_log`: 8-byte big-endian log index → bincode `Entry` (big-endian so that
//!   sled's byte order is log order).
//! - `raft_meta`: `format` (u32 BE), `vote`, `committed`, `last_purged` → bincode.
//! - `state`: `meta/applied`, `meta/membership`, `region/{name}`, `tenant/{id}`,
//!   `operation/{id}`, `node/{u64 BE}` → bincode.
//! - `snapshot`: `current` → bincode `StoredSnapshot` (meta + encoded state).

// openraft's storage traits fix the error type (`StorageError`, > 200 bytes); helpers
// returning it directly are clearer than boxing and unboxing at every trait method.
#![allow(clippy::result_large_err)]

mod state_machine;

use std::path::Path;

pub use self::state_machine::StateMachineStore;
use keyhold_raftlog::LogTrees;

use crate::codec;
use crate::limits::STORAGE_FORMAT_VERSION;
use crate::types::TypeConfig;
use crate::Error;

/// The registry's Raft log: the shared sled log store in the trees `raft_log` and
/// `raft_meta` of the registry's own `Db`.
pub type LogStore = keyhold_raftlog::LogStore<TypeConfig>;

pub(crate) const TREE_LOG: &str = "raft_log";
pub(crate) const TREE_META: &str = "raft_meta";
pub(crate) const TREE_STATE: &str = "state";
pub(crate) const TREE_SNAPSHOT: &str = "snapshot";

const KEY_FORMAT: &[u8] = b"format";

/// Opens (or creates) the registry's sled database at `path` and returns its log store
/// and state machine, ready to hand to `openraft::Raft::new`. The directory belongs to
/// this replica alone: sled locks it while open.
///
/// Blocking (call it from `spawn_blocking` in async code). If a previous instance in
/// this process was just dropped, sled's flusher thread may still hold the directory
/// lock for a moment; `keyhold_raftlog::open_db` retries for a while.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore), Error> {
    let db = keyhold_raftlog::open_db(&sled::Config::new().path(path))
        .map_err(|e| Error::Storage(e.to_string()))?;
    check_format(&db)?;
    let trees = LogTrees {
        log: TREE_LOG.to_string(),
        meta: TREE_META.to_string(),
    };
    let log = LogStore::open(&db, &trees).map_err(|e| Error::Storage(e.to_string()))?;
    let state_machine = StateMachineStore::new(&db)?;
    Ok((log, state_machine))
}

/// Stamps a new database with `STORAGE_FORMAT_VERSION` and refuses one written in
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
