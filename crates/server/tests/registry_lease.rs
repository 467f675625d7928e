//! The registry leader's contact answers (`quorum-age`) across a change of
//! leader, through three real nodes (regions a, b, c, one node each, all
//! registry voters) started in this process as `keyhold_server::run` does.
//!
//! The two registry followers are restarted with
//! `KEYHOLD_FAULT_REGISTRY_FAILOVER_APPLY_DELAY_MS`, so they hold a committed
//! `BeginFailover` in their logs but apply it seconds late. The leader commits
//! the failover of a (applying it at once) and stops; a follower is elected
//! and, until it has applied the fence, must not give a's prober a contact:
//! its own contact was recorded as a follower and its state does not show the
//! fence the failover driver already waits on (defect N5 of review-d44e5cf).
//!
//! The fault is read from this process's environment when a replica opens,
//! so this binary holds this one test.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyhold_netem::Parked;
use keyhold_registry::{Request, NODE_CREDENTIAL_HEADER};
use keyhold_server::config::Member;
use keyhold_server::{Config, Node};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "registry-lease-admin-token-0123456789";
const CREDENTIAL: &str = "registry-lease-node-credential-0123456789";
/// Start-up, elections and replication on a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(60);
/// How late the restarted followers apply the failover's begin: far longer
/// than an election (at most 3 s) on a loaded machine.
const APPLY_DELAY_MS: u64 = 12_000;
const FAULT: &str = "KEYHOLD_FAULT_REGISTRY_FAILOVER_APPLY_DELAY_MS";
const FAILOVER: &str = "op_failover_a_to_b";

struct TestNode {
    node: Arc<Node>,
    member: Member,
    api: String,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), keyhold_server::Error>>,
}

impl TestNode {
    /// Stops the node; its addresses stay held for its restart.
    async fn stop(self) -> (Member, Parked, Parked) {
        let _ = self.stop.send(());
        drop(self.node);
        self.task
            .await
            .expect("node task")
            .expect("node stopped cleanly");
        let api = Parked::at(&self.member.api_addr).await;
        let raft = Parked::at(&self.member.raft_addr).await;
        (self.member, api, raft)
    }
}

async fn start_node(
    dir: &Path,
    members: &[Member],
    member: Member,
    listener: tokio::net::TcpListener,
    raft: tokio::net::TcpListener,
) -> TestNode {
    let mut config = Config::new(
        &member.region,
        dir.join(format!("node-{}", member.id)),
        ADMIN_TOKEN.into(),
    );
    config.regions = vec!["a".into(), "b".into(), "c".into()];
    config.standbys = [("a".to_string(), "b".to_string())].into();
    config.node_id = member.id;
    config.raft_listen = member.raft_addr.clone();
    config.members = members.to_vec();
    config.node_credential_file = Some(dir.join("node-credential"));
    let api_addr = listener.local_addr().unwrap().to_string();
    let raft_addr = raft.local_addr().unwrap().to_string();
    let node = Arc::new(
        Node::open(config, api_addr.clone(), raft_addr)
            .await
            .unwrap(),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(keyhold_server::serve(
        node.clone(),
        listener,
        raft,
        async move {
            let _ = stopped.await;
        },
    ));
    TestNode {
        node,
        member,
        api: format!("http://{api_addr}"),
        stop,
        task,
    }
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn ready(api: &str) -> bool {
    client()
        .get(format!("{api}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// The status of `quorum-age` asked of `api` by a prober of region a.
async fn quorum_age_for_a(api: &str) -> Option<u16> {
    let answer = client()
        .get(format!("{api}/internal/v1/registry/quorum-age?region=a"))
        .header(NODE_CREDENTIAL_HEADER, CREDENTIAL)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    Some(answer.status().as_u16())
}

fn unix_now_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(now.unwrap().as_millis()).unwrap()
}

fn fenced_a(node: &Node) -> bool {
    node.registry()
        .read(|state| state.failover_running_from("a").is_some())
}

/// Starts a, b and c; waits until every node is ready and the registry has
/// a leader every node follows.
async fn start_cluster(dir: &Path) -> (Vec<Member>, Vec<TestNode>) {
    std::fs::write(dir.join("node-credential"), CREDENTIAL).unwrap();
    let mut listeners = Vec::new();
    let mut members = Vec::new();
    for (id, region) in (1u64..).zip(["a", "b", "c"]) {
        let (api, raft) = (Parked::any(), Parked::any());
        members.push(Member {
            id,
            region: region.to_string(),
            api_addr: api.addr().to_string(),
            raft_addr: raft.addr().to_string(),
        });
        listeners.push((api.listen(), raft.listen()));
    }
    let mut nodes = Vec::new();
    for (member, (api, raft)) in members.clone().into_iter().zip(listeners) {
        nodes.push(start_node(dir, &members, member, api, raft).await);
    }
    (members, nodes)
}

async fn settled(nodes: &[TestNode]) -> Option<u64> {
    for node in nodes {
        if !ready(&node.api).await {
            return None;
        }
    }
    let leader = nodes[0].node.registry().leader()?;
    let known = nodes.iter().all(|n| {
        n.node.registry().leader() == Some(leader) && n.node.registry().regions().len() == 3
    });
    known.then_some(leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_registry_leader_gives_no_contact_to_a_region_fenced_before_its_election() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes) = start_cluster(dir.path()).await;
    wait_until("a settled cluster", || async {
        settled(&nodes).await.is_some()
    })
    .await;
    let leader_id = settled(&nodes).await.expect("settled");
    let leader_at = nodes.iter().position(|n| n.member.id == leader_id).unwrap();
    let leader = nodes.remove(leader_at);

    // The followers come back applying a failover's begin late; the leader
    // opened before the fault was set and applies it at once.
    std::env::set_var(FAULT, APPLY_DELAY_MS.to_string());
    let mut followers = Vec::new();
    for follower in nodes {
        let (member, api, raft) = follower.stop().await;
        let restarted = start_node(dir.path(), &members, member, api.listen(), raft.listen()).await;
        let api = restarted.api.clone();
        wait_until("a restarted follower ready", || ready(&api)).await;
        followers.push(restarted);
    }
    std::env::remove_var(FAULT);
    let applied = leader.node.registry().applied_index();
    for follower in &followers {
        let registry = follower.node.registry().clone();
        wait_until("a caught-up follower", || async {
            registry.applied_index() >= applied && registry.leader() == Some(leader_id)
        })
        .await;
    }

    let written = leader
        .node
        .registry()
        .write(Request::BeginFailover {
            operation_id: FAILOVER.into(),
            region: "a".into(),
            to: "b".into(),
            now_ms: unix_now_ms(),
        })
        .await
        .expect("failover begun");
    assert!(fenced_a(&leader.node), "the leader applied its write");
    let _ = leader.stop().await;

    // From the new leader's election until it shows the fence, a's prober
    // gets no contact; then it is told that a is fenced.
    let deadline = Instant::now() + WAIT;
    let mut asked_before_the_fence = 0;
    loop {
        assert!(Instant::now() < deadline, "no fenced answer in time");
        let new_leader = followers
            .iter()
            .find(|f| f.node.registry().leader() == Some(f.member.id));
        let Some(new_leader) = new_leader else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let fenced_before = fenced_a(&new_leader.node);
        let status = quorum_age_for_a(&new_leader.api).await;
        assert_ne!(
            status,
            Some(200),
            "the new leader (node {}, fence applied: {fenced_before}, \
             applied index {} of {}) renewed fenced region a",
            new_leader.member.id,
            new_leader.node.registry().applied_index(),
            written.log_index,
        );
        if !fenced_before {
            asked_before_the_fence += 1;
        }
        if status == Some(409) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        asked_before_the_fence > 0,
        "the new leader was never asked before it applied the fence"
    );
    for follower in followers {
        let _ = follower.stop().await;
    }
}
