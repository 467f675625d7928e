//! The Raft log store on sled (openraft's `RaftLogStorage`): entries keyed by big-endian
//! index, plus the vote, the committed log id and the last purged log id. A vote or an
//! append is acknowledged only after `flush_async` has made it durable, because openraft
//! counts an acknowledged entry towards a quorum and an acknowledged vote towards an
//! election; losing either on a crash could elect two leaders or lose a committed write.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError};
use sled::Transactional;

use super::{decode_value, index_key, TREE_LOG, TREE_META};
use crate::codec;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// The registry's Raft log. Cloning is cheap and shares the same trees (openraft reads
/// through a clone while the original keeps appending).
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("entries", &self.log.len())
            .finish()
    }
}

impl LogStore {
    pub(crate) fn new(db: &sled::Db) -> Result<Self, sled::Error> {
        Ok(Self {
            db: db.clone(),
            log: db.open_tree(TREE_LOG)?,
            meta: db.open_tree(TREE_META)?,
        })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageIOError<u64>> {
        let Some(bytes) = self.meta.get(key).map_err(|e| StorageIOError::read(&e))? else {
            return Ok(None);
        };
        decode_value(&bytes)
            .map(Some)
            .map_err(|e| StorageIOError::read(&e))
    }

    async fn flush(&self) -> Result<(), sled::Error> {
        self.db.flush_async().await.map(|_| ())
    }
}

fn to_key_range<RB: RangeBounds<u64>>(range: &RB) -> (Bound<[u8; 8]>, Bound<[u8; 8]>) {
    let start = match range.start_bound() {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => match i.checked_add(1) {
            Some(next) => Bound::Included(index_key(next)),
            None => Bound::Excluded(index_key(u64::MAX)),
        },
        Bound::Unbounded => Bound::Unbounded,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut entries = Vec::new();
        for item in self.log.range(to_key_range(&range)) {
            let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let entry: Entry = decode_value(&value).map_err(|e| StorageIOError::read_logs(&e))?;
            // The key is derived from the entry; a mismatch means a corrupted tree.
            if key.as_ref() != index_key(entry.log_id.index) {
                return Err(StorageIOError::read_log_at_index(
                    entry.log_id.index,
                    openraft::AnyError::error("log key does not match the entry's index"),
                )
                .into());
            }
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(KEY_LAST_PURGED)?;
        let last_entry = self.log.last().map_err(|e| StorageIOError::read_logs(&e))?;
        let last_log_id = match last_entry {
            Some((_, value)) => {
                let entry: Entry =
                    decode_value(&value).map_err(|e| StorageIOError::read_logs(&e))?;
                Some(entry.log_id)
            }
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = codec::encode(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.meta
            .insert(KEY_VOTE, bytes)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.read_meta(KEY_VOTE)?)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed on its own: a stale committed id after a crash only means fewer
        // entries are re-applied at startup before the leader re-announces the rest.
        let bytes = codec::encode(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.meta
            .insert(KEY_COMMITTED, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = codec::encode(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.insert(&index_key(entry.log_id.index), bytes);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Durable before openraft may count these entries as replicated.
        let flushed = self.flush().await;
        let result = flushed
            .as_ref()
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()));
        callback.log_io_completed(result);
        flushed.map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for key in self.log.range(index_key(log_id.index)..).keys() {
            batch.remove(key.map_err(|e| StorageIOError::write_logs(&e))?);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Flushed so that conflicting entries cannot reappear after a crash once the
        // replacement entries are acknowledged.
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let marker = codec::encode(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let mut doomed = Vec::new();
        for key in self.log.range(..=index_key(log_id.index)).keys() {
            doomed.push(key.map_err(|e| StorageIOError::write_logs(&e))?);
        }
        // Marker and deletions in one transaction: a crash never leaves a purged range
        // without its marker (a log that seems to start at 1 again) or the reverse.
        // The closure may run more than once, so it only replays precomputed writes.
        let result: sled::transaction::TransactionResult<(), ()> = (&self.log, &self.meta)
            .transaction(|(log, meta)| {
                meta.insert(KEY_LAST_PURGED, marker.as_slice())?;
                for key in &doomed {
                    log.remove(key)?;
                }
                Ok(())
            });
        result
            .map_err(|e| StorageIOError::write_logs(openraft::AnyError::error(format!("{e:?}"))))?;
        Ok(())
    }
}
