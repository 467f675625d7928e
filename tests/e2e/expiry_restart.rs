//! End-to-end tests of expiry (contract section 6) and of restarts (section 9):
//! an expired record falls back to the business marker (200 with the existing
//! order, nothing new), an expired record no longer pins its key, the sweeper
//! physically removes expired records (seen in `/metrics`), a TTL policy that
//! breaks `marker_ttl >= response_ttl` or `processed_ttl >= response_ttl` stops
//! `keyhold up` and `keyhold serve` with a non-zero exit naming the rule, and a
//! restart of `keyhold up` on the same data dir keeps tenants, tokens, orders,
//! records and claims.

mod common;

use common::{assert_order, assert_same_order, order_body, poll, run_to_exit, unique, Cluster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The sum of `keyhold_sweeper_deleted_total{kind="record"}` series in a
/// Prometheus text page.
fn swept_records(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("keyhold_sweeper_deleted_total") && l.contains("kind=\"record\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn expired_records_fall_back_to_markers_and_are_swept() {
    let cluster = Cluster::start("a", &["--response-ttl", "2s"]);
    let api = cluster.api("a");
    let token = cluster.tenant("a").token;
    let policy = api.get("/v1/idempotency-policy", None).json();
    assert_eq!(policy["response_ttl_seconds"], 2, "{policy}");
    assert_eq!(policy["marker_ttl_seconds"], 30 * 86_400, "{policy}");

    let (k1, coid1) = (unique("k"), unique("co"));
    let first = api.create_order(&token, &k1, &order_body(&coid1, 100));
    let order1 = assert_order(&first, 201, &coid1, 100);
    let replay = api.create_order(&token, &k1, &order_body(&coid1, 100));
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    let (k2, coid2) = (unique("k"), unique("co"));
    assert_order(
        &api.create_order(&token, &k2, &order_body(&coid2, 200)),
        201,
        &coid2,
        200,
    );
    // A claim completed now expires with the records as well.
    let claim = |fingerprint: &str| {
        let body = json!({"operation": "POST:/v1/x", "key": k1, "fingerprint": fingerprint, "lease_ms": 1000});
        api.post_json("/v1/claims", Some(&token), &body.to_string())
    };
    let owner = claim("f1").assert_status(201).json()["owner_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = json!({"operation": "POST:/v1/x", "key": k1, "owner_token": owner, "outcome": "SUCCEEDED",
                      "response": {"status": 200, "headers": {}, "body": 1}});
    api.post_json("/v1/claims/complete", Some(&token), &done.to_string())
        .assert_status(200);
    claim("f2").assert_problem(422, "idempotency-key-reused");
    // Everything above was written before this instant, so 2 s from it all of it
    // has expired; the margin absorbs clock reads and scheduling.
    let written = Instant::now();
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(written.elapsed()));

    // Same key and body after the record expired: the marker answers, 200 with
    // the existing order; no new order.
    let hit = api.create_order(&token, &k1, &order_body(&coid1, 100));
    let hit_order = assert_order(&hit, 200, &coid1, 100);
    assert_eq!(hit_order["order_id"], order1["order_id"]);
    assert_ne!(hit.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(
        api.find_order(&token, &coid1).json()["order_id"],
        order1["order_id"]
    );
    // The same client_order_id with another request is still a conflict.
    api.create_order(&token, &unique("k"), &order_body(&coid1, 101))
        .assert_problem(409, "client-order-id-conflict");
    // An expired record reads as absent: its key takes a different request.
    let coid3 = unique("co");
    let fresh = api.create_order(&token, &k2, &order_body(&coid3, 300));
    assert_order(&fresh, 201, &coid3, 300);
    assert_ne!(fresh.header("idempotent-replayed").as_deref(), Some("true"));
    // The marker hit stored nothing: k1 is still free for a new request.
    let coid4 = unique("co");
    assert_order(
        &api.create_order(&token, &k1, &order_body(&coid4, 400)),
        201,
        &coid4,
        400,
    );
    // The expired claim record is gone too: another fingerprint acquires.
    let r = claim("f2");
    r.assert_status(201);
    assert_eq!(r.json()["recovery"], false);

    // The sweeper deletes expired records physically, in the background.
    let swept = poll(
        Duration::from_secs(10),
        "the sweeper to delete records",
        || {
            let n = swept_records(&api.get("/metrics", None).text());
            (n > 0.0).then_some(n)
        },
    );
    assert!(swept >= 1.0);
    // And nothing visible changed: the order is still there.
    api.get_order(&token, order1["order_id"].as_str().unwrap())
        .assert_status(200);
}

/// The sum of `keyhold_sweeper_deleted_total{kind="marker"}` series.
fn swept_markers(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("keyhold_sweeper_deleted_total") && l.contains("kind=\"marker\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn markers_expire_after_marker_ttl() {
    let cluster = Cluster::start("a", &["--response-ttl", "1s", "--marker-ttl", "2s"]);
    let api = cluster.api("a");
    let token = cluster.tenant("a").token;
    let coid = unique("co");
    let first = api.create_order(&token, &unique("k"), &order_body(&coid, 10));
    let order = assert_order(&first, 201, &coid, 10);
    let written = Instant::now();
    // Between the two TTLs: the record is gone, the marker still answers.
    std::thread::sleep(Duration::from_millis(1400).saturating_sub(written.elapsed()));
    let hit = api.create_order(&token, &unique("k"), &order_body(&coid, 10));
    assert_eq!(
        assert_order(&hit, 200, &coid, 10)["order_id"],
        order["order_id"]
    );
    // Past marker_ttl the client_order_id no longer blocks a new order.
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(written.elapsed()));
    let again = api.create_order(&token, &unique("k"), &order_body(&coid, 10));
    let second = assert_order(&again, 201, &coid, 10);
    assert_ne!(second["order_id"], order["order_id"]);
    // The first order itself is kept; only the marker expired.
    api.get_order(&token, order["order_id"].as_str().unwrap())
        .assert_status(200);
    poll(
        Duration::from_secs(10),
        "the sweeper to delete markers",
        || (swept_markers(&api.get("/metrics", None).text()) > 0.0).then_some(()),
    );
}

#[test]
fn ttl_rule_violations_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let port = common::free_base_port(1).to_string();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--response-ttl", "48h", "--marker-ttl", "1h"],
            "marker_ttl",
        ),
        (&["--response-ttl", "40d"], "marker_ttl"),
        (
            &["--response-ttl", "1h", "--processed-ttl", "30m"],
            "processed_ttl",
        ),
        // The provider must keep keys as long as events may be redelivered.
        // (A marker may outlive the consumers' memory: `--marker-ttl 40d` is
        // valid, see core's policy tests.)
        (
            &["--psp-key-retention", "24h"],
            "psp_key_retention (1day) must be at least processed_ttl (35days)",
        ),
    ];
    for (extra, rule) in cases {
        let mut args = vec![
            "up",
            "--data-dir",
            data,
            "--base-port",
            &port,
            "--regions",
            "a",
        ];
        args.extend_from_slice(extra);
        let (status, stderr) = run_to_exit(&args, Duration::from_secs(20));
        assert!(!status.success(), "{args:?} must exit non-zero");
        assert!(
            stderr.contains(rule),
            "{args:?}: stderr names {rule}: {stderr}"
        );
        assert!(
            !dir.path().join("data/cluster.json").exists(),
            "no cluster.json"
        );
    }

    // `keyhold serve` refuses the same policies.
    for (ttls, rule) in [
        (
            "response_ttl = \"48h\"\nmarker_ttl = \"1h\"\n",
            "marker_ttl",
        ),
        (
            "response_ttl = \"1h\"\nprocessed_ttl = \"30m\"\n",
            "processed_ttl",
        ),
        ("psp_key_retention = \"24h\"\n", "psp_key_retention (1day)"),
    ] {
        let config = dir.path().join("node.toml");
        std::fs::write(
            &config,
            format!(
                "region = \"a\"\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{port}\"\nadmin_token = \"0123456789abcdef0123\"\n{ttls}",
                dir.path().join("serve").display()
            ),
        )
        .unwrap();
        let (status, stderr) = run_to_exit(
            &["serve", "--config", config.to_str().unwrap()],
            Duration::from_secs(20),
        );
        assert!(!status.success(), "serve with {ttls:?} must exit non-zero");
        assert!(stderr.contains(rule), "serve stderr names {rule}: {stderr}");
    }

    // Equal TTLs satisfy the rules.
    let cluster = Cluster::start(
        "a",
        &[
            "--response-ttl",
            "1h",
            "--marker-ttl",
            "1h",
            "--processed-ttl",
            "1h",
            "--psp-key-retention",
            "2h",
        ],
    );
    let policy = cluster.api("a").get("/v1/idempotency-policy", None).json();
    assert_eq!(policy["response_ttl_seconds"], 3600);
    assert_eq!(policy["marker_ttl_seconds"], 3600);
    assert_eq!(policy["processed_ttl_seconds"], 3600);
    assert_eq!(policy["psp_key_retention_seconds"], 7200);
    // The whole window on one line: every stage in chain order, and the first
    // to forget (a tie goes to the earliest stage).
    let horizon = &policy["dedupe_horizon"];
    let stages: Vec<(&str, &str, Value)> = horizon["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| {
            (
                s["stage"].as_str().unwrap(),
                s["setting"].as_str().unwrap(),
                s["ttl_seconds"].clone(),
            )
        })
        .collect();
    assert_eq!(
        stages,
        vec![
            ("response_cache", "response_ttl", json!(3600)),
            ("marker", "marker_ttl", json!(3600)),
            ("processed_messages", "processed_ttl", json!(3600)),
            ("provider_key", "psp_key_retention", json!(7200)),
        ],
        "{policy}"
    );
    assert_eq!(horizon["ends_first"], "response_cache", "{policy}");
    assert_eq!(horizon["window_seconds"], 3600, "{policy}");
}

#[test]
fn restart_on_the_same_data_dir_keeps_everything() {
    let mut cluster = Cluster::start("a,b", &[]);
    let before = cluster.info.clone();
    let a = cluster.api("a");
    let ta = cluster.tenant("a");
    let tb = cluster.tenant("b");
    let extra = cluster.create_tenant("a", json!({}));

    let (key, coid) = (unique("k"), unique("co"));
    let body = json!({"client_order_id": coid, "cart_id": "c", "amount": 4242, "currency": "SEK",
                      "items": [{"sku": "x", "quantity": 3}], "metadata": {"m": "é"}})
    .to_string();
    let first = a.create_order(&ta.token, &key, &body);
    let order = assert_order(&first, 201, &coid, 4242);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let (xkey, xcoid) = (unique("k"), unique("co"));
    let xfirst = a.create_order(&extra.token, &xkey, &order_body(&xcoid, 5));
    let xorder = assert_order(&xfirst, 201, &xcoid, 5);
    let b = cluster.api("b");
    let (bkey, bcoid) = (unique("k"), unique("co"));
    let bfirst = b.create_order(&tb.token, &bkey, &order_body(&bcoid, 6));
    assert_order(&bfirst, 201, &bcoid, 6);
    // A claim in progress and a completed one.
    let claim = |api: &common::Api, key: &str, lease: u64| {
        let body =
            json!({"operation": "POST:/v1/x", "key": key, "fingerprint": "f", "lease_ms": lease});
        api.post_json("/v1/claims", Some(&ta.token), &body.to_string())
    };
    let (ck_done, ck_open) = (unique("c"), unique("c"));
    let owner = claim(&a, &ck_done, 60_000).assert_status(201).json()["owner_token"]
        .as_str()
        .unwrap()
        .to_owned();
    // Written by hand: `json!` would turn 1.50 into 1.5.
    let done = format!(
        r#"{{"operation":"POST:/v1/x","key":"{ck_done}","owner_token":"{owner}","outcome":"SUCCEEDED","response":{{"status":200,"headers":{{}},"body":{{"v":1.50}}}},"resource_id":"r1"}}"#
    );
    a.post_json("/v1/claims/complete", Some(&ta.token), &done)
        .assert_status(200);
    let open_owner = claim(&a, &ck_open, 3_600_000).assert_status(201).json()["owner_token"]
        .as_str()
        .unwrap()
        .to_owned();

    let status = cluster.terminate();
    assert!(
        status.success(),
        "keyhold up exits cleanly on SIGTERM: {status}"
    );
    cluster.restart();

    // cluster.json is written again with the same cluster.
    let after = cluster.info.clone();
    assert_eq!(after.admin_token, before.admin_token);
    assert_eq!(
        after.tenants, before.tenants,
        "same tenants, ids and tokens"
    );
    let names: Vec<_> = after.regions.iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["a", "b"]);

    let a = cluster.api("a");
    let b = cluster.api("b");
    // Records: the old key replays byte-identically.
    let replay = a.create_order(&ta.token, &key, &body);
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    a.create_order(&ta.token, &key, &order_body(&coid, 1))
        .assert_problem(422, "idempotency-key-reused");
    // Orders and markers.
    let got = a.get_order(&ta.token, &order_id);
    got.assert_status(200);
    assert_same_order(&got.json(), &order);
    assert_eq!(
        a.find_order(&ta.token, &coid).json()["order_id"],
        order_id.as_str()
    );
    let hit = a.create_order(&ta.token, &unique("k"), &body);
    assert_eq!(
        assert_order(&hit, 200, &coid, 4242)["order_id"],
        order_id.as_str()
    );
    // A tenant created through the admin API keeps its token and its data.
    let xreplay = a.create_order(&extra.token, &xkey, &order_body(&xcoid, 5));
    assert_eq!((xreplay.status, &xreplay.body), (201, &xfirst.body));
    a.get_order(&extra.token, xorder["order_id"].as_str().unwrap())
        .assert_status(200);
    let view = a.get(
        &format!("/admin/v1/tenants/{}", extra.tenant_id),
        Some(&after.admin_token),
    );
    view.assert_status(200);
    // The other region's tenant and records too.
    let breplay = b.create_order(&tb.token, &bkey, &order_body(&bcoid, 6));
    assert_eq!((breplay.status, &breplay.body), (201, &bfirst.body));
    // Claims: the completed one replays, the open one is still owned.
    let r = claim(&a, &ck_done, 60_000);
    r.assert_status(200);
    assert_eq!(r.json()["state"], "SUCCEEDED");
    assert_eq!(r.json()["resource_id"], "r1");
    assert!(r.text().contains(r#"{"v":1.50}"#), "{}", r.text());
    claim(&a, &ck_open, 60_000).assert_problem(409, "request-in-progress");
    let hb = json!({"operation": "POST:/v1/x", "key": ck_open, "owner_token": open_owner, "lease_ms": 60_000});
    a.post_json("/v1/claims/heartbeat", Some(&ta.token), &hb.to_string())
        .assert_status(200);
    // New work still works after the restart.
    let coid_new = unique("co");
    assert_order(
        &a.create_order(&ta.token, &unique("k"), &order_body(&coid_new, 9)),
        201,
        &coid_new,
        9,
    );
}
