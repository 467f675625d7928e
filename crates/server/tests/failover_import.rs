//! A region failover's import, through real nodes started in this process
//! (`Node::open` and `serve`, as `keyhold_server::run` does, keeping the node
//! handle to write the registry's failover requests as the lead's driver
//! will): three regions of one node each, region a with b as its standby.
//!
//! A tenant of a takes orders; a's inventory consumer handles them, but its
//! payment provider is unreachable, so no payment is delivered. b's copy of a
//! catches up; a stops. With `BeginFailover` written, b's `/copy` route
//! reports the copy's position, and b's `/import` promotes the copy and
//! imports the tenant into b's own store: every record, marker and order the
//! copy had, and the three undelivered events, held: b's relays deliver none
//! of them while the failover may still fail. A second import answers the
//! same and adds no event. After `CompleteFailover` the tenant executes in
//! b and the events join b's outbox (marked handled for inventory, which
//! handled them in a): an order acknowledged by a replays byte for byte, new
//! orders are taken, each payment is charged exactly once (by b), and b's
//! promoted copy is deleted and created again empty. (The lead's driver would do the same after
//! waiting out a's lease; it leaves the failovers these tests drive by hand
//! alone, `KEYHOLD_FAULT_FAILOVER_DRIVER_SKIPS`.)
//! A second test reads the copy of another node of b, a third lets the
//! driver do it all, opened through the admin route, a fourth restarts b
//! between two imports, a fifth fails the failover after its import, and a
//! sixth checks that the events a failed failover carried never take effect
//! in b; a seventh brings a back after a failover and checks that it takes no
//! downstream effect for the tenant it lost (issue 12).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use keyhold_core::TenantId;
use keyhold_netem::Parked;
use keyhold_registry::{LostEstimate, Request, NODE_CREDENTIAL_HEADER};
use keyhold_server::config::Member;
use keyhold_server::{Config, Node};
use keyhold_store::{Consumer, Store, TenantGuard};
use serde_json::{json, Value};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "failover-import-admin-token-0123456789";
const CREDENTIAL: &str = "failover-import-node-credential-0123456789";
/// Start-up, elections and replication on a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(60);
const TENANT: &str = "shop";
const ORDERS: usize = 3;

struct TestNode {
    node: Arc<Node>,
    member: Member,
    api: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), keyhold_server::Error>>,
}

/// A stopped node, its addresses held for its restart.
struct Stopped {
    id: u64,
    api: Parked,
    raft: Parked,
}

impl TestNode {
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        self.task
            .await
            .expect("node task")
            .expect("node stopped cleanly");
    }

    async fn stop_for_restart(self) -> Stopped {
        let member = self.member.clone();
        self.stop().await;
        Stopped {
            id: member.id,
            api: Parked::at(&member.api_addr).await,
            raft: Parked::at(&member.raft_addr).await,
        }
    }
}

/// An address where nothing listens for as long as the tests run: region a's
/// payment provider while it is unreachable.
fn unreachable_addr() -> std::net::SocketAddr {
    static NOWHERE: OnceLock<Parked> = OnceLock::new();
    NOWHERE.get_or_init(Parked::any).addr()
}

/// Starts the fake payment provider; its base URL and its stop.
async fn provider(dir: &Path) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let config = keyhold_fakepsp::PspConfig::new(dir.join("psp"));
    tokio::spawn(keyhold_fakepsp::run(config, listener, async {
        let _ = stopped.await;
    }));
    (base, stop)
}

/// One node per entry of `regions` (ids from 1: a first, then b's, then c);
/// a's standby is b. a's payment provider cannot be reached; b's is `psp`.
/// The failovers whose steps these tests take by hand: the driver leaves them
/// alone (it would otherwise complete them at once, a's lease being long over).
const BY_HAND: &str = "fo-1,fo-2,fo-4,fo-5,fo-6";

async fn start_cluster(dir: &Path, psp: &str, regions: &[&str]) -> Vec<TestNode> {
    static BY_HAND_SET: std::sync::Once = std::sync::Once::new();
    BY_HAND_SET.call_once(|| std::env::set_var("KEYHOLD_FAULT_FAILOVER_DRIVER_SKIPS", BY_HAND));
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
        listeners.push((id, api.listen(), raft.listen()));
    }
    let mut nodes = Vec::new();
    for (id, listener, raft) in listeners {
        let psp = ProviderOfA::Unreachable(psp);
        nodes.push(start_node(dir, &members, id, psp, listener, raft).await);
    }
    nodes
}

/// The payment provider of the nodes: b's is the one given; a's too when a
/// comes back (`Reachable`), else nothing listens at a's.
#[derive(Clone, Copy)]
enum ProviderOfA<'a> {
    Unreachable(&'a str),
    Reachable(&'a str),
}

/// Starts node `id` of `members` on its listeners, with its data under
/// `dir/node-<id>`.
async fn start_node(
    dir: &Path,
    members: &[Member],
    id: u64,
    provider: ProviderOfA<'_>,
    listener: tokio::net::TcpListener,
    raft: tokio::net::TcpListener,
) -> TestNode {
    let member = members.iter().find(|m| m.id == id).unwrap().clone();
    let mut config = Config::new(
        &member.region,
        dir.join(format!("node-{id}")),
        ADMIN_TOKEN.into(),
    );
    config.regions = vec!["a".into(), "b".into(), "c".into()];
    config.standbys = [("a".to_string(), "b".to_string())].into();
    config.node_id = id;
    config.raft_listen = member.raft_addr.clone();
    config.members = members.to_vec();
    config.node_credential_file = Some(dir.join("node-credential"));
    let (ProviderOfA::Unreachable(psp) | ProviderOfA::Reachable(psp)) = provider;
    config.psp_url = match (member.region.as_str(), provider) {
        // Nothing listens there.
        ("a", ProviderOfA::Unreachable(_)) => Some(format!("http://{}", unreachable_addr())),
        ("a" | "b", _) => Some(psp.to_owned()),
        _ => None,
    };
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
        stop: Some(stop),
        task,
    }
}

/// Starts a stopped node again on the addresses it had.
async fn restart_node(
    dir: &Path,
    members: &[Member],
    stopped: Stopped,
    provider: ProviderOfA<'_>,
) -> TestNode {
    let (api, raft) = (stopped.api.listen(), stopped.raft.listen());
    start_node(dir, members, stopped.id, provider, api, raft).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
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

async fn ready(api: &str) -> bool {
    client()
        .get(format!("{api}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn create_tenant(api: &str) -> String {
    let response = client()
        .post(format!("{api}/admin/v1/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"tenant_id": TENANT, "home_region": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    body["token"].as_str().unwrap().to_owned()
}

/// Sends one order; its status, whether it was a replay, and its body.
async fn order(api: &str, token: &str, key: &str) -> (u16, bool, Vec<u8>) {
    let body = json!({
        "client_order_id": format!("co-{key}"),
        "cart_id": "cart-1",
        "amount": 1200,
        "currency": "EUR",
    });
    let response = client()
        .post(format!("{api}/v1/orders"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let status = response.status().as_u16();
    (status, replayed, response.bytes().await.unwrap().to_vec())
}

/// `order`, sent again while the answer is 503 (the region lease may lapse
/// for a moment while the registry elects a leader without a's node).
async fn order_settled(api: &str, token: &str, key: &str) -> (u16, bool, Vec<u8>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = order(api, token, key).await;
        if answer.0 != 503 || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `node`'s registry replica knows a leader other than node 1
/// (a's, stopped): writes then go to it at once.
async fn wait_registry_without_a(node: &Node) {
    wait_until("a registry leader other than a", || async {
        node.registry()
            .metrics()
            .current_leader
            .is_some_and(|leader| leader != 1)
    })
    .await;
}

/// Writes `request` through `node`'s registry (retrying while the registry
/// elects a leader), waits until `node`'s replica applied it, and returns
/// its log index.
/// Region a is lost: once b's copy holds everything a applied, a's node
/// stops, and b (with a registry leader other than a) begins failover
/// `operation_id` of a into b. Returns b's node, b's API origin and the URL
/// that imports b's copy (node 2's) for that failover.
async fn lose_a_and_begin_failover(
    nodes: &mut Vec<TestNode>,
    operation_id: &str,
) -> (Arc<Node>, String, String) {
    let a = nodes[0].node.clone();
    let a_applied = a.store().applied_index().unwrap();
    let b = nodes[1].node.clone();
    wait_until("b's copy holds all of a", || async {
        let copy = b.standby_copy("a").unwrap();
        copy.store.applied_index().unwrap() >= a_applied
    })
    .await;
    nodes.remove(0).stop().await;
    drop(a);
    let b_api = nodes[0].api.clone();
    wait_until("b ready without a", || ready(&b_api)).await;
    wait_registry_without_a(&b).await;
    write(
        &b,
        Request::BeginFailover {
            operation_id: operation_id.into(),
            region: "a".into(),
            to: "b".into(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    let import_url =
        format!("{b_api}/internal/v1/failover/a/import?operation_id={operation_id}&source=2");
    (b, b_api, import_url)
}

async fn write(node: &Node, request: Request) -> u64 {
    let deadline = Instant::now() + WAIT;
    let written = loop {
        match node.registry().write(request.clone()).await {
            Ok(written) => break written,
            Err(e) if Instant::now() < deadline => {
                eprintln!("registry write not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("registry write: {e}"),
        }
    };
    node.registry()
        .wait_applied(written.log_index, WAIT)
        .await
        .unwrap();
    written.log_index
}

/// An internal call with the node credential; status and JSON body.
async fn internal(method: reqwest::Method, url: String) -> (u16, Value) {
    let response = client()
        .request(method, url)
        .header(NODE_CREDENTIAL_HEADER, CREDENTIAL)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Every entry of the tenant a move or failover carries, as stored.
async fn tenant_entries(store: &Store) -> Vec<keyhold_store::ExportEntry> {
    let tenant = TenantId::parse(TENANT).unwrap();
    let (entries, next) = store
        .export_tenant(&tenant, None, usize::MAX)
        .await
        .unwrap();
    assert!(next.is_none());
    entries
}

async fn outbox_ids(store: &Store) -> Vec<String> {
    let events = store.outbox_after(0, 1_000).await.unwrap();
    events.into_iter().map(|e| e.event_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_imports_the_promoted_copy_once_and_the_tenant_executes_in_the_standby() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let token = create_tenant(&nodes[0].api).await;
    let mut acknowledged = Vec::new();
    for n in 0..ORDERS {
        let key = format!("order-{n}");
        let (status, _, body) = order(&nodes[0].api, &token, &key).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        acknowledged.push((key, body));
    }
    let (a, b) = (nodes[0].node.clone(), nodes[1].node.clone());
    // a delivers to inventory; its payments cannot reach the provider.
    wait_until("a's inventory consumer is done", || async {
        a.store().cursor(Consumer::Inventory).await.unwrap() >= ORDERS as u64
    })
    .await;
    assert_eq!(a.store().cursor(Consumer::Payments).await.unwrap(), 0);
    let a_applied = a.store().applied_index().unwrap();
    wait_until("b's copy holds all of a", || async {
        let copy = b.standby_copy("a").expect("b keeps a copy of a");
        copy.store.applied_index().unwrap() >= a_applied
    })
    .await;
    wait_until("b's copy knows its lag", || async {
        let copy = b.standby_copy("a").unwrap();
        let known = copy.lag.lock().unwrap().is_some();
        known
    })
    .await;
    let a_entries = tenant_entries(a.store()).await;
    assert!(!a_entries.is_empty());

    // Region a fails.
    let a_node = nodes.remove(0);
    a_node.stop().await;
    drop(a);
    let (b_api, b_id) = (nodes[0].api.clone(), b.config().node_id);
    wait_until("b ready without a", || ready(&b_api)).await;
    wait_registry_without_a(&b).await;

    // The copy's position, before any failover.
    let (status, position) = internal(
        reqwest::Method::GET,
        format!("{b_api}/internal/v1/failover/a/copy"),
    )
    .await;
    assert_eq!(status, 200, "{position}");
    assert_eq!(position["node_id"], json!(b_id));
    assert!(position["last_log_index"].as_u64().unwrap() >= a_applied);
    assert!(position["applied_index"].as_u64().unwrap() >= a_applied);
    assert_eq!(position["promoted"], json!(false));
    assert!(position["lag"]["commands"].is_u64(), "{position}");
    assert!(position["lag"]["seconds"].is_f64(), "{position}");
    // No copy of c here; and nothing is promoted without a running failover.
    let (status, _) = internal(
        reqwest::Method::GET,
        format!("{b_api}/internal/v1/failover/c/copy"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = internal(
        reqwest::Method::POST,
        format!("{b_api}/internal/v1/failover/a/promote"),
    )
    .await;
    assert_eq!(status, 409);
    let import_url =
        format!("{b_api}/internal/v1/failover/a/import?operation_id=fo-1&source={b_id}");
    let (status, _) = internal(reqwest::Method::POST, import_url.clone()).await;
    assert_eq!(status, 409, "no failover operation yet");

    // The driver's part: begin, import, complete.
    write(
        &b,
        Request::BeginFailover {
            operation_id: "fo-1".into(),
            region: "a".into(),
            to: "b".into(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    let (status, first) = internal(reqwest::Method::POST, import_url.clone()).await;
    assert_eq!(status, 200, "{first}");
    let at = first["at"].as_u64().unwrap();
    assert!(at >= a_applied);
    assert_eq!(first["tenants"], json!(1));
    assert_eq!(first["entries"], json!(a_entries.len()));
    assert_eq!(first["events"], json!(ORDERS), "{first}");

    let copy = b.standby_copy("a").unwrap();
    assert_eq!(copy.store.promoted().unwrap(), Some(at));
    // b holds every record, marker and order the copy had (payments may
    // already be changing b's orders: compare the other kinds, then orders by id).
    let copied = tenant_entries(&copy.store).await;
    let here = tenant_entries(b.store()).await;
    assert_eq!(copied.len(), here.len());
    for (c, h) in copied.iter().zip(&here) {
        assert_eq!(c.key, h.key);
        if c.key.first() != Some(&b'o') {
            assert_eq!(
                c.payload,
                h.payload,
                "entry {:?}",
                String::from_utf8_lossy(&c.key)
            );
        }
    }
    drop(copy);
    let tenant = TenantId::parse(TENANT).unwrap();
    assert_eq!(
        b.store().guard(&tenant).unwrap(),
        Some(TenantGuard::Importing {
            operation_id: "fo-1".into(),
            epoch: 2
        })
    );
    // The undelivered events, once each, held until the failover is done:
    // b's relays (woken by nothing, polling every 200 ms) charge nothing.
    assert_eq!(b.store().held_events(&tenant).unwrap(), ORDERS as u64);
    assert_eq!(outbox_ids(b.store()).await, Vec::<String>::new());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(charged_orders(&psp).await, Vec::<String>::new());

    // Again (a retry, a new leader): the same answer, no event added.
    let (status, second) = internal(reqwest::Method::POST, import_url.clone()).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second, first);
    assert_eq!(b.store().held_events(&tenant).unwrap(), ORDERS as u64);

    write(
        &b,
        Request::CompleteFailover {
            operation_id: "fo-1".into(),
            at,
            estimated_lost: LostEstimate::default(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    assert_eq!(b.registry().tenant(TENANT).unwrap().home_region, "b");
    wait_until("b's store owns the tenant", || async {
        b.store().guard(&tenant).unwrap() == Some(TenantGuard::Owned { epoch: 2 })
    })
    .await;
    // Owned: the carried events are b's to deliver, marked handled for
    // inventory, which handled them in a.
    assert_eq!(b.store().held_events(&tenant).unwrap(), 0);
    let events = outbox_ids(b.store()).await;
    assert_eq!(events.len(), ORDERS, "{events:?}");
    for id in &events {
        assert!(b
            .store()
            .is_processed(Consumer::Inventory, id)
            .await
            .unwrap());
    }
    // What a acknowledged replays from b byte for byte; new orders are taken.
    for (key, body) in &acknowledged {
        let (status, replayed, replay) = order_settled(&b_api, &token, key).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&replay));
        assert!(replayed, "{key} replays");
        assert_eq!(&replay, body, "{key}");
    }
    let (status, _, body) = order_settled(&b_api, &token, "after-failover").await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    // b delivers each carried payment once, and the new order's.
    wait_until("b's payments consumer is done", || async {
        let head = b.store().outbox_after(0, 1_000).await.unwrap().len() as u64;
        b.store().cursor(Consumer::Payments).await.unwrap() >= head
    })
    .await;
    let mut charged = charged_orders(&psp).await;
    let before = charged.len();
    charged.dedup();
    assert_eq!(before, charged.len(), "no order is charged twice");
    assert_eq!(charged.len(), ORDERS + 1);
    for n in 0..ORDERS {
        let order = b
            .store()
            .order_by_client_order_id(&tenant, &format!("co-order-{n}"))
            .await
            .unwrap()
            .expect("the order is in b's store");
        assert_eq!(order.status, keyhold_core::OrderStatus::Paid, "order {n}");
    }

    // The promoted copy is deleted and created again, empty.
    wait_until("b's copy of a is reset", || async {
        b.standby_copy("a").is_some_and(|copy| {
            copy.store.promoted().unwrap().is_none() && copy.store.applied_index().unwrap() == 0
        })
    })
    .await;
    let (status, position) = internal(
        reqwest::Method::GET,
        format!("{b_api}/internal/v1/failover/a/copy"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(position["promoted"], json!(false));

    drop(b);
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// Region b of two nodes: the import, sent to b's follower and passed on to
/// b's leader, reads the copy of the follower over HTTP (promoting that copy,
/// not the leader's own), and the tenant is then served through either node
/// of b.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_import_reads_the_copy_another_node_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let token = create_tenant(&nodes[0].api).await;
    let mut acknowledged = Vec::new();
    for n in 0..ORDERS {
        let key = format!("order-{n}");
        let (status, _, body) = order(&nodes[0].api, &token, &key).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        acknowledged.push((key, body));
    }
    let a = nodes[0].node.clone();
    let a_applied = a.store().applied_index().unwrap();
    let a_entries = tenant_entries(a.store()).await;
    wait_until("b's leader is known", || async {
        nodes[1].node.leads_region() || nodes[2].node.leads_region()
    })
    .await;
    let (leader, source) = if nodes[1].node.leads_region() {
        (nodes[1].node.clone(), nodes[2].node.clone())
    } else {
        (nodes[2].node.clone(), nodes[1].node.clone())
    };
    for node in [&leader, &source] {
        wait_until("both copies hold all of a", || async {
            let copy = node.standby_copy("a").unwrap();
            copy.store.applied_index().unwrap() >= a_applied
        })
        .await;
    }
    nodes.remove(0).stop().await;
    drop(a);
    for node in &nodes {
        wait_until("every node ready without a", || ready(&node.api)).await;
        wait_registry_without_a(&node.node).await;
    }

    let begin = Request::BeginFailover {
        operation_id: "fo-2".into(),
        region: "a".into(),
        to: "b".into(),
        now_ms: keyhold_server_now(),
    };
    let index = write(&leader, begin).await;
    // The source acts only once its replica shows the failover.
    source.registry().wait_applied(index, WAIT).await.unwrap();
    let api_of = |node: &Arc<Node>| {
        let addr = node.registry().node().api_addr.clone();
        format!("http://{addr}")
    };
    let (leader_api, source_api) = (api_of(&leader), api_of(&source));
    let source_id = source.config().node_id;
    // Only the leader imports: a follower sends the call on once, and a
    // call sent on to a node that does not lead is refused.
    let path = format!("/internal/v1/failover/a/import?operation_id=fo-2&source={source_id}");
    let hop = client()
        .post(format!("{source_api}{path}"))
        .header(NODE_CREDENTIAL_HEADER, CREDENTIAL)
        .header("keyhold-hop", "region")
        .send()
        .await
        .unwrap();
    assert_eq!(hop.status(), 503);
    assert!(hop.headers().contains_key("keyhold-not-leader"));
    let (status, answer) = internal(reqwest::Method::POST, format!("{source_api}{path}")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, again) = internal(reqwest::Method::POST, format!("{leader_api}{path}")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, answer);
    assert_eq!(answer["tenants"], json!(1));
    assert_eq!(answer["entries"], json!(a_entries.len()));
    assert_eq!(answer["events"], json!(ORDERS));
    let at = answer["at"].as_u64().unwrap();
    let promoted = source.standby_copy("a").unwrap();
    assert_eq!(promoted.store.promoted().unwrap(), Some(at));
    let own = leader.standby_copy("a").unwrap();
    assert_eq!(
        own.store.promoted().unwrap(),
        None,
        "the leader's copy stays"
    );
    let copied = tenant_entries(&promoted.store).await;
    let here = tenant_entries(leader.store()).await;
    assert_eq!(
        copied.iter().map(|e| &e.key).collect::<Vec<_>>(),
        here.iter().map(|e| &e.key).collect::<Vec<_>>()
    );
    drop((promoted, own));
    let tenant = TenantId::parse(TENANT).unwrap();
    assert_eq!(leader.store().held_events(&tenant).unwrap(), ORDERS as u64);

    let complete = Request::CompleteFailover {
        operation_id: "fo-2".into(),
        at,
        estimated_lost: LostEstimate::default(),
        now_ms: keyhold_server_now(),
    };
    let index = write(&leader, complete).await;
    source.registry().wait_applied(index, WAIT).await.unwrap();
    // Through either node of b, what a acknowledged replays.
    for api in [&leader_api, &source_api] {
        for (key, body) in &acknowledged {
            let (status, replayed, replay) = order_settled(api, &token, key).await;
            assert_eq!(status, 201, "{}", String::from_utf8_lossy(&replay));
            assert!(replayed, "{key} replays via {api}");
            assert_eq!(&replay, body, "{key} via {api}");
        }
    }
    wait_until("the source's copy is reset", || async {
        source
            .standby_copy("a")
            .is_some_and(|copy| copy.store.promoted().unwrap().is_none())
    })
    .await;

    drop((leader, source));
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// The lead's driver end to end: the admin route opens the failover, b's
/// leader waits the lease out, asks for the copy's position, imports through
/// this import route and completes; the registry keeps the result, the tenant
/// is served by b and b's copy is reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_driver_completes_a_failover_through_the_import() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let token = create_tenant(&nodes[0].api).await;
    let (status, _, acknowledged) = order(&nodes[0].api, &token, "before").await;
    assert_eq!(status, 201);
    let (a, b) = (nodes[0].node.clone(), nodes[1].node.clone());
    let a_applied = a.store().applied_index().unwrap();
    wait_until("b's copy holds all of a", || async {
        let copy = b.standby_copy("a").unwrap();
        copy.store.applied_index().unwrap() >= a_applied
    })
    .await;
    nodes.remove(0).stop().await;
    drop(a);
    let b_api = nodes[0].api.clone();
    wait_until("b ready without a", || ready(&b_api)).await;
    wait_registry_without_a(&b).await;
    let response = client()
        .post(format!("{b_api}/admin/v1/regions/a/failover"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 202, "{body}");
    let operation_id = body["operation_id"].as_str().unwrap().to_owned();
    wait_until("the failover is done", || async {
        b.registry()
            .read(|s| s.failover_result(&operation_id).is_some())
    })
    .await;
    let result = b
        .registry()
        .read(|s| s.failover_result(&operation_id).cloned())
        .unwrap();
    assert!(result.at >= a_applied);
    assert_eq!(result.tenants, vec![TENANT.to_string()]);
    // The registry keeps the promoted copy's tail, which a's reconciliation
    // reads its cut from; the driver's answer carried it.
    let tail = b
        .registry()
        .read(|s| s.failover_tails.get(&operation_id).cloned())
        .expect("the failover recorded its copy's tail");
    assert_eq!(tail.last, result.at);
    assert!(tail.committed <= tail.last);
    let (status, replayed, replay) = order_settled(&b_api, &token, "before").await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&replay));
    assert!(replayed);
    assert_eq!(replay, acknowledged);
    wait_until("b's copy of a is reset", || async {
        b.standby_copy("a")
            .is_some_and(|copy| copy.store.promoted().unwrap().is_none())
    })
    .await;
    drop(b);
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// b restarts between two imports: its copy stays promoted at the same index
/// (it does not rejoin a's group), the import answers as before without a
/// second copy of any event, and once the failover is done the copy is reset;
/// a copy a reset had set aside when the node stopped is removed at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_promoted_copy_survives_a_restart_of_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let members = nodes[0].node.config().members.clone();
    let token = create_tenant(&nodes[0].api).await;
    let (status, _, acknowledged) = order(&nodes[0].api, &token, "before").await;
    assert_eq!(status, 201);
    let (b, b_api, import_url) = lose_a_and_begin_failover(&mut nodes, "fo-4").await;
    let (status, first) = internal(reqwest::Method::POST, import_url.clone()).await;
    assert_eq!(status, 200, "{first}");
    let at = first["at"].as_u64().unwrap();
    let tenant = TenantId::parse(TENANT).unwrap();
    assert_eq!(b.store().held_events(&tenant).unwrap(), 1);

    // b stops (with a leftover of an interrupted reset) and starts again.
    drop(b);
    let b_stopped = nodes.remove(0).stop_for_restart().await;
    let aside = dir.path().join("node-2").join("standby-a.reset");
    std::fs::create_dir_all(aside.join("db")).unwrap();
    std::fs::write(aside.join("db").join("leftover"), b"x").unwrap();
    nodes.insert(
        0,
        restart_node(
            dir.path(),
            &members,
            b_stopped,
            ProviderOfA::Unreachable(&psp),
        )
        .await,
    );
    let b = nodes[0].node.clone();
    assert!(!aside.exists(), "the set-aside copy is removed at start");
    wait_until("b ready again", || ready(&b_api)).await;
    let copy = b.standby_copy("a").unwrap();
    assert_eq!(copy.store.promoted().unwrap(), Some(at));
    assert_eq!(copy.store.last_log_index().unwrap(), at);
    drop(copy);
    let (status, again) = internal(reqwest::Method::POST, import_url.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, first);
    assert_eq!(b.store().held_events(&tenant).unwrap(), 1);

    write(
        &b,
        Request::CompleteFailover {
            operation_id: "fo-4".into(),
            at,
            estimated_lost: LostEstimate::default(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    let (status, replayed, replay) = order_settled(&b_api, &token, "before").await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&replay));
    assert!(replayed);
    assert_eq!(replay, acknowledged);
    wait_until("b's copy of a is reset", || async {
        b.standby_copy("a")
            .is_some_and(|copy| copy.store.promoted().unwrap().is_none())
    })
    .await;
    drop(b);
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// A failover that fails after its import: b erases what it imported and
/// drops the guard (a later failover or move of the tenant to b would be
/// refused by it), and resets its promoted copy; the tenant stays a's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_failovers_import_is_erased_from_the_standby() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let token = create_tenant(&nodes[0].api).await;
    let (status, _, _) = order(&nodes[0].api, &token, "before").await;
    assert_eq!(status, 201);
    let (b, _, import_url) = lose_a_and_begin_failover(&mut nodes, "fo-5").await;
    let (status, answer) = internal(reqwest::Method::POST, import_url).await;
    assert_eq!(status, 200, "{answer}");
    let tenant = TenantId::parse(TENANT).unwrap();
    assert!(b.store().tenant_entry_count(&tenant).unwrap() > 0);
    write(
        &b,
        Request::FailFailover {
            operation_id: "fo-5".into(),
            error: "given up by the test".into(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    wait_until("b erased the failed import", || async {
        b.store().guard(&tenant).unwrap().is_none()
            && b.store().tenant_entry_count(&tenant).unwrap() == 0
    })
    .await;
    assert_eq!(b.registry().tenant(TENANT).unwrap().home_region, "a");
    wait_until("b's copy of a is reset", || async {
        b.standby_copy("a")
            .is_some_and(|copy| copy.store.promoted().unwrap().is_none())
    })
    .await;
    drop(b);
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// Every order id the payment provider charged, sorted.
async fn charged_orders(psp: &str) -> Vec<String> {
    let charges: Value = client()
        .get(format!("{psp}/v1/charges"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut charged: Vec<String> = charges["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["order_id"].as_str().unwrap().to_owned())
        .collect();
    charged.sort_unstable();
    charged
}

/// The carried events of a failover that then fails never take effect in
/// the standby: imported, they wait unseen by b's relays (b's outbox holds
/// none, b's payment provider charges nothing, however long b's relay runs)
/// while the failover runs; when it fails they are erased with the import.
/// The region that keeps its tenants delivers them itself when it returns,
/// so an effect made by b too would be a second one (a second inventory
/// reservation: only payments have the provider's key to dedupe).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_failovers_carried_events_take_no_effect_in_the_standby() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let token = create_tenant(&nodes[0].api).await;
    for n in 0..ORDERS {
        let (status, _, body) = order(&nodes[0].api, &token, &format!("order-{n}")).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }
    let (b, _, import_url) = lose_a_and_begin_failover(&mut nodes, "fo-6").await;
    let (status, answer) = internal(reqwest::Method::POST, import_url).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["events"], json!(ORDERS), "{answer}");
    // b's relays had many rounds (they poll every 200 ms): nothing carried
    // is theirs to deliver yet.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(charged_orders(&psp).await, Vec::<String>::new());
    assert_eq!(outbox_ids(b.store()).await, Vec::<String>::new());
    let tenant = TenantId::parse(TENANT).unwrap();
    assert_eq!(b.store().held_events(&tenant).unwrap(), ORDERS as u64);
    write(
        &b,
        Request::FailFailover {
            operation_id: "fo-6".into(),
            error: "given up by the test".into(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    wait_until("b erased the failed import", || async {
        b.store().guard(&tenant).unwrap().is_none()
            && b.store().tenant_entry_count(&tenant).unwrap() == 0
    })
    .await;
    assert_eq!(b.store().held_events(&tenant).unwrap(), 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(charged_orders(&psp).await, Vec::<String>::new());
    assert_eq!(outbox_ids(b.store()).await, Vec::<String>::new());
    assert_eq!(b.registry().tenant(TENANT).unwrap().home_region, "a");
    drop(b);
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

/// The order id of a 201 answer's body.
fn order_id_of(body: &[u8]) -> String {
    let body: Value = serde_json::from_slice(body).unwrap();
    body["order_id"].as_str().unwrap().to_owned()
}

/// Issue 12: a region that comes back after a failover away from it takes no
/// downstream effect for the tenants it lost. Region a takes three orders
/// its standby b copies (a's inventory consumer handles them, its payments
/// cannot reach a provider), then two more while b is down: those are the
/// suffix the failover loses. a fails, b comes back, and the failover
/// carries the three undelivered payments into b, which charges them. A
/// client retries one lost order against b (a new order there). Then a comes
/// back, now with the payment provider reachable. Its outbox still holds all
/// five payments past its payments cursor: the three are b's (b charged
/// them; a charging them again is a second effect in a's store, and a second
/// charge wherever the provider's key dedupe does not reach), the two lost
/// ones are orphans, listed for a person to compensate, and the retried one
/// is already charged by b. So a charges nothing: every surviving order has
/// exactly one charge (b's), the orphans none (`charged: false`), and a's
/// store holds no payment effect for an event b carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_returning_region_takes_no_effect_for_the_tenants_it_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (psp, psp_stop) = provider(dir.path()).await;
    let mut nodes = start_cluster(dir.path(), &psp, &["a", "b", "c"]).await;
    for node in &nodes {
        wait_until("every node ready", || ready(&node.api)).await;
    }
    let members = nodes[0].node.config().members.clone();
    let a_api = nodes[0].api.clone();
    let token = create_tenant(&a_api).await;
    let mut carried = Vec::new();
    for n in 0..ORDERS {
        let (status, _, body) = order(&a_api, &token, &format!("order-{n}")).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        carried.push(order_id_of(&body));
    }
    let (a, b) = (nodes[0].node.clone(), nodes[1].node.clone());
    wait_until("a's inventory consumer is done", || async {
        a.store().cursor(Consumer::Inventory).await.unwrap() >= ORDERS as u64
    })
    .await;
    let a_applied = a.store().applied_index().unwrap();
    wait_until("b's copy holds all of a", || async {
        let copy = b.standby_copy("a").unwrap();
        copy.store.applied_index().unwrap() >= a_applied
    })
    .await;

    // b goes down: what a acknowledges now never reaches b's copy.
    drop(b);
    let b_stopped = nodes.remove(1).stop_for_restart().await;
    let mut lost = Vec::new();
    for n in 0..2 {
        let (status, _, body) = order_settled(&a_api, &token, &format!("lost-{n}")).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        lost.push(order_id_of(&body));
    }

    // a fails; b comes back and the failover re-homes the tenant in b.
    drop(a);
    let a_stopped = nodes.remove(0).stop_for_restart().await;
    nodes.insert(
        0,
        restart_node(
            dir.path(),
            &members,
            b_stopped,
            ProviderOfA::Unreachable(&psp),
        )
        .await,
    );
    let (b, b_api) = (nodes[0].node.clone(), nodes[0].api.clone());
    wait_until("b ready without a", || ready(&b_api)).await;
    wait_registry_without_a(&b).await;
    write(
        &b,
        Request::BeginFailover {
            operation_id: "fo-7".into(),
            region: "a".into(),
            to: "b".into(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    let import_url = format!("{b_api}/internal/v1/failover/a/import?operation_id=fo-7&source=2");
    let (status, imported) = internal(reqwest::Method::POST, import_url).await;
    assert_eq!(status, 200, "{imported}");
    assert_eq!(imported["events"], json!(ORDERS), "{imported}");
    let at = imported["at"].as_u64().unwrap();
    write(
        &b,
        Request::CompleteFailover {
            operation_id: "fo-7".into(),
            at,
            estimated_lost: LostEstimate::default(),
            now_ms: keyhold_server_now(),
        },
    )
    .await;
    let tenant = TenantId::parse(TENANT).unwrap();
    wait_until("b's store owns the tenant", || async {
        b.store().guard(&tenant).unwrap() == Some(TenantGuard::Owned { epoch: 2 })
    })
    .await;
    // The client of lost-1 retries it against the new home.
    let (status, replayed, body) = order_settled(&b_api, &token, "lost-1").await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert!(!replayed, "b never had lost-1");
    let retried = order_id_of(&body);
    wait_until("b's payments consumer is done", || async {
        let head = b.store().outbox_after(0, 1_000).await.unwrap().len() as u64;
        b.store().cursor(Consumer::Payments).await.unwrap() >= head
    })
    .await;

    // a comes back, able to charge now, and reconciles.
    nodes.push(
        restart_node(
            dir.path(),
            &members,
            a_stopped,
            ProviderOfA::Reachable(&psp),
        )
        .await,
    );
    let a = nodes.last().unwrap().node.clone();
    wait_until("a's reconciliation is done", || async {
        a.store()
            .reconciliation("fo-7")
            .unwrap()
            .is_some_and(|r| r.done)
    })
    .await;
    let report = a.store().reconciliation("fo-7").unwrap().unwrap();
    assert_eq!(report.orphans.len(), lost.len(), "{report:?}");
    for (orphan, order_id) in report.orphans.iter().zip(&lost) {
        assert_eq!(orphan.order_id.as_ref(), Some(order_id), "{orphan:?}");
        assert!(
            !orphan.charged,
            "a charged an orphan after losing its tenant: {orphan:?}"
        );
    }
    assert_eq!(report.orphans[1].duplicate_of.as_ref(), Some(&retried));
    // One charge per surviving order, made by b; none for an orphan.
    let mut expected: Vec<String> = carried.iter().chain([&retried]).cloned().collect();
    expected.sort_unstable();
    assert_eq!(charged_orders(&psp).await, expected);
    for order_id in &carried {
        let event_id = format!("evt_{order_id}");
        assert!(
            !a.store()
                .is_processed(Consumer::Payments, &event_id)
                .await
                .unwrap(),
            "a took the payment effect of {event_id}, which b carried and charged"
        );
    }

    drop((a, b));
    for node in nodes {
        node.stop().await;
    }
    let _ = psp_stop.send(());
}

fn keyhold_server_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
