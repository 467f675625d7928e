//! kill -9 durability: a child process (this test binary re-invoked with
//! `KILL9_CHILD_DIR` set) saves a vote and appends entries one at a time, printing
//! `ACK n` only after `append` reported the entry flushed; the parent SIGKILLs it
//! mid-stream and reopens the store. Everything acknowledged must be there.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keyhold_registry::store;
use keyhold_registry::types::Vote;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::RaftLogReader;

use crate::common::{add_region, entry};

const CHILD_DIR_ENV: &str = "KILL9_CHILD_DIR";
/// The child stops by itself after this many entries, so it can never run unbounded.
const CHILD_ENTRIES_MAX: u64 = 5_000;
/// The parent kills the child after reading this many acknowledgements.
const KILL_AFTER_ACKS: u64 = 60;
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "kill9::kill9_child_entry_point",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");

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

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
