//! Limits of the region store, units last, in one place.

use keyhold_raftlog::limits::{APPEND_ENVELOPE_BYTES_MAX, RPC_BODY_BYTES_MAX};

/// Commands waiting for the region group's writer. A full queue answers 503
/// `store-unavailable` at once instead of letting latency grow without bound.
pub const QUEUE_COMMANDS_MAX: usize = 8192;
/// Commands in one log entry, made durable by one fsync. Large enough that 64
/// concurrent clients always share a flush; small enough that one entry's apply
/// stays short.
pub const BATCH_COMMANDS_MAX: usize = 1024;
/// Expired entries one sweep command deletes, so a sweep never holds up the
/// apply long enough to delay writers noticeably.
pub const SWEEP_ENTRIES_MAX: usize = 256;
/// Records and markers one sweep reads on the leader to find the due ones
/// (`Store::sweep`): the pace of the scan that replaced their expiry index
/// entries. At one sweep a second (`SWEEP_INTERVAL_MS_DEFAULT`) a pass over
/// 5 million entries takes under 21 minutes, a small delay against TTLs of
/// hours, for about one millisecond of reads per sweep.
pub const SWEEP_SCAN_ENTRIES_MAX: usize = 4096;
/// Entries one `EraseTenant` command deletes (a deleted tenant's data goes in
/// pages, like a sweep, so writers of other tenants wait little).
pub const ERASE_ENTRIES_MAX: usize = 256;
/// Payload bytes of the carried events one `ReleaseHeld` command moves
/// into the outbox (at least one event): a failover of a tenant with many
/// undelivered events releases them in pages, so that no one command's
/// changes (each event with its processed entries)
/// grow with the tenant. The size of a failover's import page.
pub const HELD_RELEASE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Orphans one reconciliation report lists; beyond it the report counts them
/// as omitted. An orphan encodes to 130-450 bytes, so a full report is 13-45
/// MB, more than a log entry holds (`ENTRY_BYTES_MAX`): it is recorded in
/// pages of `RECONCILIATION_PAGE_BYTES_MAX`, a command each.
pub const RECONCILIATION_ORPHANS_MAX: usize = 100_000;
/// Encoded bytes of the orphans one page of a reconciliation report carries
/// (`Command::StageOrphans`, at least one orphan): a small part of an entry,
/// so a page shares its entry with other commands, and a full report is a
/// few dozen commands.
pub const RECONCILIATION_PAGE_BYTES_MAX: usize = 1024 * 1024;
/// How often sled persists the region tree in the background. Durability does not
/// depend on it (the region group's Raft log does that); it bounds how many
/// entries a restart applies again.
pub const SLED_FLUSH_EVERY_MS: u64 = 5_000;

/// sled's cache of the region tree when the node's config does not set
/// `store_cache_bytes` (sled's own default is 1 GiB per `Db`). sled counts what
/// it caches by the pages' serialized size, so cached pages take more than
/// this in memory, and (vendor/sled, change 7) it counts 128 bytes of record
/// for every page of the tree against it, so a larger store caches fewer
/// pages for the same setting; large enough that the recent part of the tree
/// (new keys, the outbox tail, records being replayed) stays in memory, and
/// that the records of a store of several million orders leave room for it.
pub const REGION_TREE_CACHE_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The smallest and largest region tree cache a config may set: below the
/// minimum every read goes to disk; above the maximum is a typo, not a machine.
pub const REGION_TREE_CACHE_BYTES_MIN: u64 = 1024 * 1024;
pub const REGION_TREE_CACHE_BYTES_MAX: u64 = 256 * 1024 * 1024 * 1024;

/// Collections of crossbeam-epoch's garbage after each applied entry: each
/// frees up to 512 objects (8 bags of 64) that no reader can still see, so this
/// covers the nodes an entry of a full page of writes replaces, with room for
/// those of the log's appends.
pub const EPOCH_COLLECTS_PER_ENTRY: usize = 64;

/// An entry's changes are written to the region tree in one sled batch while
/// they stay below this many key and value bytes; past it, the changes so far
/// are written (with the entry's progress, so a crash resumes after them) and
/// the entry goes on in a new batch. It bounds what an entry of large commands
/// (a move's import pages) holds in memory beside its own commands to this plus
/// one command's changes; an entry of new orders (about 1.5 KiB each, at most
/// `BATCH_COMMANDS_MAX` of them) stays in one batch.
pub const ENTRY_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Encoded bytes of one region log entry (openraft's `Entry`: its log id and
/// its `CommandBatch`), as the log stores it and an AppendEntries carries it.
/// The writer gathers commands into an entry up to `BATCH_BYTES_MAX` (a
/// single larger command goes alone), and refuses a command that no entry
/// could hold (`Error::CommandTooLarge`) before it reaches the log.
/// Every entry must cross to a member in one AppendEntries, whose body the
/// member refuses above `RPC_BODY_BYTES_MAX`, and openraft sends an entry
/// that did not cross again and again: one entry above the body limit held
/// every later one, and so the region's store, until a change of leader.
/// Half the body limit: room for the request's envelope, and at 1 Gbit/s an
/// entry crosses in well under an RPC timeout.
pub const ENTRY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// An entry's bytes beside its commands: the log id (term, node id, index:
/// varints of at most 10 bytes each), the payload's variant and the command
/// count.
pub const ENTRY_ENVELOPE_BYTES_MAX: usize = 64;
/// Bytes of commands the writer gathers into one entry: a command that would
/// take the entry past it starts the next one, and a larger command goes
/// alone (up to `ENTRY_COMMANDS_BYTES_MAX`). An AppendEntries' worth
/// (`REGION_APPEND_BYTES_MAX`, what one RPC carried within its timeout on a
/// busy machine): entries of many large commands (a move's imports, claim
/// completions with large responses) stay as small as the network sends
/// them, and only a single large command makes a larger entry.
pub const BATCH_BYTES_MAX: usize = REGION_APPEND_BYTES_MAX;
/// The commands of one entry together, and so the largest command the log
/// takes. The largest the server builds is a request body (at most 4 MiB, a
/// move's page) with a few fields: a claim's completion, or an import command
/// carrying one entry larger than its page (keyhold-server's limits assert it).
pub const ENTRY_COMMANDS_BYTES_MAX: usize = ENTRY_BYTES_MAX - ENTRY_ENVELOPE_BYTES_MAX;

/// The largest command (or imported payload) the store decodes; a length prefix
/// claiming more is refused before anything is allocated for it. Above every
/// command the log takes (`ENTRY_COMMANDS_BYTES_MAX`) and every value stored.
pub const COMMAND_BYTES_MAX: usize = 128 * 1024 * 1024;

/// A record of a storage-format-1 write-ahead log claiming more than this is
/// corrupt (a record is one commit batch, bounded by its command count); read
/// only when migrating such a directory.
pub const FORMAT_1_RECORD_BYTES_MAX: usize = 512 * 1024 * 1024;

/// Largest key or value a region snapshot file may hold; a length above it means a
/// corrupt file and is refused before anything is allocated. Values are at most an
/// imported payload, itself at most a command.
pub const SNAPSHOT_ENTRY_BYTES_MAX: usize = COMMAND_BYTES_MAX;
/// Buffer of the reader or writer of a snapshot file: building or installing a
/// snapshot holds this, one entry and (installing) one batch in memory.
pub const SNAPSHOT_IO_BUFFER_BYTES: usize = 1024 * 1024;
/// While a snapshot is built, every applied entry first records the old
/// values of the keys it changes (`raft::cut`), so that the build reads the
/// tree as it was at its cut while entries go on. Past this many recorded key
/// and value bytes the build holds the apply lock for the rest of its stream,
/// as every build did before: the records never outgrow this by more than the
/// one entry being applied. At a few thousand orders per second a build has
/// tens of seconds before it gets there.
pub const SNAPSHOT_CUT_RECORDED_BYTES_MAX: usize = 256 * 1024 * 1024;
/// An installing snapshot is written to the region tree in sled batches of about
/// this many key and value bytes (one more entry may go over it).
pub const SNAPSHOT_INSTALL_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Leader heartbeat of a region group. Its members share a region, so the round
/// trip is short.
pub const REGION_HEARTBEAT_INTERVAL_MS: u64 = 100;
/// Randomized election timeout of a region group, lower and upper bound. Long
/// enough that a busy node's late heartbeat does not start an election (a
/// needless leader change costs every waiting request a retry), short enough
/// that a region answers again within a few seconds of losing its leader.
pub const REGION_ELECTION_TIMEOUT_MIN_MS: u64 = 500;
pub const REGION_ELECTION_TIMEOUT_MAX_MS: u64 = 1_000;
/// A region leader reads its own state as the region's current state (and so
/// executes, answers reads and serves move pages) only while a majority of its
/// voters acknowledged a message it sent within this long (`raft/confirmed.rs`).
/// openraft's voters refuse every campaign for `REGION_ELECTION_TIMEOUT_MAX_MS`
/// after hearing from their leader, so no successor can commit before then; the
/// rest of that time is the margin for clock rate drift and for the delay of
/// openraft's report. Several heartbeats long, so a busy leader keeps it.
pub const REGION_READ_LEASE_MS: u64 = 600;
/// A member that knows a leader campaigns once no leader reached it for this
/// long plus a draw below `REGION_CAMPAIGN_JITTER_MS` (`raft/election.rs`).
/// Past openraft's leader lease (`REGION_ELECTION_TIMEOUT_MAX_MS`), within
/// which the other voters refuse every campaign.
pub const REGION_CAMPAIGN_AFTER_LEADER_MS: u64 = 1_200;
/// The spread of the waits before a campaign, drawn anew for each.
pub const REGION_CAMPAIGN_JITTER_MS: u64 = 500;
/// A member that learned another's log is longer holds back this long, as
/// openraft does (twice its longest election timeout).
pub const REGION_CAMPAIGN_BEHIND_MS: u64 = 2 * REGION_ELECTION_TIMEOUT_MAX_MS;
/// The leader remembers this many of the entries it appended (index, commands,
/// time) to tell a standby's lag in commands and seconds; older ones count as
/// one command each, of unknown age.
pub const WRITTEN_ENTRIES_KEPT_MAX: usize = 100_000;
/// Timeout of one Raft RPC of a region group (AppendEntries, votes). openraft 0.9
/// uses its heartbeat period as this timeout, so the group sends its own
/// heartbeats (every `REGION_HEARTBEAT_INTERVAL_MS`) and gives openraft this
/// instead: with the 100 ms period as the timeout, an AppendEntries carrying
/// large responses on a busy machine timed out again and again.
pub const REGION_RPC_TIMEOUT_MS: u64 = 450;
/// The least time an AppendEntries to a learner of a region group in another
/// region (a standby's copy) gets: an inter-region round trip and the
/// learner's log fsync, twice over, as the registry's RPC timeout
/// (keyhold-server's limits assert it against the registry's
/// `INTER_REGION_RTT_MS_MAX` and `LOG_FSYNC_MS_MAX`, which this crate cannot
/// see). openraft 0.9 drops every AppendEntries at `REGION_RPC_TIMEOUT_MS`,
/// sized for the region's own members: across a 300 ms round trip and a slow
/// fsync no AppendEntries with entries was answered in time, and the learner
/// never advanced. The network lets the call go on
/// (keyhold-registry's `AppendTimeouts`) and answers openraft's next attempt
/// with its answer.
pub const REGION_LEARNER_RPC_TIMEOUT_MS: u64 = 1_000;
/// An AppendEntries of a region group gets a second more per this many bytes
/// of entries it carries: the slowest a member takes in entries (transfer,
/// decoding, the log's write) that the timeouts are sized for. A debug build
/// on a busy machine took more than `REGION_RPC_TIMEOUT_MS` for one entry of
/// `ENTRY_BYTES_MAX`, which openraft then sent again forever; it gets 2 s more.
pub const REGION_APPEND_BYTES_PER_SECOND_MIN: u64 = 1024 * 1024;
/// Entries per AppendEntries of a region group. Each entry is a whole commit
/// batch, of a few hundred bytes to a few 128 KiB import commands: the count
/// lets a learner in a distant standby region take many small batches per
/// round trip, `REGION_APPEND_BYTES_MAX` keeps one RPC of large ones within
/// its timeout.
pub const REGION_APPEND_ENTRIES_MAX: u64 = 64;
/// Bytes of encoded entries per AppendEntries of a region group (at least one
/// entry goes whatever its size): 16 entries of 128 KiB, the most one RPC
/// carried within `REGION_RPC_TIMEOUT_MS` when the count alone bounded it.
pub const REGION_APPEND_BYTES_MAX: usize = 16 * 128 * 1024;
/// How long the writer waits for one entry to be committed and applied. A leader
/// cut off from its peers neither commits nor learns that it was deposed; past
/// this its waiters are answered `Unavailable` (outcome unknown) instead of
/// holding every later command.
/// Generous: a busy machine applying large entries must not turn slowness into
/// failures (a caller's own request bound, 30 s in the server, is longer still).
pub const REGION_WRITE_WAIT_MS: u64 = 20_000;
/// Upkeep commands (`Command::lane`) queued alone while the leader's latest
/// entry is still on its way to a follower (another voter of the region, one
/// log flush away, or a standby region's learner, a round trip away) wait for
/// a client's command to share their entry, at most this long: openraft 0.9
/// sends a member one AppendEntries at a time, so an entry of upkeep alone
/// sent just before a client's command holds that command a whole round (a
/// follower's flush for every new order of a three-node region at one client,
/// an inter-region round trip for a region-survival write). Longer than the slowest such round trip the timing is sized for
/// (300 ms, the registry's `INTER_REGION_RTT_MS_MAX`) and shorter than one
/// RPC's timeout, so a learner that stopped answering holds upkeep no longer
/// than openraft waits for it anyway.
pub const UPKEEP_RIDE_WAIT_MS: u64 = 400;
/// Once every follower holds the leader's log, upkeep waits this much longer
/// for the client command that usually follows the answer just given.
pub const UPKEEP_RIDE_GRACE_MS: u64 = 5;
/// A follower further behind than this (entries) is catching up, not one
/// round trip away: upkeep does not wait for it.
pub const UPKEEP_RIDE_LAG_ENTRIES_MAX: u64 = REGION_APPEND_ENTRIES_MAX;
/// How long starting a single-voter region group waits for this node to lead it
/// (one election timeout after a restart, plus the replay of unapplied entries).
pub const REGION_LEADER_WAIT_MS: u64 = 30_000;
/// A region group builds a snapshot (and may purge the log behind it) after at
/// least this many applied entries; each entry holds a whole commit batch.
pub const REGION_SNAPSHOT_LOGS_SINCE_LAST: u64 = 10_000;
/// ... and once those entries wrote at least this percent of the last
/// snapshot's bytes to the region tree, so that a build (a pass over the whole
/// region) costs in proportion to what was written, not to the region's size
/// every `REGION_SNAPSHOT_LOGS_SINCE_LAST` entries. The log between two
/// snapshots holds about this much of the region's size again.
pub const REGION_SNAPSHOT_WRITTEN_PERCENT: u64 = 100;

const _: () = assert!(BATCH_COMMANDS_MAX <= QUEUE_COMMANDS_MAX);
// Every entry crosses to a member in one AppendEntries: alone, with the
// request's envelope, or with others within the network's byte bound (which
// cuts before the entry that would pass it, so a request carries at most
// `REGION_APPEND_BYTES_MAX` of entries, or one larger entry).
const _: () = assert!(ENTRY_BYTES_MAX + APPEND_ENVELOPE_BYTES_MAX < RPC_BODY_BYTES_MAX);
const _: () = assert!(ENTRY_BYTES_MAX <= RPC_BODY_BYTES_MAX / 2);
const _: () = assert!(REGION_APPEND_BYTES_MAX <= ENTRY_BYTES_MAX);
const _: () = assert!(ENTRY_ENVELOPE_BYTES_MAX < ENTRY_BYTES_MAX);
const _: () = assert!(ENTRY_BYTES_MAX <= COMMAND_BYTES_MAX);
const _: () = assert!(BATCH_BYTES_MAX <= ENTRY_COMMANDS_BYTES_MAX);
// A page of orphans (one more orphan may go over it: an orphan is below a
// KiB) is a small part of an entry.
const _: () = assert!(RECONCILIATION_PAGE_BYTES_MAX * 4 <= ENTRY_COMMANDS_BYTES_MAX);
const _: () = assert!(REGION_TREE_CACHE_BYTES_MIN <= REGION_TREE_CACHE_BYTES_DEFAULT);
const _: () = assert!(REGION_TREE_CACHE_BYTES_DEFAULT <= REGION_TREE_CACHE_BYTES_MAX);
const _: () = assert!(REGION_HEARTBEAT_INTERVAL_MS * 3 <= REGION_ELECTION_TIMEOUT_MIN_MS);
const _: () = assert!(REGION_ELECTION_TIMEOUT_MIN_MS < REGION_ELECTION_TIMEOUT_MAX_MS);
// A campaign after a silent leader comes after openraft's lease, in which the
// other voters still refuse it; a retry after a failed one comes sooner.
const _: () = assert!(REGION_ELECTION_TIMEOUT_MAX_MS < REGION_CAMPAIGN_AFTER_LEADER_MS);
const _: () = assert!(REGION_ELECTION_TIMEOUT_MIN_MS < REGION_CAMPAIGN_AFTER_LEADER_MS);
// The ticker that asks the election timer runs many times per wait.
const _: () = assert!(REGION_HEARTBEAT_INTERVAL_MS * 4 <= REGION_CAMPAIGN_JITTER_MS);
const _: () =
    assert!(REGION_CAMPAIGN_AFTER_LEADER_MS + REGION_CAMPAIGN_JITTER_MS < REGION_WRITE_WAIT_MS);
const _: () = assert!(REGION_HEARTBEAT_INTERVAL_MS < REGION_RPC_TIMEOUT_MS);
const _: () = assert!(REGION_RPC_TIMEOUT_MS < REGION_ELECTION_TIMEOUT_MIN_MS);
const _: () = assert!(REGION_ELECTION_TIMEOUT_MAX_MS < REGION_WRITE_WAIT_MS);
/// How often a write held for its standby's answers looks at them again
/// (`RegionGroup::wait_standby_confirms_within`): the network notes an answer
/// without waking anyone. Well under a heartbeat interval, so an answer is
/// seen about when openraft would have reported it.
pub const STANDBY_ANSWER_POLL_MS: u64 = 25;

const _: () = assert!(STANDBY_ANSWER_POLL_MS * 2 <= REGION_HEARTBEAT_INTERVAL_MS);
const _: () = assert!(SWEEP_ENTRIES_MAX <= BATCH_COMMANDS_MAX);
const _: () = assert!(SWEEP_ENTRIES_MAX <= SWEEP_SCAN_ENTRIES_MAX);
const _: () = assert!(ERASE_ENTRIES_MAX <= BATCH_COMMANDS_MAX);
const _: () = assert!(COMMAND_BYTES_MAX <= FORMAT_1_RECORD_BYTES_MAX);
const _: () = assert!(SNAPSHOT_IO_BUFFER_BYTES <= SNAPSHOT_INSTALL_BATCH_BYTES_MAX);
const _: () = assert!(ENTRY_BATCH_BYTES_MAX < SNAPSHOT_CUT_RECORDED_BYTES_MAX);
const _: () = assert!(REGION_HEARTBEAT_INTERVAL_MS < REGION_ELECTION_TIMEOUT_MIN_MS);
const _: () = assert!(REGION_ELECTION_TIMEOUT_MIN_MS < REGION_ELECTION_TIMEOUT_MAX_MS);
const _: () = assert!(REGION_ELECTION_TIMEOUT_MAX_MS * 10 <= REGION_LEADER_WAIT_MS);
const _: () = assert!(UPKEEP_RIDE_GRACE_MS < UPKEEP_RIDE_WAIT_MS);
const _: () = assert!(UPKEEP_RIDE_WAIT_MS < REGION_RPC_TIMEOUT_MS);
// The read lease ends well inside openraft's leader lease (a third of it left for
// drift and report delay) and spans several heartbeats.
const _: () = assert!(REGION_READ_LEASE_MS * 3 <= REGION_ELECTION_TIMEOUT_MAX_MS * 2);
const _: () = assert!(REGION_HEARTBEAT_INTERVAL_MS * 4 <= REGION_READ_LEASE_MS);
const _: () = assert!(REGION_RPC_TIMEOUT_MS < REGION_LEARNER_RPC_TIMEOUT_MS);
// The longest AppendEntries, the largest entry to a learner, ends before the
// writer gives up on its entry.
const _: () = assert!(
    REGION_LEARNER_RPC_TIMEOUT_MS
        + ENTRY_BYTES_MAX as u64 * 1000 / REGION_APPEND_BYTES_PER_SECOND_MIN
        < REGION_WRITE_WAIT_MS / 2
);
