//! The apply thread and group commit.
//!
//! One OS thread owns all writes. It blocks for the first waiting command, takes
//! every other command already queued (up to `BATCH_COMMANDS_MAX`), applies them in
//! order, appends the batch to the write-ahead log with one sync, and only then
//! answers. While one sync runs, new commands queue up and form the next batch, so
//! under load many commands share each fsync and the fsync rate, not the client
//! count, bounds throughput.

use crate::codec::encode;
use crate::keys;
use crate::limits::BATCH_COMMANDS_MAX;
use crate::machine::Machine;
use crate::wal::{Wal, WAL_BYTES_MAX};
use crate::{Error, Job};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Counters of the commit loop, read by `/metrics` and by benchmarks.
#[derive(Debug, Default)]
pub struct CommitStats {
    batches: AtomicU64,
    commands: AtomicU64,
    sync_micros: AtomicU64,
    failed: AtomicBool,
}

impl CommitStats {
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }
    /// Total time spent appending batches to the write-ahead log and syncing it.
    pub fn sync_micros(&self) -> u64 {
        self.sync_micros.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Counts one batch of `commands` made durable in `took`, and records it in the
    /// `keyhold_store_fsync_seconds` and `keyhold_store_batch_commands` histograms.
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

pub(crate) fn spawn(
    db: sled::Db,
    machine: Machine,
    mut wal: Wal,
    mut jobs: mpsc::Receiver<Job>,
    flushed: watch::Sender<u64>,
    mut batch: u64,
    stats: Arc<CommitStats>,
) -> Result<(), Error> {
    let body = move || {
        let mut pending: Vec<Job> = Vec::with_capacity(BATCH_COMMANDS_MAX);
        while let Some(first) = jobs.blocking_recv() {
            pending.push(first);
            while pending.len() < BATCH_COMMANDS_MAX {
                match jobs.try_recv() {
                    Ok(job) => pending.push(job),
                    Err(_) => break,
                }
            }
            batch += 1;
            let results: Vec<Result<_, Error>> = pending
                .iter()
                .map(|job| machine.apply(&job.command, batch))
                .collect();
            // Stamped after the batch's commands: a tree that holds this stamp holds
            // the whole batch, so recovery replays only later batches.
            let stamped = machine
                .tree()
                .insert(keys::META_BATCH, encode(batch, &batch))
                .map(|_| ())
                .map_err(Error::from);
            let started = Instant::now();
            // A command whose apply failed wrote nothing (the store itself failed:
            // I/O, a value that does not decode); logging it would make recovery
            // meet the same failure and refuse to open. Refusals are answers
            // (`Applied::Rejected`) and are logged like any other command.
            let commands: Vec<_> = pending
                .iter()
                .zip(&results)
                .filter(|(_, result)| result.is_ok())
                .map(|(job, _)| &job.command)
                .collect();
            let durable = stamped.and_then(|()| wal.append(batch, &commands));
            stats.record(pending.len(), started.elapsed());
            if let Err(e) = durable {
                // The tree may now be ahead of the disk: stop taking commands
                // rather than answer from state a crash could take back.
                tracing::error!(error = %e, "write-ahead log append failed; refusing further commands");
                stats.mark_failed();
                for job in pending.drain(..) {
                    let _ = job.reply.send(Err(Error::Unavailable));
                }
                return;
            }
            if wal.bytes() > WAL_BYTES_MAX {
                if let Err(e) = checkpoint(&db, &mut wal) {
                    tracing::error!(error = %e, "checkpoint failed; refusing further commands");
                    stats.mark_failed();
                    for job in pending.drain(..) {
                        let _ = job.reply.send(Err(Error::Unavailable));
                    }
                    return;
                }
            }
            flushed.send_replace(batch);
            for (job, result) in pending.drain(..).zip(results) {
                // A waiter that gave up (client went away) is fine to skip: its
                // command is durable and a retry will replay it.
                let _ = job.reply.send(result);
            }
        }
        // A clean stop leaves everything in sled and an empty log.
        if let Err(e) = checkpoint(&db, &mut wal) {
            tracing::error!(error = %e, "final checkpoint failed");
        }
    };
    std::thread::Builder::new()
        .name("keyhold-apply".into())
        .spawn(body)
        .map_err(Error::Io)?;
    Ok(())
}

/// Makes sled durable up to now, then empties the log it made redundant.
fn checkpoint(db: &sled::Db, wal: &mut Wal) -> Result<(), Error> {
    let started = Instant::now();
    db.flush()?;
    wal.reset()?;
    metrics::histogram!("keyhold_store_checkpoint_seconds").record(started.elapsed().as_secs_f64());
    Ok(())
}
