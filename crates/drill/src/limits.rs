//! Named limits of a drill, units last; relations checked at compile time.

/// One request of the drill's client, and one admin or control call.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// A failed order request is sent again (same key, same body) after this.
pub const RETRY_WAIT_MS: u64 = 250;
/// Requests of the drill's client in flight at once (retries included).
pub const INFLIGHT_MAX: usize = 256;
/// Highest accepted `--rate` (orders per second over all regions).
pub const RATE_MAX: f64 = 2_000.0;
/// Longest accepted `--duration` (steady traffic before the fault).
pub const DURATION_MS_MAX: u64 = 3_600_000;
/// How long the failover may take, from its request to `done`.
pub const FAILOVER_WAIT_MS: u64 = 180_000;
/// How long the failover request is retried while the faulty region still
/// looks healthy to the cluster (a 409 right after the fault).
pub const FAILOVER_REQUEST_WAIT_MS: u64 = 30_000;
/// Traffic keeps flowing this long after the failover is done, so that the
/// report shows the tenants served from their new home.
pub const AFTER_DONE_MS: u64 = 2_000;
/// How long the region may take to come back and publish its reconciliation.
pub const RECONCILIATION_WAIT_MS: u64 = 180_000;
/// How long unanswered requests keep being retried once new ones stopped.
pub const DRAIN_WAIT_MS: u64 = 30_000;
/// How long the payments consumer may take to charge every surviving order.
pub const CHARGES_SETTLE_WAIT_MS: u64 = 30_000;
/// Slack in judging when a lost order was acknowledged: the drill's client
/// times an answer when it arrives, a little after the node gave it.
pub const ACK_TIME_TOLERANCE_MS: u64 = 200;
/// How long a drill with `--auto` waits for the cluster to begin the
/// failover itself (its `--auto-failover-after`, at most a few seconds, plus
/// the wait for a registry leader).
pub const AUTO_FAILOVER_BEGIN_WAIT_MS: u64 = 60_000;
/// Polling period of every wait above.
pub const POLL_MS: u64 = 250;
/// Polling period of the failover's operation while it runs: the phases of
/// the window are measured at this resolution.
pub const FAILOVER_POLL_MS: u64 = 50;
/// The failover's `progress` once its driver waited the lost region's lease
/// out (the node's `FAILOVER_WAIT_PROGRESS_SHARE`; asserted equal in
/// `crates/cli/src/limits.rs`).
pub const LEASE_WAITED_PROGRESS: f64 = 0.8;
/// How often the registry's leader is read for the timeline (a leader
/// change shorter than this may go unseen).
pub const LEADER_POLL_MS: u64 = 250;

const _: () = assert!(RETRY_WAIT_MS < REQUEST_TIMEOUT_MS);
const _: () = assert!(POLL_MS < AFTER_DONE_MS);
const _: () = assert!(FAILOVER_POLL_MS < POLL_MS);
const _: () = assert!(AUTO_FAILOVER_BEGIN_WAIT_MS <= FAILOVER_WAIT_MS);
const _: () = assert!(REQUEST_TIMEOUT_MS < DRAIN_WAIT_MS);
const _: () = assert!(LEADER_POLL_MS < REQUEST_TIMEOUT_MS);
