//! Three nodes of one region, started in this process through `keyhold_server::run_listening`
//! with one another as members: the region's store is one Raft group of three
//! voters. Any node takes a tenant's request; followers send it on to the leader
//! (one hop), so every node gives the same answers. A client cannot set the hop
//! mark. When the leader stops, the other two elect a new one: every order
//! acknowledged before replays byte for byte through every remaining node, and
//! new orders are taken again within a few seconds. The stopped node is then
//! replaced on an empty data dir: removed from both groups, started with
//! `start = "join"`, added back; it catches up by a snapshot (the leader purged
//! its log behind one), votes, and serves every order.
//!
//! And three regions of one node each, region a with b as its standby: a purges
//! its log behind its snapshots only as far as b's copy holds it; while b is
//! down a keeps everything b lacks, and purges again once b caught up.
//!
//! Region survival on the same shape: a `"survival": "region"` tenant of a is
//! answered once b's copy holds its command (b's log, read after b stopped,
//! has the entry); with b down its order answers 503 after `SURVIVAL_WAIT_MS`
//! while a zone tenant of a answers 201 at once; once b is back the retry
//! replays the order. The admin API refuses a region tenant whose home has no
//! standby (409) and any other survival (400, pointer `/survival`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use keyhold_netem::Parked;
use keyhold_server::config::{Member, Start};
use keyhold_server::Config;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "replicated-region-admin-token-0123456789";
const CREDENTIAL: &str = "replicated-region-node-credential-0123456789";
/// Start-up, elections and replication on a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(30);
/// How soon the region must take orders again after losing its leader.
const RECOVERY_MAX: Duration = Duration::from_secs(5);

/// Snapshot after this many region log entries (and keep as many): small, so
/// that the leader purges its log during the test.
const SNAPSHOT_ENTRIES: u64 = 5;
/// How often a region's leader looks at its standby (`limits::STANDBY_CHECK_MS`).
const STANDBY_CHECK_MS: u64 = keyhold_server::limits::STANDBY_CHECK_MS;

struct TestNode {
    id: u64,
    api: String,
    member: Member,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), keyhold_server::Error>>,
}

/// A stopped node, to start again on its data dir and addresses.
struct Stopped {
    id: u64,
    member: Member,
    dir: PathBuf,
    api: Parked,
    raft: Parked,
}

/// Starts `stopped` again where it was, beside the `running` nodes, with `standbys`.
async fn restart(
    root: &std::path::Path,
    stopped: Stopped,
    running: &[TestNode],
    standbys: &[(&str, &str)],
) -> TestNode {
    let mut members: Vec<Member> = running.iter().map(|n| n.member.clone()).collect();
    members.push(stopped.member);
    let shape = Shape {
        members,
        standbys: standby_map(standbys),
    };
    start_node(
        root,
        stopped.id,
        stopped.dir,
        (stopped.api, stopped.raft),
        &shape,
        Start::Create,
    )
}

impl TestNode {
    async fn stop_for_restart(self) -> Stopped {
        let (id, member, dir) = (self.id, self.member.clone(), self.dir.clone());
        self.stop().await;
        Stopped {
            id,
            dir,
            api: Parked::at(&member.api_addr).await,
            raft: Parked::at(&member.raft_addr).await,
            member,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        self.task
            .await
            .expect("node task")
            .expect("node stopped cleanly");
    }
}

async fn start_region(dir: &std::path::Path) -> Vec<TestNode> {
    start_cluster(dir, &["a", "a", "a"], &[]).await
}

/// One node per entry of `regions` (its region), ids from 1, with `standbys`.
async fn start_cluster(
    dir: &std::path::Path,
    regions: &[&str],
    standbys: &[(&str, &str)],
) -> Vec<TestNode> {
    let credential_file: PathBuf = dir.join("node-credential");
    std::fs::write(&credential_file, CREDENTIAL).unwrap();
    let mut listeners = Vec::new();
    let mut members = Vec::new();
    for (id, region) in (1u64..).zip(regions) {
        let (api, raft) = (Parked::any(), Parked::any());
        members.push(Member {
            id,
            region: region.to_string(),
            api_addr: api.addr().to_string(),
            raft_addr: raft.addr().to_string(),
        });
        listeners.push((id, (api, raft)));
    }
    let shape = Shape {
        members,
        standbys: standby_map(standbys),
    };
    let mut nodes = Vec::new();
    for (id, addrs) in listeners {
        let node_dir = dir.join(format!("node-{id}"));
        nodes.push(start_node(dir, id, node_dir, addrs, &shape, Start::Create));
    }
    nodes
}

fn standby_map(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(r, s)| (r.to_string(), s.to_string()))
        .collect()
}

/// Who is in the cluster, and each region's standby.
#[derive(Clone)]
struct Shape {
    members: Vec<Member>,
    standbys: std::collections::BTreeMap<String, String>,
}

fn start_node(
    dir: &std::path::Path,
    id: u64,
    node_dir: PathBuf,
    (api, raft): (Parked, Parked),
    shape: &Shape,
    start: Start,
) -> TestNode {
    let member = shape.members.iter().find(|m| m.id == id).unwrap().clone();
    let mut config = Config::new(&member.region, node_dir.clone(), ADMIN_TOKEN.into());
    let mut regions: Vec<String> = shape.members.iter().map(|m| m.region.clone()).collect();
    regions.dedup();
    config.regions = regions;
    config.standbys = shape.standbys.clone();
    config.node_id = id;
    config.raft_listen = member.raft_addr.clone();
    config.members = shape.members.clone();
    config.node_credential_file = Some(dir.join("node-credential"));
    config.region_snapshot_entries = SNAPSHOT_ENTRIES;
    // Snapshots by entries alone: the test counts them in entries.
    config.region_snapshot_written_percent = 0;
    config.start = start;
    let api_url = format!("http://{}", api.addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(keyhold_server::run_listening(
        config,
        api.listen(),
        raft.listen(),
        async move {
            let _ = stopped.await;
        },
    ));
    TestNode {
        id,
        api: api_url,
        member,
        dir: node_dir,
        stop: Some(stop),
        task,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn cluster_view(api: &str) -> Option<Value> {
    let response = client()
        .get(format!("{api}/admin/v1/cluster"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Waits until every node answers /readyz and one of them leads the region
/// group; returns that node's id.
async fn wait_for_leader(nodes: &[TestNode]) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut ready = true;
        let mut leader = None;
        for node in nodes {
            let ok = client()
                .get(format!("{}/readyz", node.api))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            ready &= ok;
            if let Some(view) = cluster_view(&node.api).await {
                if view["store"]["leads"] == json!(true) {
                    leader = Some(node.id);
                }
            }
        }
        if let (true, Some(id)) = (ready, leader) {
            return id;
        }
        assert!(Instant::now() < deadline, "no ready region leader in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_tenant(api: &str) -> String {
    let response = client()
        .post(format!("{api}/admin/v1/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"tenant_id": "shop", "home_region": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    body["token"].as_str().unwrap().to_owned()
}

struct Answer {
    status: u16,
    replayed: bool,
    region: Option<String>,
    body: Vec<u8>,
}

async fn order(api: &str, token: &str, key: &str, extra: &[(&str, &str)]) -> Answer {
    let body = json!({
        "client_order_id": format!("co-{key}"),
        "cart_id": "cart-1",
        "amount": 1200,
        "currency": "EUR",
    });
    let mut request = client()
        .post(format!("{api}/v1/orders"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(&body);
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Answer {
        status: response.status().as_u16(),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        region: header("keyhold-region"),
        body: response.bytes().await.unwrap().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_of_a_region_answers_and_the_region_survives_its_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_region(dir.path()).await;
    let leader = wait_for_leader(&nodes).await;
    let token = create_tenant(&nodes[0].api).await;

    // Through every node, the leader and both followers: one order each.
    let mut first = Vec::new();
    for node in &nodes {
        let key = format!("order-via-{}", node.id);
        let created = order(&node.api, &token, &key, &[]).await;
        assert_eq!(
            created.status,
            201,
            "{}",
            String::from_utf8_lossy(&created.body)
        );
        assert_eq!(created.region.as_deref(), Some("a"));
        first.push((key, created.body));
    }
    // Each replays identically through every node.
    for (key, body) in &first {
        for node in &nodes {
            let replay = order(&node.api, &token, key, &[]).await;
            assert_eq!(replay.status, 201);
            assert!(replay.replayed, "a second send is a replay");
            assert_eq!(
                &replay.body, body,
                "replay of {key} through node {}",
                node.id
            );
        }
    }
    // A client's hop mark is ignored: without the node credential a follower
    // still sends the request on rather than refusing it as a stray hop.
    for node in nodes.iter().filter(|n| n.id != leader) {
        let key = format!("forged-hop-{}", node.id);
        let created = order(&node.api, &token, &key, &[("keyhold-hop", "region")]).await;
        assert_eq!(
            created.status,
            201,
            "{}",
            String::from_utf8_lossy(&created.body)
        );
        first.push((key, created.body));
    }

    // The leader stops; the other two elect a new one.
    let index = nodes.iter().position(|n| n.id == leader).unwrap();
    let old = nodes.remove(index);
    let stopped_at = Instant::now();
    let old = old.stop_for_restart().await;
    let (old_id, old_member, old_dir) = (old.id, old.member.clone(), old.dir.clone());
    let survivor = nodes[0].api.clone();
    let recovered = loop {
        let probe = order(&survivor, &token, "after-leader-loss", &[]).await;
        if probe.status == 201 {
            break stopped_at.elapsed();
        }
        assert_eq!(
            probe.status,
            503,
            "{}",
            String::from_utf8_lossy(&probe.body)
        );
        assert!(stopped_at.elapsed() < WAIT, "the region never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("the region took orders again {recovered:?} after its leader stopped");
    assert!(recovered < RECOVERY_MAX, "recovery took {recovered:?}");
    for (key, body) in &first {
        for node in &nodes {
            let replay = order(&node.api, &token, key, &[]).await;
            assert!(
                replay.replayed && &replay.body == body,
                "{key} via node {}",
                node.id
            );
        }
    }

    // Replace the stopped node on an empty data dir: out of both groups first.
    let (status, removed) = admin_post(
        &survivor,
        &format!("/admin/v1/nodes/{}/remove", old_id),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed["region_group"], "removed");
    assert_eq!(removed["registry"], "removed");
    std::fs::remove_dir_all(&old_dir).unwrap();
    // The leader purged its log behind a snapshot: the new node can only catch
    // up from that snapshot. A replica snapshots and purges in the background
    // after it applied enough entries (the relays' upkeep entries go on after
    // the orders), so a new leader may purge a moment after it was elected.
    let purged = purged_by_the_leader(&nodes).await;
    assert!(purged > 0, "the leader's log was purged behind a snapshot");
    let members: Vec<Member> = nodes
        .iter()
        .map(|n| n.member.clone())
        .chain([old_member.clone()])
        .collect();
    let shape = Shape {
        members,
        standbys: Default::default(),
    };
    let replacement = start_node(
        dir.path(),
        old_id,
        old_dir,
        (old.api, old.raft),
        &shape,
        Start::Join,
    );
    let add = json!({
        "node_id": old_id,
        "region": "a",
        "api_addr": old_member.api_addr,
        "raft_addr": old_member.raft_addr,
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, added) = admin_post(&survivor, "/admin/v1/nodes", add.clone()).await;
        if status == 200 {
            assert_eq!(added["region_group"], "voter", "{added}");
            assert_eq!(added["registry"], "voter", "{added}");
            break;
        }
        assert_eq!(status, 202, "{added}");
        assert!(Instant::now() < deadline, "the replacement never caught up");
    }
    // Its own view settles a moment after the leader counted it caught up.
    let deadline = Instant::now() + WAIT;
    let view = loop {
        let view = cluster_view(&replacement.api).await.unwrap();
        let applied = view["store"]["applied_index"].as_u64().unwrap_or(0);
        let votes = view["store"]["voters"]
            .as_array()
            .unwrap()
            .contains(&json!(old_id));
        if applied >= purged && votes {
            break view;
        }
        assert!(
            Instant::now() < deadline,
            "the replacement did not settle: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("the replacement: {}", view["store"]);
    assert!(
        view["store"]["purged_index"].as_u64().unwrap_or(0) > 0,
        "the replacement's log starts after a snapshot: {view}"
    );
    nodes.push(replacement);
    // It votes: with one of the two others gone, it makes the majority.
    let gone = nodes.remove(0);
    gone.stop().await;
    let deadline = Instant::now() + WAIT;
    loop {
        let probe = order(&nodes[0].api, &token, "after-replacement", &[]).await;
        if probe.status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no majority with the replacement"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And it holds every order.
    for (key, body) in &first {
        for node in &nodes {
            let replay = order(&node.api, &token, key, &[]).await;
            assert!(
                replay.replayed && &replay.body == body,
                "{key} via node {}",
                node.id
            );
        }
    }
    for node in nodes {
        node.stop().await;
    }
}

async fn admin_post(api: &str, path: &str, body: Value) -> (u16, Value) {
    let response = client()
        .post(format!("{api}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The cluster view of the node that leads the region group now.
async fn leader_view(nodes: &[TestNode]) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        for node in nodes {
            if let Some(view) = cluster_view(&node.api).await {
                if view["store"]["leads"] == json!(true) {
                    return view;
                }
            }
        }
        assert!(Instant::now() < deadline, "no region leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The index up to which the region's leader purged its log, once it is
/// above 0 (0 when it is not within `WAIT`).
async fn purged_by_the_leader(nodes: &[TestNode]) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let purged = leader_view(nodes).await["store"]["purged_index"]
            .as_u64()
            .unwrap_or(0);
        if purged > 0 || Instant::now() >= deadline {
            return purged;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `api`'s view of its own region store (`store` of the cluster view).
async fn store_view(api: &str) -> Value {
    cluster_view(api).await.expect("cluster view")["store"].clone()
}

/// Polls `api`'s store view until `ready` holds for it.
async fn store_view_until(api: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let view = store_view(api).await;
        if ready(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "{what}: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn index(view: &Value, name: &str) -> u64 {
    view[name].as_u64().unwrap_or(0)
}

/// Orders that make a region write more entries than the standby's match is
/// recorded after (`STANDBY_MATCHED_RECORD_ENTRIES`, one entry per order at
/// least), with room to spare.
const ORDERS_PAST_A_RECORD: u64 = keyhold_server::limits::STANDBY_MATCHED_RECORD_ENTRIES + 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_purges_its_log_only_as_far_as_its_standby_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let standbys = [("a", "b")];
    let mut nodes = start_cluster(dir.path(), &["a", "b", "c"], &standbys).await;
    wait_for_leader(&nodes).await;
    let a = nodes[0].api.clone();
    let token = create_tenant(&a).await;
    // More orders than `STANDBY_MATCHED_RECORD_ENTRIES` entries even when
    // each order's relay effects ride in the next order's entry.
    for i in 0..ORDERS_PAST_A_RECORD {
        let created = order(&a, &token, &format!("before-{i}"), &[]).await;
        assert_eq!(created.status, 201);
    }
    // With b's copy keeping up, a purges behind its snapshots as it goes.
    store_view_until(&a, "a purges while b keeps up", |v| {
        index(v, "purged_index") > 0
    })
    .await;

    // b stops: its copy lacks every entry from here on.
    let b = nodes.remove(1).stop_for_restart().await;
    let held = index(&store_view(&a).await, "applied_index");
    for i in 0..ORDERS_PAST_A_RECORD {
        // The standby does not vote: a answers without it.
        let created = order(&a, &token, &format!("while-b-is-down-{i}"), &[]).await;
        assert_eq!(created.status, 201);
    }
    let view = store_view_until(&a, "a snapshots on", |v| {
        index(v, "snapshot_index") > held + 4 * SNAPSHOT_ENTRIES
    })
    .await;
    // Several purge rounds pass; none reaches what b lacks.
    tokio::time::sleep(Duration::from_millis(3 * STANDBY_CHECK_MS)).await;
    let view_later = store_view(&a).await;
    for v in [&view, &view_later] {
        assert!(
            index(v, "purged_index") <= held,
            "a purged what b lacks: {v} (b held {held})"
        );
    }

    // b is back and catches up from the log a kept; a purges past it again.
    nodes.push(restart(dir.path(), b, &nodes, &standbys).await);
    store_view_until(&a, "a purges again once b caught up", |v| {
        index(v, "purged_index") > held
    })
    .await;
    for node in nodes {
        node.stop().await;
    }
}

/// Creates tenant `id` homed in `home` with `survival` (none: the default).
async fn create_tenant_with(
    api: &str,
    id: &str,
    home: &str,
    survival: Option<&str>,
) -> (u16, Value) {
    let mut body = json!({"tenant_id": id, "home_region": home});
    if let Some(survival) = survival {
        body["survival"] = survival.into();
    }
    admin_post(api, "/admin/v1/tenants", body).await
}

/// The idempotency keys of the orders whose commands are in the log of the
/// region store copy in `dir` (of region `region`'s group), read straight
/// from the log: what that copy holds durably, applied or not.
async fn keys_in_log(dir: &std::path::Path, region: &str) -> Vec<String> {
    use keyhold_store::raft::CommandBatch;
    use keyhold_store::Command;
    use openraft::RaftLogReader;
    let group = keyhold_store::raft::group_name(region);
    let (mut log, _machine) = keyhold_store::raft::open(dir, &group).expect("open the copy");
    let entries = log
        .try_get_log_entries(0..u64::MAX)
        .await
        .expect("read the copy's log");
    let mut keys = Vec::new();
    for entry in entries {
        if let openraft::EntryPayload::Normal(CommandBatch { commands }) = entry.payload {
            for command in commands {
                if let Command::CreateOrder { scope, .. } = command {
                    keys.push(scope.key.as_str().to_owned());
                }
            }
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_survival_tenant_is_answered_only_once_its_standby_holds_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let standbys = [("a", "b")];
    let mut nodes = start_cluster(dir.path(), &["a", "b", "c"], &standbys).await;
    wait_for_leader(&nodes).await;
    let a = nodes[0].api.clone();

    // The admin API: survival is shown, checked, and refused without a standby.
    let (status, safe) = create_tenant_with(&a, "safe", "a", Some("region")).await;
    assert_eq!(status, 201, "{safe}");
    assert_eq!(safe["survival"], "region");
    let safe_token = safe["token"].as_str().unwrap().to_owned();
    let (status, fast) = create_tenant_with(&a, "fast", "a", None).await;
    assert_eq!(status, 201, "{fast}");
    assert_eq!(fast["survival"], "zone");
    let fast_token = fast["token"].as_str().unwrap().to_owned();
    let shown = client()
        .get(format!("{a}/admin/v1/tenants/safe"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(shown["survival"], "region", "{shown}");
    let (status, refused) = create_tenant_with(&a, "nowhere", "c", Some("region")).await;
    assert_eq!(status, 409, "c has no standby: {refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("standby"),
        "{refused}"
    );
    let (status, refused) = create_tenant_with(&a, "odd", "a", Some("planet")).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["errors"][0]["pointer"], "/survival", "{refused}");

    // a streams to b before anything is asked of b's copy.
    let deadline = Instant::now() + WAIT;
    while cluster_view(&a)
        .await
        .is_none_or(|v| v["regions"][0]["replication_lag"].is_null())
    {
        assert!(Instant::now() < deadline, "a never streamed to b");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = order(&a, &safe_token, "held", &[]).await;
    assert_eq!(held.status, 201, "{}", String::from_utf8_lossy(&held.body));
    let claimed = client()
        .post(format!("{a}/v1/claims"))
        .bearer_auth(&safe_token)
        .json(&json!({"operation": "POST:/v1/payments", "key": "pay-1",
                      "fingerprint": "fp-1", "lease_ms": 5_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(claimed.status(), 201);

    // b stops: the registry keeps its majority (a and c), a keeps its lease.
    let b = nodes.remove(1).stop_for_restart().await;
    // b's copy held "held" durably when a answered it.
    let copy = b.dir.join("standby-a");
    let keys = keys_in_log(&copy, "a").await;
    assert!(keys.contains(&"held".to_owned()), "b's copy: {keys:?}");

    let wait = Duration::from_millis(keyhold_server::limits::SURVIVAL_WAIT_MS);
    let started = Instant::now();
    let fast_order = order(&a, &fast_token, "fast-while-b-is-down", &[]).await;
    let fast_took = started.elapsed();
    assert_eq!(fast_order.status, 201);
    assert!(fast_took < wait, "a zone tenant waited {fast_took:?}");
    let started = Instant::now();
    let unheld = order(&a, &safe_token, "unheld", &[]).await;
    let took = started.elapsed();
    assert_eq!(
        unheld.status,
        503,
        "{}",
        String::from_utf8_lossy(&unheld.body)
    );
    let problem: Value = serde_json::from_slice(&unheld.body).unwrap();
    assert_eq!(
        problem["type"],
        "https://keyhold.dev/problems/standby-unreachable"
    );
    assert!(took >= wait, "answered after {took:?}");
    // Its retry replays from the store, and still waits for b.
    let again = order(&a, &safe_token, "unheld", &[]).await;
    assert_eq!(again.status, 503);
    // The order was executed: it is there, only not acknowledged.
    let found = client()
        .get(format!("{a}/v1/orders?client_order_id=co-unheld"))
        .bearer_auth(&safe_token)
        .send()
        .await
        .unwrap();
    assert_eq!(found.status(), 200);
    let found = found.bytes().await.unwrap().to_vec();
    // And b's copy does not have it: b was down.
    assert!(!keys_in_log(&copy, "a").await.contains(&"unheld".to_owned()));
    let metrics = client()
        .get(format!("{a}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("keyhold_survival_waits_total{outcome=\"timed_out\"}"),
        "{metrics}"
    );
    // The apply's share of each entry, for telling a slow disk from a busy node.
    assert!(
        metrics.contains("keyhold_store_apply_seconds_count"),
        "{metrics}"
    );

    // b is back: the retry replays the order once b's copy has it.
    nodes.push(restart(dir.path(), b, &nodes, &standbys).await);
    let deadline = Instant::now() + WAIT;
    let replay = loop {
        let retry = order(&a, &safe_token, "unheld", &[]).await;
        if retry.status != 503 {
            break retry;
        }
        assert!(Instant::now() < deadline, "the retry never replayed");
    };
    assert_eq!(
        replay.status,
        201,
        "{}",
        String::from_utf8_lossy(&replay.body)
    );
    assert!(replay.replayed);
    // The order the first attempt created (its status may have moved on since).
    let id = |body: &[u8]| serde_json::from_slice::<Value>(body).unwrap()["order_id"].clone();
    assert_eq!(id(&replay.body), id(&found), "the replay is the order");
    let second = order(&a, &safe_token, "unheld", &[]).await;
    assert!(second.replayed && second.body == replay.body);
    for node in nodes {
        node.stop().await;
    }
}
