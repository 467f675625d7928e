//! `CommitStats`: the counters of group commit over the region's Raft log, read by
//! `/metrics`, the admin cluster view and the benchmarks.
//!
//! One "batch" is one log entry written by the region group's writer: one
//! `client_write`, which openraft 0.9 turns into one log append and one flush of the
//! log (see `raft::CommandBatch`), so `commands() / batches()` is commands per log
//! fsync. Raft's own entries (the blank entry of a new term, membership changes)
//! are not counted; they are rare.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Counters of the region group's writer.
#[derive(Debug, Default)]
pub struct CommitStats {
    batches: AtomicU64,
    commands: AtomicU64,
    sync_micros: AtomicU64,
    failed: AtomicBool,
}

impl CommitStats {
    /// Entries written (log appends, each with one fsync).
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }
    /// Total time entries took from submission to applied: the log append with
    /// its fsync, then the apply.
    pub fn sync_micros(&self) -> u64 {
        self.sync_micros.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Counts one entry of `commands` made durable and applied in `took`, and
    /// records it in the `keyhold_store_fsync_seconds` and
    /// `keyhold_store_batch_commands` histograms.
    pub(crate) fn record(&self, commands: usize, took: Duration) {
        self.sync_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commands.fetch_add(commands as u64, Ordering::Relaxed);
        metrics::histogram!("keyhold_store_fsync_seconds").record(took.as_secs_f64());
        metrics::histogram!("keyhold_store_batch_commands").record(commands as f64);
    }

    /// The store can no longer make commands durable.
    pub(crate) fn mark_failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }
}
