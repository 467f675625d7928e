//! Limits of the shared Raft storage, units last.

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

const _: () = assert!(DB_OPEN_LOCK_RETRY_MS * 10 <= DB_OPEN_LOCK_WAIT_MS);
