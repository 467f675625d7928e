//! End-to-end test of `keyhold drill` (contract section 10, "Drill"; issue 12)
//! on `keyhold up --regions a,b,c`: a drill of an isolated region, then one of
//! a killed region on the same cluster, each must pass (exit 0) and report its
//! figures, in the table on stdout and in the JSON report. The same with three
//! nodes per region: `drill_replicas.rs`.

mod common;

use common::{drill, Cluster, KEYHOLD};
use std::process::Command;

#[test]
fn drills_of_an_isolated_and_of_a_killed_region_pass_and_report_their_figures() {
    let cluster = Cluster::start("a,b,c", &[]);
    for (region, fault, to) in [("a", "isolate", "b"), ("b", "kill", "c")] {
        let report = drill::run(&cluster, region, fault);
        drill::assert_passed(&report, to);
    }
}

/// Issue 39: `keyhold drill --auto` on a cluster that fails regions over by
/// itself (`--auto-failover-after 2s`) asks for nothing, waits for the
/// cluster's failover, passes, and splits the window by phase; the clients
/// are served again within the contract's 10 s, each phase in its place.
#[test]
fn an_automatic_drill_waits_for_the_cluster_s_failover_and_splits_the_window() {
    let cluster = Cluster::start("a,b,c", &["--auto-failover-after", "2s"]);
    for (region, fault, to) in [("a", "kill", "b"), ("b", "isolate", "c")] {
        let report = drill::run_with(&cluster, region, fault, &["--auto"]);
        drill::assert_passed(&report, to);
        assert_eq!(report["trigger"], "automatic", "{report}");
        let phases = &report["timings"]["phases"];
        let served = phases["served_again_s"].as_f64().expect("served again");
        assert!(
            served < 10.0,
            "served again only {served} s after the fault: {phases}"
        );
        let detection = phases["detection_s"].as_f64().unwrap();
        assert!((1.5..served).contains(&detection), "{phases}");
        let lease = phases["lease_wait_s"]
            .as_f64()
            .expect("the lease wait seen");
        assert!(lease > 0.0 && detection + lease < served, "{phases}");
        let timeline = report["timeline"].to_string();
        assert!(
            timeline.contains("failover begun by the cluster"),
            "{timeline}"
        );
    }
}

/// Contract section 11: the drill takes its tenants from the registry when it
/// starts, not from cluster.json (whose homes are those of `up`'s start). After
/// region a's only tenant moved to b, a drill of a tests nothing: it is
/// refused, non-zero, saying why and where the tenant lives. It used to drill
/// a anyway, sending demo-a's orders to b, and print PASS.
#[test]
fn a_drill_of_a_region_whose_tenants_moved_away_is_refused() {
    let cluster = Cluster::start("a,b", &[]);
    drill::move_back(&cluster, "b", "demo-a", "b");
    let cluster_json = cluster.data_dir().join("cluster.json");
    let out = Command::new(KEYHOLD)
        .args(["drill", "--cluster"])
        .arg(&cluster_json)
        .args([
            "--region",
            "a",
            "--rate",
            "20",
            "--duration",
            "1s",
            "--quiet",
        ])
        .output()
        .expect("run keyhold drill");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("homes no active tenant in region a")
            && stderr.contains("demo-a in b")
            && stderr.contains("keyhold tenant move"),
        "the refusal says why and the way out:\n{stderr}"
    );
    assert!(!stdout.contains("verdict"), "no drill ran:\n{stdout}");
}
