//! The apply thread and group commit.
//!
//! One OS thread owns all writes. It blocks for the first waiting command, takes
//! every other command already queued (up to `BATCH_COMMANDS_MAX`), applies them in
//! order, flushes sled once, and only then answers. While one flush runs, new
//! commands queue up and form the next batch, so under load many commands share
//! each fsync and the fsync rate, not the client count, bounds throughput.

use crate::codec::encode;
use crate::keys;
use crate::limits::BATCH_COMMANDS_MAX;
use crate::machine::Machine;
use crate::{Error, Job};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// Counters of the commit loop, read by `/metrics` and by benchmarks.
#[derive(Debug, Default)]
pub struct CommitStats {
    batches: AtomicU64,
    commands: AtomicU64,
    flush_micros: AtomicU64,
    failed: AtomicBool,
}

impl CommitStats {
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }
    /// Total time spent in flush (fsync) calls.
    pub fn flush_micros(&self) -> u64 {
        self.flush_micros.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

pub(crate) fn spawn(
    db: sled::Db,
    machine: Machine,
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
            // Stamp the batch number first, so after a crash the stored number is
            // at least that of every value that survived.
            let stamped = machine
                .tree()
                .insert(keys::META_BATCH, encode(batch, &batch));
            let results: Vec<Result<_, Error>> = match stamped {
                Ok(_) => pending
                    .iter()
                    .map(|job| machine.apply(&job.command, batch))
                    .collect(),
                Err(e) => pending
                    .iter()
                    .map(|_| Err(Error::Sled(e.clone())))
                    .collect(),
            };
            let started = Instant::now();
            let flush = db.flush();
            let flush_time = started.elapsed();
            stats
                .flush_micros
                .fetch_add(flush_time.as_micros() as u64, Ordering::Relaxed);
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats
                .commands
                .fetch_add(pending.len() as u64, Ordering::Relaxed);
            metrics::histogram!("keyhold_store_fsync_seconds").record(flush_time.as_secs_f64());
            metrics::histogram!("keyhold_store_batch_commands").record(pending.len() as f64);
            if let Err(e) = flush {
                // The tree may now be ahead of the disk: stop taking commands
                // rather than answer from state a crash could take back.
                tracing::error!(error = %e, "store flush failed; refusing further commands");
                stats.failed.store(true, Ordering::Relaxed);
                for job in pending.drain(..) {
                    let _ = job.reply.send(Err(Error::Unavailable));
                }
                return;
            }
            flushed.send_replace(batch);
            for (job, result) in pending.drain(..).zip(results) {
                // A waiter that gave up (client went away) is fine to skip: its
                // command is durable and a retry will replay it.
                let _ = job.reply.send(result);
            }
        }
        if let Err(e) = db.flush() {
            tracing::error!(error = %e, "final store flush failed");
        }
    };
    std::thread::Builder::new()
        .name("keyhold-apply".into())
        .spawn(body)
        .map_err(Error::Io)?;
    Ok(())
}
