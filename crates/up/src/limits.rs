//! Every port, count, wait and poll of `keyhold up`, named with its unit, and
//! the relations between them checked at compile time.

/// Ports `keyhold up` may use: `base_port .. base_port + PORTS_PER_CLUSTER`
/// (contract section 9).
pub const PORTS_PER_CLUSTER: u16 = 50;
/// Regions one local cluster may have.
pub const REGIONS_MAX: usize = 8;
/// Nodes one region may have (`--nodes-per-region`): 3 is the tested case
/// (contract section 10, "Replicas in a region"); more would only make the
/// local cluster heavier without showing anything new.
pub const NODES_PER_REGION_MAX: usize = 3;
/// Nodes one local cluster may have in all (regions times nodes per region):
/// node `k` (0-based) listens for the API on `base_port + k`, for Raft on
/// `base_port + RAFT_PORT_OFFSET + k`, and has its two proxies at
/// `API_PROXY_PORT_OFFSET + k` and `RAFT_PROXY_PORT_OFFSET + k`.
pub const NODES_MAX: usize = 10;
/// Each node's Raft listener: base port + this + the node's index.
pub const RAFT_PORT_OFFSET: u16 = 10;
/// The proxies in front of each node's API and Raft listeners, through which
/// every other node reaches it (delay, isolation).
pub const API_PROXY_PORT_OFFSET: u16 = 20;
pub const RAFT_PROXY_PORT_OFFSET: u16 = 30;
/// The fake payment provider's port, relative to the base port.
pub const PSP_PORT_OFFSET: u16 = 40;
/// The control API's port (kill, start, isolate, heal), relative to the base port.
pub const CONTROL_PORT_OFFSET: u16 = 41;

const _: () = assert!(NODES_MAX <= RAFT_PORT_OFFSET as usize);
const _: () = assert!(REGIONS_MAX <= NODES_MAX);
/// The tested layout, three regions of three nodes, fits.
const _: () = assert!(3 * NODES_PER_REGION_MAX <= NODES_MAX);
const _: () = assert!(RAFT_PORT_OFFSET as usize + NODES_MAX <= API_PROXY_PORT_OFFSET as usize);
const _: () =
    assert!(API_PROXY_PORT_OFFSET as usize + NODES_MAX <= RAFT_PROXY_PORT_OFFSET as usize);
const _: () = assert!(RAFT_PROXY_PORT_OFFSET as usize + NODES_MAX <= PSP_PORT_OFFSET as usize);
const _: () = assert!(PSP_PORT_OFFSET < CONTROL_PORT_OFFSET);
const _: () = assert!(CONTROL_PORT_OFFSET < PORTS_PER_CLUSTER);
/// Each node connects out from its own loopback address `127.0.2.(index + 1)`,
/// so the last octet must fit.
const _: () = assert!(NODES_MAX < 255);

/// From the start of `up` until every node is ready and every demo tenant known.
pub const CLUSTER_READY_WAIT_MS: u64 = 60_000;
/// From spawning a node until it answers `/healthz` (the control API's `start`).
pub const NODE_START_WAIT_MS: u64 = 20_000;
/// How long a node may take to exit after SIGTERM before it gets SIGKILL.
pub const NODE_STOP_WAIT_MS: u64 = 15_000;
/// How long `up` waits for a node's ports to be free before spawning it (a
/// node of an `up` that was just killed may still be exiting).
pub const NODE_PORTS_FREE_WAIT_MS: u64 = 10_000;
/// Interval of the readiness and port polls.
pub const READY_POLL_MS: u64 = 50;
/// Interval at which the supervisor looks for nodes that exited by themselves.
pub const EXIT_POLL_MS: u64 = 200;
/// Timeout of one HTTP probe or admin call of `up` to a node.
pub const PROBE_TIMEOUT_MS: u64 = 2_000;
/// After an isolate or heal, how long the control API waits before answering,
/// so that the proxies' connection tasks have closed what the cut covers.
pub const REROUTE_SETTLE_MS: u64 = 50;
/// Bytes of a node's log quoted in an error when it exits during start.
pub const LOG_TAIL_BYTES_MAX: usize = 2_000;

const _: () = assert!(READY_POLL_MS < NODE_START_WAIT_MS);
const _: () = assert!(NODE_START_WAIT_MS <= CLUSTER_READY_WAIT_MS);
const _: () = assert!(PROBE_TIMEOUT_MS < NODE_START_WAIT_MS);
