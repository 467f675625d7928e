//! End-to-end tests of `keyhold up` as a supervisor of node processes and of
//! its control API (contract section 10, "Processes"): a killed node is gone
//! and only its region's tenants suffer, a started node serves its data again,
//! an isolated region is cut off from the others both ways while the rest keep
//! a working registry and the isolated region stops executing once its region
//! lease ran out (and serves again after the heal), SIGKILL of `up` leaves no
//! node running, and a restart of `up` resumes every node.

mod common;

use common::{order_body, unique, Cluster};
use serde_json::Value;
use std::time::{Duration, Instant};

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Retries `f` (bounded) until it gives `Some`.
#[track_caller]
fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cluster_json_names_every_node_process_and_the_control_api() {
    let cluster = Cluster::start("a,b", &[]);
    let raw = &cluster.info.raw;
    let control = cluster.info.control_url.clone();
    let port: u16 = control
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("control_url is an origin: {control}"));
    assert!((cluster.base_port..cluster.base_port + 50).contains(&port));
    assert_eq!(cluster.info.nodes.len(), 2, "{raw}");
    for (node, region) in cluster.info.nodes.iter().zip(["a", "b"]) {
        assert_eq!(node.region, region);
        assert_eq!(node.api_url, cluster.region(region).api_url);
        let pid = node.pid.expect("a running node has a pid");
        assert!(process_exists(pid));
        assert_ne!(pid, cluster.pid(), "each node is its own process");
        assert!(
            cluster.node_log(region).contains("keyhold node listening"),
            "each node logs to its own file"
        );
    }

    // Only the admin token opens the control API; unknown names are 404.
    let node_id = cluster.node("a").node_id;
    let (status, body) = cluster.control_as(&format!("/v1/nodes/{node_id}/kill"), None);
    assert_eq!(status, 401, "{body}");
    assert!(body["type"].as_str().unwrap().ends_with("/unauthenticated"));
    let tenant = cluster.tenant("a").token;
    let (status, _) = cluster.control_as(&format!("/v1/nodes/{node_id}/kill"), Some(&tenant));
    assert_eq!(status, 401, "a tenant's token is not the admin's");
    let admin = cluster.info.admin_token.clone();
    for path in [
        "/v1/nodes/99/kill",
        "/v1/nodes/x/start",
        "/v1/regions/zz/isolate",
    ] {
        let (status, body) = cluster.control_as(path, Some(&admin));
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body["type"].as_str().unwrap().ends_with("/not-found"));
    }
    assert!(
        process_exists(cluster.node("a").pid.unwrap()),
        "refused calls kill nothing"
    );
}

#[test]
fn a_killed_node_takes_down_only_its_region_and_comes_back_with_its_data() {
    let mut cluster = Cluster::start("a,b,c", &[]);
    let (a, b) = (cluster.api("a"), cluster.api("b"));
    let (ta, tb) = (cluster.tenant("a").token, cluster.tenant("b").token);
    let key = unique("k");
    let coid = unique("co");
    let first = b.create_order(&tb, &key, &order_body(&coid, 7));
    first.assert_status(201);

    let node = cluster.node("b");
    let old_pid = node.pid.unwrap();
    let answer = cluster.control(&format!("/v1/nodes/{}/kill", node.node_id));
    assert_eq!(answer["state"], "stopped", "{answer}");
    assert!(
        !process_exists(old_pid),
        "kill answers once the process is reaped"
    );
    cluster.reload_info();
    assert_eq!(cluster.node("b").pid, None, "cluster.json shows it down");

    // b's tenant cannot be served from a; a's tenant is served as before.
    let forwarded = a.create_order(&tb, &unique("k"), &order_body(&unique("co"), 1));
    forwarded.assert_problem(503, "owner-unreachable");
    a.create_order(&ta, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);
    // Killing a node that is down is a no-op.
    cluster.control(&format!("/v1/nodes/{}/kill", node.node_id));

    let answer = cluster.control(&format!("/v1/nodes/{}/start", node.node_id));
    assert_eq!(answer["state"], "running", "{answer}");
    let new_pid = answer["pid"].as_u64().expect("pid") as u32;
    assert!(process_exists(new_pid));
    cluster.reload_info();
    assert_eq!(
        cluster.node("b").pid,
        Some(new_pid),
        "cluster.json has the new pid"
    );

    // The order made before the kill replays, through b and through a.
    for api in [&b, &a.expecting("b")] {
        let replay = eventually("the restarted node serves", Duration::from_secs(20), || {
            let r = api
                .try_send(api.order_rb(&tb, &key, &order_body(&coid, 7)))
                .ok()?;
            (r.status == 201).then_some(r)
        });
        assert_eq!(replay.body, first.body, "byte-identical replay");
    }
}

#[test]
fn an_isolated_region_is_cut_off_both_ways_and_heals() {
    let cluster = Cluster::start("a,b,c", &[]);
    let (a, c) = (cluster.api("a"), cluster.api("c"));
    let tc = cluster.tenant("c").token;
    let key = unique("k");
    let coid = unique("co");
    let first = c.create_order(&tc, &key, &order_body(&coid, 3));
    first.assert_status(201);

    let answer = cluster.control("/v1/regions/c/isolate");
    assert_eq!(answer["isolated"], true, "{answer}");
    // Requests forwarded into c fail at once from the other regions.
    a.create_order(&tc, &key, &order_body(&coid, 3))
        .assert_problem(503, "owner-unreachable");
    // The registry still works among a and b: a tenant can be created.
    cluster.create_tenant("a", Value::Null);
    // And c's side of the cut: c cannot reach a's tenant either.
    let ta = cluster.tenant("a").token;
    c.create_order(&ta, &unique("k"), &order_body(&unique("co"), 1))
        .assert_problem(503, "owner-unreachable");

    let answer = cluster.control("/v1/regions/c/heal");
    assert_eq!(answer["isolated"], false, "{answer}");
    let a_to_c = a.expecting("c");
    let a = &a_to_c;
    let replay = eventually("a reaches c again", Duration::from_secs(20), || {
        let r = a
            .try_send(a.order_rb(&tc, &key, &order_body(&coid, 3)))
            .ok()?;
        (r.status == 201).then_some(r)
    });
    assert_eq!(replay.body, first.body, "byte-identical replay");
}

#[test]
fn an_isolated_region_stops_executing_within_its_lease_and_serves_again_after_the_heal() {
    let lease = Duration::from_millis(keyhold_server::limits::REGION_LEASE_MS);
    let cluster = Cluster::start("a,b,c", &[]);
    let (a, c) = (cluster.api("a"), cluster.api("c"));
    let (ta, tc) = (cluster.tenant("a").token, cluster.tenant("c").token);
    let new_order = |api: &common::Api, token: &str| {
        api.try_send(api.order_rb(token, &unique("k"), &order_body(&unique("co"), 2)))
    };
    new_order(&c, &tc).unwrap().assert_status(201);

    cluster.control("/v1/regions/c/isolate");
    let cut = Instant::now();
    // Cut off from the registry's majority, c stops on its own: its own tenant,
    // sent straight to c, is refused once the lease ran out.
    let refused = eventually("c stops executing", lease * 3, || {
        let r = new_order(&c, &tc).ok()?;
        (r.status == 503).then_some(r)
    });
    let stopped_after = cut.elapsed();
    println!("c stopped answering {stopped_after:?} after the cut (lease {lease:?})");
    // Its standby (a) falls silent first: within `max_standby_lag` and the
    // bounded wait, c holds its answers back (contract section 11, "Bounded
    // loss"); once the lease ran out it executes nothing at all.
    assert!(
        matches!(
            refused.slug().as_deref(),
            Some("standby-unreachable" | "owner-unreachable")
        ),
        "{}",
        refused.text()
    );
    assert!(
        refused.header("retry-after").is_some(),
        "a refusal says when to retry"
    );
    assert!(
        stopped_after < lease + Duration::from_secs(3),
        "stopped {stopped_after:?} after the cut, the lease is {lease:?}"
    );
    let unowned = eventually("c's lease runs out", lease * 3, || {
        let r = new_order(&c, &tc).ok()?;
        (r.slug().as_deref() == Some("owner-unreachable")).then_some(r)
    });
    let stopped_after = cut.elapsed();
    println!("c stopped executing {stopped_after:?} after the cut (lease {lease:?})");
    unowned.assert_problem(503, "owner-unreachable");
    assert!(
        stopped_after < lease + Duration::from_secs(3),
        "stopped {stopped_after:?} after the cut, the lease is {lease:?}"
    );
    // The majority side keeps its lease and executes.
    new_order(&a, &ta).unwrap().assert_status(201);

    cluster.control("/v1/regions/c/heal");
    eventually("c executes again", Duration::from_secs(20), || {
        let r = new_order(&c, &tc).ok()?;
        (r.status == 201).then_some(())
    });
}

#[test]
fn sigkill_of_up_leaves_no_node_and_a_restart_resumes_every_node() {
    let mut cluster = Cluster::start("a,b", &[]);
    let b = cluster.api("b");
    let tb = cluster.tenant("b").token;
    let key = unique("k");
    let coid = unique("co");
    let first = b.create_order(&tb, &key, &order_body(&coid, 5));
    first.assert_status(201);
    let nodes: Vec<u32> = cluster.info.nodes.iter().filter_map(|n| n.pid).collect();
    assert_eq!(nodes.len(), 2);

    cluster.kill9();
    eventually("every node exits with up", Duration::from_secs(5), || {
        nodes.iter().all(|&p| !process_exists(p)).then_some(())
    });

    cluster.restart();
    for node in &cluster.info.nodes {
        let pid = node.pid.expect("every node runs again");
        assert!(process_exists(pid) && !nodes.contains(&pid));
    }
    let a = cluster.api("a").expecting("b");
    for api in [&b, &a] {
        let replay = api.create_order(&tb, &key, &order_body(&coid, 5));
        replay.assert_status(201);
        assert_eq!(replay.body, first.body, "byte-identical replay");
    }
}
