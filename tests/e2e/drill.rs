//! End-to-end test of `keyhold drill` (contract section 10, "Drill"; issue 12)
//! on `keyhold up --regions a,b,c`: a drill of an isolated region, then one of
//! a killed region on the same cluster, each must pass (exit 0) and report its
//! figures, in the table on stdout and in the JSON report. The same with three
//! nodes per region: `drill_replicas.rs`.

mod common;

use common::{drill, Cluster};

#[test]
fn drills_of_an_isolated_and_of_a_killed_region_pass_and_report_their_figures() {
    let cluster = Cluster::start("a,b,c", &[]);
    for (region, fault, to) in [("a", "isolate", "b"), ("b", "kill", "c")] {
        let report = drill::run(&cluster, region, fault);
        drill::assert_passed(&report, to);
    }
}
