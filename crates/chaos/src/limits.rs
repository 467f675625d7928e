//! Limits of a chaos run, units last.

/// The window in which a seed's client steps and faults are scheduled.
pub const TRAFFIC_MS: u64 = 8_000;
/// Faults start no earlier than this, so the cluster has served some traffic.
pub const FAULT_START_MS: u64 = 500;
/// Concurrent clients of one run, each with its own sequence of steps.
pub const CLIENTS: u32 = 4;
/// Steps per client: drawn from this range.
pub const STEPS_PER_CLIENT_MIN: usize = 40;
pub const STEPS_PER_CLIENT_MAX: usize = 70;
/// Faults per seed: drawn from this range.
pub const FAULTS_MIN: usize = 1;
pub const FAULTS_MAX: usize = 4;
/// SIGKILLs per seed at most: each restart costs seconds.
pub const KILLS_MAX: usize = 2;
/// How long the cluster stays down after a SIGKILL, at most.
pub const DOWN_MS_MAX: u64 = 1_500;
/// Copies of one request sent at once by a concurrent-duplicates step.
pub const DUPLICATES_MAX: usize = 4;
/// Item lines per order at most.
pub const ITEMS_MAX: u8 = 3;
/// A client timeout step gives up after this long at most (an `unknown`).
pub const CLIENT_TIMEOUT_MS_MAX: u64 = 60;
/// Every other request gives up after this long (an `unknown`): longer than
/// the server's in-flight wait and forwarding timeout.
pub const REQUEST_TIMEOUT_MS: u64 = 15_000;
/// Leases of chaos claims: short, so a crashed holder's lease runs out in the run.
pub const LEASE_MS_MIN: u64 = 150;
pub const LEASE_MS_MAX: u64 = 400;
/// Attempts of a claim takeover while the old lease has not run out yet.
pub const TAKEOVER_ATTEMPTS_MAX: u32 = 20;
pub const TAKEOVER_RETRY_MS: u64 = 100;
/// After a refused connection, a client waits this long before its next step.
pub const RECONNECT_PAUSE_MS: u64 = 200;
/// How long `keyhold up` may take to write cluster.json.
pub const READY_TIMEOUT_MS: u64 = 60_000;
/// How long moves may take to end after the traffic. A move whose driver died
/// in a kill is resumed by the restarted node that holds its lease as soon as
/// the registry has a leader again, so a few seconds are plenty; a move that
/// waits for its lease to expire (30 s) fails the seed.
pub const MOVES_SETTLE_MS: u64 = 5_000;
pub const MOVES_POLL_MS: u64 = 250;
/// How long the checker waits for downstream work to settle.
pub const SETTLE_WAIT_MS: u64 = 30_000;
/// Ops one seed's history keeps: far above what a plan sends (4 clients of at
/// most 70 steps, a claim job or a duplicates step sending a few requests).
pub const HISTORY_OPS_MAX: usize = 100_000;
/// Ports `keyhold up` uses from its base port.
pub const PORTS_PER_CLUSTER: u16 = 50;

const _: () = assert!(FAULT_START_MS < TRAFFIC_MS);
const _: () = assert!(STEPS_PER_CLIENT_MIN < STEPS_PER_CLIENT_MAX);
const _: () = assert!(FAULTS_MIN <= FAULTS_MAX && KILLS_MAX <= FAULTS_MAX);
const _: () = assert!(LEASE_MS_MIN < LEASE_MS_MAX);
const _: () = assert!(TAKEOVER_ATTEMPTS_MAX as u64 * TAKEOVER_RETRY_MS > LEASE_MS_MAX);
const _: () = assert!(CLIENT_TIMEOUT_MS_MAX < REQUEST_TIMEOUT_MS);
// A claim job sends at most its takeover attempts plus four requests; no other
// step sends more than that.
const _: () = assert!(
    HISTORY_OPS_MAX
        >= CLIENTS as usize * STEPS_PER_CLIENT_MAX * (TAKEOVER_ATTEMPTS_MAX as usize + 4)
);
const _: () = assert!(DUPLICATES_MAX <= TAKEOVER_ATTEMPTS_MAX as usize + 4);
