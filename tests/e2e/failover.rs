//! End-to-end tests of unplanned failover (contract section 10, "Unplanned
//! failover" and "No split brain"; issue 12) on `keyhold up --regions a,b,c`,
//! where b is a's standby: the admin route's refusals, and a region isolated
//! under load and failed over to b: after `done` nothing the isolated region
//! executed is acknowledged (a client talking straight to a's node included),
//! every order acknowledged before the isolation is served by b (replays and
//! marker hits), new orders go to b, and once healed a forwards its old
//! tenant's requests to b instead of executing them.

mod common;

use common::{order_body, unique, Cluster};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn failover(cluster: &Cluster, via: &str, region: &str, body: &str) -> common::Resp {
    cluster.api(via).post_json(
        &format!("/admin/v1/regions/{region}/failover"),
        Some(&cluster.info.admin_token),
        body,
    )
}

fn operation(cluster: &Cluster, via: &str, id: &str) -> Value {
    cluster
        .api(via)
        .get(
            &format!("/admin/v1/operations/{id}"),
            Some(&cluster.info.admin_token),
        )
        .json()
}

#[test]
fn a_failover_is_refused_when_the_target_holds_no_copy_or_the_region_is_healthy() {
    let cluster = Cluster::start("a,b,c", &[]);
    // c is not a's standby: it holds no copy of a.
    failover(&cluster, "c", "a", r#"{"to":"c"}"#).assert_problem(409, "conflict");
    // a answers and is ready: a failover needs "force".
    let healthy = failover(&cluster, "c", "a", "{}");
    let problem = healthy.assert_problem(409, "conflict");
    assert!(
        problem["detail"].as_str().unwrap().contains("force"),
        "{problem}"
    );
    failover(&cluster, "c", "nowhere", "{}").assert_problem(404, "not-found");
    failover(&cluster, "c", "a", r#"{"to": 7}"#).assert_status(400);
    failover(&cluster, "c", "a", r#"{"unknown": true}"#).assert_status(400);
    // Without the admin token nothing is checked.
    cluster
        .api("c")
        .post_json("/admin/v1/regions/a/failover", None, "{}")
        .assert_status(401);
    // None of this touched a: its tenant is served at home.
    let ta = cluster.tenant("a").token;
    cluster
        .api("a")
        .create_order(&ta, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);
}

/// What the client talking straight to a's node saw: each acknowledged
/// order's key, client order id and the instant its answer arrived.
type Acks = Arc<Mutex<Vec<(String, String, Instant)>>>;

#[test]
fn an_isolated_region_failed_over_hands_its_tenants_to_its_standby_and_acknowledges_nothing_after_done(
) {
    let cluster = Cluster::start("a,b,c", &[]);
    let tenant = cluster.tenant("a");
    let (a, b, c) = (cluster.api("a"), cluster.api("b"), cluster.api("c"));
    // Orders acknowledged before the fault, through a and through c.
    let mut before = Vec::new();
    for i in 0..20 {
        let (key, co) = (unique("k"), unique("co"));
        let via = if i % 2 == 0 { &a } else { &c };
        let body = order_body(&co, 5);
        let created = via.expecting("a").create_order(&tenant.token, &key, &body);
        created.assert_status(201);
        before.push((key, co, body, created.json()));
    }
    // The standby has them all before the fault (the lag is measured, not
    // assumed: this is the no-loss case).
    cluster.standby_caught_up("a");

    // A client keeps writing straight to a's node through the isolation.
    let acks: Acks = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (a, token, acks, stop) = (a.clone(), tenant.token.clone(), acks.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (key, co) = (unique("k"), unique("co"));
                let sent =
                    a.try_send_any(a.order_rb(&token, &key, &order_body(&co, 5)), &["a", "b"]);
                if let Ok(r) = sent {
                    if r.status == 201 || r.status == 200 {
                        acks.lock().unwrap().push((key, co, Instant::now()));
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    cluster.control("/v1/regions/a/isolate");
    let isolated_at = Instant::now();
    // From c, a cannot be reached: no "force" needed. When a's node led the
    // registry, b and c elect another leader first: until then the request
    // answers 503 with Retry-After, and is retried as a client would.
    let started = common::poll(Duration::from_secs(30), "the failover accepted", || {
        let answer = failover(&cluster, "c", "a", "{}");
        if answer.status == 503 {
            return None;
        }
        answer.assert_status(202);
        Some(answer)
    });
    let op_id = started.json()["operation_id"].as_str().unwrap().to_owned();
    let done = common::poll(Duration::from_secs(90), "the failover is done", || {
        let op = operation(&cluster, "c", &op_id);
        assert_ne!(op["state"], "failed", "{op}");
        (op["state"] == "done").then_some(op)
    });
    let done_at = Instant::now();
    assert_eq!(done["kind"], "failover");
    assert_eq!(done["result"]["from"], "a");
    assert_eq!(done["result"]["to"], "b");
    assert!(done["result"]["at"].as_u64().unwrap() > 0, "{done}");
    assert!(
        done["result"]["estimated_lost"]["commands"].is_u64(),
        "{done}"
    );
    eprintln!(
        "failover done {:.1} s after the isolation",
        (done_at - isolated_at).as_secs_f64()
    );
    // Keep the direct client going past done, and past a's whole lease (the
    // failover may be done before it ends: it waits the standby's grant, not
    // the lease): a must acknowledge nothing from now on.
    let lease_over = isolated_at + Duration::from_secs(11);
    std::thread::sleep(
        lease_over
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(2)),
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acks = acks.lock().unwrap().clone();
    let late: Vec<_> = acks.iter().filter(|(_, _, at)| *at > done_at).collect();
    assert!(late.is_empty(), "acknowledged by a after done: {late:?}");

    // b serves the tenant: everything acknowledged before the fault replays
    // byte for byte, and its client order ids are taken.
    for api in [&b, &c] {
        for (key, _, body, first) in &before {
            let replay = api.expecting("b").create_order(&tenant.token, key, body);
            replay.assert_status(201);
            assert_eq!(&replay.json(), first);
        }
    }
    let (_, co, _, first) = &before[0];
    let hit = b
        .expecting("b")
        .create_order(&tenant.token, &unique("k"), &order_body(co, 5));
    hit.assert_status(200);
    assert_eq!(hit.json()["order_id"], first["order_id"]);
    // New orders go to b.
    b.expecting("b")
        .create_order(&tenant.token, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);

    // Healed, a forwards its old tenant to b and executes nothing for it.
    cluster.control("/v1/regions/a/heal");
    let fresh = unique("co");
    let key = unique("k");
    let answer = common::poll(Duration::from_secs(30), "a forwards to b", || {
        let r = a
            .try_send_any(
                a.order_rb(&tenant.token, &key, &order_body(&fresh, 1)),
                &["a", "b"],
            )
            .ok()?;
        (r.status == 201).then_some(r)
    });
    assert_eq!(answer.header("keyhold-region").as_deref(), Some("b"));
}

#[test]
fn with_auto_failover_a_killed_region_is_failed_over_to_its_standby_on_its_own() {
    let cluster = Cluster::start("a,b,c", &["--auto-failover-after", "15s"]);
    let tenant = cluster.tenant("a");
    let c = cluster.api("c");
    let (key, body) = (unique("k"), order_body(&unique("co"), 3));
    let first = c.expecting("a").create_order(&tenant.token, &key, &body);
    first.assert_status(201);
    cluster.standby_caught_up("a");
    let killed = Instant::now();
    cluster.control(&format!("/v1/nodes/{}/kill", cluster.node("a").node_id));
    // Nobody asks for the failover: b's leader begins it once a has not been
    // ready for 15 s, then drives it.
    let done = common::poll(
        Duration::from_secs(120),
        "an automatic failover of a",
        || {
            let ops = c
                .get("/admin/v1/operations", Some(&cluster.info.admin_token))
                .json();
            ops["data"]
                .as_array()?
                .iter()
                .find(|op| op["kind"] == "failover" && op["from"] == "a" && op["state"] == "done")
                .cloned()
        },
    );
    let took = killed.elapsed();
    eprintln!(
        "automatic failover done {:.1} s after the kill",
        took.as_secs_f64()
    );
    assert!(
        took >= Duration::from_secs(15),
        "not before auto_failover_after"
    );
    assert_eq!(done["to"], "b");
    let replay = c.expecting("b").create_order(&tenant.token, &key, &body);
    replay.assert_status(201);
    assert_eq!(replay.json(), first.json());
}
