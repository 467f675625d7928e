//! Named limits and defaults of the registry: Raft timing sized for inter-region round
//! trips, the write-forwarding budget, and snapshot thresholds. Units come last in every
//! name; the relations between them are checked at compile time below.

/// The slowest inter-region round trip the default timing is sized for.
pub const INTER_REGION_RTT_MS_MAX: u64 = 300;

/// The slowest log fsync on a follower the default timing is sized for: a follower
/// answers an AppendEntries only once the entries are durable.
pub const LOG_FSYNC_MS_MAX: u64 = 200;

/// Leader heartbeat period (sent by the registry's own ticker, see `Registry::start`).
/// Regions are tens to a few hundred milliseconds apart, so openraft's 50 ms default
/// would spend most of the link on heartbeats.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 250;

/// Timeout of one Raft RPC (AppendEntries with or without entries, votes). openraft
/// 0.9 takes it from its `heartbeat_interval` setting, which is why the heartbeat
/// period is kept apart (openraft's own heartbeat is off): an RPC must outlast a
/// slow round trip plus a follower's fsync, twice over, or a healthy but distant
/// follower never acknowledges anything and appends stall.
pub const RPC_TIMEOUT_MS_DEFAULT: u64 = 1_000;

/// Entries by which a member's AppendEntries cap grows after each AppendEntries
/// that carried the whole cap and was answered in time (`network.rs`): halved
/// on a timeout, raised one entry at a time, like a congestion window, so a
/// member that times out on large entries is not sent them again at once.
pub const APPEND_CAP_GROWTH_ENTRIES: u64 = 1;

/// Lower bound of the randomized election timeout: four missed heartbeats, and
/// longer than one RPC timeout, before a follower campaigns (after openraft's
/// leader lease, below).
pub const ELECTION_TIMEOUT_MIN_MS_DEFAULT: u64 = 1_100;

/// Upper bound of the randomized election timeout. The 0.5 s spread, more
/// than a vote's round trip (the slowest inter-region round trip and the
/// voter's fsync), makes split votes between regions rare. openraft 0.9 also takes it as its leader lease: a
/// follower that heard from a leader campaigns only this long plus its
/// election timeout after the last heartbeat, and refuses votes until this
/// long after it (`ELECTION_MS_MAX`).
pub const ELECTION_TIMEOUT_MAX_MS_DEFAULT: u64 = 1_600;

/// The longest a registry election takes once its leader is gone: openraft's
/// leader lease (`ELECTION_TIMEOUT_MAX_MS_DEFAULT`), then a follower's election
/// timeout, then one vote round. The region lease of the server outlasts it
/// (asserted there). The timeouts were 1.5-3 s (6 s in all) until issue 39.
pub const ELECTION_MS_MAX: u64 =
    2 * ELECTION_TIMEOUT_MAX_MS_DEFAULT + INTER_REGION_RTT_MS_MAX + LOG_FSYNC_MS_MAX;

/// Time a follower may spend receiving one snapshot chunk. openraft's 200 ms default is
/// less than one inter-region round trip for a multi-megabyte chunk.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Build a snapshot (and allow purging the log behind it) after this many applied
/// entries. The registry changes slowly, so snapshots are rare.
pub const SNAPSHOT_LOGS_SINCE_LAST_DEFAULT: u64 = 5_000;

/// Entries kept in the log behind a snapshot, so that a briefly lagging follower
/// catches up by replication instead of receiving a whole snapshot.
pub const SNAPSHOT_LOGS_KEPT_MAX: u64 = 1_000;

/// Timeout of one forwarded client write (follower → leader): one inter-region round
/// trip to the leader plus one to a quorum, with room for a slow fsync.
pub const WRITE_FORWARD_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// Overall bound of one `Registry::write`, retries included. A leader cut off from its
/// quorum would otherwise keep a write waiting for a commit that cannot happen.
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 15_000;

/// Attempts of `Registry::write` before it gives up with `Error::NoLeader`. Each
/// attempt that finds no usable leader waits up to `WRITE_NO_LEADER_WAIT_MS` for the
/// metrics to name one.
pub const WRITE_ATTEMPTS_MAX: u32 = 12;

/// Wait per attempt while no leader is known (or the known one did not answer).
pub const WRITE_NO_LEADER_WAIT_MS: u64 = 500;

/// Upper bound of one Raft RPC body accepted by the HTTP router (a snapshot chunk is
/// the largest the registry sends: `SNAPSHOT_CHUNK_BYTES_MAX` plus its envelope).
/// Defined in keyhold-raftlog, which the region store sees too: its writer keeps
/// every region log entry under it.
pub use keyhold_raftlog::limits::RPC_BODY_BYTES_MAX;

/// Size of one snapshot chunk sent over HTTP.
pub const SNAPSHOT_CHUNK_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// Longest tenant id, region name and operation id accepted by the state machine, so a
/// single bad request cannot bloat every replica.
pub const NAME_BYTES_MAX: usize = 128;

/// Shortest node credential accepted: 32 bytes is 192 bits of base64 or 128 of hex.
pub const NODE_CREDENTIAL_BYTES_MIN: usize = 32;

/// sled's cache of each of a registry replica's two `Db`s (log and state). The
/// registry holds regions, tenants, operations and nodes: small and read
/// through the applied state, so a small cache does; sled's 1 GiB default per
/// `Db` would let it grow with the log until a snapshot purges it.
pub const DB_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// On-disk format version of everything this crate writes to sled (bincode 2,
/// `config::standard()`); bumped on any incompatible change to a stored type or layout.
/// 2: the Raft log and the applied state in separate sled `Db`s (1: one `Db`, which
/// `store::open` migrates).
pub const STORAGE_FORMAT_VERSION: u32 = 2;

const _: () = assert!(HEARTBEAT_INTERVAL_MS_DEFAULT * 3 <= ELECTION_TIMEOUT_MIN_MS_DEFAULT);
// Several heartbeats are sent while one RPC may still be outstanding, so a single
// slow round trip does not silence the leader.
const _: () = assert!(HEARTBEAT_INTERVAL_MS_DEFAULT * 2 <= RPC_TIMEOUT_MS_DEFAULT);
const _: () = assert!(RPC_TIMEOUT_MS_DEFAULT >= 2 * (INTER_REGION_RTT_MS_MAX + LOG_FSYNC_MS_MAX));
// openraft requires it (its heartbeat setting carries the RPC timeout), and a vote
// must be able to finish before the next candidate's timer fires.
const _: () = assert!(RPC_TIMEOUT_MS_DEFAULT < ELECTION_TIMEOUT_MIN_MS_DEFAULT);
const _: () = assert!(ELECTION_TIMEOUT_MIN_MS_DEFAULT < ELECTION_TIMEOUT_MAX_MS_DEFAULT);
const _: () = assert!(INSTALL_SNAPSHOT_TIMEOUT_MS_DEFAULT >= ELECTION_TIMEOUT_MAX_MS_DEFAULT);
const _: () = assert!(
    ELECTION_TIMEOUT_MAX_MS_DEFAULT - ELECTION_TIMEOUT_MIN_MS_DEFAULT
        >= INTER_REGION_RTT_MS_MAX + LOG_FSYNC_MS_MAX
);
// A write must outlast one full election (a leader dies, followers time out, a new
// leader is voted in) before reporting NoLeader.
const _: () = assert!(
    WRITE_ATTEMPTS_MAX as u64 * WRITE_NO_LEADER_WAIT_MS >= 2 * ELECTION_TIMEOUT_MAX_MS_DEFAULT
);
// The overall bound leaves room for one election plus one forwarded attempt.
const _: () = assert!(
    WRITE_TIMEOUT_MS_DEFAULT
        >= 2 * ELECTION_TIMEOUT_MAX_MS_DEFAULT + WRITE_FORWARD_TIMEOUT_MS_DEFAULT
);
const _: () = assert!(SNAPSHOT_CHUNK_BYTES_MAX < RPC_BODY_BYTES_MAX as u64 / 2);
const _: () = assert!(SNAPSHOT_LOGS_KEPT_MAX < SNAPSHOT_LOGS_SINCE_LAST_DEFAULT);
/// Refused Raft calls (no or a wrong node credential) are logged in one
/// summary line at most this often; the metric counts every one.
pub const REFUSED_LOG_INTERVAL_MS: u64 = 10_000;
