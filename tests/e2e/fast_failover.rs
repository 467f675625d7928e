//! End-to-end tests of automatic failover with the shortest
//! `auto_failover_after` (contract section 11, "Fast automatic failover";
//! issue 39) on `keyhold up --auto-failover-after 2s`: after a SIGKILL of a
//! region's node, and after its isolation, a client of its zone tenant that
//! retries one order through the other regions has it accepted in the standby
//! region with nobody asking for the failover, within the contract's 10 s; the
//! same when the registry leader's node is killed while the failover waits
//! for the lost region's lease. In the isolation, a client talking straight to
//! the isolated node keeps writing for longer than its whole lease, and
//! nothing it executes is acknowledged after the failover is done.

mod common;

use common::{order_body, unique, Api, Cluster};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Contract section 11: orders accepted again within 10 s of the fault.
/// docs/benchmarks.md says where the seconds go (about 6 s here).
const WINDOW_MAX: Duration = Duration::from_secs(10);
/// One attempt of the retrying client; it retries at once after a timeout.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between the retrying client's attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long the direct client keeps writing to a after the fault: beyond a's
/// region lease (5 s) and the failover's margin, the longest a could think
/// it owns its tenant.
const DIRECT_WRITES_FOR: Duration = Duration::from_secs(8);

/// Retries one new order of `region`'s tenant (one key) through `vias` in
/// turn until it is accepted; answers how long after `fault` that was and the
/// region that executed it.
fn accepted_again(
    cluster: &Cluster,
    region: &str,
    vias: &[&str],
    fault: Instant,
) -> (Duration, String) {
    let tenant = cluster.tenant(region);
    let (key, body) = (unique("k"), order_body(&unique("co"), 2));
    let vias: Vec<Api> = vias.iter().map(|r| cluster.api(r)).collect();
    let regions: Vec<&str> = cluster
        .info
        .regions
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    let mut attempt = 0;
    loop {
        assert!(
            fault.elapsed() < 3 * WINDOW_MAX,
            "no order accepted {:?} after the fault",
            fault.elapsed()
        );
        let via = &vias[attempt % vias.len()];
        attempt += 1;
        let rb = via
            .order_rb(&tenant.token, &key, &body)
            .timeout(ATTEMPT_TIMEOUT);
        if let Ok(answer) = via.try_send_any(rb, &regions) {
            if answer.status == 201 || answer.status == 200 {
                let region = answer.header("keyhold-region").unwrap_or_default();
                return (fault.elapsed(), region);
            }
        }
        std::thread::sleep(RETRY_PAUSE);
    }
}

/// `region`'s failover as `via` lists it, once it satisfies `done`.
fn failover_of(cluster: &Cluster, region: &str, via: &str, wanted: &str) -> Value {
    common::poll(Duration::from_secs(60), "the failover listed", || {
        let ops = cluster
            .api(via)
            .get("/admin/v1/operations", Some(&cluster.info.admin_token))
            .json();
        ops["data"]
            .as_array()?
            .iter()
            .find(|op| {
                op["kind"] == "failover"
                    && op["from"] == region
                    && (wanted == "any" || op["state"] == wanted)
            })
            .cloned()
    })
}

/// The automatic failover of a, once done (through c).
fn failover_of_a(cluster: &Cluster) -> Value {
    failover_of(cluster, "a", "c", "done")
}

#[test]
fn a_killed_region_s_tenant_is_served_again_within_ten_seconds() {
    let cluster = Cluster::start("a,b,c", &["--auto-failover-after", "2s"]);
    let tenant = cluster.tenant("a");
    let c = cluster.api("c");
    let (key, body) = (unique("k"), order_body(&unique("co"), 3));
    let first = c.expecting("a").create_order(&tenant.token, &key, &body);
    first.assert_status(201);
    cluster.standby_caught_up("a");

    let nodes: Vec<u64> = cluster
        .info
        .nodes
        .iter()
        .filter(|n| n.region == "a")
        .map(|n| n.node_id)
        .collect();
    let fault = Instant::now();
    for id in &nodes {
        cluster.control(&format!("/v1/nodes/{id}/kill"));
    }
    let (window, region) = accepted_again(&cluster, "a", &["b", "c"], fault);
    eprintln!("kill: an order accepted again {window:?} after the fault, in {region}");
    assert!(
        window < WINDOW_MAX,
        "accepted only {window:?} after the kill"
    );
    assert_eq!(region, "b");
    let done = failover_of_a(&cluster);
    assert_eq!(done["to"], "b");
    // What a acknowledged before the kill is served by b.
    let replay = c.expecting("b").create_order(&tenant.token, &key, &body);
    replay.assert_status(201);
    assert_eq!(replay.json(), first.json());
}

#[test]
fn an_isolated_region_is_failed_over_within_ten_seconds_and_acknowledges_nothing_after_done() {
    let cluster = Cluster::start("a,b,c", &["--auto-failover-after", "2s"]);
    let tenant = cluster.tenant("a");
    let a = cluster.api("a");
    let started = SystemTime::now();
    a.create_order(&tenant.token, &unique("k"), &order_body(&unique("co"), 1))
        .assert_status(201);
    cluster.standby_caught_up("a");

    // A client keeps writing straight to a's node, new orders, and notes when
    // each acknowledgement a executed arrived.
    let acks: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (a, token, acks, stop) = (a.clone(), tenant.token.clone(), acks.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rb = a
                    .order_rb(&token, &unique("k"), &order_body(&unique("co"), 1))
                    .timeout(ATTEMPT_TIMEOUT);
                if let Ok(r) = a.try_send_any(rb, &["a", "b"]) {
                    let executed_in_a = r.header("keyhold-region").as_deref() == Some("a");
                    if (r.status == 201 || r.status == 200) && executed_in_a {
                        acks.lock().unwrap().push(SystemTime::now());
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    cluster.control("/v1/regions/a/isolate");
    let fault = Instant::now();
    let (window, region) = accepted_again(&cluster, "a", &["b", "c"], fault);
    eprintln!("isolate: an order accepted again {window:?} after the fault, in {region}");
    assert!(
        window < WINDOW_MAX,
        "accepted only {window:?} after the isolation"
    );
    assert_eq!(region, "b");
    let done = failover_of_a(&cluster);
    assert_eq!(done["to"], "b");
    // When the registry recorded it done (by the driver's wall clock, the
    // same machine's as this test's).
    let done_at = humantime::parse_rfc3339(done["updated_at"].as_str().expect("updated_at"))
        .expect("an RFC 3339 time");
    // On past a's lease, and at least 2 s past done.
    let remaining = DIRECT_WRITES_FOR
        .saturating_sub(fault.elapsed())
        .max(Duration::from_secs(2));
    std::thread::sleep(remaining);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acks = acks.lock().unwrap().clone();
    let since = |t: SystemTime| t.duration_since(started).unwrap_or_default();
    eprintln!(
        "isolate: a's last acknowledgement {:?}, failover done {:?}, after the test began",
        acks.iter().max().map(|t| since(*t)),
        since(done_at)
    );
    let late = acks.iter().filter(|at| **at > done_at).count();
    assert_eq!(
        late, 0,
        "a acknowledged {late} orders after its failover was done"
    );
    cluster.control("/v1/regions/a/heal");
}

/// The node id of the registry's leader, as `via` sees it.
fn registry_leader(cluster: &Cluster, via: &str) -> u64 {
    let view = cluster
        .api(via)
        .get("/admin/v1/cluster", Some(&cluster.info.admin_token))
        .json();
    view["registry"]["leader"]
        .as_u64()
        .expect("a registry leader")
}

#[test]
fn a_killed_region_is_failed_over_in_time_when_the_registry_leader_dies_during_the_wait() {
    // Five regions, one node each (every node votes in the registry): the
    // lost region and the registry leader's node leave three of five, a
    // majority. Standbys are the next region: a->b, b->c, ..., e->a.
    let regions = ["a", "b", "c", "d", "e"];
    let cluster = Cluster::start("a,b,c,d,e", &["--auto-failover-after", "2s"]);
    let leader_id = registry_leader(&cluster, "a");
    let leader = cluster
        .info
        .nodes
        .iter()
        .find(|n| n.node_id == leader_id)
        .expect("the leader is a node of the cluster")
        .clone();
    let at = regions
        .iter()
        .position(|r| *r == leader.region)
        .expect("a region");
    // The lost region and its standby are neither the registry leader's.
    let lost = regions[(at + 2) % regions.len()];
    let standby = regions[(at + 3) % regions.len()];
    let other = regions[(at + 4) % regions.len()];
    let tenant = cluster.tenant(lost);
    let via = cluster.api(standby);
    let (key, body) = (unique("k"), order_body(&unique("co"), 3));
    let first = via.expecting(lost).create_order(&tenant.token, &key, &body);
    first.assert_status(201);
    cluster.standby_caught_up(lost);

    let fault = Instant::now();
    cluster.control(&format!("/v1/nodes/{}/kill", cluster.node(lost).node_id));
    // The failover begins (about 2 s in), and while it waits for the lost
    // region's lease the registry's leader dies.
    failover_of(&cluster, lost, other, "any");
    std::thread::sleep(Duration::from_millis(500));
    cluster.control(&format!("/v1/nodes/{leader_id}/kill"));
    eprintln!(
        "registry leader (node {leader_id}, region {}) killed {:?} after the fault",
        leader.region,
        fault.elapsed()
    );

    let (window, region) = accepted_again(&cluster, lost, &[standby, other], fault);
    eprintln!("an order of {lost} accepted again {window:?} after the fault, in {region}");
    assert!(
        window < WINDOW_MAX,
        "accepted only {window:?} after the kill"
    );
    assert_eq!(region, standby);
    let done = failover_of(&cluster, lost, other, "done");
    assert_eq!(done["to"], standby);
    let replay = via
        .expecting(standby)
        .create_order(&tenant.token, &key, &body);
    replay.assert_status(201);
    assert_eq!(replay.json(), first.json());
}

#[test]
fn a_failover_s_progress_moves_while_it_waits_for_the_lease() {
    // Isolated, the region's lease runs out about 5 s after its last contact;
    // the driver reports the wait's progress on the way.
    let cluster = Cluster::start("a,b,c", &["--auto-failover-after", "2s"]);
    cluster.standby_caught_up("a");
    cluster.control("/v1/regions/a/isolate");
    let mut seen: Vec<f64> = Vec::new();
    let done = common::poll(Duration::from_secs(30), "a's failover done", || {
        let op = failover_of(&cluster, "a", "c", "any");
        let progress = op["progress"].as_f64().expect("progress");
        if seen.last() != Some(&progress) {
            seen.push(progress);
        }
        std::thread::sleep(Duration::from_millis(100));
        (op["state"] == "done").then_some(op)
    });
    eprintln!("progress seen: {seen:?}");
    assert_eq!(done["progress"], 1.0);
    let between = seen.iter().filter(|p| **p > 0.0 && **p < 1.0).count();
    assert!(between >= 2, "the progress jumped: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the progress went back: {seen:?}"
    );
    cluster.control("/v1/regions/a/heal");
}
