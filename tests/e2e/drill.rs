//! End-to-end test of `keyhold drill` (contract section 10, "Drill"; issue 12)
//! on `keyhold up --regions a,b,c`: a drill of an isolated region, then one of
//! a killed region on the same cluster, each must pass (exit 0) and report its
//! figures, in the table on stdout and in the JSON report.

mod common;

use common::{Cluster, KEYHOLD};
use serde_json::Value;
use std::process::Command;

/// Runs one drill on `cluster` and returns its JSON report, after printing
/// its table and log (a CI log then shows the figures).
fn drill(cluster: &Cluster, region: &str, fault: &str) -> Value {
    let report = cluster.data_dir().join(format!("drill-{region}.json"));
    let cluster_json = cluster.data_dir().join("cluster.json");
    let out = Command::new(KEYHOLD)
        .args(["drill", "--cluster"])
        .arg(&cluster_json)
        .args(["--region", region, "--fault", fault])
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

#[test]
fn drills_of_an_isolated_and_of_a_killed_region_pass_and_report_their_figures() {
    let cluster = Cluster::start("a,b,c", &[]);
    for (region, fault, to) in [("a", "isolate", "b"), ("b", "kill", "c")] {
        let report = drill(&cluster, region, fault);
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
    }
}
