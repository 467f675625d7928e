//! The region store's write path below HTTP: `Store::execute`, the region group's
//! writer over openraft with the sled Raft log (one voter). Each run has `clients`
//! tasks each creating new orders back to back for a fixed number of commands, and
//! prints commands per second and commands per log fsync (entries, from
//! `CommitStats`) with an fsync probe of the same disk beside it. (Until the store
//! moved onto its region group it also ran the apply thread with its write-ahead
//! log; docs/benchmarks.md keeps that run's figures for comparison.)
//!
//! `cargo bench -p keyhold-store --bench write_path` (release build). Results go in
//! docs/benchmarks.md.

use std::path::Path;
use std::time::{Duration, Instant};

use keyhold_store::{Applied, Command, CommitStats, Error, Store};

#[path = "../tests/common/mod.rs"]
mod common;

/// Commands per run (all clients together) under `cargo bench`.
const COMMANDS_PER_RUN: u64 = 6_000;
/// Commands per run when the target runs as a test (`cargo test --all-targets`,
/// which passes no `--bench`): a smoke run, not a measurement.
const COMMANDS_PER_SMOKE_RUN: u64 = 320;
const CLIENTS: [u64; 3] = [1, 16, 64];
/// Writes of the fsync probe.
const PROBE_FSYNCS: u32 = 200;

/// 4 KiB write + fsync, repeated: the disk's fsync rate right now.
fn fsync_probe(dir: &Path) -> f64 {
    keyhold_raftlog::probe::fsyncs_per_second(dir, PROBE_FSYNCS).expect("fsync probe")
}

/// Runs `clients` tasks that together execute `COMMANDS_PER_RUN` new orders.
async fn drive<F, Fut>(clients: u64, commands: u64, execute: F) -> Duration
where
    F: Fn(Command) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Applied, Error>> + Send,
{
    let per_client = commands / clients;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let execute = execute.clone();
        tasks.spawn(async move {
            for i in 0..per_client {
                let answer = execute(common::new_order(1 + client * per_client + i)).await;
                assert!(answer.is_ok(), "{answer:?}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("client task");
    }
    started.elapsed()
}

fn report(path: &str, clients: u64, took: Duration, stats: &CommitStats, probe: f64) {
    let commands = stats.commands() as f64;
    println!(
        "| {path} | {clients} | {:.0} | {:.1} | {probe:.0} |",
        commands / took.as_secs_f64(),
        commands / stats.batches().max(1) as f64,
    );
}

fn main() {
    let commands = if std::env::args().any(|a| a == "--bench") {
        COMMANDS_PER_RUN
    } else {
        COMMANDS_PER_SMOKE_RUN
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| path | clients | commands/s | commands per fsync | fsync probe (/s) |");
    println!("|---|---|---|---|---|");
    runtime.block_on(async {
        for clients in CLIENTS {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = Store::open(&dir.path().join("store"), common::member())
                .await
                .expect("open store");
            let probe = fsync_probe(dir.path());
            let handle = store.clone();
            let took = drive(clients, commands, move |c| {
                let store = handle.clone();
                async move { store.execute(c).await }
            })
            .await;
            report("Store (region group)", clients, took, store.stats(), probe);
            store.shutdown().await.expect("shutdown");
        }
    });
}
