//! Seeded chaos in CI: `keyhold chaos` runs a few seeds (each a local cluster
//! through `keyhold up`, client traffic, read-backs and faults from the seed,
//! judged by the history checker) and must pass each. A failing seed's directory (plan,
//! history, final state, verdict, logs) is kept and named in the output.

use std::process::Command;

const KEYHOLD: &str = env!("CARGO_BIN_EXE_keyhold");
/// Seeds CI runs: few, so the suite stays short; `scripts/chaos` runs many.
/// They run two at a time (one `keyhold chaos` process and cluster each),
/// and between them plan every fault kind: seed 1 loses region c's standby (b's
/// standby region isolated 7.9 s) besides a node kill, an isolation and two
/// moves; seed 2 isolates region a and fails it over by hand, then kills the
/// whole cluster twice and replays the outbox; seed 3 runs 3-node regions and
/// isolates node 6 (a follower or leader of region c) for 3 s besides a node
/// kill and a move; seed 13 kills region b and lets the cluster fail it over
/// (`--auto-failover-after 15s`).
const EVERY_KIND_SEEDS: [u64; 4] = [1, 2, 3, 13];
/// Seed 106 SIGKILLs the cluster 268 ms after it starts a move: the move must
/// end within `MOVES_SETTLE_MS` of the traffic (its driver's node resumes it
/// after the restart), not once the driver's lease expired. (Seed 1 played
/// this part before the plan drew node kills and isolations.)
const MOVE_CUT_SHORT_SEED: u64 = 106;
/// Seed 21 SIGKILLs the cluster right after a move's 202, before its driver
/// held the lease: the registry leader's node drives it once it stayed
/// without a lease for `MOVE_UNLEASED_GRACE_MS`, not after a whole lease.
const MOVE_UNLEASED_SEED: u64 = 21;

/// Seed 8 isolates region b while a claim completion forwarded into b may be
/// in flight: b completes it, the forwarding node answers 503
/// `owner-unreachable`, and a later claim replays b's body.
const ISOLATION_CUT_SEED: u64 = 8;

/// Seeds run this many at once: four clusters at once (one of nine nodes)
/// starved `keyhold up`'s start on the shared 2-core machine.
const SEEDS_AT_ONCE: usize = 2;

#[test]
fn chaos_seeds_with_every_fault_kind_pass_the_checker() {
    let mut failed: Vec<String> = Vec::new();
    for seeds in EVERY_KIND_SEEDS.chunks(SEEDS_AT_ONCE) {
        let runs: Vec<_> = seeds
            .iter()
            .map(|&seed| (seed, std::thread::spawn(move || run_seeds(seed, 1))))
            .collect();
        for (seed, run) in runs {
            if let Err(e) = run.join() {
                failed.push(format!("seed {seed}: {:?}", e.downcast_ref::<String>()));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Seed 1 failed on the code before moves resumed at start-up: its move ended
/// about 60 s after the traffic ("moves ended 60 s after the traffic").
#[test]
fn a_move_cut_short_by_a_kill_ends_soon_after_the_traffic() {
    run_seeds(MOVE_CUT_SHORT_SEED, 1);
}

/// Failed before the leader's node drove moves left without a lease early:
/// "stuck moves" after `MOVES_SETTLE_MS`.
#[test]
fn a_move_killed_before_its_driver_leased_it_ends_soon_after_the_traffic() {
    run_seeds(MOVE_UNLEASED_SEED, 1);
}

/// Failed once in a 30-seed run before the checker learned that 503
/// `owner-unreachable` settles nothing ("a replay shows a body never
/// completed"); whether the cut meets the completion depends on timing.
#[test]
fn an_isolation_that_cuts_a_forwarded_completion_is_judged_right() {
    run_seeds(ISOLATION_CUT_SEED, 1);
}

/// Seed 1106 (3-node regions; the whole cluster SIGKILLed and restarted,
/// region a isolated 1.3 s, node 4 of region a isolated 5.7 s) failed once in
/// the 200-seed run of issue 37 with a stale read: `GET
/// /v1/orders?client_order_id=s1106-c2-o3` through region a answered 404
/// about 0.5 s after node 1 listened again, for an order acknowledged
/// 2.5 s earlier that the final read found: node 1 came back as the leader of
/// its old term and counted itself ready before it applied its log again
/// (fixed: `raft::group::Opened`; docs/reliability.md).
const RESTART_STALE_READ_SEED: u64 = 1106;

#[test]
fn a_node_restarted_with_its_cluster_reads_acknowledged_orders() {
    run_seeds(RESTART_STALE_READ_SEED, 1);
}

/// Seed 2498 (region c isolated and failed over by hand, region a isolated
/// 0.7 s) failed in the 100-seed run of issue 39: an order of `demo-c`
/// acknowledged 0.1 s after c's cut was lost (an orphan), the client created
/// the same client order id under a new key in the new home, and the
/// checker's final replay of the lost key was answered 409
/// `client-order-id-conflict`, the right answer, which the checker retried as
/// "not now" until it gave up reading. Whether an order is lost this way
/// depends on timing.
const LOST_KEY_CONFLICT_SEED: u64 = 2498;

#[test]
fn a_lost_key_whose_order_id_moved_to_another_key_is_read_right() {
    run_seeds(LOST_KEY_CONFLICT_SEED, 1);
}

/// Runs `keyhold chaos` on seeds `from..from + seeds`; each must pass the checker.
fn run_seeds(from: u64, seeds: u64) {
    let out = tempfile::Builder::new()
        .prefix("keyhold-chaos-")
        .tempdir()
        .expect("tempdir");
    // Kept outside the tempdir on failure, so the evidence survives the test.
    let runs = std::env::temp_dir().join(format!(
        "keyhold-chaos-ci-{}-from-{from}",
        std::process::id()
    ));
    let output = Command::new(KEYHOLD)
        .args([
            "chaos",
            "--seeds",
            &seeds.to_string(),
            "--from",
            &from.to_string(),
            "--out",
        ])
        .arg(&runs)
        .current_dir(out.path())
        .output()
        .expect("run keyhold chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "keyhold chaos failed; its runs are in {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        runs.display()
    );
    for seed in from..from + seeds {
        assert!(
            stdout.contains(&format!("seed {seed}: ok")),
            "seed {seed} did not report ok:\n{stdout}"
        );
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("summary.json")).expect("summary.json"))
            .expect("summary is JSON");
    assert_eq!(summary["seeds"], seeds);
    assert!(summary["requests"].as_u64().unwrap() > 100, "{summary}");
    let _ = std::fs::remove_dir_all(&runs);
}
