//! The region state machine's apply alone, below openraft and the log: entries of
//! `commands` new orders each are handed to `RegionStateMachine::apply` one entry
//! at a time, as openraft hands over committed entries, on a fresh region tree.
//! No fsync is involved (sled writes the tree in the background), so this is the
//! CPU an entry costs the serial apply, without the log's writes to the same
//! process's sled beside it. Prints microseconds of apply per command and per
//! entry, for entries of as many commands as the writer forms at 1, 16 and 64
//! clients, with an entry written in sled batches of at most `BATCH_BYTES` (0:
//! one batch per command, as before issue 13; `ENTRY_BATCH_BYTES_MAX`: one batch
//! per entry of new orders).
//!
//! `cargo bench -p keyhold-store --bench apply_path` (release build). Results go in
//! docs/benchmarks.md.

use std::time::Instant;

use keyhold_store::limits::{
    ENTRY_BATCH_BYTES_MAX, REGION_TREE_CACHE_BYTES_DEFAULT, SLED_FLUSH_EVERY_MS,
};
use keyhold_store::raft::{self, RegionStateMachine};
use openraft::storage::RaftStateMachine;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/raft/helpers.rs"]
mod helpers;

/// Commands applied per run (all entries together) under `cargo bench`.
const COMMANDS_PER_RUN: u64 = 12_000;
/// Commands per run when the target runs as a test (no `--bench`): a smoke run.
const COMMANDS_PER_SMOKE_RUN: u64 = 120;
/// Commands per entry: what the writer gathers at 1, 16 and 64 clients.
const COMMANDS_PER_ENTRY: [u64; 3] = [1, 12, 46];
/// Bounds of an entry's sled batches tried, in bytes of keys and values.
const BATCH_BYTES: [usize; 3] = [0, 16 * 1024, ENTRY_BATCH_BYTES_MAX];

fn main() {
    let commands = if std::env::args().any(|a| a == "--bench") {
        COMMANDS_PER_RUN
    } else {
        COMMANDS_PER_SMOKE_RUN
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| batch bytes max | commands per entry | entries | us per command | us per entry |");
    println!("|---|---|---|---|---|");
    runtime.block_on(async {
        for (per_entry, batch_bytes) in COMMANDS_PER_ENTRY
            .into_iter()
            .flat_map(|c| BATCH_BYTES.map(|b| (c, b)))
        {
            if per_entry == 1 && batch_bytes > 0 {
                continue; // An entry of one command is one batch whatever the bound.
            }
            let dir = tempfile::tempdir().expect("tempdir");
            // The tree of `raft::open`, with the bound under test.
            let db = sled::Config::new()
                .path(dir.path().join("db"))
                .cache_capacity(REGION_TREE_CACHE_BYTES_DEFAULT)
                .flush_every_ms(Some(SLED_FLUSH_EVERY_MS))
                .open()
                .expect("db");
            let tree = db.open_tree(raft::REGION_TREE).expect("tree");
            let mut machine = RegionStateMachine::open_with_entry_batch_bytes_max(
                db,
                tree,
                &dir.path().join("snapshots"),
                batch_bytes,
            )
            .expect("open");
            machine
                .apply([helpers::membership_entry(1)])
                .await
                .expect("membership");
            let entries = commands / per_entry;
            let started = Instant::now();
            for entry in 0..entries {
                let first = entry * per_entry + 1;
                let batch = (first..first + per_entry).map(helpers::new_order).collect();
                let outcomes = machine
                    .apply([helpers::commands_entry(entry + 2, batch)])
                    .await
                    .expect("apply");
                assert!(helpers::answers(&outcomes[0])
                    .iter()
                    .all(helpers::is_created));
            }
            let micros = started.elapsed().as_secs_f64() * 1e6;
            println!(
                "| {batch_bytes} | {per_entry} | {entries} | {:.1} | {:.0} |",
                micros / (entries * per_entry) as f64,
                micros / entries as f64
            );
        }
    });
}
