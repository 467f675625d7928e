//! Registry log appends with the applied state in the log's own sled `Db` (format 1)
//! and in a `Db` of its own (format 2), side by side in one run. A sled flush writes
//! out everything dirty in its `Db`, so with one `Db` every append also pays for the
//! state written since the previous one; review defect 10 named this as a cause of
//! slow heartbeats and needless elections.
//!
//! Each round writes some state keys of `STATE_VALUE_BYTES` each (one applied batch
//! touches a few tenant, operation and meta keys; a burst of moves or tenant creations
//! many), then appends one entry and waits for it to be flushed, as openraft does
//! before it acknowledges; the append's latency is what a heartbeat-carried append
//! waits for. Layouts alternate round by round so the disk's drifting fsync rate hits
//! both alike. An fsync probe of the same disk is printed beside the table.
//!
//! `cargo bench -p keyhold-registry --bench append` (release build). Results go in
//! docs/benchmarks.md.

use std::path::Path;
use std::time::{Duration, Instant};

use keyhold_raftlog::LogTrees;
use keyhold_registry::store::LogStore;
use keyhold_registry::types::{Entry, LogId};
use keyhold_registry::Request;
use openraft::storage::RaftLogStorageExt;
use openraft::{CommittedLeaderId, EntryPayload};

/// Rounds per layout and state size under `cargo bench`.
const ROUNDS: u64 = 400;
/// Rounds when the target runs as a test (no `--bench`): a smoke run.
const SMOKE_ROUNDS: u64 = 5;
/// State keys written before each append: one applied batch's few keys, and a
/// burst of applied writes. Small keys, as the registry writes them: sled stores a
/// large value as a blob file of its own, which flushes differently.
const STATE_KEYS: [u64; 2] = [4, 256];
/// Bytes of one state value (a tenant record with its token hash is about this).
const STATE_VALUE_BYTES: usize = 512;
const PROBE_FSYNCS: u32 = 200;

fn fsync_probe(dir: &Path) -> f64 {
    keyhold_raftlog::probe::fsyncs_per_second(dir, PROBE_FSYNCS).expect("fsync probe")
}

fn trees() -> LogTrees {
    LogTrees {
        log: "raft_log".to_string(),
        meta: "raft_meta".to_string(),
    }
}

/// One replica's log and the tree its state goes to.
struct Replica {
    log: LogStore,
    state: sled::Tree,
    next_index: u64,
    // Kept open for as long as the replica is used.
    _dbs: Vec<sled::Db>,
}

impl Replica {
    fn one_db(dir: &Path) -> Replica {
        let db = sled::Config::new().path(dir).open().expect("db");
        Replica {
            log: LogStore::open(&db, &trees()).expect("log"),
            state: db.open_tree("state").expect("state"),
            next_index: 1,
            _dbs: vec![db],
        }
    }

    fn two_dbs(dir: &Path) -> Replica {
        let log_db = sled::Config::new()
            .path(dir.join("log"))
            .open()
            .expect("log db");
        let state_db = sled::Config::new()
            .path(dir.join("state"))
            .open()
            .expect("state db");
        Replica {
            log: LogStore::open(&log_db, &trees()).expect("log"),
            state: state_db.open_tree("state").expect("state"),
            next_index: 1,
            _dbs: vec![log_db, state_db],
        }
    }

    /// Writes `keys` state values, then appends one entry; returns the append's time.
    async fn round(&mut self, keys: u64) -> Duration {
        let value = vec![(self.next_index % 251) as u8; STATE_VALUE_BYTES];
        for key in 0..keys {
            // Rewrites the same keys every round, as applied state does.
            self.state
                .insert(key.to_be_bytes(), value.as_slice())
                .expect("state write");
        }
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.next_index),
            payload: EntryPayload::Normal(Request::AddRegion {
                name: format!("r{}", self.next_index),
                now_ms: 1,
            }),
        };
        self.next_index += 1;
        let started = Instant::now();
        self.log.blocking_append([entry]).await.expect("append");
        started.elapsed()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds = if std::env::args().any(|a| a == "--bench") {
        ROUNDS
    } else {
        SMOKE_ROUNDS
    };
    let dir = tempfile::tempdir().expect("tempdir");
    println!("fsync probe before: {:.0}/s", fsync_probe(dir.path()));
    println!(
        "| state keys written before each append | layout | append p50 ms | p99 ms | mean ms |"
    );
    println!("|---|---|---|---|---|");
    for (i, keys) in STATE_KEYS.into_iter().enumerate() {
        let mut one = Replica::one_db(&dir.path().join(format!("one-{i}")));
        let mut two = Replica::two_dbs(&dir.path().join(format!("two-{i}")));
        let mut one_times = Vec::new();
        let mut two_times = Vec::new();
        for _ in 0..rounds {
            one_times.push(one.round(keys).await);
            two_times.push(two.round(keys).await);
        }
        for (layout, times) in [
            ("log and state in one Db (format 1)", &mut one_times),
            ("log in its own Db (format 2)", &mut two_times),
        ] {
            times.sort();
            let mean = times.iter().sum::<Duration>() / times.len() as u32;
            println!(
                "| {keys} × {STATE_VALUE_BYTES} B | {layout} | {} | {} | {} |",
                ms(percentile(times, 0.5)),
                ms(percentile(times, 0.99)),
                ms(mean)
            );
        }
    }
    println!("fsync probe after: {:.0}/s", fsync_probe(dir.path()));
}
