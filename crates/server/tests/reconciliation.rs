//! A region that comes back after a failover away from it reconciles: three
//! regions of one node each, started in this process through
//! `keyhold_server::run_listening`, region a with b as its standby. Region a takes orders,
//! then stops; the failover is written into the registry by hand (`BeginFailover`
//! and `CompleteFailover` over the registry's write route, under the node
//! credential) with a position `at` below a's last orders, so those orders are
//! the suffix the failover lost (a region-survival tenant's order among them is
//! none: its answers wait for the standby, so it was never acknowledged). A
//! client's retry of one of them creates it again
//! in b. When a is back, its region leader publishes the report at
//! `GET /admin/v1/regions/a/reconciliation` (asked through another region's
//! node): the lost orders as orphans, not charged (the payment provider is
//! down until a has been back a while; a returning region charges nothing for
//! a tenant it lost, and the report waits until a's payments consumer has
//! looked each orphan's charge up at the provider), `duplicate_of` naming b's
//! order for the retried one. A move back while the report is pending fails (a refuses to import the
//! tenant over its stale data); once it is done a's store holds nothing of the
//! tenant, so a planned move brings the tenant back to a with b's orders and
//! none of the stale ones.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keyhold_netem::Parked;
use keyhold_registry::{LostEstimate, Request, NODE_CREDENTIAL_HEADER};
use keyhold_server::config::{Member, Start};
use keyhold_server::Config;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "reconciliation-admin-token-0123456789";
const CREDENTIAL: &str = "reconciliation-node-credential-0123456789";
/// Start-up, elections and replication on a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(30);
const FAILOVER: &str = "op_failover_a_to_b";

struct TestNode {
    api: String,
    member: Member,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), keyhold_server::Error>>,
}

/// A stopped node: its addresses held for its restart.
struct Stopped {
    member: Member,
    api: Parked,
    raft: Parked,
}

impl TestNode {
    async fn stop(mut self) -> Stopped {
        let _ = self.stop.take().expect("running").send(());
        self.task
            .await
            .expect("node task")
            .expect("node stopped cleanly");
        Stopped {
            api: Parked::at(&self.member.api_addr).await,
            raft: Parked::at(&self.member.raft_addr).await,
            member: self.member,
        }
    }
}

fn start_node(
    dir: &std::path::Path,
    member: &Member,
    members: &[Member],
    (api, raft): (Parked, Parked),
    psp_url: &str,
) -> TestNode {
    let node_dir = dir.join(format!("node-{}", member.id));
    let mut config = Config::new(&member.region, node_dir, ADMIN_TOKEN.into());
    config.regions = vec!["a".into(), "b".into(), "c".into()];
    config.standbys = [("a".to_string(), "b".to_string())].into_iter().collect();
    config.node_id = member.id;
    config.raft_listen = member.raft_addr.clone();
    config.members = members.to_vec();
    config.node_credential_file = Some(dir.join("node-credential"));
    config.start = Start::Create;
    config.psp_url = Some(psp_url.to_owned());
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
        api: api_url,
        member: member.clone(),
        stop: Some(stop),
        task,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn admin_get(api: &str, path: &str) -> (u16, Value) {
    let response = client()
        .get(format!("{api}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Polls `GET path` on `api` until `ready` holds for its 200 answer.
async fn admin_get_until(api: &str, path: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(response) = client()
            .get(format!("{api}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
        {
            if response.status() == 200 {
                let body: Value = response.json().await.unwrap();
                if ready(&body) {
                    return body;
                }
                assert!(Instant::now() < deadline, "{path} on {api}: {body}");
            }
        }
        assert!(Instant::now() < deadline, "{path} on {api} did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates an order of the tenant through `api` and returns its id.
async fn order(api: &str, token: &str, key: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let response = client()
            .post(format!("{api}/v1/orders"))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(&json!({
                "client_order_id": format!("co-{key}"),
                "cart_id": "cart-1",
                "amount": 1200,
                "currency": "EUR",
            }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        if status == 201 {
            return body["order_id"].as_str().unwrap().to_owned();
        }
        // A node that just started (or just learned the new home) may answer
        // 503 briefly; the key makes the retry safe.
        assert!(
            status == 503 && Instant::now() < deadline,
            "order {key}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /v1/orders/{order_id}` through `api`: its status and body.
async fn get_order(api: &str, token: &str, order_id: &str) -> (u16, Value) {
    let response = client()
        .get(format!("{api}/v1/orders/{order_id}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Moves the tenant to `to` through `api` and returns the operation once it
/// ended (done or failed).
async fn move_tenant(api: &str, to: &str) -> Value {
    let moved = client()
        .post(format!("{api}/admin/v1/tenants/shop/move"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "to": to }))
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status(), 202);
    let operation = moved.json::<Value>().await.unwrap()["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    admin_get_until(api, &format!("/admin/v1/operations/{operation}"), |op| {
        op["state"] == json!("done") || op["state"] == json!("failed")
    })
    .await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Writes `request` into the registry through the write route of the nodes'
/// Raft listeners: the leader commits it and answers `Ok` (bincode's tag 0
/// first), the others answer "forward to leader"; tries again until one
/// committed it.
async fn registry_write(raft_addrs: &[String], request: Request) {
    let body = keyhold_raftlog::codec::encode(&request).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        for addr in raft_addrs {
            let sent = client()
                .post(format!("http://{addr}/raft/registry/write"))
                .header(NODE_CREDENTIAL_HEADER, CREDENTIAL)
                .body(body.clone())
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            let Ok(response) = sent else { continue };
            if response.status() == 200 && response.bytes().await.unwrap().first() == Some(&0) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{request:?} not committed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates a tenant homed in a through `api` and returns its token.
async fn create_tenant(api: &str, tenant_id: &str) -> String {
    let created = client()
        .post(format!("{api}/admin/v1/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"tenant_id": tenant_id, "home_region": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    created.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_returning_region_lists_its_orphans_erases_them_and_takes_its_tenant_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("node-credential"), CREDENTIAL).unwrap();
    // The payment provider every region's payments consumer charges: down
    // until region a is back and has waited a while, so a charges nothing
    // before.
    let psp_parked = Parked::any();
    let psp = format!("http://{}", psp_parked.addr());
    let mut listeners = Vec::new();
    let mut members = Vec::new();
    for (id, region) in (1u64..).zip(["a", "b", "c"]) {
        let (api, raft) = (Parked::any(), Parked::any());
        members.push(Member {
            id,
            region: region.into(),
            api_addr: api.addr().to_string(),
            raft_addr: raft.addr().to_string(),
        });
        listeners.push((api, raft));
    }
    let mut nodes: Vec<TestNode> = members
        .iter()
        .zip(listeners)
        .map(|(m, l)| start_node(dir.path(), m, &members, l, &psp))
        .collect();
    let (a, b, c) = (
        nodes[0].api.clone(),
        nodes[1].api.clone(),
        nodes[2].api.clone(),
    );
    for api in [&a, &b, &c] {
        admin_get_until(api, "/admin/v1/cluster", |v| {
            v["registry"]["leader"].is_u64() && v["store"]["leads"] == json!(true)
        })
        .await;
    }
    // Before any failover there is nothing to reconcile.
    let (status, _) = admin_get(&c, "/admin/v1/regions/a/reconciliation").await;
    assert_eq!(status, 404);
    let (status, _) = admin_get(&c, "/admin/v1/regions/nowhere/reconciliation").await;
    assert_eq!(status, 404);

    let token = create_tenant(&a, "shop").await;
    // A region-survival tenant: its answers wait for the standby, so what a
    // wrote for it after `at` was never acknowledged and is no orphan.
    let vault = create_tenant(&a, "vault").await;
    let all_raft: Vec<String> = members.iter().map(|m| m.raft_addr.clone()).collect();
    let survival = Request::SetSurvival {
        tenant_id: "vault".into(),
        survival: keyhold_registry::Survival::Region,
    };
    registry_write(&all_raft, survival).await;
    for i in 0..3 {
        order(&a, &token, &format!("before-{i}")).await;
    }
    // The promoted copy held a's log up to here: what follows is the suffix.
    let (_, view) = admin_get(&a, "/admin/v1/cluster").await;
    let at = view["store"]["applied_index"].as_u64().unwrap();
    let mut lost = Vec::new();
    for i in 0..3 {
        lost.push(order(&a, &token, &format!("after-{i}")).await);
    }
    order(&a, &vault, "vault-after-0").await;

    // a is lost; the failover to b commits in the registry (b and c are a
    // majority of its voters).
    for order_id in &lost {
        let (_, body) = get_order(&a, &token, order_id).await;
        assert_eq!(body["status"], json!("CONFIRMED"), "charged early: {body}");
    }
    let a_stopped = nodes.remove(0).stop().await;
    let raft_addrs: Vec<String> = members[1..].iter().map(|m| m.raft_addr.clone()).collect();
    let begin = Request::BeginFailover {
        operation_id: FAILOVER.into(),
        region: "a".into(),
        to: "b".into(),
        now_ms: now_ms(),
    };
    registry_write(&raft_addrs, begin).await;
    let complete = Request::CompleteFailover {
        operation_id: FAILOVER.into(),
        at,
        estimated_lost: LostEstimate {
            commands: 3,
            seconds: 0.1,
        },
        now_ms: now_ms(),
    };
    registry_write(&raft_addrs, complete).await;
    admin_get_until(&c, &format!("/admin/v1/operations/{FAILOVER}"), |op| {
        op["state"] == json!("done")
    })
    .await;
    for api in [&b, &c] {
        admin_get_until(api, "/admin/v1/tenants/shop", |t| {
            t["home_region"] == json!("b")
        })
        .await;
    }
    // While a is away its reconciliation is pending.
    let pending = admin_get_until(&c, "/admin/v1/regions/a/reconciliation", |_| true).await;
    assert_eq!(pending["state"], json!("pending"), "{pending}");
    assert_eq!(pending["failover_operation_id"], json!(FAILOVER));

    // The client of the lost order after-1 retried it against the new home,
    // which created it again.
    let retried = order(&b, &token, "after-1").await;
    assert_ne!(retried, lost[1]);

    // a comes back on its data dir and reconciles.
    nodes.insert(
        0,
        start_node(
            dir.path(),
            &a_stopped.member,
            &members,
            (a_stopped.api, a_stopped.raft),
            &psp,
        ),
    );
    // Its payments consumer cannot look the lost orders' charges up yet: the
    // report waits, as `charged` is not final.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, waiting) = admin_get(&c, "/admin/v1/regions/a/reconciliation").await;
    assert_eq!(waiting["state"], json!("pending"), "{waiting}");
    assert_eq!(waiting["orphans"], json!([]), "{waiting}");
    // A move back now would meet a's stale data: a refuses the import and the
    // move fails, leaving the tenant in b.
    let early = move_tenant(&c, "a").await;
    assert_eq!(early["state"], json!("failed"), "{early}");
    let error = early["error"].as_str().unwrap_or("");
    assert!(error.contains("has not reconciled"), "{early}");
    admin_get_until(&c, "/admin/v1/tenants/shop", |t| {
        t["home_region"] == json!("b")
    })
    .await;
    let psp_listener = psp_parked.listen();
    let (stop_psp, psp_stopped) = oneshot::channel::<()>();
    let psp_task = tokio::spawn(keyhold_fakepsp::run(
        keyhold_fakepsp::PspConfig::new(dir.path().join("psp")),
        psp_listener,
        async move {
            let _ = psp_stopped.await;
        },
    ));
    let report = admin_get_until(&c, "/admin/v1/regions/a/reconciliation", |r| {
        r["state"] == json!("done")
    })
    .await;
    assert_eq!(report["failover_operation_id"], json!(FAILOVER));
    assert_eq!(report["at"], json!(at));
    let orphans = report["orphans"].as_array().unwrap();
    assert_eq!(orphans.len(), 3, "{report}");
    for (i, orphan) in orphans.iter().enumerate() {
        assert_eq!(orphan["tenant_id"], json!("shop"));
        assert_eq!(orphan["kind"], json!("order"));
        assert_eq!(orphan["idempotency_key"], json!(format!("after-{i}")));
        assert_eq!(orphan["order_id"], json!(lost[i]));
        assert_eq!(orphan["client_order_id"], json!(format!("co-after-{i}")));
        assert!(orphan["created_at"].is_string(), "{orphan}");
        // Nothing charged them before the loss, and a charges no orphan.
        assert_eq!(orphan["charged"], json!(false), "{orphan}");
        let duplicate = if i == 1 { json!(retried) } else { Value::Null };
        assert_eq!(orphan["duplicate_of"], duplicate, "{orphan}");
    }
    // Every node gives the same report (a's own from its store).
    let (_, from_a) = admin_get(&a, "/admin/v1/regions/a/reconciliation").await;
    assert_eq!(from_a, report);
    let (status, _) = admin_get(&c, "/admin/v1/regions/b/reconciliation").await;
    assert_eq!(status, 404);

    // a forwards the tenant to b: the retried order is served from there.
    let (status, body) = get_order(&a, &token, &retried).await;
    assert_eq!((status, &body["home_region"]), (200, &json!("b")), "{body}");

    // A planned move brings the tenant back to a, whose store kept nothing of
    // it: b's order arrives, the lost ones stay gone.
    let done = move_tenant(&c, "a").await;
    assert_eq!(done["state"], json!("done"), "{done}");
    admin_get_until(&a, "/admin/v1/tenants/shop", |t| {
        t["home_region"] == json!("a")
    })
    .await;
    let response = client()
        .get(format!("{c}/v1/orders/{retried}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["keyhold-region"], "a");
    for order_id in [&lost[0], &lost[2]] {
        let (status, body) = get_order(&c, &token, order_id).await;
        assert_eq!(status, 404, "a stale order came back: {body}");
    }
    let by_marker = client()
        .get(format!("{c}/v1/orders?client_order_id=co-after-0"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(by_marker.status(), 404);
    // And a takes the tenant's new orders again.
    order(&c, &token, "back-home").await;
    for node in nodes {
        node.stop().await;
    }
    let _ = stop_psp.send(());
    psp_task.await.unwrap().unwrap();
}
