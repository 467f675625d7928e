//! How much snapshot building a region does as it fills, by the snapshot
//! policy. Each policy fills its own region state machine with `ORDERS` new
//! orders in entries of `COMMANDS_PER_ENTRY` (the writer's batch at 16
//! clients) and builds a snapshot whenever the policy asks for one
//! (`take_snapshot_wanted`, as the region group's ticker does), in line, so
//! that its cost is counted in full. Policies: every `REGION_SNAPSHOT_LOGS_SINCE_LAST`
//! entries alone (`written_percent` 0, the rule before the bytes were
//! weighed), and the node's default (`REGION_SNAPSHOT_WRITTEN_PERCENT`).
//!
//! Prints, per policy and checkpoint: snapshots built, MiB streamed, seconds
//! spent building, and the seconds of the fill's applies apart, with an fsync
//! probe of the disk (every build syncs its file and flushes the tree).
//!
//! `cargo bench -p keyhold-store --bench snapshot_policy` (release build).
//! Results go in docs/benchmarks.md.

use std::time::{Duration, Instant};

use keyhold_store::limits::{REGION_SNAPSHOT_LOGS_SINCE_LAST, REGION_SNAPSHOT_WRITTEN_PERCENT};
use keyhold_store::raft::{self, SnapshotPolicy};
use openraft::storage::RaftStateMachine;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/raft/helpers.rs"]
mod helpers;

/// Orders each policy's region is filled with under `cargo bench`.
const ORDERS: u64 = 1_200_000;
/// Orders when the target runs as a test (no `--bench`): a smoke run.
const ORDERS_SMOKE: u64 = 3_000;
/// Commands per entry (the writer's batch at 16 clients).
const COMMANDS_PER_ENTRY: u64 = 12;
/// A row is printed every this many orders.
const CHECKPOINTS: u64 = 4;
/// Syncs of the fsync probe.
const PROBE_FSYNCS: u32 = 200;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let orders = if bench { ORDERS } else { ORDERS_SMOKE };
    // In a smoke run, entries alone would never reach the interval.
    let entries = if bench {
        REGION_SNAPSHOT_LOGS_SINCE_LAST
    } else {
        10
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "entries of {COMMANDS_PER_ENTRY} new orders; a snapshot at least every {entries} entries"
    );
    println!("| written percent | stored orders | snapshots built | MiB streamed | build s | apply s | fsync probe (/s) |");
    println!("|---|---|---|---|---|---|---|");
    runtime.block_on(async move {
        for written_percent in [0, REGION_SNAPSHOT_WRITTEN_PERCENT] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (_, mut machine) = raft::open(dir.path(), "region-bench").expect("open");
            machine.set_snapshot_policy(SnapshotPolicy {
                entries,
                written_percent,
            });
            machine
                .apply([helpers::membership_entry(1)])
                .await
                .expect("membership");
            let (mut built, mut streamed, mut building, mut applying) =
                (0u64, 0u64, Duration::ZERO, Duration::ZERO);
            let mut index = 2u64;
            let mut stored = 0u64;
            let step = orders / CHECKPOINTS;
            while stored < orders {
                let batch = (stored..stored + COMMANDS_PER_ENTRY)
                    .map(helpers::new_order)
                    .collect();
                let started = Instant::now();
                machine
                    .apply([helpers::commands_entry(index, batch)])
                    .await
                    .expect("apply");
                applying += started.elapsed();
                index += 1;
                stored += COMMANDS_PER_ENTRY;
                if machine.take_snapshot_wanted() {
                    let started = Instant::now();
                    let (_, file) = machine
                        .build_snapshot_with(usize::MAX, |_| {})
                        .await
                        .expect("build");
                    building += started.elapsed();
                    built += 1;
                    streamed += file.metadata().expect("metadata").len();
                }
                if stored % step < COMMANDS_PER_ENTRY {
                    let probe = keyhold_raftlog::probe::fsyncs_per_second(dir.path(), PROBE_FSYNCS)
                        .expect("fsync probe");
                    println!(
                        "| {written_percent} | {stored} | {built} | {:.0} | {:.1} | {:.1} | {probe:.0} |",
                        streamed as f64 / (1 << 20) as f64,
                        building.as_secs_f64(),
                        applying.as_secs_f64(),
                    );
                }
            }
        }
    });
}
