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
//! 503 `store-unavailable` after the survival wait while a's zone tenant is
//! answered at once, and after the heal the retry replays the order.

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
    unheld.assert_problem(503, "store-unavailable");
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
