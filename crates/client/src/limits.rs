//! Every limit and default of the SDK, named with its unit last, with the reason
//! beside it.

/// Attempts per call, the first included: with the default backoff this spans
/// several seconds, longer than a node's usual restart or leader change.
pub const ATTEMPTS_MAX_DEFAULT: u32 = 8;
/// Ceiling of the first retry's jittered wait.
pub const BACKOFF_MS_BASE_DEFAULT: u64 = 50;
/// No jittered wait is longer than this.
pub const BACKOFF_MS_MAX_DEFAULT: u64 = 5_000;
/// A server's `Retry-After` is honoured up to this; a longer one is cut so that a
/// misconfigured proxy cannot park a caller for hours.
pub const RETRY_AFTER_MS_MAX_DEFAULT: u64 = 30_000;
/// Per attempt: longer than the server's default in-flight wait (2 s) plus a slow
/// fsync, so a coalesced duplicate is not cut short.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Pending intents one journal file holds; the whole file is rewritten on every
/// change, so it must stay small.
pub const JOURNAL_INTENTS_MAX: usize = 10_000;
/// A claim guard heartbeats this many times per lease, so one lost heartbeat
/// still leaves time for the next before the lease runs out.
pub const HEARTBEATS_PER_LEASE: u64 = 3;
/// The contract's bounds of `lease_ms` (section 5).
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 3_600_000;

const _: () = assert!(BACKOFF_MS_BASE_DEFAULT <= BACKOFF_MS_MAX_DEFAULT);
const _: () = assert!(LEASE_MS_MIN / HEARTBEATS_PER_LEASE > 0);
