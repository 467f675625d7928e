//! Limits of the node, units last, in one place. Configurable ones have their
//! defaults here; `Config` may override them.

/// Request bodies above this get 413 `payload-too-large` (contract default 64 KiB).
pub const BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// A body the handler did not read to its end (a refused request) is read and
/// discarded up to this many bytes and this long, so the connection stays usable;
/// past either the answer says `Connection: close`.
pub const DRAIN_BYTES_MAX: usize = 1024 * 1024;
pub const DRAIN_MS: u64 = 1_000;
/// A request body must arrive whole within this long (408 `request-timeout`);
/// a body allowed to be larger than the client limit (a move's import page)
/// gets as long as its limit takes at `BODY_READ_BYTES_PER_SECOND_MIN`.
pub const BODY_READ_MS: u64 = 10_000;
pub const BODY_READ_BYTES_PER_SECOND_MIN: u64 = 1024 * 1024;
/// Header lines and bytes (names plus values) the node interprets; more is 431
/// `headers-too-large`.
pub const HEADERS_MAX: usize = 100;
pub const HEADER_BYTES_MAX: usize = 16 * 1024;
/// What one request head may hold at all: header lines, and bytes from the
/// first byte to the empty line that ends it. The connection's head check
/// refuses more before hyper reads it (431 `headers-too-large`, or 414
/// `uri-too-long` when the request line does not even end within the bytes),
/// and hyper is configured with the same values, so it never refuses a head
/// itself. Above the node's own limits, which the router checks with a problem
/// document and a connection kept open. hyper needs at least 8 KiB of buffer.
pub const HEAD_LINES_MAX: usize = 200;
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Bytes a connection reads from its socket at a time, into a buffer it holds
/// only while it has unread bytes (an idle connection holds none).
pub const READ_CHUNK_BYTES: usize = 8 * 1024;
/// Open connections of the API listener, by default; `Config::connections_max`.
/// Past it a new connection is accepted and closed at once.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4_096;
/// Open connections from one client address, by default;
/// `Config::connections_per_address_max`. Past it a new connection from that
/// address is accepted and closed at once, so one client (probe d44e5cf held
/// 19,800 idle sockets) cannot hold the node. Far above what a load test from
/// one address opens (the load generator and the benches use a few hundred
/// connections from 127.0.0.1), and a quarter of `CONNECTIONS_MAX_DEFAULT`.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 1_024;
/// New connections one client address may open a second, by default (and as
/// many at once); `Config::new_connections_per_address_per_second`. Past it a
/// new connection from that address is accepted and closed at once, before
/// any TLS-free byte is read: a flood of short-lived connections from one
/// address (probe d44e5cf, O2: 250 a second kept other clients at 3 of 13)
/// costs the node an accept and a close each. A load generator's pool opens
/// its connections once and keeps them.
pub const NEW_CONNECTIONS_PER_ADDRESS_PER_SECOND_DEFAULT: u32 = 1_000;
/// Client addresses the connection rate limiter remembers before it forgets
/// those whose allowance is full again (`governor`'s `retain_recent`).
pub const CONNECTION_RATE_ADDRESSES_MAX: usize = 65_536;
/// A connection must deliver a whole request head within this long of opening
/// or of its previous answer; `Config::header_read_timeout`. Also the idle
/// limit of keep-alive connections.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 20_000;
/// The API listener's accept queue (the kernel caps it at
/// `net.core.somaxconn`). tokio binds with 128 here; a client opening
/// connections faster than the loop accepts them for a moment then overflows
/// the queue, and the kernel drops SYNs of every client alike (each retried
/// only a second later). The loop refuses over-limit connections at once, so
/// a deeper queue only absorbs bursts.
pub const ACCEPT_BACKLOG: i32 = 4_096;
/// Pause after a failed accept (out of descriptors): no busy loop.
pub const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;
/// How long shutdown waits for open connections to finish their request.
pub const SHUTDOWN_DRAIN_MS: u64 = REQUEST_TIMEOUT_MS + 1_000;

const _: () = assert!(HEADERS_MAX < HEAD_LINES_MAX);
const _: () = assert!(HEADER_BYTES_MAX < HEAD_BYTES_MAX);
const _: () = assert!(HEAD_BYTES_MAX >= 8 * 1024);
// hyper's own limit of a request target (u16::MAX - 1 bytes) is never reached
// by a head the check passed (the shortest head around a target is
// "A  HTTP/1.1\n\n"), so hyper never answers 414 itself.
const _: () = assert!(HEAD_BYTES_MAX - b"A  HTTP/1.1\n\n".len() < u16::MAX as usize);
const _: () = assert!(READ_CHUNK_BYTES <= HEAD_BYTES_MAX);
const _: () = assert!(CONNECTIONS_PER_ADDRESS_MAX_DEFAULT * 4 <= CONNECTIONS_MAX_DEFAULT);
// A burst of one address's whole share waits in the accept queue instead of
// having its SYNs dropped, and the queue never holds more than the node admits.
const _: () = assert!(ACCEPT_BACKLOG as usize >= CONNECTIONS_PER_ADDRESS_MAX_DEFAULT);
const _: () = assert!(ACCEPT_BACKLOG as usize <= CONNECTIONS_MAX_DEFAULT);
const _: () = assert!(BODY_READ_MS < REQUEST_TIMEOUT_MS);
const _: () = assert!(DRAIN_MS < BODY_READ_MS);
// A client-sized body always gets the plain BODY_READ_MS.
const _: () = assert!(
    (BODY_BYTES_MAX_DEFAULT as u64) * 1000 / BODY_READ_BYTES_PER_SECOND_MIN <= BODY_READ_MS
);
/// How long an in-flight duplicate waits for the first attempt (contract: 2 s).
pub const INFLIGHT_WAIT_MS_DEFAULT: u64 = 2_000;
/// `Retry-After` on 409 `request-in-progress` and on 503s, in seconds.
pub const RETRY_AFTER_SECONDS: u64 = 1;
/// Default per-tenant request rate, and burst, for tenants created without one.
pub const TENANT_REQUESTS_PER_SECOND_DEFAULT: u32 = 1_000;
pub const TENANT_NEW_KEYS_PER_SECOND_DEFAULT: u32 = 500;
/// Demo tenants of `keyhold up` must sustain load tests (contract: >= 20,000/s).
pub const DEMO_TENANT_REQUESTS_PER_SECOND: u32 = 50_000;
/// How often the sweeper looks for expired entries, and how many it deletes per
/// command (each command is one short apply in the region state machine).
pub const SWEEP_INTERVAL_MS_DEFAULT: u64 = 1_000;
pub const SWEEP_COMMANDS_PER_ROUND_MAX: usize = 64;
/// Whole-request timeout: longer than the in-flight wait plus a slow fsync.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Bytes of a bearer token's random part.
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// Header values copied into a claim's stored response.
pub const CLAIM_RESPONSE_HEADERS_MAX: usize = 32;

/// How long a rotated-out tenant token keeps working by default, and at most:
/// a day lets clients roll the new token out without an outage.
pub const TOKEN_GRACE_SECONDS_DEFAULT: u64 = 86_400;
pub const TOKEN_GRACE_SECONDS_MAX: u64 = 7 * 86_400;
/// The highest per-tenant rate limit the admin API accepts.
pub const TENANT_RATE_PER_SECOND_MAX: u32 = 1_000_000;
/// Entries one admin list answer (tenants, operations) carries at most.
pub const ADMIN_LIST_ITEMS_MAX: usize = 1_000;
/// How long the erasure task waits before trying a failed erasure (or its
/// registry report) again.
pub const ERASE_RETRY_MS: u64 = 1_000;
/// How long the reconciliation task waits before trying a failover's
/// reconciliation again (the new home did not answer, a leader changed).
pub const RECONCILE_RETRY_MS: u64 = 1_000;
/// Client order ids one marker lookup of the reconciliation asks the new home
/// about.
pub const RECONCILE_MARKER_IDS_MAX: usize = 1_000;
/// The body of one marker lookup: its ids at their longest, every character
/// escaped (six bytes), with quotes and commas.
pub const RECONCILE_MARKER_BODY_BYTES_MAX: usize = 512 * 1024;
const _: () = assert!(
    RECONCILE_MARKER_IDS_MAX * (6 * keyhold_core::limits::CLIENT_ORDER_ID_LENGTH_MAX + 3) + 64
        <= RECONCILE_MARKER_BODY_BYTES_MAX
);

const _: () = assert!(INFLIGHT_WAIT_MS_DEFAULT < REQUEST_TIMEOUT_MS);
const _: () = assert!(TOKEN_GRACE_SECONDS_DEFAULT <= TOKEN_GRACE_SECONDS_MAX);
const _: () = assert!(DEMO_TENANT_REQUESTS_PER_SECOND <= TENANT_RATE_PER_SECOND_MAX);
const _: () = assert!(TENANT_REQUESTS_PER_SECOND_DEFAULT <= TENANT_RATE_PER_SECOND_MAX);
const _: () = assert!(DEMO_TENANT_REQUESTS_PER_SECOND >= 20_000);

/// Outbox events one relay round reads, and how many of them are handled at once.
pub const RELAY_BATCH_EVENTS_MAX: usize = 256;
pub const RELAY_INFLIGHT_EVENTS_MAX: usize = 32;
/// How often an idle relay looks at the outbox without being woken.
pub const RELAY_IDLE_POLL_MS: u64 = 200;
/// Least time between the starts of two relay rounds unless the earlier one was
/// full. Every round is one store command per consumer, and every command is a
/// Raft entry a new order's entry may queue behind: at low load a round per order
/// would double the entries (and the fsyncs) a new order waits for, while a few
/// milliseconds let one round carry the events of several orders.
pub const RELAY_LINGER_MS: u64 = 5;
/// Ceiling of the relay's backoff after a failed round.
pub const RELAY_BACKOFF_MS_MAX: u64 = 5_000;
/// One charge request to the payment provider, and how often it is tried per
/// delivery before the event is left for the next round.
pub const PSP_REQUEST_TIMEOUT_MS: u64 = 3_000;
pub const PSP_ATTEMPTS_MAX: u32 = 8;
pub const PSP_BACKOFF_MS_BASE: u64 = 20;
pub const PSP_BACKOFF_MS_MAX: u64 = 1_000;

const _: () = assert!(RELAY_INFLIGHT_EVENTS_MAX <= RELAY_BATCH_EVENTS_MAX);
const _: () = assert!(RELAY_LINGER_MS < RELAY_IDLE_POLL_MS);
const _: () = assert!(PSP_BACKOFF_MS_BASE < PSP_BACKOFF_MS_MAX);
const _: () = assert!(PSP_BACKOFF_MS_MAX <= RELAY_BACKOFF_MS_MAX);

/// How long a node waits for its registry replica to apply a write it made (or a
/// later state another node reported) before giving up.
pub const REGISTRY_READ_WAIT_MS: u64 = 5_000;
/// How long an unknown token or tenant waits for this node's registry replica to
/// apply entries it already holds: about one heartbeat, after which the follower
/// knows they committed.
pub const REGISTRY_CATCH_UP_WAIT_MS: u64 = 1_000;
/// Such waits for an unknown token of the tenant form that may run at once on
/// one node; past it the token is refused at once (401). Each wait holds its
/// connection for `REGISTRY_CATCH_UP_WAIT_MS`; without a bound, a client
/// sending made-up tokens would hold connections a second each (probe
/// d44e5cf, O2). A tenant created through another node a moment ago is rare,
/// so a few dozen waits at once cover it.
pub const REGISTRY_CATCH_UP_WAITS_MAX: usize = 32;
/// A node that leads the registry is ready only while a quorum acknowledged it
/// within this long: after an election timeout the others may have elected
/// another leader.
pub const READY_QUORUM_ACK_MS_MAX: u64 = 1_500;
const _: () =
    assert!(READY_QUORUM_ACK_MS_MAX <= keyhold_registry::limits::ELECTION_TIMEOUT_MAX_MS_DEFAULT);
/// How long `keyhold up` and a bootstrapping node wait for the registry to elect a
/// leader and accept the regions.
pub const REGISTRY_BOOTSTRAP_WAIT_MS: u64 = 30_000;
/// One forwarded request to the home region: longer than the home's in-flight
/// wait plus a slow fsync, shorter than a client's patience.
pub const FORWARD_TIMEOUT_MS: u64 = 10_000;
// The home may first wait for its registry replica to learn the caller's token.
const _: () = assert!(REGISTRY_CATCH_UP_WAIT_MS < FORWARD_TIMEOUT_MS);
/// A region's part of a fanned-out admin call, and another region's view of
/// its reconciliation: a request to another node like a forward.
pub const ADMIN_CALL_TIMEOUT_MS: u64 = FORWARD_TIMEOUT_MS;
/// The lookup of the orders another region holds under a reconciling
/// region's orphans (one store read per client order id, on its leader).
pub const RECONCILE_MARKERS_CALL_TIMEOUT_MS: u64 = FORWARD_TIMEOUT_MS;
/// Forwarding tries the home once, and once more after a 421 and a registry refresh.
pub const FORWARD_ATTEMPTS_MAX: u32 = 2;
/// How long a follower of the home region waits for its region store's leader
/// to be known and reachable before it answers 503 `store-unavailable`: a
/// few election timeouts, within which a region that lost its leader elects
/// another.
pub const REGION_LEADER_WAIT_MS: u64 = 5_000;
/// How long a node that leads its region group by its own account but has no
/// recent confirmation from a majority (`Leadership::Unconfirmed`) holds a
/// request before it answers 503 `store-unavailable`: a healthy leader is
/// confirmed again within a few heartbeats, while a leader cut off from its
/// peers stays unconfirmed until it can reach them, and its clients do better
/// retrying through another node than waiting the whole `REGION_LEADER_WAIT_MS`.
pub const REGION_UNCONFIRMED_WAIT_MS: u64 = 1_500;
const _: () = assert!(
    keyhold_store::limits::REGION_READ_LEASE_MS < REGION_UNCONFIRMED_WAIT_MS
        && REGION_UNCONFIRMED_WAIT_MS < REGION_LEADER_WAIT_MS
);
/// The region lease: a node executes tenant requests only while its last contact
/// with a registry majority is younger than this. Longer than a registry
/// election and a contact probe's timeout (so healthy regions keep serving
/// while the registry elects a new leader: asserted below; only the slowest
/// elections, every timer at its maximum, leave the other regions a few
/// hundred milliseconds without a lease), short enough that a failover,
/// which waits the lost region's lease out, serves its tenants again within
/// the 10 s of contract section 11 ("Fast automatic failover"). It was 8 s
/// until issue 39; docs/benchmarks.md has the window it gives.
pub const REGION_LEASE_MS: u64 = 5_000;
/// How often a node renews its contact with the registry majority.
pub const REGISTRY_CONTACT_PROBE_MS: u64 = 500;
/// How long a tenant request waits for the lease to be renewed when it does not
/// hold (a node just started, or a probe came late) before it is refused.
pub const REGION_LEASE_RENEWAL_WAIT_MS: u64 = 2 * REGISTRY_CONTACT_PROBE_MS;
/// How long one contact probe may take.
pub const REGISTRY_CONTACT_TIMEOUT_MS: u64 = 1_000;
const _: () = assert!(4 * REGISTRY_CONTACT_PROBE_MS <= REGION_LEASE_MS);
const _: () = assert!(REGISTRY_CONTACT_TIMEOUT_MS < REGION_LEASE_MS);
// A registry election (openraft's leader lease, a follower's timeout, the
// vote) and one contact probe after it fit in the lease: a registry leader
// change does not stop a healthy region.
const _: () = assert!(
    keyhold_registry::limits::ELECTION_MS_MAX + REGISTRY_CONTACT_TIMEOUT_MS < REGION_LEASE_MS
);
/// How often the failover driver looks for running failovers to its region,
/// and the automatic failover's watcher probes the regions it watches.
pub const FAILOVER_CHECK_MS: u64 = 250;
/// Waited beyond the failed region's lease before a failover reads a copy:
/// covers clocks that run at slightly different rates (parts per million of
/// the lease) and the moment between a node's last lease check on an answer
/// and the answer leaving it. When the bound comes from the first time the
/// driver saw the failover instead of from the registry leader
/// (`lease::lease_end`), it also covers the moment between the leader's
/// commit of the fence and its apply.
pub const FAILOVER_LEASE_MARGIN_MS: u64 = 500;
/// How long the registry leader may take to say how much longer a fenced
/// region's lease can hold (`CallKind::LeaseEnd`).
pub const LEASE_END_CALL_TIMEOUT_MS: u64 = REGISTRY_CONTACT_TIMEOUT_MS;
/// The failover's progress (`GET /admin/v1/operations/{id}`) while it waits the
/// lost region's lease out: that wait is this share of the whole; the copy's
/// import and the commit are the rest.
pub const FAILOVER_WAIT_PROGRESS_SHARE: f64 = 0.8;
/// The driver reports the wait's progress to the registry each time it moved
/// by this much (a registry write each; a failover makes about eight).
pub const FAILOVER_PROGRESS_STEP: f64 = 0.1;
const _: () =
    assert!(FAILOVER_PROGRESS_STEP > 0.0 && FAILOVER_PROGRESS_STEP < FAILOVER_WAIT_PROGRESS_SHARE);
const _: () = assert!(FAILOVER_WAIT_PROGRESS_SHARE < 1.0);
/// Added to a failover's bound on the span of what it lost
/// (`failover::lost_bound`): the delivery of the copy's newest entry after the
/// region appended it, and the copies' answers' transit.
pub const LOST_BOUND_MARGIN_MS: u64 = 250;
/// How long one node may take to say where its copy stands.
pub const FAILOVER_COPY_TIMEOUT_MS: u64 = 2_000;
/// How long the promotion and import of a copy may take (it is proportional
/// to the failed region's data).
pub const FAILOVER_IMPORT_TIMEOUT_MS: u64 = 600_000;
/// Attempts of a failover before the driver fails it (each a whole run, one
/// `FAILOVER_CHECK_MS` apart at least).
pub const FAILOVER_DRIVE_ATTEMPTS_MAX: u32 = 20;
/// The shortest `auto_failover_after` (contract section 11, "Fast automatic
/// failover"): a few health probes, so that one slow probe never starts a
/// failover. A registry leader change does not make a region unready (its
/// lease outlasts an election). A failover begun for a region that was only
/// slow to answer is safe, not free: the driver waits the region's lease out
/// before it promotes a copy, and the region loses what its standby lacked.
pub const AUTO_FAILOVER_AFTER_MS_MIN: u64 = 2_000;
/// How long a region the automatic failover's watcher has not seen ready
/// since it started may stay unready before it is failed over (with a shorter
/// `auto_failover_after`; see `failover::unready_limit`): a whole cluster
/// restarted at once has every region ready within this.
pub const AUTO_FAILOVER_UNSEEN_MS: u64 = 30_000;
const _: () = assert!(AUTO_FAILOVER_UNSEEN_MS >= 10 * AUTO_FAILOVER_AFTER_MS_MIN);
const _: () = assert!(AUTO_FAILOVER_AFTER_MS_MIN >= 2 * FAILOVER_HEALTH_PROBE_MS);
const _: () = assert!(AUTO_FAILOVER_AFTER_MS_MIN >= 4 * FAILOVER_CHECK_MS);
/// How long the admin route waits for a node of the region to fail over to say
/// it is ready (a ready region is healthy: refused unless forced).
pub const FAILOVER_HEALTH_PROBE_MS: u64 = 1_000;
const _: () = assert!(FAILOVER_HEALTH_PROBE_MS < REGION_LEASE_MS);
/// How often a region's leader adds its standby region's nodes as learners
/// (new ones, or after a change of leader) and samples the standby's lag.
pub const STANDBY_CHECK_MS: u64 = 1_000;
/// The region's leader records how far its standby holds the log (which bounds
/// every replica's log purge) each time the standby got this many entries
/// further.
pub const STANDBY_MATCHED_RECORD_ENTRIES: u64 = 64;
/// How long the answer to a `"survival": "region"` tenant's command waits, on
/// its home region's leader, for a majority of the standby region's nodes to
/// hold the command's log entry; past it the answer is 503 `standby-unreachable`
/// (the command stays executed; a retry replays it once the standby has it).
/// Far above an inter-region round trip (50 ms in the benchmark), so a healthy
/// standby that is briefly slow does not turn writes into errors; short enough
/// that a lost standby is reported within one client timeout.
pub const SURVIVAL_WAIT_MS: u64 = 3_000;
// The home answers a forwarded request before the forwarding node gives up on it.
const _: () = assert!(SURVIVAL_WAIT_MS + REGION_LEASE_RENEWAL_WAIT_MS < FORWARD_TIMEOUT_MS);
/// `max_standby_lag` (config), default and bounds. The default is the
/// contract's 1 s. Below the minimum a healthy standby a round trip away
/// (`INTER_REGION_RTT_MS_MAX`) could not keep up; above the maximum the bound
/// on loss would mean little.
pub const MAX_STANDBY_LAG_MS_DEFAULT: u64 = 1_000;
pub const MAX_STANDBY_LAG_MS_MIN: u64 = 2 * keyhold_registry::limits::INTER_REGION_RTT_MS_MAX;
pub const MAX_STANDBY_LAG_MS_MAX: u64 = 60_000;
const _: () = assert!(MAX_STANDBY_LAG_MS_MIN <= MAX_STANDBY_LAG_MS_DEFAULT);
// What a cluster file of an earlier release means by its absence.
const _: () = assert!(MAX_STANDBY_LAG_MS_DEFAULT == 1_000);
// A healthy standby answers a heartbeat at least every heartbeat interval plus
// one inter-region round trip: within the smallest lag, or a region would
// refuse writes with its standby streaming (`RegionGroup::standby_confirms_within`).
const _: () = assert!(
    keyhold_store::limits::REGION_HEARTBEAT_INTERVAL_MS
        + keyhold_registry::limits::INTER_REGION_RTT_MS_MAX
        < MAX_STANDBY_LAG_MS_MIN
);
const _: () = assert!(MAX_STANDBY_LAG_MS_DEFAULT <= MAX_STANDBY_LAG_MS_MAX);
/// How long a zone tenant's answer waits for the standby to confirm what is
/// older than `max_standby_lag` before it is 503 `standby-unreachable` (the
/// command stays executed; a retry replays it once allowed).
pub const STANDBY_LAG_WAIT_MS: u64 = 2_000;
const _: () = assert!(STANDBY_LAG_WAIT_MS + REGION_LEASE_RENEWAL_WAIT_MS < FORWARD_TIMEOUT_MS);
/// The region's leader asks the registry to record its standby lost once the
/// standby has confirmed nothing older than `max_standby_lag` for this long:
/// with the default lag, a lost standby stops zone writes for about the lag
/// plus this, within the contract's 10 s.
pub const STANDBY_LOST_AFTER_MS: u64 = 3_000;
/// How often the region's leader checks its standby's confirmations (for
/// recording it lost, or streaming again).
pub const STANDBY_WATCH_MS: u64 = 250;
const _: () = assert!(STANDBY_WATCH_MS * 4 <= STANDBY_LOST_AFTER_MS);
const _: () = assert!(
    MAX_STANDBY_LAG_MS_DEFAULT + STANDBY_LOST_AFTER_MS + STANDBY_WATCH_MS + STANDBY_LAG_WAIT_MS
        < 10_000
);
/// How long the cluster view waits for a region's leader to report its
/// standby's lag; past it the lag is shown as unknown (`null`).
pub const STANDBY_LAG_CALL_TIMEOUT_MS: u64 = 1_000;
/// How long a membership call waits for a group's leader to be known.
pub const MEMBERSHIP_CALL_WAIT_MS: u64 = 5_000;
/// How long adding a node waits for it to catch up before answering 202 (it
/// keeps catching up; the call is repeated to make it a voter).
pub const MEMBERSHIP_CATCH_UP_WAIT_MS: u64 = 5_000;
/// One membership call to a group's leader, as its caller waits for it: the
/// leader may wait for the added node to catch up, and a follower that
/// received it for its leader to be known.
pub const MEMBERSHIP_CALL_TIMEOUT_MS: u64 = MEMBERSHIP_CATCH_UP_WAIT_MS + MEMBERSHIP_CALL_WAIT_MS;
const _: () = assert!(MEMBERSHIP_CATCH_UP_WAIT_MS < MEMBERSHIP_CALL_TIMEOUT_MS);
// An add waits for both groups, the registry's and the region's.
const _: () =
    assert!(2 * (MEMBERSHIP_CALL_WAIT_MS + MEMBERSHIP_CATCH_UP_WAIT_MS) < REQUEST_TIMEOUT_MS);
/// Between two looks for the region's leader while it is unknown or unreachable.
pub const REGION_LEADER_POLL_MS: u64 = 25;
const _: () = assert!(REGION_LEADER_WAIT_MS + FORWARD_TIMEOUT_MS < REQUEST_TIMEOUT_MS);
// A store write gives up before the request that waits for it is cut off.
const _: () = assert!(keyhold_store::limits::REGION_WRITE_WAIT_MS < REQUEST_TIMEOUT_MS);
const _: () = assert!(REGION_LEADER_POLL_MS < REGION_LEADER_WAIT_MS);
/// Bytes of keys and payloads per page when a tenant's data is copied to its
/// new home (a page holds at least one entry, however large).
pub const MOVE_PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// The largest store command this node builds: one request body (at most
/// `MOVE_PAGE_BYTES_MAX`, the bound of `body_bytes_max`) with its small fields
/// and headers. A claim's completion carries one; so does an import command
/// with a single entry larger than `MOVE_IMPORT_COMMAND_BYTES_MAX` (it goes
/// alone); every other command is smaller (a reconciliation report goes in
/// pages of `RECONCILIATION_PAGE_BYTES_MAX`).
pub const COMMAND_BYTES_BUILT_MAX: usize = MOVE_PAGE_BYTES_MAX + 1024 * 1024;
// Every command fits a region log entry, and so crosses to a member in one
// AppendEntries (keyhold-store asserts entry < RPC body): a larger one would be
// refused (`CommandTooLarge`, 413) instead of carried.
const _: () = assert!(COMMAND_BYTES_BUILT_MAX <= keyhold_store::limits::ENTRY_COMMANDS_BYTES_MAX);
const _: () =
    assert!(keyhold_store::limits::RECONCILIATION_PAGE_BYTES_MAX <= COMMAND_BYTES_BUILT_MAX);
/// Body of one import call: a full page plus one more entry, which holds at
/// most one request body (`body_bytes_max`, at most `MOVE_PAGE_BYTES_MAX`)
/// and its small fields.
pub const MOVE_IMPORT_BODY_BYTES_MAX: usize = 2 * MOVE_PAGE_BYTES_MAX + 1024 * 1024;
/// How long the old home waits for its relay to deliver the moving tenant's
/// events before it exports, and how often it looks.
pub const MOVE_DRAIN_WAIT_MS: u64 = 300_000;
pub const MOVE_DRAIN_POLL_MS: u64 = 20;
/// One call between nodes during a move (a page export or import).
pub const MOVE_CALL_TIMEOUT_MS: u64 = 60_000;
// A move route may wait for its region's leader, then for the registry entry
// that granted the caller's lease (`check_running`).
const _: () = assert!(REGION_LEADER_WAIT_MS + REGISTRY_READ_WAIT_MS < MOVE_CALL_TIMEOUT_MS);
/// The fence call of a move: the old home waits for its relay to deliver the
/// tenant's events (`MOVE_DRAIN_WAIT_MS`), then answers like any move call.
pub const MOVE_FENCE_CALL_TIMEOUT_MS: u64 = MOVE_DRAIN_WAIT_MS + MOVE_CALL_TIMEOUT_MS;
const _: () = assert!(MOVE_DRAIN_WAIT_MS < MOVE_FENCE_CALL_TIMEOUT_MS);
/// Pages the new home copies from the old home in one `pull` call, and how
/// long it keeps starting new pages: between calls the driver reports
/// progress (a registry write that also renews its lease).
pub const MOVE_PULL_PAGES_MAX: u64 = 16;
pub const MOVE_PULL_BUDGET_MS: u64 = 5_000;
/// Bytes of keys and payloads in one import command at the new home, in the
/// fenced final pass. A page from the old home is split into commands this
/// large, so that the apply thread, which also serves the new home's own
/// tenants, never holds their commands behind a whole page (a 4 MiB page kept
/// them waiting ~1 s; see docs/benchmarks.md, "Store: a move's import").
pub const MOVE_IMPORT_COMMAND_BYTES_MAX: usize = 128 * 1024;
/// The same in the online first pass, which is paced anyway: every one of the
/// new home's own orders that shares an entry with an import command waits
/// for all of it to apply, so smaller commands keep those waits short. The
/// final pass keeps the larger commands: there each second is a second of 503
/// `tenant-moving` for the moving tenant.
pub const MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX: usize = 32 * 1024;
/// Import commands of one page a new home has queued or applying at once.
/// One at a time, each waited for an entry of the new home's writer to apply
/// (5-10 ms under load), which held the online pass below its pace: a tenant
/// of 100,000 orders took 29-35 s to move with the pace raised or not
/// (docs/benchmarks.md, "The online pass: bound by its one command in
/// flight"). With two, the next command is queued while one applies.
pub const MOVE_IMPORT_COMMANDS_IN_FLIGHT: usize = 2;
/// The rate at which the first pass of a move (online: the tenant is still
/// served at its old home) imports at the new home, in bytes of keys and
/// payloads per second: the new home's own tenants keep most of its apply
/// thread. At ~220 bytes per entry (92 MB measured for 103,550 orders), a
/// tenant of 100,000 orders copies in about 21 s when the new home keeps up.
/// The final pass, under the fence, is not paced: every second of it is a
/// second of 503 `tenant-moving`.
pub const MOVE_COPY_BYTES_PER_SECOND: u64 = 4 * 1024 * 1024;
/// One `pull` call as the driver waits for it: the budget plus the one page
/// (an export call and its import) it may still be copying then.
pub const MOVE_PULL_CALL_TIMEOUT_MS: u64 = MOVE_PULL_BUDGET_MS + 2 * MOVE_CALL_TIMEOUT_MS;
const _: () = assert!(MOVE_PULL_BUDGET_MS + MOVE_CALL_TIMEOUT_MS < MOVE_PULL_CALL_TIMEOUT_MS);
/// Entries of a tenant's change index one `EndTracking` command deletes once
/// its move ended (in pages, so writers of other tenants wait little).
pub const MOVE_PRUNE_ENTRIES_MAX: u32 = 256;
/// Default lease of a move's driver in the registry (`move_driver_lease`). A
/// driver renews it every third of it; the registry leader's node looks for
/// expired leases as often, and a successor takes over only after expiry.
pub const MOVE_DRIVER_LEASE_MS_DEFAULT: u64 = 30_000;
pub const MOVE_DRIVER_LEASE_MS_MIN: u64 = 300;
pub const MOVE_DRIVER_RENEWALS_PER_LEASE: u64 = 3;
/// How often a node looks for moves it should drive: its own whose driver is
/// gone (after a restart), and, on the registry leader's node, expired leases.
/// A local read; it bounds how long a restarted node leaves its move stalled.
pub const MOVE_RESUME_POLL_MS: u64 = 250;
/// How long a move no driver ever leased may wait for the driver its accepting
/// node starts, before the registry leader's node starts one too. The lease
/// decides between them (the registry grants a free lease once), so a short
/// grace is safe; it only bounds the stall when the accepting node died between
/// the 202 and its first `AcquireDriver` (chaos seed 21).
pub const MOVE_UNLEASED_GRACE_MS: u64 = 2_000;

/// One call of a failover's import to the node holding the promoted copy (a
/// page of a tenant's entries or events, or the promotion itself, which
/// applies the copy's unapplied log).
pub const FAILOVER_CALL_TIMEOUT_MS: u64 = 60_000;
// The copy's node may first catch its registry replica up to the failover.
const _: () = assert!(REGISTRY_CATCH_UP_WAIT_MS < FAILOVER_CALL_TIMEOUT_MS);
// The import makes those calls, after its own catch-up.
const _: () =
    assert!(REGISTRY_CATCH_UP_WAIT_MS + FAILOVER_CALL_TIMEOUT_MS < FAILOVER_IMPORT_TIMEOUT_MS);

const _: () = assert!(BODY_BYTES_MAX_DEFAULT <= MOVE_PAGE_BYTES_MAX);
const _: () = assert!(2 * MOVE_PAGE_BYTES_MAX < MOVE_IMPORT_BODY_BYTES_MAX);
const _: () = assert!(MOVE_DRAIN_POLL_MS * 100 <= MOVE_DRAIN_WAIT_MS);
const _: () = assert!(MOVE_DRIVER_LEASE_MS_MIN <= MOVE_DRIVER_LEASE_MS_DEFAULT);
const _: () = assert!(MOVE_DRIVER_RENEWALS_PER_LEASE >= 2);
const _: () = assert!(MOVE_RESUME_POLL_MS * 10 <= MOVE_DRIVER_LEASE_MS_DEFAULT);
const _: () = assert!(MOVE_RESUME_POLL_MS < MOVE_UNLEASED_GRACE_MS);
const _: () = assert!(MOVE_UNLEASED_GRACE_MS * 10 <= MOVE_DRIVER_LEASE_MS_DEFAULT);
// A driver renews its lease between pull calls, and while one runs.
const _: () = assert!(MOVE_PULL_BUDGET_MS * 3 <= MOVE_DRIVER_LEASE_MS_DEFAULT);
const _: () = assert!(MOVE_PULL_PAGES_MAX >= 1);
const _: () = assert!(MOVE_IMPORT_COMMANDS_IN_FLIGHT >= 1);
// A command is a fraction of a page, and one second of pacing holds a few.
const _: () = assert!(MOVE_IMPORT_COMMAND_BYTES_MAX * 8 <= MOVE_PAGE_BYTES_MAX);
const _: () = assert!(MOVE_IMPORT_COMMAND_BYTES_MAX as u64 * 4 <= MOVE_COPY_BYTES_PER_SECOND);
const _: () = assert!(MOVE_ONLINE_IMPORT_COMMAND_BYTES_MAX <= MOVE_IMPORT_COMMAND_BYTES_MAX);
// A pull call copies at least one page within its budget at the paced rate.
const _: () =
    assert!(MOVE_PAGE_BYTES_MAX as u64 * 1000 <= MOVE_COPY_BYTES_PER_SECOND * MOVE_PULL_BUDGET_MS);

const _: () = assert!(INFLIGHT_WAIT_MS_DEFAULT < FORWARD_TIMEOUT_MS);

// Timing relations between the region store's limits and the registry's: this
// crate sees both. A region group's stream to a standby learner crosses the
// same inter-region links the registry's timing is sized for: an AppendEntries
// to it outlasts the slowest round trip plus a slow fsync on the learner, twice
// over, as the registry's own RPC timeout does.
const _: () = assert!(
    keyhold_store::limits::REGION_LEARNER_RPC_TIMEOUT_MS
        >= 2 * (keyhold_registry::limits::INTER_REGION_RTT_MS_MAX
            + keyhold_registry::limits::LOG_FSYNC_MS_MAX)
);
// Upkeep that waits to ride with a client's command waits longer than the
// round trip of the learner it waits for.
const _: () = assert!(
    keyhold_store::limits::UPKEEP_RIDE_WAIT_MS > keyhold_registry::limits::INTER_REGION_RTT_MS_MAX
);
