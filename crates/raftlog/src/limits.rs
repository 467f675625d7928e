//! Limits of the shared Raft storage, units last.

/// How long `open_db` keeps retrying a directory whose sled lock is still held by a
/// just-dropped instance in the same process (its flusher thread exits asynchronously).
pub const DB_OPEN_LOCK_WAIT_MS: u64 = 10_000;

/// Pause between those retries.
pub const DB_OPEN_LOCK_RETRY_MS: u64 = 20;

const _: () = assert!(DB_OPEN_LOCK_RETRY_MS * 10 <= DB_OPEN_LOCK_WAIT_MS);
