//! The Raft log store on sled (openraft's `RaftLogStorage`), generic over a group's
//! type configuration: entries keyed by big-endian index, plus the vote, the committed
//! log id and the last purged log id. A vote or an append is acknowledged only after
//! `flush_async` has made it durable, because openraft counts an acknowledged entry
//! towards a quorum and an acknowledged vote towards an election; losing either on a
//! crash could elect two leaders or lose a committed write.

// openraft's storage traits fix the error type (`StorageError`, > 200 bytes); helpers
// returning it directly are clearer than boxing and unboxing at every trait method.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    LogId, OptionalSend, RaftLogId, RaftLogReader, RaftTypeConfig, StorageError, StorageIOError,
    Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::Transactional;

use crate::codec;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// The names of the two trees one group's log occupies in a sled `Db`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTrees {
    /// 8-byte big-endian log index → encoded entry (big-endian so that sled's byte
    /// order is log order).
    pub log: String,
    /// `vote`, `committed`, `last_purged` → encoded value. Other keys are the owner's
    /// (the registry keeps its format version here).
    pub meta: String,
}

impl LogTrees {
    /// The trees of group `group` (for example `region-eu`): `{group}/raft_log` and
    /// `{group}/raft_meta`, so that several groups can share one `Db`.
    pub fn for_group(group: &str) -> Self {
        Self {
            log: format!("{group}/raft_log"),
            meta: format!("{group}/raft_meta"),
        }
    }
}

/// One group's Raft log. Cloning is cheap and shares the same trees (openraft reads
/// through a clone while the original keeps appending).
pub struct LogStore<C: RaftTypeConfig> {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    config: PhantomData<C>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            log: self.log.clone(),
            meta: self.meta.clone(),
            config: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("entries", &self.log.len())
            .finish()
    }
}

/// Big-endian key of a log index, so that key order is index order.
fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
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

impl<C> LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    /// Opens (or creates) the log of one group in `db` under `trees`.
    pub fn open(db: &sled::Db, trees: &LogTrees) -> Result<Self, crate::Error> {
        Ok(Self {
            db: db.clone(),
            log: db.open_tree(&trees.log)?,
            meta: db.open_tree(&trees.meta)?,
            config: PhantomData,
        })
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageIOError<C::NodeId>> {
        let Some(bytes) = self.meta.get(key).map_err(|e| StorageIOError::read(&e))? else {
            return Ok(None);
        };
        codec::decode(&bytes)
            .map(Some)
            .map_err(|e| StorageIOError::read(&e))
    }

    fn decode_entry(bytes: &[u8]) -> Result<C::Entry, StorageIOError<C::NodeId>> {
        codec::decode(bytes).map_err(|e| StorageIOError::read_logs(&e))
    }

    async fn flush(&self) -> Result<(), sled::Error> {
        self.db.flush_async().await.map(|_| ())
    }
}

impl<C> RaftLogReader<C> for LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let mut entries = Vec::new();
        for item in self.log.range(to_key_range(&range)) {
            let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let entry = Self::decode_entry(&value)?;
            let index = entry.get_log_id().index;
            // The key is derived from the entry; a mismatch means a corrupted tree.
            if key.as_ref() != index_key(index) {
                return Err(StorageIOError::read_log_at_index(
                    index,
                    openraft::AnyError::error("log key does not match the entry's index"),
                )
                .into());
            }
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl<C> RaftLogStorage<C> for LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let last_purged_log_id: Option<LogId<C::NodeId>> = self.read_meta(KEY_LAST_PURGED)?;
        let last_entry = self.log.last().map_err(|e| StorageIOError::read_logs(&e))?;
        let last_log_id = match last_entry {
            Some((_, value)) => Some(Self::decode_entry(&value)?.get_log_id().clone()),
            None => last_purged_log_id.clone(),
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let bytes = codec::encode(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.meta
            .insert(KEY_VOTE, bytes)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(self.read_meta(KEY_VOTE)?)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        // Not flushed on its own: a stale committed id after a crash only means fewer
        // entries are re-applied at startup before the leader re-announces the rest.
        let bytes = codec::encode(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.meta
            .insert(KEY_COMMITTED, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(self
            .read_meta::<Option<LogId<C::NodeId>>>(KEY_COMMITTED)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = codec::encode(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.insert(&index_key(entry.get_log_id().index), bytes);
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

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
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

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
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
