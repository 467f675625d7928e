//! The sled-backed Raft log store shared by every openraft group of keyhold (the
//! registry and each region's store), generic over the group's type configuration,
//! with the node identity those groups share, their one byte encoding, and where
//! two copies of one group's log part (`tail`).
//!
//! One group's log occupies two trees of a sled `Db` (`LogTrees`): its entries and its
//! meta (vote, committed and last purged log id). Trees rather than a `Db` per group
//! because a node holds several groups: their logs may share one `Db`, and then one
//! sled flush (one fsync) makes the appends of every group durable together, while a
//! group whose state must not be flushed with every append (a region store's state
//! machine) keeps that state in a `Db` of its own.
//!
//! **Architecture Invariant:** a vote or an append is acknowledged to openraft only
//! after the sled `Db` holding it was flushed; nothing here knows what an entry means.

pub mod codec;
mod contacts;
pub mod limits;
mod log;
mod node;
pub mod probe;
pub mod tail;
mod votes;

use std::time::{Duration, Instant};

pub use self::contacts::Contacts;
pub use self::log::{LogStore, LogTrees};
pub use self::node::{NodeId, NodeInfo};
pub use self::tail::{LeaderRun, LogTail};
pub use self::votes::{LongerLogs, NotesVotes};

/// Errors of opening a log store (every later failure is openraft's `StorageError`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// sled failed to open a tree, or to finish a purge a crash cut short.
    #[error("raft log storage: {0}")]
    Storage(#[from] sled::Error),
    /// A stored value of the log's own could not be decoded.
    #[error("raft log storage: {0}")]
    Corrupt(String),
}

/// The configuration of a sled `Db` in `path` that holds Raft logs: sled's cache
/// bounded to `limits::LOG_DB_CACHE_BYTES`, since a log is read back only near
/// its tail (sled would otherwise cache up to 1 GiB of it).
pub fn log_db_config(path: &std::path::Path) -> sled::Config {
    sled::Config::new()
        .path(path)
        .cache_capacity(limits::LOG_DB_CACHE_BYTES)
}

/// Opens (or creates) the sled `Db` that `config` describes. Blocking. If a previous
/// instance in this process was just dropped, sled's flusher thread may still hold the
/// directory lock for a moment; the open is retried for up to
/// `limits::DB_OPEN_LOCK_WAIT_MS`.
pub fn open_db(config: &sled::Config) -> Result<sled::Db, Error> {
    let deadline = Instant::now() + Duration::from_millis(limits::DB_OPEN_LOCK_WAIT_MS);
    loop {
        match config.open() {
            Ok(db) => return Ok(db),
            // Any I/O error while the deadline lasts: the lock shows up as
            // WouldBlock, but a just-dropped instance may also still be closing files.
            Err(sled::Error::Io(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(limits::DB_OPEN_LOCK_RETRY_MS));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
