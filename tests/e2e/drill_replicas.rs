//! End-to-end test of region failover with three nodes per region (issue 12,
//! "once with three nodes per region"): on `keyhold up --regions a,b,c
//! --nodes-per-region 3` (nine nodes), `keyhold drill` isolates region a
//! (all three of its nodes cut off) and fails it over to b, then SIGKILLs all
//! three nodes of region b and fails it over to c. Each drill must pass with
//! the same report properties as with one node per region; after each
//! return the region's reconciliation is `done`, it serves as a standby again
//! (the region it stands in for has its lag back at zero), and a planned move
//! brings its tenant back to it.

mod common;

use common::{drill, Cluster};

#[test]
fn with_three_nodes_per_region_isolate_and_kill_drills_pass_and_the_regions_take_their_tenants_back(
) {
    let cluster = Cluster::start("a,b,c", &["--nodes-per-region", "3"]);
    for (region, fault, to) in [("a", "isolate", "b"), ("b", "kill", "c")] {
        let tenant = cluster.tenant(region).tenant_id;
        let report = drill::run(&cluster, region, fault);
        drill::assert_passed(&report, to);
        drill::assert_returned(&cluster, to, region, &report);
        drill::move_back(&cluster, to, &tenant, region);
    }
}
