//! The Raft log store on sled (openraft's `RaftLogStorage`), generic over a group's
//! type configuration: entries keyed by big-endian index, each cut into values of
//! at most `LOG_VALUE_CHUNK_BYTES` (see that limit for why), plus the vote, the
//! committed log id and the last purged log id. A vote or an append is acknowledged only after
//! `flush_async` has made it durable, because openraft counts an acknowledged entry
//! towards a quorum and an acknowledged vote towards an election; losing either on a
//! crash could elect two leaders or lose a committed write.
//!
//! A purge records its log id first and then deletes the entries at or below it
//! in batches of at most `PURGE_BATCH_KEYS_MAX` keys: nothing reads below the
//! last purged id, so keys a crash leaves there are dead, and `open` deletes
//! them. (One sled transaction over the whole range, as before, held every key
//! and the epoch pinned for as long as it took: at millions of keys, seconds
//! during which nothing sled replaced anywhere in the process could be freed,
//! and the memory grew by gigabytes; docs/benchmarks.md.)

// openraft's storage traits fix the error type (`StorageError`, > 200 bytes); helpers
// returning it directly are clearer than boxing and unboxing at every trait method.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use crate::codec;
use crate::limits::{LOG_VALUE_CHUNK_BYTES, PURGE_BATCH_KEYS_MAX};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    LogId, OptionalSend, RaftLogId, RaftLogReader, RaftTypeConfig, StorageError, StorageIOError,
    Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// The names of the two trees one group's log occupies in a sled `Db`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTrees {
    /// 8-byte big-endian log index and 4-byte big-endian chunk number → that
    /// chunk of the encoded entry (big-endian so that sled's byte order is log
    /// order, then chunk order). A log written before entries were chunked has
    /// 8-byte keys holding whole entries; both forms are read.
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

/// Big-endian key of a log index, so that key order is index order; the prefix
/// of every chunk key of that index (`chunk_key`), and sorted before them.
fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Key of chunk `chunk` of the entry at `index`, 12 bytes.
fn chunk_key(index: u64, chunk: u32) -> [u8; 12] {
    let mut key = [0; 12];
    key[..8].copy_from_slice(&index_key(index));
    key[8..].copy_from_slice(&chunk.to_be_bytes());
    key
}

/// The log index and chunk number of a key of the log tree: a 12-byte chunk key,
/// or an 8-byte key of a whole entry (a log written before chunking), chunk 0.
fn parse_key(key: &[u8]) -> Option<(u64, u32)> {
    let index = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    match key.len() {
        8 => Some((index, 0)),
        12 => Some((index, u32::from_be_bytes(key[8..].try_into().ok()?))),
        _ => None,
    }
}

/// The keys of the entries whose indexes are in `range`: from the first key of
/// its first index up to, not including, the first key of the index after it.
fn to_key_range<RB: RangeBounds<u64>>(range: &RB) -> (Bound<[u8; 8]>, Bound<[u8; 8]>) {
    let after = |i: u64| match i.checked_add(1) {
        Some(next) => Bound::Excluded(index_key(next)),
        None => Bound::Unbounded,
    };
    let start = match range.start_bound() {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => match i.checked_add(1) {
            Some(next) => Bound::Included(index_key(next)),
            // Nothing comes after the last index: an empty range.
            None => {
                return (
                    Bound::Excluded(index_key(u64::MAX)),
                    Bound::Excluded(index_key(0)),
                )
            }
        },
        Bound::Unbounded => Bound::Unbounded,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => after(*i),
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
    /// Opens (or creates) the log of one group in `db` under `trees`, and
    /// finishes a purge a crash cut short.
    pub fn open(db: &sled::Db, trees: &LogTrees) -> Result<Self, crate::Error> {
        let store = Self {
            db: db.clone(),
            log: db.open_tree(&trees.log)?,
            meta: db.open_tree(&trees.meta)?,
            config: PhantomData,
        };
        let purged: Option<LogId<C::NodeId>> = store
            .read_meta(KEY_LAST_PURGED)
            .map_err(|e| crate::Error::Corrupt(e.to_string()))?;
        if let Some(purged) = purged {
            store.delete_through(purged.index)?;
        }
        Ok(store)
    }

    /// Deletes every key of the entries at or below `index`, at most
    /// `PURGE_BATCH_KEYS_MAX` per sled batch, so that no one write holds a
    /// purge's whole range (see the module doc).
    fn delete_through(&self, index: u64) -> Result<(), sled::Error> {
        loop {
            let mut batch = sled::Batch::default();
            let mut keys = 0;
            for key in self
                .log
                .range(to_key_range(&(..=index)))
                .keys()
                .take(PURGE_BATCH_KEYS_MAX)
            {
                batch.remove(key?);
                keys += 1;
            }
            if keys == 0 {
                return Ok(());
            }
            self.log.apply_batch(batch)?;
        }
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

    /// The entries whose indexes are in `range`, each put together from its
    /// chunks and checked against its keys.
    fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: &RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let corrupt = |index: u64, why: &'static str| -> StorageError<C::NodeId> {
            StorageIOError::read_log_at_index(index, openraft::AnyError::error(why)).into()
        };
        let mut entries = Vec::new();
        // The index being put together and its bytes so far.
        let mut current: Option<(u64, Vec<u8>, u32)> = None;
        let mut finish = |index: u64, bytes: &[u8]| -> Result<(), StorageError<C::NodeId>> {
            let entry = Self::decode_entry(bytes)?;
            // The key is derived from the entry; a mismatch means a corrupted tree.
            if entry.get_log_id().index != index {
                return Err(corrupt(index, "log key does not match the entry's index"));
            }
            entries.push(entry);
            Ok(())
        };
        for item in self.log.range(to_key_range(range)) {
            let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let (index, chunk) =
                parse_key(&key).ok_or_else(|| corrupt(0, "log key of an unknown length"))?;
            match &mut current {
                Some((at, bytes, next)) if *at == index => {
                    if chunk != *next {
                        return Err(corrupt(index, "log entry with a missing chunk"));
                    }
                    bytes.extend_from_slice(&value);
                    *next += 1;
                }
                _ => {
                    if let Some((at, bytes, _)) = current.take() {
                        finish(at, &bytes)?;
                    }
                    if chunk != 0 {
                        return Err(corrupt(index, "log entry without its first chunk"));
                    }
                    current = Some((index, value.to_vec(), 1));
                }
            }
        }
        if let Some((at, bytes, _)) = current {
            finish(at, &bytes)?;
        }
        Ok(entries)
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
        self.read_entries(&range)
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
        let last_key = self.log.last().map_err(|e| StorageIOError::read_logs(&e))?;
        let last_index = match last_key {
            Some((key, _)) => Some(parse_key(&key).map(|(index, _)| index).ok_or_else(|| {
                StorageIOError::read_logs(openraft::AnyError::error("log key of an unknown length"))
            })?),
            None => None,
        };
        // Keys at or below the last purged id are a purge's leftovers (see
        // `purge`): the log ends at the purged id then.
        let purged_index = last_purged_log_id.as_ref().map(|id| id.index);
        let last_log_id = match last_index.filter(|&index| Some(index) > purged_index) {
            Some(index) => match self.read_entries(&(index..=index))?.pop() {
                Some(entry) => Some(entry.get_log_id().clone()),
                None => {
                    return Err(StorageIOError::read_logs(openraft::AnyError::error(
                        "the log's last entry vanished while read",
                    ))
                    .into())
                }
            },
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
            let index = entry.get_log_id().index;
            // An empty encoding still gets its chunk 0, so every entry has a key.
            let mut chunks = bytes.chunks(LOG_VALUE_CHUNK_BYTES).peekable();
            if chunks.peek().is_none() {
                batch.insert(&chunk_key(index, 0), &[][..]);
            }
            for (n, chunk) in chunks.enumerate() {
                let n = u32::try_from(n).map_err(|_| {
                    StorageIOError::write_logs(openraft::AnyError::error(
                        "log entry of more than 2^32 chunks",
                    ))
                })?;
                batch.insert(&chunk_key(index, n), chunk);
            }
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
        // The id first: from then on nothing reads at or below it, so a crash
        // before the deletions end leaves only dead keys, which `open` (or the
        // next purge) deletes. Both trees are in one `Db`, whose log sled
        // recovers as a prefix: a deletion that survives a crash means the id
        // survived too.
        let marker = codec::encode(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        self.meta
            .insert(KEY_LAST_PURGED, marker)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.delete_through(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The snapshot data type `declare_raft_types!` defaults to names it.
    use std::io::Cursor;

    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    openraft::declare_raft_types!(
        /// A group whose entries carry bytes, to store entries of any size.
        Bytes:
            D = Vec<u8>,
            R = (),
    );

    type Entry = openraft::Entry<Bytes>;

    fn log_id(index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(1, 0), index)
    }

    /// The entry at `index`, `len` payload bytes that differ from one index to
    /// the next.
    fn entry(index: u64, len: usize) -> Entry {
        let payload = (0..len).map(|i| (i as u64 + index) as u8).collect();
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(payload),
        }
    }

    fn open() -> LogStore<Bytes> {
        let db = sled::Config::new()
            .temporary(true)
            .open()
            .expect("temporary sled");
        LogStore::open(&db, &LogTrees::for_group("test")).expect("open log")
    }

    /// Sizes around the chunk size: empty payload, one chunk, exactly one, one
    /// byte more, many chunks.
    const SIZES: [usize; 5] = [
        0,
        100,
        LOG_VALUE_CHUNK_BYTES - 8,
        LOG_VALUE_CHUNK_BYTES + 1,
        40 * LOG_VALUE_CHUNK_BYTES + 7,
    ];

    async fn filled() -> (LogStore<Bytes>, Vec<Entry>) {
        let mut log = open();
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, SIZES[i as usize % 5])).collect();
        log.blocking_append(entries.clone()).await.expect("append");
        (log, entries)
    }

    #[tokio::test]
    async fn entries_of_many_chunks_read_back_whole_by_any_range() {
        let (mut log, entries) = filled().await;
        // A large entry really is cut into chunks.
        assert!(log.log.len() > 40, "{} keys", log.log.len());
        assert_eq!(log.try_get_log_entries(1..=10).await.unwrap(), entries);
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
        assert_eq!(log.try_get_log_entries(4..=4).await.unwrap(), entries[3..4]);
        assert_eq!(log.try_get_log_entries(4..9).await.unwrap(), entries[3..8]);
        assert_eq!(
            log.try_get_log_entries((Bound::Excluded(3), Bound::Included(5)))
                .await
                .unwrap(),
            entries[3..5]
        );
        assert!(log.try_get_log_entries(11..).await.unwrap().is_empty());
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(10)));
        assert_eq!(state.last_purged_log_id, None);
    }

    #[tokio::test]
    async fn purge_and_truncate_take_every_chunk_of_their_entries() {
        let (mut log, entries) = filled().await;
        // Entry 4 and 9 are the many-chunk ones.
        log.purge(log_id(4)).await.unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries[4..]);
        log.truncate(log_id(9)).await.unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries[4..8]);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(8)));
        assert_eq!(state.last_purged_log_id, Some(log_id(4)));
        // No chunk of a removed entry is left behind.
        let first = log.log.first().unwrap().unwrap().0;
        assert_eq!(parse_key(&first), Some((5, 0)));
        log.purge(log_id(8)).await.unwrap();
        assert!(log.log.is_empty());
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(8)));
    }

    /// A purge's range larger than one deletion batch goes whole, in batches.
    #[tokio::test]
    async fn a_purge_of_more_keys_than_a_batch_deletes_them_all() {
        let mut log = open();
        let chunks = PURGE_BATCH_KEYS_MAX + PURGE_BATCH_KEYS_MAX / 2;
        let entries: Vec<Entry> = (1..=3)
            .map(|i| entry(i, chunks * LOG_VALUE_CHUNK_BYTES / 2))
            .collect();
        log.blocking_append(entries.clone()).await.unwrap();
        let before = log.log.len();
        assert!(before > 2 * PURGE_BATCH_KEYS_MAX, "{before} keys");
        log.purge(log_id(2)).await.unwrap();
        let first = log.log.first().unwrap().unwrap().0;
        assert_eq!(parse_key(&first), Some((3, 0)));
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries[2..]);
        assert_eq!(
            log.get_log_state().await.unwrap().last_purged_log_id,
            Some(log_id(2))
        );
    }

    /// A crash between a purge's id and the end of its deletions leaves keys
    /// at or below the id: nothing reads them, the log's state ignores them
    /// (also when they are all that is left), and opening the log deletes them.
    #[tokio::test]
    async fn keys_a_cut_short_purge_left_are_ignored_and_deleted_at_open() {
        let (mut log, entries) = filled().await;
        // The purge's first write, and none of its deletions.
        let marker = codec::encode(&log_id(6)).unwrap();
        log.meta.insert(KEY_LAST_PURGED, marker).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(6)));
        assert_eq!(state.last_log_id, Some(log_id(10)));
        assert_eq!(log.try_get_log_entries(7..).await.unwrap(), entries[6..]);

        // Every entry at or below the purged id: the log ends there.
        let marker = codec::encode(&log_id(12)).unwrap();
        log.meta.insert(KEY_LAST_PURGED, marker).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(12)));

        let reopened: LogStore<Bytes> =
            LogStore::open(&log.db, &LogTrees::for_group("test")).unwrap();
        assert!(reopened.log.is_empty(), "{} keys left", reopened.log.len());
        let mut reopened = reopened;
        let state = reopened.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(12)));
        assert_eq!(state.last_purged_log_id, Some(log_id(12)));
    }

    #[tokio::test]
    async fn a_log_of_whole_entries_from_before_chunking_is_read() {
        let mut log = open();
        // Entries 1 and 2 as the earlier format wrote them: one 8-byte key each.
        let old: Vec<Entry> = vec![entry(1, 5 * LOG_VALUE_CHUNK_BYTES), entry(2, 10)];
        for e in &old {
            let bytes = codec::encode(e).unwrap();
            log.log.insert(index_key(e.log_id.index), bytes).unwrap();
        }
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(log_id(2))
        );
        let new = vec![entry(3, 3 * LOG_VALUE_CHUNK_BYTES)];
        log.blocking_append(new.clone()).await.unwrap();
        let all: Vec<Entry> = old.iter().chain(&new).cloned().collect();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), all);
        log.purge(log_id(1)).await.unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), all[1..]);
    }

    #[tokio::test]
    async fn a_missing_chunk_is_a_read_error() {
        let (mut log, _) = filled().await;
        log.log.remove(chunk_key(4, 7)).unwrap();
        assert!(log.try_get_log_entries(3..=5).await.is_err());
        assert!(log.try_get_log_entries(5..=5).await.is_ok());
        log.log.remove(chunk_key(9, 0)).unwrap();
        assert!(log.try_get_log_entries(9..=9).await.is_err());
    }
}
