//! End-to-end tests of planned moves and of the inter-node boundary they rely on
//! (contract section 8, last two bullets), against the real binary: inter-node
//! endpoints (Raft, move copy) refuse every caller without the cluster's node
//! credential and change nothing; a client's `Keyhold-Epoch` has no effect; an
//! old export page replayed after a move is refused; a tenant with large claim
//! responses moves; an old home killed right after fencing, whose move was
//! aborted meanwhile, serves the tenant again after its restart; of two racing
//! drivers exactly one wins and the new home's content equals the old one's; a
//! move cut short by a crash of the whole cluster resumes as soon as it is back;
//! moves under load, one with its driver killed, lose and duplicate nothing
//! (judged by the history checker).

mod common;

use common::{assert_order, order_body, unique, Cluster, ServeCluster};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const REGIONS: [&str; 3] = ["a", "b", "c"];

/// A raw answer from a listener that is not an API node (no common checks).
fn raw(rb: reqwest::blocking::RequestBuilder) -> (u16, String, String) {
    let r = rb.send().expect("the listener answers");
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, content_type, r.text().unwrap_or_default())
}

/// Inter-node (1): Raft and move endpoints answer 401 `unauthenticated` to the
/// admin token, a tenant token, no credential and a wrong one; nothing changes
/// (the tenant still executes, the registry still has its leader and tenants);
/// the right credential opens them. A client's `Keyhold-Epoch` is ignored.
#[test]
fn inter_node_endpoints_need_the_node_credential() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let tenant = cluster.tenant("a");
    let credential = std::fs::read_to_string(cluster.data_dir().join("node-credential"))
        .expect("keyhold up keeps the node credential in its data dir")
        .trim()
        .to_owned();
    assert!(credential.len() >= 32);
    assert_ne!(credential, admin);
    let http = reqwest::blocking::Client::new();
    let tenants_before = cluster.api("b").get(
        &format!("/admin/v1/tenants/{}", tenant.tenant_id),
        Some(&admin),
    );
    tenants_before.assert_status(200);

    let wrong = "wrong-node-credential-0123456789abcdef";
    type Caller<'a> = (
        &'a str,
        Box<dyn Fn(reqwest::blocking::RequestBuilder) -> reqwest::blocking::RequestBuilder + 'a>,
    );
    let callers: Vec<Caller> = vec![
        ("nobody", Box::new(|rb| rb)),
        ("the admin token", Box::new(|rb| rb.bearer_auth(&admin))),
        (
            "a tenant token",
            Box::new(|rb| rb.bearer_auth(&tenant.token)),
        ),
        (
            "a wrong credential",
            Box::new(|rb| rb.header("keyhold-node-credential", wrong)),
        ),
        (
            "the admin token as credential",
            Box::new(|rb| rb.header("keyhold-node-credential", &admin)),
        ),
    ];
    let t = &tenant.tenant_id;
    for (i, region) in REGIONS.iter().enumerate() {
        let raft = format!(
            "http://127.0.0.1:{}",
            cluster.base_port + common::RAFT_PORT_OFFSET + i as u16
        );
        let api = cluster.region(region).api_url.clone();
        for (who, with) in &callers {
            let region_group = format!("region-{region}");
            let rpcs = ["append", "vote", "snapshot", "write"]
                .map(|rpc| ("registry", rpc))
                .into_iter()
                .chain(["append", "vote", "snapshot"].map(|rpc| (region_group.as_str(), rpc)));
            for (group, rpc) in rpcs {
                let url = format!("{raft}/raft/{group}/{rpc}");
                let (status, content_type, body) = raw(with(http.post(url)).body(vec![0u8; 8]));
                assert_eq!(status, 401, "{group} {rpc} on {region} from {who}: {body}");
                assert_eq!(content_type, "application/problem+json");
                assert!(body.contains("/problems/unauthenticated"), "{body}");
            }
            let internal = [
                http.post(format!(
                    "{api}/internal/v1/moves/{t}/fence?registry_index=0"
                )),
                http.get(format!(
                    "{api}/internal/v1/moves/{t}/export?max=10&bytes_max=65536"
                )),
                http.post(format!("{api}/internal/v1/moves/{t}/import"))
                    .body(vec![0u8]),
                http.post(format!(
                    "{api}/internal/v1/moves/{t}/track?registry_index=0"
                )),
                http.get(format!(
                    "{api}/internal/v1/moves/{t}/changes?bytes_max=65536"
                )),
                http.post(format!(
                    "{api}/internal/v1/moves/{t}/pull?registry_index=0&pass=full"
                )),
            ];
            for rb in internal {
                let api = cluster.api(region);
                let r = api.send(with(rb));
                r.assert_problem(401, "unauthenticated");
            }
        }
    }
    // Nothing changed: the tenant is still active at home, and executes there.
    let after = cluster
        .api("b")
        .get(&format!("/admin/v1/tenants/{t}"), Some(&admin));
    assert_eq!(after.json(), tenants_before.json());
    let coid = unique("co");
    let r = cluster
        .api("a")
        .create_order(&tenant.token, &unique("k"), &order_body(&coid, 7));
    assert_order(&r, 201, &coid, 7);

    // The right credential opens an internal endpoint (export reads only).
    let api = cluster.region("a").api_url.clone();
    let (status, _, _) = raw(http
        .get(format!(
            "{api}/internal/v1/moves/{t}/export?max=10&bytes_max=65536"
        ))
        .header("keyhold-node-credential", &credential));
    assert_eq!(status, 200);
    // And the region group's Raft routes, mounted beside the registry's: an empty
    // body does not decode (400), which only a matched, authorised route says.
    let raft_a = format!(
        "http://127.0.0.1:{}",
        cluster.base_port + common::RAFT_PORT_OFFSET
    );
    let (status, _, body) = raw(http
        .post(format!("{raft_a}/raft/region-a/vote"))
        .header("keyhold-node-credential", &credential)
        .body(Vec::<u8>::new()));
    assert_eq!(status, 400, "{body}");

    // A client's Keyhold-Epoch changes nothing: sent to the home or to another
    // region, with any value, the order is placed and executed as usual.
    for via in REGIONS {
        for epoch in ["0", "1", "99"] {
            let coid = unique("co");
            let api = cluster.api(via).expecting("a");
            let rb = api
                .order_rb(&tenant.token, &unique("k"), &order_body(&coid, 8))
                .header("keyhold-epoch", epoch);
            let r = api.send(rb);
            assert_order(&r, 201, &coid, 8);
        }
        // A wrong credential on a tenant route is refused, never trusted.
        let api = cluster.api(via);
        let rb = api
            .order_rb(&tenant.token, &unique("k"), &order_body(&unique("co"), 9))
            .header("keyhold-epoch", "1")
            .header("keyhold-node-credential", wrong);
        api.send(rb).assert_problem(401, "unauthenticated");
    }
}

/// `POST /admin/v1/tenants/{id}/move` that must be accepted; the operation id.
#[track_caller]
fn start_move(api: &common::Api, admin: &str, tenant_id: &str, to: &str) -> String {
    let r = api.post_json(
        &format!("/admin/v1/tenants/{tenant_id}/move"),
        Some(admin),
        &serde_json::json!({ "to": to }).to_string(),
    );
    r.assert_status(202);
    r.json()["operation_id"]
        .as_str()
        .expect("operation_id")
        .to_owned()
}

/// Polls the operation until it is `done` or `failed`; returns its last view.
fn wait_finished(api: &common::Api, admin: &str, op: &str, timeout: Duration) -> Value {
    common::poll(timeout, &format!("operation {op} to finish"), || {
        let r = api.get(&format!("/admin/v1/operations/{op}"), Some(admin));
        r.assert_status(200);
        let j = r.json();
        matches!(j["state"].as_str(), Some("done" | "failed")).then_some(j)
    })
}

/// The node credential `keyhold up` keeps in its data dir.
fn node_credential(cluster: &Cluster) -> String {
    std::fs::read_to_string(cluster.data_dir().join("node-credential"))
        .expect("keyhold up keeps the node credential in its data dir")
        .trim()
        .to_owned()
}

/// Every page of a tenant's export from one node (with the node credential).
fn export_pages(api_url: &str, credential: &str, tenant_id: &str) -> Vec<Vec<u8>> {
    let http = reqwest::blocking::Client::new();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{api_url}/internal/v1/moves/{tenant_id}/export?bytes_max=65536");
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let r = http
            .get(url)
            .header("keyhold-node-credential", credential)
            .send()
            .expect("export answers");
        assert_eq!(r.status().as_u16(), 200);
        let next = r
            .headers()
            .get("keyhold-next-cursor")
            .map(|v| v.to_str().expect("hex").to_owned());
        pages.push(r.bytes().expect("page").to_vec());
        match next {
            Some(n) => after = Some(n),
            None => return pages,
        }
    }
}

fn claim_body(key: &str, fingerprint: &str) -> String {
    json!({"operation": "POST:/v1/payments", "key": key, "fingerprint": fingerprint, "lease_ms": 3_600_000})
        .to_string()
}

fn complete_body(key: &str, owner_token: &str, body: Value) -> String {
    json!({
        "operation": "POST:/v1/payments", "key": key, "owner_token": owner_token,
        "outcome": "SUCCEEDED",
        "response": {"status": 201, "headers": {}, "body": body},
        "resource_id": key,
    })
    .to_string()
}

/// Moves (1): an export page of the old home, replayed to the new home's import
/// after the move finished (a stale driver's late import), is refused with 409
/// and changes nothing: a claim completed at the new home stays completed. On
/// the old code the import took the page and put the claim back to PROCESSING
/// (review defect 2).
#[test]
fn an_old_page_replayed_after_the_move_is_refused_and_changes_nothing() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let credential = node_credential(&cluster);
    let tenant = cluster.create_tenant("a", json!({}));
    let t = tenant.tenant_id.clone();
    let key = unique("job");
    let r = cluster
        .api("a")
        .post_json("/v1/claims", Some(&tenant.token), &claim_body(&key, "fp"));
    r.assert_status(201);
    let owner = r.json()["owner_token"].as_str().expect("owner").to_owned();
    let coid = unique("co");
    let order_key = unique("k");
    let first = cluster
        .api("a")
        .create_order(&tenant.token, &order_key, &order_body(&coid, 5));
    assert_order(&first, 201, &coid, 5);

    let op = start_move(&cluster.api("b"), &admin, &t, "b");
    let done = wait_finished(&cluster.api("b"), &admin, &op, Duration::from_secs(30));
    assert_eq!(done["state"], "done", "{done}");
    // The old home still holds the tenant as it was when fenced.
    let pages = export_pages(&cluster.region("a").api_url, &credential, &t);
    // At the new home, the claim's owner completes it.
    let b = cluster.api("b");
    b.post_json(
        "/v1/claims/complete",
        Some(&tenant.token),
        &complete_body(&key, &owner, json!({"paid": true})),
    )
    .assert_status(200);

    // The replayed pages, with the node credential and the finished move's scope.
    let http = reqwest::blocking::Client::new();
    let import = format!(
        "{}/internal/v1/moves/{t}/import?operation_id={op}&epoch=1&generation=1&registry_index=0",
        cluster.region("b").api_url
    );
    for page in pages {
        let r = b.send(
            http.post(&import)
                .header("keyhold-node-credential", &credential)
                .body(page),
        );
        r.assert_problem(409, "conflict");
    }
    // Nothing changed: the claim replays completed, the order replays, at b.
    let replay = b.post_json("/v1/claims", Some(&tenant.token), &claim_body(&key, "fp"));
    replay.assert_status(200);
    assert_eq!(replay.json()["state"], "SUCCEEDED");
    assert_eq!(replay.json()["response"]["body"], json!({"paid": true}));
    let again = b
        .expecting("b")
        .create_order(&tenant.token, &order_key, &order_body(&coid, 5));
    assert_eq!((again.status, &again.body), (201, &first.body));
}

/// Moves (2): a tenant with 1,100 claims holding 60 KiB responses (more than
/// 64 MiB in all) moves: pages are sized by bytes, and every response replays
/// byte-identically from the new home. On the old code a 2,000-entry page
/// exceeded the 64 MiB import limit, the import answered 413 and the move
/// failed (review defect 5).
#[test]
fn a_tenant_with_large_claim_responses_moves() {
    // 66 MB written as fast as eight clients can: the debug build's standby
    // trails by more than the default 1 s `max_standby_lag` on a busy 2-core
    // machine, and a's writes would answer 503 `standby-unreachable` (as
    // designed) where this test, about paging a move by bytes, expects each
    // to be answered.
    let cluster = Cluster::start("a,b,c", &["--max-standby-lag", "60s"]);
    let admin = cluster.info.admin_token.clone();
    let tenant = cluster.tenant("a");
    const CLAIMS: usize = 1_100;
    const THREADS: usize = 8;
    let filler = "x".repeat(60 * 1024);
    let prefix = unique("big");
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let (api, tenant, filler, prefix) = (cluster.api("a"), &tenant, &filler, &prefix);
            s.spawn(move || {
                for i in (th..CLAIMS).step_by(THREADS) {
                    let key = format!("{prefix}-{i}");
                    let r =
                        api.post_json("/v1/claims", Some(&tenant.token), &claim_body(&key, "fp"));
                    r.assert_status(201);
                    let owner = r.json()["owner_token"].as_str().expect("owner").to_owned();
                    let body = json!({"i": i, "filler": filler});
                    api.post_json(
                        "/v1/claims/complete",
                        Some(&tenant.token),
                        &complete_body(&key, &owner, body),
                    )
                    .assert_status(200);
                }
            });
        }
    });
    let moving = std::time::Instant::now();
    let op = start_move(&cluster.api("c"), &admin, &tenant.tenant_id, "b");
    // 66 MB of responses: ~27 s with release builds, but this test runs the
    // debug binary beside the file's other tests, where the same move took up
    // to ~120 s on the 2-core CI machine. The bound is liveness, not speed
    // (docs/benchmarks.md holds the move's timings).
    let done = wait_finished(&cluster.api("c"), &admin, &op, Duration::from_secs(300));
    assert_eq!(done["state"], "done", "{done}");
    // For comparing builds (run with --nocapture): the move alone, without
    // the writes before it.
    eprintln!(
        "the move of 66 MB took {:.1} s",
        moving.elapsed().as_secs_f64()
    );
    let b = cluster.api("b");
    for i in (0..CLAIMS).step_by(37).chain([CLAIMS - 1]) {
        let key = format!("{prefix}-{i}");
        let r = b.post_json("/v1/claims", Some(&tenant.token), &claim_body(&key, "fp"));
        r.assert_status(200);
        let j = r.json();
        assert_eq!(j["state"], "SUCCEEDED");
        assert_eq!(j["response"]["body"], json!({"i": i, "filler": filler}));
    }
}

/// Moves (3): the old home dies right after its store fenced the tenant (the
/// fault hook aborts the process there), so the driver aborts the move while
/// the old home is down. Restarted, the old home lifts its own fence from the
/// registry (the move ended, it owns the tenant at a later epoch): the tenant
/// gets 201 again through every node, with no manual step. On the old code the
/// fence was lifted by one HTTP call to the dead node, and the tenant answered
/// 503 `tenant-moving` forever (review defect 3).
#[test]
fn an_old_home_down_when_its_move_was_aborted_lifts_its_fence_after_restart() {
    let mut sc = ServeCluster::start(&["a", "b", "c"], "");
    let admin = sc.admin_token.clone();
    let (a, b) = (sc.index("a"), sc.index("b"));
    let tenant = sc.create_tenant(b, "a");
    let coid = unique("co");
    let key = unique("k");
    let first = common::poll(Duration::from_secs(10), "the tenant on a", || {
        let r = sc
            .api(a)
            .expecting("a")
            .create_order(&tenant.token, &key, &order_body(&coid, 3));
        (r.status == 201).then_some(r)
    });
    assert_order(&first, 201, &coid, 3);

    sc.members[a]
        .env
        .push(("KEYHOLD_FAULT_ABORT_AFTER_FENCE".into(), "1".into()));
    sc.kill9(a);
    sc.restart(a);
    sc.wait_ready(a, Duration::from_secs(20));
    let op = start_move(&sc.api(b), &admin, &tenant.tenant_id, "b");
    let finished = wait_finished(&sc.api(b), &admin, &op, Duration::from_secs(60));
    assert_eq!(finished["state"], "failed", "{finished}");
    assert!(sc.exited(a).is_some(), "the old home died after fencing");

    // Back without the fault hook: no call lifts the fence; the node must.
    sc.members[a].env.clear();
    sc.kill9(a);
    sc.restart(a);
    sc.wait_ready(a, Duration::from_secs(20));
    for via in [a, b, sc.index("c")] {
        let api = sc.api(via).expecting("a");
        let coid = unique("co");
        let r = common::poll(
            Duration::from_secs(10),
            "the tenant served again after the aborted move",
            || {
                let r = api.create_order(&tenant.token, &unique("k"), &order_body(&coid, 4));
                match r.status {
                    201 => Some(r),
                    503 => {
                        r.assert_problem(503, "tenant-moving");
                        None
                    }
                    _ => panic!("unexpected {} {}", r.status, r.text()),
                }
            },
        );
        assert_order(&r, 201, &coid, 4);
    }
    let again = sc
        .api(b)
        .expecting("a")
        .create_order(&tenant.token, &key, &order_body(&coid, 3));
    assert_eq!((again.status, &again.body), (201, &first.body));
}

/// `count` orders of `tenant` created at member `home`: key, body and answer.
fn orders_at(
    sc: &ServeCluster,
    home: usize,
    tenant: &common::Tenant,
    count: u64,
) -> Vec<(String, String, common::Resp)> {
    let region = sc.members[home].region.clone();
    (0..count)
        .map(|n| {
            let (key, coid) = (unique("k"), unique("co"));
            let body = order_body(&coid, 100 + n);
            let r = common::poll(Duration::from_secs(10), "the tenant at home", || {
                let r = sc
                    .api(home)
                    .expecting(&region)
                    .create_order(&tenant.token, &key, &body);
                (r.status == 201).then_some(r)
            });
            (key, body, r)
        })
        .collect()
}

/// Every order in `made` replays byte-identically through member `via`, executed
/// by `region` (the tenant's home now).
#[track_caller]
fn assert_replayed(
    sc: &ServeCluster,
    via: usize,
    region: &str,
    tenant: &common::Tenant,
    made: &[(String, String, common::Resp)],
) {
    for (key, body, first) in made {
        let again = sc
            .api(via)
            .expecting(region)
            .create_order(&tenant.token, key, body);
        assert_eq!((again.status, &again.body), (201, &first.body));
    }
}

/// Restarts member `i` with its move drivers stalling `pause_ms` after the fence.
fn restart_with_driver_pause(sc: &mut ServeCluster, i: usize, pause_ms: u64) {
    sc.members[i]
        .env
        .push(("KEYHOLD_FAULT_DRIVER_PAUSE_MS".into(), pause_ms.to_string()));
    sc.kill9(i);
    sc.restart(i);
    sc.wait_ready(i, Duration::from_secs(20));
}

/// Moves: a move whose accepting node dies before its driver took the lease
/// (chaos seed 21: the cluster killed right after the 202). No node holds the
/// lease, so no node resumes it as its own; the registry leader's node must
/// start a driver after a short grace, not after a whole lease. Failed on the
/// old code: the move waited `move_driver_lease` (30 s) from its start.
#[test]
fn a_move_never_leased_before_a_crash_is_driven_soon_after_the_restart() {
    let mut sc = ServeCluster::start(&["a", "b", "c"], "move_driver_lease = \"30s\"");
    let (a, b, c) = (sc.index("a"), sc.index("b"), sc.index("c"));
    let tenant = sc.create_tenant(c, "a");
    let made = orders_at(&sc, a, &tenant, 5);
    let op = start_faulted_move(
        &mut sc,
        c,
        "KEYHOLD_FAULT_DRIVER_START_DELAY_MS",
        &tenant.tenant_id,
        "b",
    );
    let (done, took) = restart_all_and_time_move(&mut sc, &op, b);
    assert_eq!(done["state"], "done", "{done}");
    assert!(
        took < Duration::from_secs(10),
        "the move took {took:?} after the restart: it waited for a lease nobody held"
    );
    assert_replayed(&sc, b, "b", &tenant, &made);
}

/// Starts a move of `tenant_id` to `to` through member `driver`, restarted so
/// that its driver stalls after the fence; returns once it stalls, with the
/// fault cleared for the member's next start.
fn start_stalled_move(sc: &mut ServeCluster, driver: usize, tenant_id: &str, to: &str) -> String {
    start_faulted_move(sc, driver, "KEYHOLD_FAULT_DRIVER_PAUSE_MS", tenant_id, to)
}

/// Starts a move of `tenant_id` to `to` through member `driver`, restarted with
/// the driver fault hook `hook` set to 120 s; returns once the hook took effect
/// (the node logs "<hook> is set"), with the fault cleared for its next start.
fn start_faulted_move(
    sc: &mut ServeCluster,
    driver: usize,
    hook: &str,
    tenant_id: &str,
    to: &str,
) -> String {
    sc.members[driver].env.push((hook.into(), "120000".into()));
    sc.kill9(driver);
    sc.restart(driver);
    sc.wait_ready(driver, Duration::from_secs(20));
    let op = start_move(&sc.api(driver), &sc.admin_token, tenant_id, to);
    let effect = format!("{hook} is set");
    common::poll(Duration::from_secs(20), "the driver fault", || {
        sc.members[driver]
            .stderr_tail()
            .contains(&effect)
            .then_some(())
    });
    sc.members[driver].env.clear();
    op
}

/// SIGKILLs every member, restarts them all, and returns move `op`'s final
/// state as seen through member `via` with the time it took from the moment
/// every member was ready again.
fn restart_all_and_time_move(sc: &mut ServeCluster, op: &str, via: usize) -> (Value, Duration) {
    let all: Vec<usize> = (0..sc.members.len()).collect();
    for &i in &all {
        sc.kill9(i);
    }
    for &i in &all {
        sc.restart(i);
    }
    for &i in &all {
        sc.wait_ready(i, Duration::from_secs(30));
    }
    let back = std::time::Instant::now();
    let done = wait_finished(&sc.api(via), &sc.admin_token, op, Duration::from_secs(60));
    (done, back.elapsed())
}

/// The concatenated export pages of a tenant on one node (its stored content).
fn content(api_url: &str, credential: &str, tenant_id: &str) -> Vec<u8> {
    export_pages(api_url, credential, tenant_id).concat()
}

/// Moves (4): two drivers race. The node that accepted the move stalls after
/// the fence without renewing its lease (fault hook), so the registry leader's
/// node takes the move over once the lease expired and completes it; when the
/// first driver wakes, its imports and its FinishMove are refused. Exactly one
/// driver wins, and the new home's content equals the old home's.
#[test]
fn two_drivers_race_one_wins_and_the_new_home_equals_the_old() {
    let mut sc = ServeCluster::start(&["a", "b", "c"], "move_driver_lease = \"2s\"");
    let admin = sc.admin_token.clone();
    let credential = sc.node_credential.clone();
    let leader = common::poll(Duration::from_secs(10), "a registry leader", || {
        sc.leader_seen_by(0)
    });
    let leader = sc.index_of_id(leader);
    // The first driver runs on a node that is not the leader (whose watchdog
    // takes over); the tenant moves from a to b.
    let slow = (0..3).find(|&i| i != leader).expect("a follower");
    let tenant = sc.create_tenant(slow, "a");
    let (a, b) = (sc.index("a"), sc.index("b"));
    let made = orders_at(&sc, a, &tenant, 20);
    restart_with_driver_pause(&mut sc, slow, 8_000);
    let op = start_move(&sc.api(slow), &admin, &tenant.tenant_id, "b");
    let done = wait_finished(&sc.api(leader), &admin, &op, Duration::from_secs(60));
    assert_eq!(done["state"], "done", "{done}");

    // The first driver wakes (8 s after the fence) and is refused everywhere.
    let superseded = || {
        let r = sc.api(slow).get("/metrics", None);
        r.text()
            .lines()
            .find(|l| l.starts_with("keyhold_move_driver_superseded_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    common::poll(
        Duration::from_secs(30),
        "the stale driver to be refused",
        || superseded().filter(|n| *n >= 1.0),
    );
    let op_now = sc
        .api(b)
        .get(&format!("/admin/v1/operations/{op}"), Some(&admin));
    assert_eq!(
        op_now.json()["state"],
        "done",
        "the stale driver changed nothing"
    );
    let old = content(
        &format!("http://{}", sc.members[a].api_addr),
        &credential,
        &tenant.tenant_id,
    );
    let new = content(
        &format!("http://{}", sc.members[b].api_addr),
        &credential,
        &tenant.tenant_id,
    );
    assert!(!old.is_empty());
    assert_eq!(
        new, old,
        "the new home holds exactly the old home's content"
    );
    assert_replayed(&sc, leader, "b", &tenant, &made);
}

/// Moves (5): the whole cluster is killed while a move runs (its driver is
/// stalled after the fence, holding a 30 s lease) and restarted: the node that
/// held the lease resumes the move as soon as it is back, so the move is done
/// and the tenant answers 201 at its new home within seconds, well before the
/// lease would have expired. On the old code nobody drove the move until the
/// registry leader's watchdog saw the lease expire (chaos seed 1: the tenant
/// answered 503 `tenant-moving` for about a minute after the restart).
#[test]
fn a_move_cut_short_by_a_crash_resumes_as_soon_as_the_cluster_is_back() {
    let mut sc = ServeCluster::start(&["a", "b", "c"], "move_driver_lease = \"30s\"");
    let (a, b, c) = (sc.index("a"), sc.index("b"), sc.index("c"));
    let tenant = sc.create_tenant(c, "a");
    let made = orders_at(&sc, a, &tenant, 10);
    // The driver runs on c, neither end of the move, and stalls after the fence.
    let op = start_stalled_move(&mut sc, c, &tenant.tenant_id, "b");
    let (done, took) = restart_all_and_time_move(&mut sc, &op, b);
    assert_eq!(done["state"], "done", "{done}");
    assert!(
        took < Duration::from_secs(10),
        "the move took {took:?} after the restart: it waited for the lease"
    );
    for via in [a, b, c] {
        let (coid, key) = (unique("co"), unique("k"));
        let api = sc.api(via).expecting("b");
        // A replica that has not applied the move's end yet answers 503.
        let r = common::poll(Duration::from_secs(5), "the tenant at b", || {
            let r = api.create_order(&tenant.token, &key, &order_body(&coid, 9));
            if r.status == 503 {
                r.assert_problem(503, "tenant-moving");
                return None;
            }
            Some(r)
        });
        assert_order(&r, 201, &coid, 9);
    }
    assert_replayed(&sc, b, "b", &tenant, &made);
}

/// Moves (6), end to end under load: clients keep creating and replaying
/// orders of the tenant through every region while it moves a → b, and while
/// it moves back b → a with its driver's node killed mid-move (the driver
/// stalled after the fence, then SIGKILLed and restarted: it resumes the
/// move). The history checker then reads the final state: zero duplicates
/// (one order per client_order_id), no acknowledged order missing or
/// changed, every replay byte-identical.
#[test]
fn moves_under_load_through_every_region_lose_and_duplicate_nothing() {
    let mut sc = ServeCluster::start(&["a", "b", "c"], "");
    let admin = sc.admin_token.clone();
    let (a, b, c) = (sc.index("a"), sc.index("b"), sc.index("c"));
    let tenant = sc.create_tenant(c, "a");
    orders_at(&sc, a, &tenant, 1);
    let apis: Vec<(String, String)> = sc
        .members
        .iter()
        .map(|m| (m.region.clone(), format!("http://{}", m.api_addr)))
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let recorder = keyhold_checker::Recorder::new(1_000_000);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|client| {
            let load = common::load::LoadClient {
                client,
                apis: apis.clone(),
                tenants: vec![("t".to_owned(), tenant.token.clone())],
                twice_every: None,
                recorder: recorder.clone(),
                stop: stop.clone(),
            };
            runtime.spawn(load.run())
        })
        .collect();
    let answered = |status: u16| {
        recorder
            .history()
            .ops
            .iter()
            .filter(|op| op.outcome.answer().is_some_and(|(s, _)| s == status))
            .count()
    };
    common::poll(Duration::from_secs(20), "load before the moves", || {
        (answered(201) >= 200).then_some(())
    });

    let op = start_move(&sc.api(c), &admin, &tenant.tenant_id, "b");
    let done = wait_finished(&sc.api(c), &admin, &op, Duration::from_secs(60));
    assert_eq!(done["state"], "done", "{done}");
    let created = answered(201);
    common::poll(Duration::from_secs(20), "load at the new home", || {
        (answered(201) >= created + 200).then_some(())
    });

    // Back to a, driven by c, which stalls after the fence and is killed there.
    let op = start_stalled_move(&mut sc, c, &tenant.tenant_id, "a");
    sc.kill9(c);
    sc.restart(c);
    sc.wait_ready(c, Duration::from_secs(30));
    let done = wait_finished(&sc.api(b), &admin, &op, Duration::from_secs(20));
    assert_eq!(done["state"], "done", "{done}");
    let created = answered(201);
    common::poll(Duration::from_secs(20), "load back at the old home", || {
        (answered(201) >= created + 200).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        runtime.block_on(client).expect("a load client");
    }

    let target = keyhold_checker::Target {
        regions: apis,
        tokens: [("t".to_owned(), tenant.token.clone())].into(),
        admin_token: None,
        psp_url: None,
    };
    let (history, _) = common::load::judge(&runtime, &target, &recorder, 300);
    // Both homes answered: the load really ran across both moves.
    for region in ["a", "b"] {
        assert!(
            history.ops.iter().any(|op| op
                .outcome
                .json()
                .is_some_and(|j| j["home_region"] == region)),
            "no order answered from home {region}"
        );
    }
}
