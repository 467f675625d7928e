//! Limits of the reader, units last.

/// Attempts per read while the cluster answers "not now" (503, 429, 409, 421,
/// transport errors).
pub const READ_ATTEMPTS_MAX: u32 = 40;
/// Pause between attempts of one read.
pub const READ_RETRY_MS: u64 = 250;
/// One HTTP request of the reader: longer than the server's in-flight wait
/// (2 s) and forwarding timeout (10 s).
pub const READ_TIMEOUT_MS: u64 = 15_000;
/// Reads in flight at once.
pub const READ_CONCURRENCY_MAX: usize = 32;
/// Pause between two reads of the downstream state while it settles.
pub const SETTLE_POLL_MS: u64 = 500;
/// Violations shown per kind in the readable summary; the JSON keeps them all.
pub const SUMMARY_VIOLATIONS_PER_KIND_MAX: usize = 10;

// A read retries for at least a move's fence window and a restart.
const _: () = assert!(READ_ATTEMPTS_MAX as u64 * READ_RETRY_MS >= 10_000);
const _: () = assert!(SETTLE_POLL_MS >= READ_RETRY_MS);
