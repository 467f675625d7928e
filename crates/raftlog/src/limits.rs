//! Limits of the shared Raft storage and of the Raft transport every group
//! shares, units last.

/// How long `open_db` keeps retrying a directory whose sled lock is still held by a
/// just-dropped instance in the same process (its flusher thread exits asynchronously).
pub const DB_OPEN_LOCK_WAIT_MS: u64 = 10_000;

/// Pause between those retries.
pub const DB_OPEN_LOCK_RETRY_MS: u64 = 20;

/// sled's cache of a `Db` holding Raft logs (a region group's, the registry's).
/// An append is written and flushed, and read back only by a follower's
/// replication or the apply of the entries just appended, so the cache needs to
/// hold only the recent tail; sled's 1 GiB default would grow with the log until
/// a snapshot purges it.
pub const LOG_DB_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// sled splits its LRU cache into this many shards of `cache / 256` bytes each
/// and never evicts the page a shard saw last (sled 0.34's `lru.rs`). The
/// patched sled also counts a record per page against a shard (down to 1/8
/// of it for cached pages); a log's pages are few, since a purge frees them
/// and sled reuses freed page ids, and a shard left less than a leaf by them
/// still evicts all but its last page.
pub const SLED_CACHE_SHARDS: u64 = 256;
/// sled splits a leaf page above this many keys once its keys and values hold
/// more than `SLED_LEAF_SPLIT_ABOVE_BYTES` (vendor/sled's `Node::should_split`).
pub const SLED_LEAF_KEYS_MAX: u64 = 16;
/// See `SLED_LEAF_KEYS_MAX`: so a leaf holds at most 17 values, or this much
/// and one value more.
pub const SLED_LEAF_SPLIT_ABOVE_BYTES: u64 = 4 * 1024;

/// An entry is stored in sled values of at most this many bytes (one key per
/// chunk), so that a log leaf holds at most `SLED_LEAF_KEYS_MAX + 1` chunks (or
/// `SLED_LEAF_SPLIT_ABOVE_BYTES` and one chunk) and fits one shard of the log
/// `Db`'s cache. With whole entries as values a leaf held up to 17 entries
/// (2 MiB of a move's 128 KiB import commands), far more than a 64 KiB shard,
/// and every shard kept its last such leaf: the log's memory grew with the log
/// to ~256 leaves, whatever `LOG_DB_CACHE_BYTES` said (225 of 356 MB of heap
/// at 300k stored orders, docs/benchmarks.md).
pub const LOG_VALUE_CHUNK_BYTES: usize = 3 * 1024;

/// Keys one sled batch of a purge deletes; a purge goes on batch after batch
/// until no key at or below its id is left. A region's log between two
/// snapshots holds hundreds of thousands of chunk keys; one write of them all
/// held them, and sled's epoch, for seconds (see `log.rs`).
pub const PURGE_BATCH_KEYS_MAX: usize = 4096;

/// Upper bound of one Raft RPC body a member accepts: every group's HTTP router
/// (keyhold-registry's `group_router`) refuses a larger one before decoding it.
/// Here, beside the log whose entries those bodies carry, because both sides of
/// the bound need it: the registry's transport enforces it, and the region
/// store's writer keeps every entry under it (`ENTRY_BYTES_MAX` there), which
/// it could not see in the registry crate (the registry re-exports it). A
/// snapshot chunk is the largest body the registry itself sends.
pub const RPC_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// An AppendEntries' bytes beside its entries (bincode): the vote, the
/// previous log id, the commit index (varints of at most 10 bytes each, a few
/// tags) and the entry count. Far more than that, for the relations built on it.
pub const APPEND_ENVELOPE_BYTES_MAX: usize = 1024;

const _: () = assert!(APPEND_ENVELOPE_BYTES_MAX < RPC_BODY_BYTES_MAX);
const _: () = assert!(DB_OPEN_LOCK_RETRY_MS * 10 <= DB_OPEN_LOCK_WAIT_MS);
const _: () = assert!(PURGE_BATCH_KEYS_MAX >= 1);
const _: () = assert!(
    (SLED_LEAF_KEYS_MAX + 1) * LOG_VALUE_CHUNK_BYTES as u64
        <= LOG_DB_CACHE_BYTES / SLED_CACHE_SHARDS
);
const _: () = assert!(
    SLED_LEAF_SPLIT_ABOVE_BYTES + LOG_VALUE_CHUNK_BYTES as u64
        <= LOG_DB_CACHE_BYTES / SLED_CACHE_SHARDS
);
