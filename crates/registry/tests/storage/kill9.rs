//! kill -9 durability: a child process (this test binary re-invoked with
//! `KILL9_CHILD_DIR` set) saves a vote and appends entries one at a time, printing
//! `ACK n` only after `append` reported the entry flushed; the parent SIGKILLs it
//! mid-stream and reopens the store. Everything acknowledged must be there. A second
//! child snapshots and purges its log before it is killed: the applied state, kept in
//! another sled `Db` than the log, must not fall behind the purge.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use keyhold_registry::store;
use keyhold_registry::types::Vote;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};

use crate::common::{add_region, entry};

const CHILD_DIR_ENV: &str = "KILL9_CHILD_DIR";
/// The child stops by itself after this many entries, so it can never run unbounded.
const CHILD_ENTRIES_MAX: u64 = 5_000;
/// The parent kills the child after reading this many acknowledgements.
const KILL_AFTER_ACKS: u64 = 60;
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

/// Runs the test `entry_point` of this binary in a child process with `env` set to
/// `dir`, and returns the child with its piped stdout.
fn spawn_child(entry_point: &str, env: &str, dir: &Path) -> (Child, ChildStdout) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &format!("kill9::{entry_point}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    (child, stdout)
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn vote() -> Vote {
    Vote::new_committed(3, 2)
}

/// Child side. In a normal test run the variable is unset and this returns at once:
/// the parent test below is what runs it in a child process.
#[test]
fn kill9_child_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let (mut log, _state_machine) = store::open(dir.as_ref()).expect("open");
        log.save_vote(&vote()).await.expect("vote");
        println!("VOTE");
        for index in 1..=CHILD_ENTRIES_MAX {
            let request = add_region(&format!("region-{index}"));
            log.blocking_append([entry(3, index, request)])
                .await
                .expect("append");
            // stdout is line-buffered: the line leaves the process before the next append.
            println!("ACK {index}");
        }
    });
}

#[test]
fn acknowledged_vote_and_entries_survive_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, stdout) = spawn_child("kill9_child_entry_point", CHILD_DIR_ENV, dir.path());

    let started = Instant::now();
    let mut vote_acked = false;
    let mut last_ack = 0u64;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child output");
        // libtest prints "test <name> ... " without a newline before the child's
        // first line, so the vote marker is matched at the end of the line.
        if line.ends_with("VOTE") {
            vote_acked = true;
        } else if let Some(index) = line.strip_prefix("ACK ") {
            last_ack = index.parse().expect("ack index");
            if last_ack >= KILL_AFTER_ACKS {
                break;
            }
        }
        assert!(started.elapsed() < CHILD_DEADLINE, "child too slow");
    }
    // Child::kill sends SIGKILL on Unix: no destructor, no sled flush on drop.
    child.kill().expect("kill child");
    let status = child.wait().expect("reap child");
    assert!(
        !status.success(),
        "the child must have been killed, not finished"
    );
    assert!(vote_acked, "the child never acknowledged its vote");
    assert!(
        last_ack >= KILL_AFTER_ACKS,
        "child stopped after {last_ack} acks"
    );

    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let (mut log, _state_machine) = store::open(dir.path()).expect("reopen after kill");
        assert_eq!(log.read_vote().await.expect("read vote"), Some(vote()));
        let log_state = log.get_log_state().await.expect("log state");
        let last = log_state.last_log_id.expect("entries survived").index;
        assert!(
            last >= last_ack,
            "last entry {last} < acknowledged {last_ack}"
        );
        let entries = log.try_get_log_entries(1..=last_ack).await.expect("read");
        let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, (1..=last_ack).collect::<Vec<_>>());
    });
}

const SNAPSHOT_CHILD_DIR_ENV: &str = "KILL9_SNAPSHOT_CHILD_DIR";
/// Entries the snapshot child appends, applies and then snapshots and purges.
const SNAPSHOT_CHILD_ENTRIES: u64 = 200;

/// Child side of the snapshot test: appends and applies entries, builds a snapshot,
/// purges the log behind it as openraft does, prints `PURGED n`, then idles until the
/// parent kills it. The applied state lives in another sled `Db` than the log, so the
/// purge is only safe if the snapshot's state was durable first.
#[test]
fn kill9_snapshot_child_entry_point() {
    let Ok(dir) = std::env::var(SNAPSHOT_CHILD_DIR_ENV) else {
        return;
    };
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let (mut log, mut state_machine) = store::open(dir.as_ref()).expect("open");
        log.save_vote(&vote()).await.expect("vote");
        let entries: Vec<_> = (1..=SNAPSHOT_CHILD_ENTRIES)
            .map(|index| entry(3, index, add_region(&format!("region-{index}"))))
            .collect();
        log.blocking_append(entries.clone()).await.expect("append");
        log.save_committed(entries.last().map(|e| e.log_id))
            .await
            .expect("commit");
        state_machine.apply(entries).await.expect("apply");
        let snapshot = state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build snapshot");
        let purged = snapshot
            .meta
            .last_log_id
            .expect("snapshot of applied entries");
        log.purge(purged).await.expect("purge");
        // The purge marker rides on the next log flush in normal operation; a vote
        // save is one, so the purge is on disk before the parent hears of it.
        log.save_vote(&vote()).await.expect("vote again");
        println!("PURGED {}", purged.index);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// Review defect 10: with the log in its own `Db`, a log purge no longer flushes the
/// applied state along with it. Killed right after a snapshot and a purge, the replica
/// must reopen with its applied state at or beyond the purge point (otherwise the
/// entries between them are gone from both places).
#[test]
fn applied_state_survives_sigkill_after_snapshot_and_purge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, stdout) = spawn_child(
        "kill9_snapshot_child_entry_point",
        SNAPSHOT_CHILD_DIR_ENV,
        dir.path(),
    );
    let started = Instant::now();
    let mut purged = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child output");
        if let Some((_, index)) = line.split_once("PURGED ") {
            purged = Some(index.trim().parse::<u64>().expect("purged index"));
            break;
        }
        assert!(started.elapsed() < CHILD_DEADLINE, "child too slow");
    }
    child.kill().expect("kill child");
    let _ = child.wait().expect("reap child");
    let purged = purged.expect("the child reported its purge");

    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let (mut log, state_machine) = store::open(dir.path()).expect("reopen after kill");
        let log_state = log.get_log_state().await.expect("log state");
        assert_eq!(
            log_state.last_purged_log_id.map(|id| id.index),
            Some(purged),
            "the purge was flushed before the child reported it"
        );
        let applied = state_machine.last_applied().map_or(0, |id| id.index);
        assert!(
            applied >= purged,
            "applied state at {applied} is behind the purged log at {purged}: entries lost"
        );
        let regions = state_machine.read(|state| state.regions.len());
        assert_eq!(regions as u64, SNAPSHOT_CHILD_ENTRIES);
    });
}
