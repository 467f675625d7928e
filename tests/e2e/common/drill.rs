//! The drill steps shared by the end-to-end drill tests (one node per region,
//! and three): run `keyhold drill` against a cluster and judge its report
//! against the properties issue 12 asks of every drill; then the "heal" the
//! drill itself does not do: the returned region reconciled, standing in as
//! the standby it is for another region, and a tenant moved back to it.

use super::{order_body, poll, unique, Cluster, KEYHOLD};
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

/// How long a planned move back to a returned region may take (a handful of
/// orders: seconds; this leaves room for a loaded CI machine).
const MOVE_BACK_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a returned region's standby copy may take to catch up again
/// (its copy of another region, refilled by a snapshot when it was reset).
const STANDBY_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one drill on `cluster` (30 orders/s, 3 s of steady traffic) and
/// returns its JSON report, after printing its table and log (a CI log then
/// shows the figures). The drill must exit 0 with a `PASS` verdict.
pub fn run(cluster: &Cluster, region: &str, fault: &str) -> Value {
    run_with(cluster, region, fault, &[])
}

/// `run` with more of `keyhold drill`'s options (`--auto`).
pub fn run_with(cluster: &Cluster, region: &str, fault: &str, extra: &[&str]) -> Value {
    let report = cluster.data_dir().join(format!("drill-{region}.json"));
    let cluster_json = cluster.data_dir().join("cluster.json");
    let out = Command::new(KEYHOLD)
        .args(["drill", "--cluster"])
        .arg(&cluster_json)
        .args(["--region", region, "--fault", fault])
        .args(extra)
        .args(["--rate", "30", "--duration", "3s", "--quiet", "--json"])
        .arg(&report)
        .output()
        .expect("run keyhold drill");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- drill {region} {fault} ---\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the drill failed: {stdout}");
    assert!(
        stdout.contains("verdict") && stdout.contains("PASS"),
        "{stdout}"
    );
    serde_json::from_slice(&std::fs::read(&report).expect("the JSON report")).expect("JSON")
}

/// The properties every passing drill's report has: failed over to `to`,
/// orders acknowledged, the failover's result, nothing acknowledged by the
/// failed region after `done`, no order charged twice, no unlisted loss.
#[track_caller]
pub fn assert_passed(report: &Value, to: &str) {
    assert_eq!(report["passed"], true, "{report}");
    assert_eq!(report["to"], to);
    assert!(
        report["orders_acknowledged"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["failover_result"]["at"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(report["failover_result"]["estimated_lost"]["commands"].is_u64());
    assert!(report["timings"]["time_to_detect_s"].is_f64(), "{report}");
    assert_eq!(report["acknowledged_after_done_in_region"], 0);
    assert_eq!(report["charges"]["more_than_once"], 0, "{report}");
    assert!(report["lost_unlisted"].as_array().unwrap().is_empty());
    assert!(report["duplicates_unlisted"].as_array().unwrap().is_empty());
    assert_timeline(report, to);
}

/// Contract section 11: the report gives each phase with its time, in the
/// order it happened, and the failed attempts by reason.
#[track_caller]
fn assert_timeline(report: &Value, to: &str) {
    let moments = report["timeline"].as_array().expect("a timeline");
    let whats: Vec<&str> = moments.iter().filter_map(|m| m["what"].as_str()).collect();
    let position = |prefix: &str| {
        whats
            .iter()
            .position(|w| w.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in the timeline {whats:?}"))
    };
    let in_order = [
        "fault: ",
        // "failover requested", or with --auto "failover begun by the cluster"
        "failover ",
        "failover done: ",
        "the region is back",
        "reconciliation done: ",
    ]
    .map(position);
    assert!(in_order.windows(2).all(|w| w[0] < w[1]), "{whats:?}");
    let first_failure = position("first failed request (");
    assert!(first_failure > in_order[0], "{whats:?}");
    let new_home = position(&format!("first success in the new home {to}"));
    assert!(new_home > in_order[0], "{whats:?}");
    let seconds: Vec<f64> = moments
        .iter()
        .map(|m| m["after_fault_s"].as_f64().unwrap())
        .collect();
    assert!(seconds.windows(2).all(|w| w[0] <= w[1]), "{seconds:?}");
    assert!(
        moments
            .iter()
            .all(|m| m["at"].as_str().is_some_and(|at| at.ends_with('Z'))),
        "{moments:?}"
    );
    let reasons = report["failures_by_reason"].as_object().expect("reasons");
    assert!(!reasons.is_empty(), "{report}");
}

/// After a drill of `region`: its reconciliation of the drill's failover is
/// `done` (read through `via`, another region), and every region whose
/// standby `region` is has its standby caught up again (the returned region
/// serves as a standby).
pub fn assert_returned(cluster: &Cluster, via: &str, region: &str, report: &Value) {
    let admin = Some(cluster.info.admin_token.as_str());
    let api = cluster.api(via);
    let rec = api
        .get(&format!("/admin/v1/regions/{region}/reconciliation"), admin)
        .json();
    assert_eq!(rec["state"], "done", "{rec}");
    assert_eq!(
        rec["failover_operation_id"], report["failover_operation_id"],
        "{rec}"
    );
    poll(
        STANDBY_CATCH_UP_TIMEOUT,
        &format!("{region} serves as a standby again"),
        || {
            let view = api.get("/admin/v1/cluster", admin).json();
            let standing_in: Vec<Value> = view["regions"]
                .as_array()?
                .iter()
                .filter(|r| r["standby"] == region)
                .cloned()
                .collect();
            let caught_up = !standing_in.is_empty()
                && standing_in
                    .iter()
                    .all(|r| r["replication_lag"]["commands"] == 0);
            caught_up.then_some(())
        },
    );
}

/// Moves `tenant_id` back to `region` with a planned move (started through
/// `via`) and checks it is then served there: a new order through `via`
/// answers from `region`.
pub fn move_back(cluster: &Cluster, via: &str, tenant_id: &str, region: &str) {
    let admin = Some(cluster.info.admin_token.as_str());
    let api = cluster.api(via);
    let started = api.post_json(
        &format!("/admin/v1/tenants/{tenant_id}/move"),
        admin,
        &json!({ "to": region }).to_string(),
    );
    started.assert_status(202);
    let op = started.json()["operation_id"]
        .as_str()
        .expect("operation_id")
        .to_owned();
    let finished = poll(MOVE_BACK_TIMEOUT, &format!("move {op} finished"), || {
        let view = api.get(&format!("/admin/v1/operations/{op}"), admin).json();
        matches!(view["state"].as_str(), Some("done" | "failed")).then_some(view)
    });
    assert_eq!(finished["state"], "done", "{finished}");
    let token = cluster
        .info
        .tenants
        .iter()
        .find(|t| t.tenant_id == tenant_id)
        .expect("the tenant is in cluster.json")
        .token
        .clone();
    let created =
        api.expecting(region)
            .create_order(&token, &unique("k"), &order_body(&unique("co"), 1));
    created.assert_status(201);
    assert_eq!(created.header("keyhold-region").as_deref(), Some(region));
}
