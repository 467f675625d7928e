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

fn failover(cluster: &Cluster, via: &str, region: &str, body: &str) -> common::Resp {
    cluster.api(via).post_json(
        &format!("/admin/v1/regions/{region}/failover"),
        Some(&cluster.info.admin_token),
        body,
    )
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
