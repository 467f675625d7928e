//! End-to-end test of standby streaming (contract section 10, "Standby regions";
//! issue 12): `keyhold up --regions a,b,c` gives each region the next one as its
//! standby. The cluster view lists each region's standby and its replication lag;
//! the standby's nodes hold a copy of the region's store that keeps up with it
//! (their `keyhold_raft_applied_index{group="region-a"}`); a standby cut off
//! does not slow the region (it does not vote) and its lag grows in commands
//! and seconds, then falls back to zero after the heal.
//!
//! A `"survival": "region"` tenant of a (contract section 10, "Survival per
//! tenant") is answered while b keeps up; with b isolated its order answers
//! 503 `standby-unreachable` after the survival wait while a's zone tenant is
//! answered at once, and after the heal the retry replays the order.
//!
//! Losing the standby (contract section 11): with b's node killed under
//! steady zone writes, a's zone writes wait once b has confirmed nothing for
//! `max_standby_lag`, answer 503 `standby-unreachable`, and are answered
//! again within 10 s, once the registry records a's standby `lost`; the
//! region-survival tenant answers 503 `standby-unreachable` meanwhile; after
//! b's restart the standby catches up and is `streaming` again, and every
//! acknowledged order is there.
//!
//! Bounded loss (contract section 11): region a, idle and fully copied, is
//! cut off from everything; writes sent to its node directly from a moment
//! past `max_standby_lag` after the cut are none of them acknowledged. (The
//! region's own upkeep appends entries while it is cut off, which the
//! standby never confirms, so this holds even without the rule that the
//! standby must have answered lately; that rule is pinned by the unit test
//! `writes_are_allowed_only_while_a_majority_of_copies_answered_within_the_lag`
//! for a log with nothing unconfirmed.)

mod common;

use common::{order_body, unique, Cluster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Region `name`'s entry of the cluster view, read through `via`'s node.
fn region_view(cluster: &Cluster, via: &str, name: &str) -> Value {
    let view = cluster
        .api(via)
        .get("/admin/v1/cluster", Some(&cluster.info.admin_token))
        .json();
    view["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .expect("the region is listed")
}

/// A gauge of `/metrics`, with its labels as written (`{group="region-a"}`).
fn gauge(cluster: &Cluster, region: &str, series: &str) -> f64 {
    let text = cluster.api(region).get("/metrics", None).text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn each_region_streams_to_its_standby_and_reports_the_lag() {
    let cluster = Cluster::start("a,b,c", &[]);
    let a = cluster.api("a");
    let ta = cluster.tenant("a").token;
    for _ in 0..20 {
        a.create_order(&ta, &unique("k"), &order_body(&unique("co"), 1))
            .assert_status(201);
    }
    for (region, standby) in [("a", "b"), ("b", "c"), ("c", "a")] {
        assert_eq!(region_view(&cluster, "c", region)["standby"], standby);
    }
    // The standby's copy keeps up: lag zero, and b's node applied what a wrote.
    common::poll(Duration::from_secs(20), "a's standby caught up", || {
        let lag = region_view(&cluster, "b", "a")["replication_lag"].clone();
        (lag["commands"] == 0).then_some(())
    });
    let written = gauge(
        &cluster,
        "a",
        "keyhold_raft_last_log_index{group=\"region-a\"}",
    );
    assert!(written > 20.0, "a wrote {written} entries");
    // A learner learns that an entry committed with the leader's next message,
    // so its applied index follows the matched one a moment later.
    common::poll(Duration::from_secs(20), "b applied what a wrote", || {
        let copied = gauge(
            &cluster,
            "b",
            "keyhold_raft_applied_index{group=\"region-a\"}",
        );
        (copied >= written).then_some(())
    });

    // The standby cut off: a keeps answering at once, and its lag grows.
    cluster.control("/v1/regions/b/isolate");
    for _ in 0..10 {
        a.create_order(&ta, &unique("k"), &order_body(&unique("co"), 1))
            .assert_status(201);
    }
    std::thread::sleep(Duration::from_secs(1));
    let lag = region_view(&cluster, "a", "a")["replication_lag"].clone();
    assert!(lag["commands"].as_u64().unwrap() >= 10, "{lag}");
    assert!(lag["seconds"].as_f64().unwrap() >= 1.0, "{lag}");
    // Another region's view of b's lag is unknown while b is unreachable.
    assert_eq!(
        region_view(&cluster, "a", "b")["replication_lag"],
        Value::Null
    );

    cluster.control("/v1/regions/b/heal");
    common::poll(
        Duration::from_secs(20),
        "a's standby caught up again",
        || {
            let lag = region_view(&cluster, "a", "a")["replication_lag"].clone();
            (lag["commands"] == 0 && lag["seconds"] == 0.0).then_some(())
        },
    );
}

#[test]
fn a_region_survival_tenant_is_answered_only_while_its_standby_holds_its_orders() {
    let cluster = Cluster::start("a,b,c", &[]);
    let a = cluster.api("a");
    let safe = cluster.create_tenant("a", json!({"survival": "region"}));
    let zone = cluster.tenant("a");
    let shown = a
        .get(
            &format!("/admin/v1/tenants/{}", safe.tenant_id),
            Some(&cluster.info.admin_token),
        )
        .json();
    assert_eq!(shown["survival"], "region", "{shown}");
    common::poll(Duration::from_secs(20), "a streams to b", || {
        let lag = region_view(&cluster, "a", "a")["replication_lag"].clone();
        (!lag.is_null()).then_some(())
    });
    a.create_order(&safe.token, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);

    cluster.control("/v1/regions/b/isolate");
    let started = Instant::now();
    a.create_order(&zone.token, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);
    let zone_took = started.elapsed();
    let (key, client_order_id) = (unique("k"), unique("co"));
    let body = order_body(&client_order_id, 1);
    let started = Instant::now();
    let unheld = a.create_order(&safe.token, &key, &body);
    let took = started.elapsed();
    unheld.assert_problem(503, "standby-unreachable");
    assert_eq!(unheld.header("retry-after").as_deref(), Some("1"));
    // The 3 s survival wait (`SURVIVAL_WAIT_MS`); the zone tenant waited for nothing.
    assert!(took >= Duration::from_secs(3), "answered after {took:?}");
    assert!(
        zone_took < Duration::from_secs(3),
        "zone took {zone_took:?}"
    );

    cluster.control("/v1/regions/b/heal");
    let replay = common::poll(Duration::from_secs(30), "the retry replays", || {
        let retry = a.create_order(&safe.token, &key, &body);
        (retry.status != 503).then_some(retry)
    });
    replay.assert_status(201);
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    // The order the first attempt created (its status may have moved on since).
    let found = a.find_order(&safe.token, &client_order_id);
    found.assert_status(200);
    assert_eq!(replay.json()["order_id"], found.json()["order_id"]);
}

#[test]
fn losing_the_standby_pauses_zone_writes_briefly_and_never_unprotects_region_tenants() {
    let cluster = Cluster::start("a,b,c", &[]);
    let a = cluster.api("a");
    let safe = cluster.create_tenant("a", json!({"survival": "region"}));
    let zone = cluster.tenant("a");
    common::poll(Duration::from_secs(20), "a streams to b", || {
        let lag = region_view(&cluster, "a", "a")["replication_lag"].clone();
        (lag["commands"] == 0).then_some(())
    });
    assert_eq!(
        region_view(&cluster, "c", "a")["standby_state"],
        "streaming"
    );
    a.create_order(&safe.token, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);

    // b's only node dies; zone writes go on at a until they are answered
    // again after a pause.
    let b = cluster.node("b").node_id;
    let mut acked: Vec<String> = Vec::new();
    let killed_at = Instant::now();
    cluster.control(&format!("/v1/nodes/{b}/kill"));
    let mut refused = 0;
    let mut last_refusal = None;
    while killed_at.elapsed() < Duration::from_secs(20) {
        let r = a.create_order(&zone.token, &unique("k"), &order_body(&unique("co"), 1));
        match r.status {
            201 => {
                acked.push(r.json()["order_id"].as_str().expect("id").to_owned());
                if refused > 0 {
                    break;
                }
            }
            503 => {
                r.assert_problem(503, "standby-unreachable");
                refused += 1;
                last_refusal = Some(killed_at.elapsed());
            }
            other => panic!("a zone write answered {other}: {}", r.text()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let resumed = killed_at.elapsed();
    println!(
        "standby killed: {refused} zone writes refused, the last {last_refusal:?} after the \
         kill; answered again {resumed:?} after it"
    );
    assert!(refused > 0, "the zone writes never waited for the standby");
    assert!(
        resumed < Duration::from_secs(10),
        "zone writes answered again only {resumed:?} after the standby was lost"
    );
    assert_eq!(region_view(&cluster, "c", "a")["standby_state"], "lost");
    // Region-survival tenants never run unprotected.
    let (key, coid) = (unique("k"), unique("co"));
    let body = order_body(&coid, 1);
    let unprotected = a.create_order(&safe.token, &key, &body);
    unprotected.assert_problem(503, "standby-unreachable");
    assert!(unprotected.header("retry-after").is_some());

    // b comes back: it catches up, the registry records it streaming, and the
    // region-survival tenant is answered again.
    cluster.control(&format!("/v1/nodes/{b}/start"));
    common::poll(Duration::from_secs(60), "a's standby streams again", || {
        (region_view(&cluster, "c", "a")["standby_state"] == "streaming").then_some(())
    });
    let replay = common::poll(Duration::from_secs(30), "the retry answers", || {
        let retry = a.create_order(&safe.token, &key, &body);
        (retry.status != 503).then_some(retry)
    });
    replay.assert_status(201);
    for id in &acked {
        a.get(&format!("/v1/orders/{id}"), Some(&zone.token))
            .assert_status(200);
    }
}

#[test]
fn an_isolated_region_acknowledges_nothing_later_than_max_standby_lag_after_the_cut() {
    /// `max_standby_lag`'s default, what `up` runs with.
    const MAX_STANDBY_LAG: Duration = Duration::from_secs(1);
    /// The client times an answer when it arrives, after the node gave it.
    const TOLERANCE: Duration = Duration::from_millis(300);
    /// Until when writes keep coming after the cut: well into the region's
    /// lease (5 s), which alone would let it acknowledge.
    const WRITING_FOR: Duration = Duration::from_secs(4);
    let cluster = Cluster::start("a,b,c", &[]);
    let a = cluster.api("a");
    let zone = cluster.tenant("a");
    common::poll(Duration::from_secs(20), "a streams to b", || {
        let lag = region_view(&cluster, "a", "a")["replication_lag"].clone();
        (!lag.is_null()).then_some(())
    });
    for _ in 0..5 {
        a.create_order(&zone.token, &unique("k"), &order_body(&unique("co"), 1))
            .assert_status(201);
    }
    // Idle, every command held by b: nothing older than the lag is unconfirmed.
    std::thread::sleep(Duration::from_millis(1_500));

    cluster.control("/v1/regions/a/isolate");
    let cut = Instant::now();
    // Still idle past the lag: nothing is unconfirmed when the first write
    // comes, only the standby's silence can hold it.
    std::thread::sleep(MAX_STANDBY_LAG + TOLERANCE);
    let mut latest_ack = None;
    let mut refused = 0;
    while cut.elapsed() < WRITING_FOR {
        let answer = a.create_order(&zone.token, &unique("k"), &order_body(&unique("co"), 1));
        match answer.status {
            201 => latest_ack = Some(cut.elapsed()),
            503 => {
                if refused == 0 {
                    println!(
                        "first refusal {:?} after the cut: {}",
                        cut.elapsed(),
                        answer.text()
                    );
                }
                refused += 1;
            }
            other => panic!("unexpected {other}: {}", answer.text()),
        }
    }
    cluster.control("/v1/regions/a/heal");
    assert!(refused > 0, "every write was acknowledged while cut off");
    if let Some(latest) = latest_ack {
        assert!(
            latest <= MAX_STANDBY_LAG + TOLERANCE,
            "a write was acknowledged {latest:?} after the cut"
        );
    }
    // After the heal a's writes are answered again.
    common::poll(Duration::from_secs(30), "a answers writes again", || {
        let answer = a.create_order(&zone.token, &unique("k"), &order_body(&unique("co"), 1));
        (answer.status == 201).then_some(())
    });
}
