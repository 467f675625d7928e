//! What a snapshot build costs the entries applied meanwhile. A region state
//! machine is filled with `ORDERS` new orders, then builds snapshots while one
//! writer applies entries of `COMMANDS_PER_ENTRY` new orders back to back (what
//! the region writer forms at 16 clients), and each apply's time goes into a
//! histogram. Two ways of building, alternated on the same store so that a
//! ratio of the two is what to read on this noisy machine:
//! - `held`: the build takes the apply lock at its first entry and keeps it to
//!   the end, as every build did before `raft::cut` (a cut's bound of 0 bytes);
//! - `cut`: the build reads its cut while entries go on
//!   (`SNAPSHOT_CUT_RECORDED_BYTES_MAX`).
//!
//! Prints, per build: its time, the entries and orders applied during it, the
//! longest and the 99th percentile apply, with the same writer's rate and
//! percentiles without a build beside it, and an fsync probe of the disk
//! (the build syncs its file and flushes the tree).
//!
//! `cargo bench -p keyhold-store --bench snapshot_pause` (release build).
//! Results go in docs/benchmarks.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use keyhold_store::limits::SNAPSHOT_CUT_RECORDED_BYTES_MAX;
use keyhold_store::raft::{self, RegionStateMachine};
use openraft::storage::RaftStateMachine;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/raft/helpers.rs"]
mod helpers;

/// Orders in the store before the first build under `cargo bench`.
const ORDERS: u64 = 200_000;
/// Orders when the target runs as a test (no `--bench`): a smoke run.
const ORDERS_SMOKE: u64 = 2_000;
/// Commands per entry while filling (the writer's batch at 64 clients).
const FILL_COMMANDS_PER_ENTRY: u64 = 46;
/// Commands per entry while a build runs (the writer's batch at 16 clients).
const COMMANDS_PER_ENTRY: u64 = 12;
/// Builds of each way, alternated.
const ROUNDS: usize = 3;
/// The writer's baseline before each build, without one beside it.
const BASELINE_MS: u64 = 2_000;
/// Syncs of the fsync probe.
const PROBE_FSYNCS: u32 = 200;

#[derive(Clone, Copy)]
enum Way {
    Held,
    Cut,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Held => "held",
            Way::Cut => "cut",
        }
    }

    fn recorded_bytes_max(self) -> usize {
        match self {
            Way::Held => 0,
            Way::Cut => SNAPSHOT_CUT_RECORDED_BYTES_MAX,
        }
    }
}

/// Applies entries until `stop`, from log index `*next` on; returns each
/// apply's time in microseconds.
async fn write_until(
    machine: &mut RegionStateMachine,
    next: &mut u64,
    stop: &AtomicBool,
) -> Histogram<u64> {
    let mut times = Histogram::<u64>::new(3).expect("histogram");
    while !stop.load(Ordering::Relaxed) {
        let first = *next * COMMANDS_PER_ENTRY;
        let batch = (first..first + COMMANDS_PER_ENTRY)
            .map(helpers::new_order)
            .collect();
        let started = Instant::now();
        let outcomes = machine
            .apply([helpers::commands_entry(*next, batch)])
            .await
            .expect("apply");
        times
            .record(started.elapsed().as_micros() as u64)
            .expect("record");
        assert!(helpers::answers(&outcomes[0])
            .iter()
            .all(helpers::is_created));
        *next += 1;
    }
    times
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn main() {
    let orders = if std::env::args().any(|a| a == "--bench") {
        ORDERS
    } else {
        ORDERS_SMOKE
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut machine) = raft::open(dir.path(), "region-bench").expect("open");
        machine
            .apply([helpers::membership_entry(1)])
            .await
            .expect("membership");
        // Fill with orders whose numbers are far above the writer's, so that
        // none of the writer's is a replay.
        let mut index = 2u64;
        let fill_base = 1u64 << 40;
        for first in (0..orders).step_by(FILL_COMMANDS_PER_ENTRY as usize) {
            let last = (first + FILL_COMMANDS_PER_ENTRY).min(orders);
            let batch = (first..last)
                .map(|n| helpers::new_order(fill_base + n))
                .collect();
            machine
                .apply([helpers::commands_entry(index, batch)])
                .await
                .expect("fill");
            index += 1;
        }
        let mut next = index;
        println!("{orders} orders stored; entries of {COMMANDS_PER_ENTRY} new orders");
        println!(
            "| build | build s | snapshot MiB | orders/s without a build | p99 / max apply ms without | \
             orders applied during the build | orders/s during | p99 / max apply ms during | fsync probe (/s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for round in 0..ROUNDS * 2 {
            let way = if round % 2 == 0 { Way::Held } else { Way::Cut };
            // The writer alone.
            let stop = Arc::new(AtomicBool::new(false));
            let timer = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(BASELINE_MS)).await;
                    stop.store(true, Ordering::Relaxed);
                })
            };
            let before_next = next;
            let started = Instant::now();
            let alone = {
                let mut writer = machine.clone();
                let stop = stop.clone();
                let mut at = next;
                let handle = tokio::spawn(async move {
                    let times = write_until(&mut writer, &mut at, &stop).await;
                    (times, at)
                });
                let (times, at) = handle.await.expect("writer");
                next = at;
                times
            };
            timer.await.expect("timer");
            let alone_rate =
                ((next - before_next) * COMMANDS_PER_ENTRY) as f64 / started.elapsed().as_secs_f64();

            // The writer beside a build.
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let mut writer = machine.clone();
                let stop = stop.clone();
                let mut at = next;
                tokio::spawn(async move {
                    let times = write_until(&mut writer, &mut at, &stop).await;
                    (times, at)
                })
            };
            let before_next = next;
            let started = Instant::now();
            let (_meta, file) = machine
                .build_snapshot_with(way.recorded_bytes_max(), |_| {})
                .await
                .expect("build");
            let build_s = started.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let (during, at) = writer.await.expect("writer");
            next = at;
            let applied = (next - before_next) * COMMANDS_PER_ENTRY;
            let snapshot_mib = file.metadata().expect("metadata").len() as f64 / (1 << 20) as f64;
            let probe = keyhold_raftlog::probe::fsyncs_per_second(dir.path(), PROBE_FSYNCS)
                .expect("fsync probe");
            println!(
                "| {} | {build_s:.2} | {snapshot_mib:.0} | {alone_rate:.0} | {:.1} / {:.1} | {applied} | {:.0} | {:.1} / {:.1} | {probe:.0} |",
                way.name(),
                ms(alone.value_at_quantile(0.99)),
                ms(alone.max()),
                applied as f64 / build_s,
                ms(during.value_at_quantile(0.99)),
                ms(during.max()),
            );
        }
    });
}
