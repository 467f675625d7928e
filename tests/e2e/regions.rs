//! End-to-end tests of regions (contract section 8, with the common rules of
//! section 2 and the order outcomes of section 4), against the real binary:
//! routing through every region of `keyhold up` to the tenant's home only
//! (orders, replays, a 30-request race spread over the regions, reads, claims,
//! admin API on every node); a planned tenant move under client load through all
//! regions (nothing lost, nothing executed twice, replays and markers keep
//! working, the new home executes, the operation and admin validation); repeated
//! moves back and forth (the operation readable at its `Location` at once, every
//! order following the tenant); stale epochs refused with 421; a node frozen
//! with SIGSTOP during a move that, thawed, forwards to the new home; and a
//! killed registry leader in a cluster of three
//! `keyhold serve --config` processes (re-election, routing, tenant creation,
//! rejoin after restart).

mod common;

use common::{
    assert_order, assert_same_order, order_body, unique, Api, Cluster, Resp, ServeCluster, Tenant,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const REGIONS: [&str; 3] = ["a", "b", "c"];

fn is_replay(r: &Resp) -> bool {
    r.header("idempotent-replayed").as_deref() == Some("true")
}

/// Sum of `keyhold_orders_total{outcome="new"}`: orders created by the whole
/// `keyhold up` process (its nodes share one metrics recorder).
/// Orders created in the whole cluster: the sum over every node's metrics
/// (each node is its own process with its own counters).
fn orders_created(nodes: &[Api]) -> u64 {
    nodes.iter().map(orders_created_by).sum()
}

fn orders_created_by(api: &Api) -> u64 {
    let r = api.get("/metrics", None);
    r.assert_status(200);
    r.text()
        .lines()
        .filter(|l| l.starts_with("keyhold_orders_total{") && l.contains("outcome=\"new\""))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("metric line {l:?}"))
        })
        .sum::<f64>() as u64
}

/// The value of the series `name` whose labels include every one of `labels`, from one
/// node's `/metrics`; `None` when it has no such series.
fn metric(api: &Api, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let r = api.get("/metrics", None);
    r.assert_status(200);
    let text = r.text();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("metric line {l:?}"))
        })
}

/// `GET /admin/v1/tenants/{id}` on one node, `None` unless 200.
fn admin_tenant(api: &Api, admin: &str, tenant_id: &str) -> Option<Value> {
    let r = api.get(&format!("/admin/v1/tenants/{tenant_id}"), Some(admin));
    match r.status {
        200 => Some(r.json()),
        404 => None,
        _ => panic!("GET tenant: {} {}", r.status, r.text()),
    }
}

/// Polls until every node's registry shows the tenant homed in `home`, active,
/// at `epoch`.
fn wait_tenant_everywhere(apis: &[Api], admin: &str, tenant_id: &str, home: &str, epoch: u64) {
    for api in apis {
        common::poll(
            Duration::from_secs(10),
            &format!("node {} to see {tenant_id} home {home}", api.region),
            || {
                let t = admin_tenant(api, admin, tenant_id)?;
                (t["home_region"] == home && t["state"] == "active" && t["epoch"] == epoch)
                    .then_some(())
            },
        );
    }
}

/// `POST /admin/v1/tenants/{id}/move`.
fn start_move(api: &Api, admin: &str, tenant_id: &str, to: &str) -> Resp {
    api.post_json(
        &format!("/admin/v1/tenants/{tenant_id}/move"),
        Some(admin),
        &json!({ "to": to }).to_string(),
    )
}

/// Starts a move that must be accepted; checks the 202, its body and
/// `Location`; returns the operation id.
#[track_caller]
fn accepted_move(api: &Api, admin: &str, tenant_id: &str, to: &str) -> String {
    let r = start_move(api, admin, tenant_id, to);
    r.assert_status(202);
    let op = r.json()["operation_id"]
        .as_str()
        .expect("operation_id is a string")
        .to_owned();
    assert!(!op.is_empty());
    assert_eq!(
        r.header("location").as_deref(),
        Some(format!("/admin/v1/operations/{op}").as_str()),
        "Location of the operation"
    );
    // Following Location at once, on the node that accepted the move, finds it.
    let r = api.get(&format!("/admin/v1/operations/{op}"), Some(admin));
    r.assert_status(200);
    assert_eq!(r.json()["operation_id"], op.as_str());
    op
}

/// Polls `GET /admin/v1/operations/{op}` (rotating over `apis`) until `done`,
/// checking every answer's shape; returns the states seen, in order.
fn wait_operation_done(apis: &[Api], admin: &str, op: &str, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen: Vec<String> = Vec::new();
    let mut i = 0;
    loop {
        let api = &apis[i % apis.len()];
        i += 1;
        let r = api.get(&format!("/admin/v1/operations/{op}"), Some(admin));
        r.assert_status(200);
        let j = r.json();
        assert_eq!(j["operation_id"], op, "{j}");
        assert!(
            j["kind"].as_str().is_some_and(|k| !k.is_empty()),
            "kind: {j}"
        );
        let state = j["state"].as_str().expect("state is a string").to_owned();
        assert!(
            ["pending", "running", "done", "failed"].contains(&state.as_str()),
            "state {state:?}"
        );
        assert_ne!(state, "failed", "the move failed: {j}");
        let progress = j["progress"].as_f64().expect("progress is a number");
        assert!((0.0..=1.0).contains(&progress), "progress {progress}");
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "done" {
            assert!(j["error"].is_null(), "a done operation has no error: {j}");
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "operation {op} not done within {timeout:?}: {j}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Regions (1): Every region accepts every tenant's requests and only the home executes.
#[test]
fn routing_through_every_region_executes_only_in_the_home() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();

    for home in REGIONS {
        let tenant = cluster.tenant(home);
        let mut created = Vec::new();
        for via in REGIONS {
            let api = cluster.api(via).expecting(home);
            let (key, coid) = (unique("k"), unique("co"));
            let body = order_body(&coid, 100);
            let r = api.create_order(&tenant.token, &key, &body);
            let order = assert_order(&r, 201, &coid, 100);
            assert_eq!(order["home_region"], home, "executed in the home region");
            assert!(!is_replay(&r));
            created.push((key, coid, body, r, order));
        }
        for (key, coid, body, first, order) in &created {
            let order_id = order["order_id"].as_str().unwrap();
            for via in REGIONS {
                let api = cluster.api(via).expecting(home);
                let again = api.create_order(&tenant.token, key, body);
                assert_eq!(again.status, 201, "{}", again.text());
                assert_eq!(again.body, first.body, "replay via {via} is byte-identical");
                assert!(is_replay(&again));
                assert_eq!(again.header("location"), first.header("location"));
                assert_eq!(
                    again.header("idempotency-fingerprint"),
                    first.header("idempotency-fingerprint")
                );
                let got = api.get_order(&tenant.token, order_id);
                got.assert_status(200);
                assert_same_order(&got.json(), order);
                let found = api.find_order(&tenant.token, coid);
                found.assert_status(200);
                assert_same_order(&found.json(), order);
                // Key reuse is decided by the home too.
                api.create_order(&tenant.token, key, &order_body(coid, 101))
                    .assert_problem(422, "idempotency-key-reused");
            }
        }
        // Unknown order ids are 404 through every region.
        for via in REGIONS {
            cluster
                .api(via)
                .expecting(home)
                .get_order(&tenant.token, "ord_0000000000000000")
                .assert_problem(404, "not-found");
        }
    }

    // 30 concurrent requests with one key, spread over the three regions.
    let tenant = cluster.tenant("b");
    let (key, coid) = (unique("k"), unique("co"));
    let body = order_body(&coid, 3030);
    let n = 30;
    let barrier = Arc::new(Barrier::new(n));
    let answers: Vec<(Resp, Duration)> = (0..n)
        .map(|i| {
            let api = cluster.api(REGIONS[i % 3]).expecting("b");
            let (token, key, body, barrier) = (
                tenant.token.clone(),
                key.clone(),
                body.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let rb = api.order_rb(&token, &key, &body);
                barrier.wait();
                let started = Instant::now();
                let r = api.send(rb);
                (r, started.elapsed())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let mut first: Option<Resp> = None;
    let mut replays = 0;
    for (r, took) in &answers {
        match (r.status, is_replay(r)) {
            (201, false) => {
                assert!(first.is_none(), "more than one non-replayed 201");
                first = Some(r.clone());
            }
            (201, true) => replays += 1,
            // Only after waiting inflight_wait (2 s) for the first attempt.
            (409, _) if *took >= Duration::from_millis(1900) => {
                r.assert_problem(409, "request-in-progress");
            }
            _ => panic!(
                "unexpected answer after {took:?}: {} {}",
                r.status,
                r.text()
            ),
        }
    }
    let first = first.expect("exactly one non-replayed 201");
    assert!(replays > 0, "the other requests were replays");
    for (r, _) in answers.iter().filter(|(r, _)| r.status == 201) {
        assert_eq!(
            r.body, first.body,
            "every 201 is the same order, byte for byte"
        );
    }
    let order = assert_order(&first, 201, &coid, 3030);
    assert_eq!(order["home_region"], "b");
    for via in REGIONS {
        let found = cluster
            .api(via)
            .expecting("b")
            .find_order(&tenant.token, &coid);
        assert_eq!(found.json()["order_id"], order["order_id"]);
    }

    // Claims through every region, decided by the home (c).
    let tenant = cluster.tenant("c");
    let via = |r: &str| cluster.api(r).expecting("c");
    let op = "POST:/v1/payments";
    let key = unique("claim");
    let claim = json!({"operation": op, "key": key, "fingerprint": "fp-1", "lease_ms": 30_000});
    let r = via("a").post_json("/v1/claims", Some(&tenant.token), &claim.to_string());
    r.assert_status(201);
    let j = r.json();
    assert_eq!(j["state"], "PROCESSING");
    assert_eq!(j["recovery"], false);
    let owner = j["owner_token"].as_str().expect("owner_token").to_owned();
    via("b")
        .post_json("/v1/claims", Some(&tenant.token), &claim.to_string())
        .assert_problem(409, "request-in-progress");
    let hb = json!({"operation": op, "key": key, "owner_token": owner, "lease_ms": 30_000});
    via("c")
        .post_json("/v1/claims/heartbeat", Some(&tenant.token), &hb.to_string())
        .assert_status(200);
    let done = json!({
        "operation": op, "key": key, "owner_token": owner, "outcome": "SUCCEEDED",
        "response": {"status": 201, "headers": {}, "body": {"payment_id": "pay-1"}},
        "resource_id": "pay-1",
    });
    via("b")
        .post_json(
            "/v1/claims/complete",
            Some(&tenant.token),
            &done.to_string(),
        )
        .assert_status(200);
    for r in REGIONS {
        let replay = via(r).post_json("/v1/claims", Some(&tenant.token), &claim.to_string());
        replay.assert_status(200);
        let j = replay.json();
        assert_eq!(j["state"], "SUCCEEDED");
        assert_eq!(j["response"]["body"], json!({"payment_id": "pay-1"}));
        assert_eq!(j["resource_id"], "pay-1");
    }
    let reused = json!({"operation": op, "key": key, "fingerprint": "fp-2", "lease_ms": 30_000});
    via("a")
        .post_json("/v1/claims", Some(&tenant.token), &reused.to_string())
        .assert_problem(422, "idempotency-key-reused");

    // Admin: tenant creation through any node for any home region; the tenant is
    // visible on every node and executes in its home through every node.
    for creator in REGIONS {
        for home in REGIONS {
            let tenant_id = unique("t");
            let body = json!({"tenant_id": tenant_id, "home_region": home});
            let r = cluster.api(creator).post_json(
                "/admin/v1/tenants",
                Some(&admin),
                &body.to_string(),
            );
            r.assert_status(201);
            let j = r.json();
            assert_eq!(j["tenant_id"], tenant_id.as_str());
            assert_eq!(j["home_region"], home);
            let token = j["token"].as_str().expect("token shown once").to_owned();
            // The creating node answers at once.
            let t = admin_tenant(&cluster.api(creator), &admin, &tenant_id)
                .expect("the creating node knows the tenant");
            assert_eq!(t["home_region"], home);
            assert!(t.get("token").is_none(), "the token is shown only once");
            for node in REGIONS {
                let api = cluster.api(node);
                let t = common::poll(
                    Duration::from_secs(5),
                    &format!("node {node} to know {tenant_id}"),
                    || admin_tenant(&api, &admin, &tenant_id),
                );
                assert_eq!(t["home_region"], home);
                assert_eq!(t["tenant_id"], tenant_id.as_str());
                let coid = unique("co");
                let r =
                    api.expecting(home)
                        .create_order(&token, &unique("k"), &order_body(&coid, 5));
                assert_eq!(assert_order(&r, 201, &coid, 5)["home_region"], home);
            }
        }
    }
    let body = json!({"tenant_id": unique("t"), "home_region": "zz"});
    cluster
        .api("b")
        .post_json("/admin/v1/tenants", Some(&admin), &body.to_string())
        .assert_problem(400, "invalid-request");
    cluster
        .api("c")
        .get(
            &format!("/admin/v1/tenants/{}", unique("none")),
            Some(&admin),
        )
        .assert_problem(404, "not-found");
}

/// One acknowledged order request of the load.
#[derive(Clone)]
struct Ack {
    key: String,
    coid: String,
    body: String,
    resp: Resp,
    /// `Keyhold-Region` of the answer.
    region: String,
    /// When the attempt that got this answer was sent.
    sent_at: Instant,
}

#[derive(Default)]
struct LoadStats {
    attempts: AtomicU64,
    tenant_moving: AtomicU64,
    owner_unreachable: AtomicU64,
    in_progress: AtomicU64,
    transport_errors: AtomicU64,
}

/// Sends one order request, rotating over the regions, until a 201 or 200:
/// retries 503 `tenant-moving` / `owner-unreachable`, 409 `request-in-progress`
/// and transport errors, honouring `Retry-After` lightly.
fn send_until_ack(
    apis: &[Api],
    rotation: &mut usize,
    token: &str,
    key: &str,
    body: &str,
    stats: &LoadStats,
) -> Ack {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        assert!(Instant::now() < deadline, "no answer for key {key} in 40 s");
        let api = &apis[*rotation % apis.len()];
        *rotation += 1;
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let sent_at = Instant::now();
        let r = match api.try_send_any(api.order_rb(token, key, body), &REGIONS) {
            Ok(r) => r,
            Err(_) => {
                stats.transport_errors.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let region = r.header("keyhold-region").expect("checked");
        match (r.status, r.slug().as_deref()) {
            (201 | 200, _) => {
                return Ack {
                    key: key.to_owned(),
                    coid: String::new(),
                    body: body.to_owned(),
                    resp: r,
                    region,
                    sent_at,
                }
            }
            (503, Some("tenant-moving")) => {
                stats.tenant_moving.fetch_add(1, Ordering::Relaxed);
            }
            // A home whose standby trails past `max_standby_lag` under this
            // load holds its answers back the same way: retried with the key.
            (503, Some("owner-unreachable" | "standby-unreachable")) => {
                stats.owner_unreachable.fetch_add(1, Ordering::Relaxed);
            }
            (409, Some("request-in-progress")) => {
                stats.in_progress.fetch_add(1, Ordering::Relaxed);
            }
            _ => panic!(
                "unexpected answer via {} for key {key}: {} {}",
                api.base,
                r.status,
                r.text()
            ),
        }
        // Lightly: a tenth of Retry-After (seconds), at most 200 ms.
        let ra: u64 = r
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        std::thread::sleep(Duration::from_millis((ra * 100).min(200)));
    }
}

/// Regions (2): A planned move while clients keep creating and retrying orders through
/// every region: nothing lost, nothing executed twice, and the new home takes over.
#[test]
fn planned_move_under_load_loses_nothing_and_executes_nothing_twice() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let own: Vec<Api> = REGIONS.iter().map(|r| cluster.api(r)).collect();
    let tenant = cluster.tenant("a");
    let id = tenant.tenant_id.clone();
    let before = admin_tenant(&own[0], &admin, &id).expect("demo tenant");
    assert_eq!(
        (before["home_region"].as_str(), before["state"].as_str()),
        (Some("a"), Some("active"))
    );
    let epoch = before["epoch"].as_u64().expect("epoch is a number");

    // Refused moves.
    start_move(&own[1], &admin, &id, "a").assert_problem(400, "invalid-request");
    start_move(&own[2], &admin, &id, "zz").assert_problem(400, "invalid-request");
    start_move(&own[0], &admin, &unique("none"), "b").assert_problem(404, "not-found");
    assert_eq!(admin_tenant(&own[0], &admin, &id).unwrap()["epoch"], epoch);

    // The load: client threads, each rotating over the three regions.
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(LoadStats::default());
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let apis: Vec<Api> = REGIONS.iter().map(|r| cluster.api(r)).collect();
            let (stop, stats, acks, token) = (
                stop.clone(),
                stats.clone(),
                acks.clone(),
                tenant.token.clone(),
            );
            std::thread::spawn(move || {
                let mut rotation = t;
                let mut mine: Vec<Ack> = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let coid = unique("mv");
                    let key = unique("k");
                    let amount = 1 + n + 1000 * t as u64;
                    let body = order_body(&coid, amount);
                    let mut ack = send_until_ack(&apis, &mut rotation, &token, &key, &body, &stats);
                    ack.coid = coid.clone();
                    assert_order(&ack.resp, ack.resp.status, &coid, amount);
                    assert!(
                        ack.region == "a" || ack.region == "b",
                        "answered by {}, which was never home",
                        ack.region
                    );
                    acks.lock().unwrap().push(ack.clone());
                    mine.push(ack);
                    // A retry of an acknowledged request: the stored answer.
                    if n.is_multiple_of(3) {
                        let old = &mine[(n as usize * 7) % mine.len()];
                        let again = send_until_ack(
                            &apis,
                            &mut rotation,
                            &token,
                            &old.key,
                            &old.body,
                            &stats,
                        );
                        assert_eq!(again.resp.status, old.resp.status);
                        assert_eq!(again.resp.body, old.resp.body, "replay under load");
                        assert!(
                            is_replay(&again.resp),
                            "a retry of an acknowledged key replays"
                        );
                    }
                }
            })
        })
        .collect();
    let acked = || acks.lock().unwrap().len();
    common::poll(Duration::from_secs(20), "load before the move", || {
        (acked() >= 300).then_some(())
    });
    let acked_before_move = acked();

    let move_started = Instant::now();
    let op = accepted_move(&own[2], &admin, &id, "b");
    // A tenant that is already moving cannot be moved again.
    start_move(&own[0], &admin, &id, "c").assert_problem(409, "conflict");
    let states = wait_operation_done(&own, &admin, &op, Duration::from_secs(40));
    let done_at = Instant::now();
    let move_took = move_started.elapsed();
    start_move(&own[1], &admin, &unique("none"), "a").assert_problem(404, "not-found");

    // Keep the load going after the move, then stop it.
    let acked_at_done = acked();
    common::poll(Duration::from_secs(20), "load after the move", || {
        (acked() >= acked_at_done + 100).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    let acks = acks.lock().unwrap().clone();
    let during = acks
        .iter()
        .filter(|a| a.sent_at > move_started && a.sent_at < done_at)
        .count();
    eprintln!(
        "move took {move_took:?} (states {states:?}); acked {} orders ({} before the move, \
         {during} sent during it); \
         attempts {}, tenant-moving {}, owner-unreachable {}, in-progress {}, transport errors {}",
        acks.len(),
        acked_before_move,
        stats.attempts.load(Ordering::Relaxed),
        stats.tenant_moving.load(Ordering::Relaxed),
        stats.owner_unreachable.load(Ordering::Relaxed),
        stats.in_progress.load(Ordering::Relaxed),
        stats.transport_errors.load(Ordering::Relaxed),
    );

    // The registry: home b, one epoch later, active, on every node.
    wait_tenant_everywhere(&own, &admin, &id, "b", epoch + 1);

    // One order per client_order_id, and exactly as many orders created.
    let mut by_coid: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for ack in &acks {
        let order_id = ack.resp.json()["order_id"].as_str().unwrap().to_owned();
        by_coid.entry(&ack.coid).or_default().insert(order_id);
        // A first execution names the region that executed it.
        if !is_replay(&ack.resp) && ack.resp.status == 201 {
            assert_eq!(ack.resp.json()["home_region"], ack.region.as_str());
            if ack.sent_at > done_at {
                assert_eq!(ack.region, "b", "after the move only b executes");
            }
        }
        assert_eq!(
            ack.resp.status,
            201,
            "a fixed key is decided by its record: {}",
            ack.resp.text()
        );
    }
    for (coid, ids) in &by_coid {
        assert_eq!(ids.len(), 1, "client_order_id {coid} has orders {ids:?}");
    }
    assert_eq!(
        orders_created(&own),
        by_coid.len() as u64,
        "every client_order_id made exactly one order in the whole cluster"
    );

    // After the move, through every region (checked in parallel): old keys replay
    // byte-identically from b, orders read back with the same id, markers answer
    // a new key with the old order.
    let checkers: Vec<_> = (0..3)
        .map(|t| {
            let apis: Vec<Api> = REGIONS
                .iter()
                .map(|r| cluster.api(r).expecting("b"))
                .collect();
            let acks: Vec<Ack> = acks.iter().skip(t).step_by(3).cloned().collect();
            let token = tenant.token.clone();
            std::thread::spawn(move || {
                for (i, ack) in acks.iter().enumerate() {
                    let api = &apis[i % 3];
                    let first = ack.resp.json();
                    let order_id = first["order_id"].as_str().unwrap();
                    let replay = api.create_order(&token, &ack.key, &ack.body);
                    assert_eq!(replay.status, ack.resp.status, "{}", replay.text());
                    assert_eq!(
                        replay.body, ack.resp.body,
                        "old key replays byte-identically"
                    );
                    assert!(is_replay(&replay));
                    assert_eq!(replay.header("location"), ack.resp.header("location"));
                    let api = &apis[(i + 1) % 3];
                    let got = api.get_order(&token, order_id);
                    got.assert_status(200);
                    assert_same_order(&got.json(), &first);
                    let found = api.find_order(&token, &ack.coid);
                    found.assert_status(200);
                    assert_eq!(found.json()["order_id"], order_id);
                    let api = &apis[(i + 2) % 3];
                    let marker = api.create_order(&token, &unique("k"), &ack.body);
                    marker.assert_status(200);
                    assert!(!is_replay(&marker));
                    assert_eq!(marker.json()["order_id"], order_id, "the marker's order");
                }
            })
        })
        .collect();
    for c in checkers {
        c.join().expect("checker thread");
    }

    // New orders execute in the new home, whichever region they enter by.
    for via in REGIONS {
        let coid = unique("new");
        let r = cluster.api(via).expecting("b").create_order(
            &tenant.token,
            &unique("k"),
            &order_body(&coid, 9),
        );
        assert!(!is_replay(&r));
        assert_eq!(assert_order(&r, 201, &coid, 9)["home_region"], "b");
    }
    assert_eq!(orders_created(&own), by_coid.len() as u64 + 3);
    let after = admin_tenant(&own[2], &admin, &id).unwrap();
    assert_eq!(after["home_region"], "b");
    assert_eq!(after["epoch"].as_u64(), Some(epoch + 1));
    start_move(&own[0], &admin, &id, "b").assert_problem(400, "invalid-request");
}

/// Regions (3a): A forwarded request (it carries the node credential, as a
/// forwarding node does) with an epoch the node is not home at is refused with
/// 421 and executes nothing, on the new home and on the old one.
#[test]
fn stale_epoch_is_misdirected_and_executes_nothing() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let own: Vec<Api> = REGIONS.iter().map(|r| cluster.api(r)).collect();
    let tenant = cluster.create_tenant("a", json!({}));
    let id = tenant.tenant_id.clone();
    // The creating node answers once its replica has the tenant; the others
    // follow the registry a moment later.
    wait_tenant_everywhere(&own, &admin, &id, "a", 1);
    let coid0 = unique("co");
    let r = cluster.api("c").expecting("a").create_order(
        &tenant.token,
        &unique("k"),
        &order_body(&coid0, 1),
    );
    let order0 = assert_order(&r, 201, &coid0, 1);
    let old_epoch = admin_tenant(&own[0], &admin, &id).unwrap()["epoch"]
        .as_u64()
        .unwrap();
    let op = accepted_move(&own[0], &admin, &id, "b");
    wait_operation_done(&own, &admin, &op, Duration::from_secs(30));
    let new_epoch = old_epoch + 1;
    wait_tenant_everywhere(&own, &admin, &id, "b", new_epoch);
    let created_before = orders_created(&own);
    let credential = std::fs::read_to_string(cluster.data_dir().join("node-credential"))
        .expect("the node credential")
        .trim()
        .to_owned();

    let (key, coid) = (unique("k"), unique("co"));
    let body = order_body(&coid, 421);
    let with_epoch = |api: &Api, epoch: u64, key: &str, body: &str| {
        api.send(
            api.order_rb(&tenant.token, key, body)
                .header("keyhold-epoch", epoch.to_string())
                .header("keyhold-node-credential", &credential),
        )
    };
    // The new home at the old epoch, the old home at either epoch, a third node.
    for (node, epoch) in [
        ("b", old_epoch),
        ("a", old_epoch),
        ("a", new_epoch),
        ("c", old_epoch),
    ] {
        let r = with_epoch(&cluster.api(node), epoch, &key, &body);
        r.assert_problem(421, "misdirected-request");
    }
    let claim =
        json!({"operation": "POST:/v1/x", "key": key, "fingerprint": "f", "lease_ms": 1000});
    let r = cluster.api("b").send(
        cluster
            .api("b")
            .post("/v1/claims")
            .bearer_auth(&tenant.token)
            .header("keyhold-epoch", old_epoch.to_string())
            .header("keyhold-node-credential", &credential)
            .header("content-type", "application/json")
            .body(claim.to_string()),
    );
    r.assert_problem(421, "misdirected-request");
    // Nothing executed: no order, no record, no claim.
    assert_eq!(orders_created(&own), created_before);
    for via in REGIONS {
        cluster
            .api(via)
            .expecting("b")
            .find_order(&tenant.token, &coid)
            .assert_problem(404, "not-found");
    }
    let r = cluster.api("a").expecting("b").post_json(
        "/v1/claims",
        Some(&tenant.token),
        &claim.to_string(),
    );
    r.assert_status(201);
    assert_eq!(
        r.json()["recovery"],
        false,
        "the refused claim acquired nothing"
    );

    // The key works normally afterwards and makes exactly one order, in b.
    let first = cluster
        .api("c")
        .expecting("b")
        .create_order(&tenant.token, &key, &body);
    assert!(!is_replay(&first), "the first execution of the key");
    let order = assert_order(&first, 201, &coid, 421);
    assert_eq!(order["home_region"], "b");
    let replay = cluster
        .api("a")
        .expecting("b")
        .create_order(&tenant.token, &key, &body);
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert!(is_replay(&replay));
    let marker = cluster
        .api("b")
        .create_order(&tenant.token, &unique("k"), &body);
    marker.assert_status(200);
    assert_eq!(marker.json()["order_id"], order["order_id"]);
    // The right epoch, sent to the home, executes there.
    let coid2 = unique("co");
    let r = with_epoch(
        &cluster.api("b"),
        new_epoch,
        &unique("k"),
        &order_body(&coid2, 2),
    );
    assert_eq!(assert_order(&r, 201, &coid2, 2)["home_region"], "b");
    assert_eq!(orders_created(&own), created_before + 2);
    // The order made before the move reads back through every region.
    for via in REGIONS {
        let got = cluster
            .api(via)
            .expecting("b")
            .get_order(&tenant.token, order0["order_id"].as_str().unwrap());
        assert_same_order(&got.json(), &order0);
    }

    // Moved back to a: a is home again, but at a later epoch, so both the epoch
    // it was home at before and b's epoch are refused; its data came back.
    let op = accepted_move(&own[2], &admin, &id, "a");
    wait_operation_done(&own, &admin, &op, Duration::from_secs(30));
    wait_tenant_everywhere(&own, &admin, &id, "a", new_epoch + 1);
    let created_before = orders_created(&own);
    let (key3, coid3) = (unique("k"), unique("co"));
    let body3 = order_body(&coid3, 3);
    for epoch in [old_epoch, new_epoch] {
        with_epoch(&cluster.api("a"), epoch, &key3, &body3)
            .assert_problem(421, "misdirected-request");
    }
    with_epoch(&cluster.api("b"), new_epoch, &key3, &body3)
        .assert_problem(421, "misdirected-request");
    assert_eq!(orders_created(&own), created_before);
    for via in REGIONS {
        let api = cluster.api(via).expecting("a");
        let again = api.create_order(&tenant.token, &key, &body);
        assert_eq!((again.status, &again.body), (201, &first.body));
        assert!(is_replay(&again));
        assert_eq!(
            api.find_order(&tenant.token, &coid).json()["order_id"],
            order["order_id"]
        );
    }
    let r3 = cluster
        .api("b")
        .expecting("a")
        .create_order(&tenant.token, &key3, &body3);
    assert!(!is_replay(&r3));
    assert_eq!(assert_order(&r3, 201, &coid3, 3)["home_region"], "a");
    assert_eq!(orders_created(&own), created_before + 1);
}

/// Sends until something other than 503 `tenant-moving` comes back (a replica
/// that lags may say so, with Retry-After), within `timeout`.
fn send_through_lag(
    api: &Api,
    tenant: &Tenant,
    key: &str,
    body: &str,
    allowed: &[&str],
) -> (Resp, u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut refusals = 0;
    loop {
        let r = api
            .try_send_any(api.order_rb(&tenant.token, key, body), allowed)
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        if r.status == 503
            && r.slug().as_deref() == Some("tenant-moving")
            && Instant::now() < deadline
        {
            refusals += 1;
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        return (r, refusals);
    }
}

/// Regions (3b): A node frozen (SIGSTOP) while its tenant moves forwards, once thawed, to
/// the new home: never executing elsewhere, and exactly one order.
#[test]
fn frozen_node_thawed_after_a_move_forwards_to_the_new_home() {
    let mut sc = ServeCluster::start(&REGIONS, "");
    let admin = sc.admin_token.clone();
    let (a, b, c) = (sc.index("a"), sc.index("b"), sc.index("c"));
    let tenant = sc.create_tenant(a, "a");
    let id = tenant.tenant_id.clone();
    let own: Vec<Api> = (0..3).map(|i| sc.api(i)).collect();
    wait_tenant_everywhere(&own, &admin, &id, "a", 1);
    // c forwards to a before the move.
    let coid0 = unique("co");
    let r =
        sc.api(c)
            .expecting("a")
            .create_order(&tenant.token, &unique("k"), &order_body(&coid0, 10));
    let order0 = assert_order(&r, 201, &coid0, 10);

    sc.freeze(c);
    let op = accepted_move(&sc.api(a), &admin, &id, "b");
    let live = [sc.api(a), sc.api(b)];
    wait_operation_done(&live, &admin, &op, Duration::from_secs(30));
    wait_tenant_everywhere(&live, &admin, &id, "b", 2);
    sc.thaw(c);

    // At once, through the node that slept through the move.
    let (key, coid) = (unique("k"), unique("co"));
    let body = order_body(&coid, 11);
    let thawed_at = Instant::now();
    let (r, refusals) = send_through_lag(&sc.api(c), &tenant, &key, &body, &["b", "c"]);
    eprintln!(
        "thawed node answered {} after {:?} and {refusals} tenant-moving refusals",
        r.status,
        thawed_at.elapsed()
    );
    assert_eq!(
        r.header("keyhold-region").as_deref(),
        Some("b"),
        "{}",
        r.text()
    );
    assert!(!is_replay(&r));
    let order = assert_order(&r, 201, &coid, 11);
    assert_eq!(
        order["home_region"], "b",
        "executed in the new home, never in c"
    );

    // Exactly one order: replays and a marker hit through every node.
    for i in [a, b, c] {
        let api = sc.api(i).expecting("b");
        let again = api.create_order(&tenant.token, &key, &body);
        assert_eq!((again.status, &again.body), (201, &r.body));
        assert!(is_replay(&again));
        let marker = api.create_order(&tenant.token, &unique("k"), &body);
        marker.assert_status(200);
        assert_eq!(marker.json()["order_id"], order["order_id"]);
        let found = api.find_order(&tenant.token, &coid);
        assert_eq!(found.json()["order_id"], order["order_id"]);
        let got = api.get_order(&tenant.token, order0["order_id"].as_str().unwrap());
        assert_same_order(&got.json(), &order0);
    }
    wait_tenant_everywhere(&own, &admin, &id, "b", 2);
}

/// Regions (4): Killing the registry leader of three `keyhold serve` processes: a new leader
/// within a bounded time, routing and tenant creation keep working, and the
/// killed node rejoins on its data dir.
#[test]
fn registry_leader_killed_a_new_one_takes_over_and_the_node_rejoins() {
    let mut sc = ServeCluster::start(&REGIONS, "");
    let admin = sc.admin_token.clone();
    let leader = common::poll(Duration::from_secs(10), "one leader seen by all", || {
        let seen: Vec<Option<u64>> = (0..3).map(|i| sc.leader_seen_by(i)).collect();
        let first = seen[0]?;
        seen.iter().all(|s| *s == Some(first)).then_some(first)
    });
    let tenants: Vec<Tenant> = REGIONS
        .iter()
        .enumerate()
        .map(|(i, home)| sc.create_tenant(i, home))
        .collect();
    let own: Vec<Api> = (0..3).map(|i| sc.api(i)).collect();
    for t in &tenants {
        wait_tenant_everywhere(&own, &admin, &t.tenant_id, &t.home_region, 1);
    }

    let dead = sc.index_of_id(leader);
    let dead_region = sc.members[dead].region.clone();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != dead).collect();
    // Per-group Raft metrics before the kill: every node leads its own region's
    // group, the registry leader's node says so, and this scrape is the baseline
    // the elections counter counts from.
    for i in 0..3 {
        let region_group = format!("region-{}", sc.members[i].region);
        let region_leader = [("group", region_group.as_str()), ("role", "leader")];
        assert_eq!(
            metric(&sc.api(i), "keyhold_raft_role", &region_leader),
            Some(1.0)
        );
        let registry_leader = [("group", "registry"), ("role", "leader")];
        let leads = if i == dead { 1.0 } else { 0.0 };
        assert_eq!(
            metric(&sc.api(i), "keyhold_raft_role", &registry_leader),
            Some(leads)
        );
    }
    let registry = [("group", "registry")];
    sc.kill9(dead);
    let killed_at = Instant::now();
    let bound = Duration::from_secs(15);

    let new_leader = common::poll(bound, "a new leader on both survivors", || {
        let seen: Vec<Option<u64>> = survivors.iter().map(|&i| sc.leader_seen_by(i)).collect();
        let first = seen[0]?;
        (first != leader && seen.iter().all(|s| *s == Some(first))).then_some(first)
    });
    let elected_after = killed_at.elapsed();
    assert!(survivors.contains(&sc.index_of_id(new_leader)));
    for &i in &survivors {
        let elections = metric(&sc.api(i), "keyhold_raft_elections_total", &registry);
        assert!(
            elections.is_some_and(|n| n >= 1.0),
            "node {i} saw the registry's election: {elections:?}"
        );
        let registry_leader = [("group", "registry"), ("role", "leader")];
        let leads = if sc.index_of_id(new_leader) == i {
            1.0
        } else {
            0.0
        };
        assert_eq!(
            metric(&sc.api(i), "keyhold_raft_role", &registry_leader),
            Some(leads)
        );
    }

    // Routing for tenants homed in surviving regions, through either survivor,
    // once their region leases hold again: a survivor counts its contact with
    // the registry majority from the new leader's first confirmation.
    for &via in &survivors {
        common::poll(bound, "the survivor ready under the new leader", || {
            let r = sc.api(via).get("/readyz", None);
            (r.status == 200).then_some(())
        });
    }
    for t in tenants.iter().filter(|t| t.home_region != dead_region) {
        for &via in &survivors {
            let coid = unique("co");
            let r = sc.api(via).expecting(&t.home_region).create_order(
                &t.token,
                &unique("k"),
                &order_body(&coid, 3),
            );
            assert_eq!(
                assert_order(&r, 201, &coid, 3)["home_region"],
                t.home_region.as_str()
            );
        }
    }
    // The dead region's tenant is never executed elsewhere.
    let orphan = tenants
        .iter()
        .find(|t| t.home_region == dead_region)
        .unwrap();
    for &via in &survivors {
        sc.api(via)
            .create_order(&orphan.token, &unique("k"), &order_body(&unique("co"), 4))
            .assert_problem(503, "owner-unreachable");
    }
    // Tenant creation works again (a write needs the new leader).
    let mut created_while_down = Vec::new();
    for (n, &via) in survivors.iter().enumerate() {
        let home = if n == 0 {
            dead_region.clone()
        } else {
            sc.members[via].region.clone()
        };
        created_while_down.push(sc.create_tenant(via, &home));
    }
    let recovered_after = killed_at.elapsed();
    assert!(
        recovered_after < bound,
        "election, routing and tenant creation took {recovered_after:?}"
    );
    let live: Vec<Api> = survivors.iter().map(|&i| sc.api(i)).collect();
    for t in &created_while_down {
        wait_tenant_everywhere(&live, &admin, &t.tenant_id, &t.home_region, 1);
    }

    // The killed node comes back on its data dir and catches up.
    sc.restart(dead);
    let restarted_at = Instant::now();
    sc.wait_ready(dead, Duration::from_secs(20));
    let ready_after = restarted_at.elapsed();
    for t in &created_while_down {
        wait_tenant_everywhere(&[sc.api(dead)], &admin, &t.tenant_id, &t.home_region, 1);
    }
    common::poll(
        Duration::from_secs(10),
        "the rejoined node to know a leader",
        || sc.leader_seen_by(dead),
    );
    // Its region's tenants are served again, through every node, and the tenant
    // created while it was down works through it.
    for t in tenants.iter().chain(&created_while_down) {
        for i in 0..3 {
            let coid = unique("co");
            let r = sc.api(i).expecting(&t.home_region).create_order(
                &t.token,
                &unique("k"),
                &order_body(&coid, 6),
            );
            assert_eq!(
                assert_order(&r, 201, &coid, 6)["home_region"],
                t.home_region.as_str()
            );
        }
    }
    eprintln!(
        "leader {leader} killed: leader {new_leader} after {elected_after:?}, routing and \
         creation after {recovered_after:?}; restarted node ready after {ready_after:?}"
    );
}

/// Regions (2b): repeated moves back and forth, each started on a node that is
/// not the registry's first member: the operation is readable at its `Location`
/// on that node at once, the epoch grows by one per move, and every order made
/// in any earlier home replays byte-identically from the current one.
#[test]
fn repeated_moves_back_and_forth_keep_every_order() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let own: Vec<Api> = REGIONS.iter().map(|r| cluster.api(r)).collect();
    let tenant = cluster.create_tenant("a", json!({}));
    let id = tenant.tenant_id.clone();
    wait_tenant_everywhere(&own, &admin, &id, "a", 1);
    let mut home = "a";
    let mut made: Vec<(String, String, Resp)> = Vec::new();
    for i in 0..12u64 {
        // One order in the current home, entered through another region.
        let (key, coid) = (unique("k"), unique("co"));
        let body = order_body(&coid, 10 + i);
        let r = cluster
            .api(REGIONS[(i % 3) as usize])
            .expecting(home)
            .create_order(&tenant.token, &key, &body);
        assert!(!is_replay(&r));
        assert_eq!(assert_order(&r, 201, &coid, 10 + i)["home_region"], home);
        made.push((key, body, r));

        let to = if home == "a" { "b" } else { "a" };
        let via = &own[1 + (i % 2) as usize];
        let op = accepted_move(via, &admin, &id, to);
        wait_operation_done(
            std::slice::from_ref(via),
            &admin,
            &op,
            Duration::from_secs(20),
        );
        home = to;
        wait_tenant_everywhere(&own, &admin, &id, home, i + 2);
        for (j, (key, body, first)) in made.iter().enumerate() {
            let again =
                cluster
                    .api(REGIONS[j % 3])
                    .expecting(home)
                    .create_order(&tenant.token, key, body);
            assert_eq!((again.status, &again.body), (201, &first.body));
            assert!(is_replay(&again));
        }
    }
}

/// A tenant created through one node is usable through every other node at
/// once: a node that does not know a token yet waits (bounded) for its registry
/// replica to apply what it already holds before answering 401.
#[test]
fn a_new_tenant_works_through_every_node_at_once() {
    let cluster = Cluster::start("a,b,c", &[]);
    let admin = cluster.info.admin_token.clone();
    let regions = ["a", "b", "c"];
    for round in 0..9 {
        let via = cluster.api(regions[round % 3]);
        let home = regions[(round + 1) % 3];
        let use_through = cluster.api(regions[(round + 2) % 3]);
        let tenant_id = unique("fresh");
        let created = via.post_json(
            "/admin/v1/tenants",
            Some(&admin),
            &json!({"tenant_id": tenant_id, "home_region": home}).to_string(),
        );
        created.assert_status(201);
        let token = created.json()["token"].as_str().expect("token").to_owned();
        // Straight away, through a third node.
        let shown = use_through.get(&format!("/admin/v1/tenants/{tenant_id}"), Some(&admin));
        shown.assert_status(200);
        let coid = unique("co");
        let r =
            use_through
                .expecting(home)
                .create_order(&token, &unique("k"), &order_body(&coid, 5));
        assert_eq!(r.status, 201, "round {round}: {}", r.text());
        assert_eq!(r.header("keyhold-region").as_deref(), Some(home));
    }
}
