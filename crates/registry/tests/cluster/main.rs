//! A real registry cluster on 127.0.0.1: three voters (one per region) and a learner,
//! each with its own sled directory and its own HTTP Raft listener on port 0, using the
//! default (inter-region) Raft timing. Covers initialization, writes forwarded from a
//! follower and a learner, replication to every replica, a tenant move with its epoch
//! bump, the loss of the leader, and its restart from disk; and the node credential:
//! forged Raft calls are refused with 401 and change nothing, while a cluster in the
//! middle of a credential rotation keeps replicating.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keyhold_registry::{
    raft_router, NodeCredentials, NodeId, NodeInfo, OperationState, Registry, RegistryConfig,
    Request, Response, TenantState, NODE_CREDENTIAL_HEADER,
};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use common::{add_region, eventually, tenant};
use keyhold_netem::{Parked, Proxy};

const ELECTION_WAIT: Duration = Duration::from_secs(10);
const APPLY_WAIT: Duration = Duration::from_secs(5);
/// The node credential of the tests' clusters (one secret, sent and accepted).
const CREDENTIAL: &str = "test-node-credential-0123456789abcdef";

/// One running replica and what the test must stop to kill it.
struct TestNode {
    registry: Registry,
    /// The address its Raft listener is bound to (a proxy may front it).
    listen_addr: String,
    stop_http: Option<oneshot::Sender<()>>,
    http: JoinHandle<()>,
    _dir: TempDir,
}

impl TestNode {
    /// Binds the Raft listener first (so the address is known), then starts the replica
    /// and serves its router.
    async fn start(id: NodeId, region: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_full(id, region, Parked::any(), dir, CREDENTIAL).await
    }

    /// A fresh replica that sends the first of `credentials` and accepts them all.
    async fn start_with(id: NodeId, region: &str, credentials: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_full(id, region, Parked::any(), dir, credentials).await
    }

    /// Starts a killed replica again on its address and data.
    async fn restart(id: NodeId, region: &str, killed: Killed) -> Self {
        Self::start_full(id, region, killed.raft, killed.dir, CREDENTIAL).await
    }

    async fn start_full(
        id: NodeId,
        region: &str,
        raft: Parked,
        dir: TempDir,
        credentials: &str,
    ) -> Self {
        let credentials = NodeCredentials::parse(credentials).expect("valid credentials");
        let listener = raft.listen();
        let raft_addr = listener.local_addr().expect("local addr").to_string();
        let info = NodeInfo::new(region, format!("127.0.0.1:{}", 8000 + id), raft_addr);
        Self::serve(
            RegistryConfig::new(id, info, dir.path(), credentials),
            listener,
            dir,
        )
        .await
    }

    /// Starts a replica whose Raft listener is reached only through a proxy that
    /// delays each direction by `one_way`: a member in a distant region.
    async fn start_distant(id: NodeId, region: &str, one_way: Duration) -> (Self, Proxy) {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind raft listener");
        let front = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let proxy =
            Proxy::start(front, listener.local_addr().expect("addr"), one_way).expect("proxy");
        let info = NodeInfo::new(
            region,
            format!("127.0.0.1:{}", 8000 + id),
            proxy.addr().to_string(),
        );
        let credentials = NodeCredentials::parse(CREDENTIAL).expect("valid credentials");
        let config = RegistryConfig::new(id, info, dir.path(), credentials);
        (Self::serve(config, listener, dir).await, proxy)
    }

    async fn serve(
        config: RegistryConfig,
        listener: tokio::net::TcpListener,
        dir: TempDir,
    ) -> Self {
        let registry = Registry::start(config).await.expect("start registry");
        let listen_addr = listener.local_addr().expect("local addr").to_string();
        let (stop_http, stopped) = oneshot::channel::<()>();
        let router = raft_router(registry.clone());
        let http = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                panic!("raft listener failed: {e}");
            }
        });
        TestNode {
            registry,
            listen_addr,
            stop_http: Some(stop_http),
            http,
            _dir: dir,
        }
    }

    /// Shuts the replica down and closes its listener, like a crashed process; returns
    /// its data directory for a restart.
    async fn kill(mut self) -> TempDir {
        self.registry.shutdown().await.expect("shutdown");
        if let Some(stop) = self.stop_http.take() {
            let _ = stop.send(());
        }
        // Keep-alive connections from the other members may hold graceful shutdown open.
        self.http.abort();
        let _ = self.http.await;
        self._dir
    }

    /// [`kill`](Self::kill), holding the replica's address for its restart.
    async fn kill_for_restart(self) -> Killed {
        let addr = self.listen_addr.clone();
        let dir = self.kill().await;
        Killed {
            dir,
            raft: Parked::at(&addr).await,
        }
    }
}

/// A killed replica's data and address.
struct Killed {
    dir: TempDir,
    raft: Parked,
}

/// The leader all `nodes` agree on, once they do, other than `not` (a dead leader the
/// survivors still name until their election timeout fires).
async fn agreed_leader(nodes: &[&TestNode], not: Option<NodeId>) -> Option<NodeId> {
    let mut leader = None;
    let agreed = eventually(ELECTION_WAIT, || {
        let seen: Vec<Option<NodeId>> = nodes.iter().map(|n| n.registry.leader()).collect();
        leader = seen[0];
        leader.is_some() && leader != not && seen.iter().all(|l| *l == leader)
    })
    .await;
    agreed.then_some(leader).flatten()
}

async fn write_ok(registry: &Registry, request: Request) -> (u64, Response) {
    let written = registry.write(request.clone()).await.expect("write");
    assert!(
        written.response.rejection().is_none(),
        "{request} rejected: {:?}",
        written.response
    );
    (written.log_index, written.response)
}

async fn all_applied(nodes: &[&TestNode], index: u64) {
    for node in nodes {
        node.registry
            .wait_applied(index, APPLY_WAIT)
            .await
            .unwrap_or_else(|e| panic!("node {}: {e}", node.registry.id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_replicates_forwards_moves_and_survives_leader_loss() {
    let started = Instant::now();
    let regions = ["eu", "us", "ap"];
    let mut nodes: BTreeMap<NodeId, TestNode> = BTreeMap::new();
    for (id, region) in (1..=3).zip(regions) {
        nodes.insert(id, TestNode::start(id, region).await);
    }
    let members: BTreeMap<NodeId, NodeInfo> = nodes
        .iter()
        .map(|(id, n)| (*id, n.registry.node().clone()))
        .collect();

    // Initialize on one node; repeating it (here or elsewhere) is harmless.
    nodes[&1]
        .registry
        .initialize(members.clone())
        .await
        .expect("initialize");
    nodes[&1]
        .registry
        .initialize(members.clone())
        .await
        .expect("initialize again");
    let all: Vec<&TestNode> = nodes.values().collect();
    let leader = agreed_leader(&all, None)
        .await
        .expect("a leader is elected");
    let elected = started.elapsed();
    let follower = *nodes.keys().find(|id| **id != leader).expect("a follower");

    // Regions, then a tenant created through a follower (forwarded to the leader).
    for region in regions {
        write_ok(&nodes[&follower].registry, add_region(region)).await;
    }
    let (index, response) = write_ok(
        &nodes[&follower].registry,
        Request::CreateTenant {
            record: tenant("t1", "eu"),
        },
    )
    .await;
    assert_eq!(
        response,
        Response::TenantCreated {
            record: tenant("t1", "eu")
        }
    );
    all_applied(&all, index).await;
    for node in &all {
        assert_eq!(node.registry.tenant("t1"), Some(tenant("t1", "eu")));
        assert_eq!(node.registry.regions().len(), 3);
        assert_eq!(node.registry.nodes(), members);
    }

    // A duplicate id with another record is refused, typed.
    let dup = nodes[&follower]
        .registry
        .write(Request::CreateTenant {
            record: tenant("t1", "us"),
        })
        .await
        .expect("write");
    assert!(dup.response.rejection().is_some(), "{:?}", dup.response);

    // A learner joins, catches up, and can write through forwarding too.
    let learner = TestNode::start(4, "eu").await;
    nodes[&leader]
        .registry
        .add_learner(4, learner.registry.node().clone())
        .await
        .expect("add learner");
    learner
        .registry
        .wait_applied(index, APPLY_WAIT)
        .await
        .expect("learner catches up");
    assert_eq!(learner.registry.tenant("t1"), Some(tenant("t1", "eu")));

    // Move t1 from eu to us: fenced with the same epoch, then active in us at epoch 2.
    let (_, begun) = write_ok(
        &learner.registry,
        Request::BeginMove {
            tenant_id: "t1".to_string(),
            to: "us".to_string(),
            operation_id: "op-1".to_string(),
            now_ms: 10,
        },
    )
    .await;
    let Response::MoveUpdated { record, operation } = begun else {
        panic!("unexpected {begun:?}");
    };
    assert_eq!(record.epoch, 1);
    assert!(matches!(record.state, TenantState::Moving { .. }));
    assert_eq!(operation.state, OperationState::Pending);
    let (index, completed) = write_ok(
        &nodes[&follower].registry,
        Request::CompleteMove {
            tenant_id: "t1".to_string(),
            operation_id: "op-1".to_string(),
            now_ms: 20,
        },
    )
    .await;
    let Response::MoveUpdated { record, operation } = completed else {
        panic!("unexpected {completed:?}");
    };
    assert_eq!((record.home_region.as_str(), record.epoch), ("us", 2));
    assert_eq!(operation.state, OperationState::Done);
    all_applied(&all, index).await;
    learner
        .registry
        .wait_applied(index, APPLY_WAIT)
        .await
        .expect("learner applies the move");
    for node in all.iter().chain([&&learner]) {
        let t1 = node.registry.tenant("t1").expect("t1");
        assert_eq!((t1.home_region.as_str(), t1.epoch), ("us", 2));
        assert!(t1.is_active());
        let op = node.registry.operation("op-1").expect("op-1");
        assert_eq!(op.state, OperationState::Done);
    }

    // Kill the leader: the two remaining voters elect a new one, and writes work again.
    let killed_at = Instant::now();
    let old_leader = nodes.remove(&leader).expect("leader node");
    let old_leader_info = old_leader.registry.node().clone();
    let old_leader_killed = old_leader.kill_for_restart().await;
    let survivors: Vec<&TestNode> = nodes.values().collect();
    let new_leader = agreed_leader(&survivors, Some(leader))
        .await
        .expect("a new leader is elected");
    let failover = killed_at.elapsed();
    assert_ne!(new_leader, leader);
    let survivor_follower = *nodes
        .keys()
        .find(|id| **id != new_leader)
        .expect("follower");

    let (index, response) = write_ok(
        &nodes[&survivor_follower].registry,
        Request::CreateTenant {
            record: tenant("t2", "ap"),
        },
    )
    .await;
    assert!(matches!(response, Response::TenantCreated { .. }));
    all_applied(&survivors, index).await;
    learner
        .registry
        .wait_applied(index, APPLY_WAIT)
        .await
        .expect("learner follows the new leader");
    for node in survivors.iter().chain([&&learner]) {
        assert_eq!(node.registry.tenant("t2"), Some(tenant("t2", "ap")));
    }
    println!(
        "first election {elected:?}, failover {failover:?}, total {:?}",
        started.elapsed()
    );
    assert!(failover < ELECTION_WAIT, "failover took {failover:?}");

    // The old leader restarts from its directory on its old address, rejoins as a
    // follower with its persisted state, and catches up with what it missed.
    let restarted = TestNode::restart(leader, &old_leader_info.region, old_leader_killed).await;
    restarted
        .registry
        .wait_applied(index, ELECTION_WAIT)
        .await
        .expect("restarted node catches up");
    assert_eq!(restarted.registry.tenant("t2"), Some(tenant("t2", "ap")));
    assert_eq!(restarted.registry.tenant("t1").map(|t| t.epoch), Some(2));
    nodes.insert(leader, restarted);

    learner.kill().await;
    for (_, node) in nodes {
        node.kill().await;
    }
}

/// Review defect 10: with openraft's heartbeat period doubling as its RPC
/// timeout, a 250 ms heartbeat meant every AppendEntries to a member more than
/// 250 ms of round trip away timed out: the leader was elected (votes have
/// their own timeout) but never heard an acknowledgement, so nothing committed.
/// Here every member is 200 ms away in each direction (a 400 ms round trip,
/// within `INTER_REGION_RTT_MS_MAX` plus fsync, twice over); writes must commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_commit_across_a_slow_inter_region_link() {
    let one_way = Duration::from_millis(200);
    let mut nodes = Vec::new();
    let mut proxies = Vec::new();
    for (id, region) in (1..=3).zip(["eu", "us", "ap"]) {
        let (node, proxy) = TestNode::start_distant(id, region, one_way).await;
        nodes.push(node);
        proxies.push(proxy);
    }
    let members: BTreeMap<NodeId, NodeInfo> = nodes
        .iter()
        .map(|n| (n.registry.id(), n.registry.node().clone()))
        .collect();
    nodes[0]
        .registry
        .initialize(members)
        .await
        .expect("initialize");
    let all: Vec<&TestNode> = nodes.iter().collect();
    let leader = agreed_leader(&all, None)
        .await
        .expect("a leader is elected across the slow link");
    let leader = all
        .iter()
        .find(|n| n.registry.id() == leader)
        .expect("leader node");
    let mut last = 0;
    for region in ["eu", "us", "ap"] {
        let (index, _) = write_ok(&leader.registry, add_region(region)).await;
        last = index;
    }
    all_applied(&all, last).await;
    for node in &all {
        assert_eq!(node.registry.regions().len(), 3);
    }
    drop(proxies);
}

/// POSTs `body` to a Raft route of `node` with the given credential header (if any).
async fn raw_post(
    node: &TestNode,
    rpc: &str,
    credential: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let url = format!(
        "http://{}/raft/registry/{rpc}",
        node.registry.node().raft_addr
    );
    let mut builder = reqwest::Client::new().post(url).body(body);
    if let Some(c) = credential {
        builder = builder.header(NODE_CREDENTIAL_HEADER, c);
    }
    let response = builder.send().await.expect("raft listener answers");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let text = response.text().await.unwrap_or_default();
    if status == 401 {
        assert_eq!(content_type.as_deref(), Some("application/problem+json"));
        assert!(text.contains("/problems/unauthenticated"), "{text}");
    }
    (status, text)
}

fn bincode_of<T: serde::Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encode")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_raft_calls_are_refused_and_rotation_keeps_replicating() {
    const OLD: &str = "old-node-credential-0123456789abcdef";
    const NEW: &str = "new-node-credential-0123456789abcdef";
    // Mid-rotation: node 1 still sends the old secret, nodes 2 and 3 already send the
    // new one; every node accepts both.
    let mut nodes: BTreeMap<NodeId, TestNode> = BTreeMap::new();
    let credentials = [
        format!("{OLD},{NEW}"),
        format!("{NEW},{OLD}"),
        format!("{NEW}\n{OLD}"),
    ];
    for ((id, region), creds) in (1..=3).zip(["eu", "us", "ap"]).zip(&credentials) {
        nodes.insert(id, TestNode::start_with(id, region, creds).await);
    }
    let members: BTreeMap<NodeId, NodeInfo> = nodes
        .iter()
        .map(|(id, n)| (*id, n.registry.node().clone()))
        .collect();
    nodes[&1]
        .registry
        .initialize(members)
        .await
        .expect("initialize");
    let all: Vec<&TestNode> = nodes.values().collect();
    let leader = agreed_leader(&all, None)
        .await
        .expect("a leader is elected");
    // Writes through every node replicate to every node.
    let mut index = 0;
    for (id, region) in (1..=3).zip(["eu", "us", "ap"]) {
        (index, _) = write_ok(&nodes[&id].registry, add_region(region)).await;
    }
    all_applied(&all, index).await;

    let term_before: Vec<u64> = all
        .iter()
        .map(|n| n.registry.metrics().current_term)
        .collect();
    let state_before: Vec<_> = all.iter().map(|n| n.registry.state()).collect();
    let forged_write = bincode_of(&Request::CreateTenant {
        record: tenant("forged", "eu"),
    });
    // A vote for a far-future term: accepted, it would depose the leader.
    let forged_vote = bincode_of(&openraft::raft::VoteRequest::<NodeId>::new(
        openraft::Vote::new(term_before[0] + 100, 99),
        None,
    ));
    let wrong = "not-the-node-credential-0123456789abcdef";
    for node in &all {
        for credential in [None, Some(wrong), Some("")] {
            let (status, _) = raw_post(node, "write", credential, forged_write.clone()).await;
            assert_eq!(status, 401);
            let (status, _) = raw_post(node, "vote", credential, forged_vote.clone()).await;
            assert_eq!(status, 401);
            for rpc in ["append", "snapshot"] {
                let (status, _) = raw_post(node, rpc, credential, b"junk".to_vec()).await;
                assert_eq!(status, 401, "{rpc}");
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let term_after: Vec<u64> = all
        .iter()
        .map(|n| n.registry.metrics().current_term)
        .collect();
    assert_eq!(term_after, term_before, "no forged vote took effect");
    let state_after: Vec<_> = all.iter().map(|n| n.registry.state()).collect();
    assert_eq!(state_after, state_before, "no forged write took effect");
    assert_eq!(all[0].registry.leader(), Some(leader));

    // The very same write with an accepted credential (old or new) is served: the
    // refusals above were the credential's doing, not the body's.
    let leader_node = &nodes[&leader];
    let (status, _) = raw_post(leader_node, "write", Some(OLD), forged_write).await;
    assert_eq!(status, 200);
    let (status, _) = raw_post(
        leader_node,
        "write",
        Some(NEW),
        bincode_of(&Request::CreateTenant {
            record: tenant("rotated", "us"),
        }),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        eventually(APPLY_WAIT, || all
            .iter()
            .all(|n| n.registry.tenant("rotated").is_some()))
        .await
    );
    for (_, node) in nodes {
        node.kill().await;
    }
}

/// A replica dropped without `shutdown` (a node's start-up failing half way, a test
/// ending) must release its Raft core and with it the sled databases, so the same data
/// dir can be opened again in the process. The heartbeat task used to hold a handle of
/// the Raft instance forever and keep both alive.
#[tokio::test]
async fn a_dropped_replica_releases_its_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = NodeCredentials::parse(CREDENTIAL).expect("valid credentials");
    let info = NodeInfo::new("eu", "127.0.0.1:8001", "127.0.0.1:9");
    let registry = Registry::start(RegistryConfig::new(1, info, dir.path(), credentials))
        .await
        .expect("start registry");
    drop(registry);
    let path = dir.path().to_path_buf();
    let reopened = tokio::task::spawn_blocking(move || keyhold_registry::store::open(&path))
        .await
        .expect("open task");
    assert!(
        reopened.is_ok(),
        "the data dir is still held by the dropped replica: {:?}",
        reopened.err()
    );
}
