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
/// Faults of the kinds issue 37 added (node isolation, standby loss,
/// failovers) per seed: one, drawn from a stream of its own.
pub const NEW_FAULTS_PER_SEED: usize = 1;
/// SIGKILLs per seed at most (of one node or of the whole cluster): each
/// restart costs seconds.
pub const KILLS_MAX: usize = 2;
/// How long a region stays isolated: drawn from this range.
pub const ISOLATE_MS_MIN: u64 = 200;
pub const ISOLATE_MS_MAX: u64 = 3_000;
/// How long one node stays isolated (cut from every other node, its region's
/// included): drawn from this range; past 5 s the rest of a 3-node region
/// must answer writes again.
pub const NODE_ISOLATE_MS_MIN: u64 = 500;
pub const NODE_ISOLATE_MS_MAX: u64 = 6_000;
/// How long a region's standby stays lost (its region isolated or killed):
/// past `max_standby_lag` (1 s) + 3 s it is recorded lost, and the region's
/// zone writes must resume within 10 s.
pub const STANDBY_LOSS_MS_MIN: u64 = 5_000;
pub const STANDBY_LOSS_MS_MAX: u64 = 12_000;
/// A failover cuts its region off no earlier and no later than this (ms after
/// the traffic starts), so orders are acknowledged before and after it.
pub const FAILOVER_AT_MS_MIN: u64 = 1_000;
pub const FAILOVER_AT_MS_MAX: u64 = 6_000;
/// A manual failover is requested this long after the cut, at most.
pub const FAILOVER_REQUEST_DELAY_MS_MAX: u64 = 2_000;
/// Attempts of the failover request while it answers 409 (the region still
/// looks healthy) or 5xx, and the pause between them.
pub const FAILOVER_REQUEST_ATTEMPTS_MAX: u32 = 40;
pub const FAILOVER_REQUEST_RETRY_MS: u64 = 500;
/// `--auto-failover-after` of the seeds that let the cluster fail a region
/// over: the smallest value the node accepts (`AUTO_FAILOVER_AFTER_MS_MIN`;
/// 15 s until issue 39).
/// Checked against the node's limits in `crates/cli/src/limits.rs`.
pub const AUTO_FAILOVER_AFTER_MS: u64 = 2_000;
/// How long a failover may take from its request (or, automatic, from the
/// cut plus `AUTO_FAILOVER_AFTER_MS`) to `done`: the region's lease (5 s)
/// plus the margin, the import, and room for a loaded machine and a whole
/// cluster's restart meanwhile (`AUTO_FAILOVER_UNSEEN_MS`).
pub const FAILOVER_WAIT_MS: u64 = 60_000;
/// How long the lost region's reconciliation may take to report `done` once
/// the region is back.
pub const RECONCILE_WAIT_MS: u64 = 60_000;
/// Polling of a failover operation and of a reconciliation.
pub const FAILOVER_POLL_MS: u64 = 250;
/// Regions' nodes in the seeds with replicated regions (`--nodes-per-region`).
pub const NODES_PER_REGION_REPLICATED: usize = 3;
/// One seed in this many runs 3-node regions.
pub const REPLICATED_SEED_ONE_IN: u32 = 4;
/// Out of 100 client steps, how many are followed by a read of an order the
/// client saw acknowledged (by id or by client_order_id, through a random
/// region).
pub const READ_AFTER_STEP_PERCENT: u32 = 50;
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
/// How long one control API call (kill, start, isolate, heal) may take: a
/// start waits for the node to listen (`up` allows it 20 s).
pub const CONTROL_TIMEOUT_MS: u64 = 30_000;
/// How long moves may take to end after the traffic. A move whose driver died
/// in a kill is resumed by the restarted node that holds its lease as soon as
/// the registry has a leader again, so a few seconds are plenty on an idle
/// machine; 15 s leaves room for a loaded CI machine (seed 1 took 5.2 s with a
/// load average of 19) while a move that waits for its lease to expire (30 s)
/// still fails the seed.
pub const MOVES_SETTLE_MS: u64 = 15_000;
pub const MOVES_POLL_MS: u64 = 250;
/// How long the checker waits for downstream work to settle.
pub const SETTLE_WAIT_MS: u64 = 30_000;
/// Ops one seed's history keeps: far above what a plan sends (4 clients of at
/// most 70 steps, a claim job or a duplicates step sending a few requests).
pub const HISTORY_OPS_MAX: usize = 100_000;
/// Read-backs per step at most (one planned read after a step).
pub const READS_PER_STEP_MAX: usize = 1;
/// Ports `keyhold up` uses from its base port.
pub const PORTS_PER_CLUSTER: u16 = 50;
/// Base ports are drawn from `BASE_PORT_MIN..BASE_PORT_END`, below Linux's
/// default ephemeral range (32768-60999) so that no outgoing connection holds
/// a cluster port when the cluster restarts.
pub const BASE_PORT_MIN: u16 = 20_000;
pub const BASE_PORT_END: u16 = 32_768;
const _: () = assert!(BASE_PORT_MIN as u32 + PORTS_PER_CLUSTER as u32 <= BASE_PORT_END as u32);

const _: () = assert!(FAULT_START_MS < TRAFFIC_MS);
const _: () = assert!(NODE_ISOLATE_MS_MIN < NODE_ISOLATE_MS_MAX);
// A standby loss outlasts max_standby_lag's default (1 s) plus the 3 s after
// which the registry records the standby lost.
const _: () =
    assert!(STANDBY_LOSS_MS_MIN > 1_000 + 3_000 && STANDBY_LOSS_MS_MIN < STANDBY_LOSS_MS_MAX);
const _: () = assert!(
    FAULT_START_MS <= FAILOVER_AT_MS_MIN
        && FAILOVER_AT_MS_MIN < FAILOVER_AT_MS_MAX
        && FAILOVER_AT_MS_MAX < TRAFFIC_MS
);
// The request is retried for longer than the registry takes to see the
// region's nodes not ready.
const _: () = assert!(FAILOVER_REQUEST_ATTEMPTS_MAX as u64 * FAILOVER_REQUEST_RETRY_MS >= 10_000);
// The failover waits out the region's lease and margin before it imports, or
// for a region not seen ready since a restart, longer still (the node's own
// figures: asserted in `crates/cli/src/limits.rs`).
const _: () = assert!(FAILOVER_WAIT_MS > 30_000 + 5_000 + 500);
const _: () = assert!(READ_AFTER_STEP_PERCENT <= 100 && REPLICATED_SEED_ONE_IN >= 1);
const _: () = assert!(STEPS_PER_CLIENT_MIN < STEPS_PER_CLIENT_MAX);
const _: () = assert!(FAULTS_MIN <= FAULTS_MAX && KILLS_MAX <= FAULTS_MAX);
const _: () = assert!(LEASE_MS_MIN < LEASE_MS_MAX);
const _: () = assert!(ISOLATE_MS_MIN < ISOLATE_MS_MAX && ISOLATE_MS_MAX < TRAFFIC_MS);
const _: () = assert!(TAKEOVER_ATTEMPTS_MAX as u64 * TAKEOVER_RETRY_MS > LEASE_MS_MAX);
const _: () = assert!(CLIENT_TIMEOUT_MS_MAX < REQUEST_TIMEOUT_MS);
// A claim job sends at most its takeover attempts plus four requests; no other
// step sends more than that.
const _: () = assert!(
    HISTORY_OPS_MAX
        >= CLIENTS as usize
            * STEPS_PER_CLIENT_MAX
            * (TAKEOVER_ATTEMPTS_MAX as usize + 4 + READS_PER_STEP_MAX)
);
const _: () = assert!(DUPLICATES_MAX <= TAKEOVER_ATTEMPTS_MAX as usize + 4);
