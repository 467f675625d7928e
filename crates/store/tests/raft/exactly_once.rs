//! Exactly-once apply across kill -9: a child process (this test binary re-invoked
//! with `APPLY_CHILD_DIR` set) applies new orders to a region state machine one
//! entry at a time, flushing sled now and then so that the state on disk is some
//! prefix of what it applied, and the parent SIGKILLs it mid-stream. After reopening,
//! the last applied id must match the effects exactly: re-applying every entry after
//! it, as openraft does from the log at startup, creates each of those orders anew
//! (an entry applied but not recorded as applied would replay instead), and the
//! region ends up identical to a replica that applied every entry once.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use keyhold_store::raft;
use openraft::storage::RaftStateMachine;

use crate::helpers::{is_created, membership_entry, order_entry};

const CHILD_DIR_ENV: &str = "APPLY_CHILD_DIR";
/// Entries of the whole run; the child stops by itself after them.
const ENTRIES_MAX: u64 = 3_000;
/// The parent kills the child after reading this many acknowledgements.
const KILL_AFTER_ACKS: u64 = 400;
/// The child makes sled durable after every this many entries.
const FLUSH_EVERY_ENTRIES: u64 = 37;
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Child side; returns at once in a normal test run.
#[test]
fn apply_child_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let runtime = runtime();
    runtime.block_on(async {
        let (_log, mut state_machine) = raft::open(dir.as_ref(), "region-eu").expect("open");
        state_machine
            .apply([membership_entry(1)])
            .await
            .expect("membership");
        for index in 2..=ENTRIES_MAX {
            let outcomes = state_machine
                .apply([order_entry(index)])
                .await
                .expect("apply");
            assert!(is_created(&outcomes[0]), "{outcomes:?}");
            if index % FLUSH_EVERY_ENTRIES == 0 {
                state_machine.flush().await.expect("flush");
            }
            println!("ACK {index}");
        }
    });
}

#[test]
fn an_entry_is_applied_exactly_once_across_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = crate::common::spawn_child(
        "exactly_once::apply_child_entry_point",
        CHILD_DIR_ENV,
        dir.path(),
    );
    let stdout = child.stdout.take().expect("child stdout");
    let started = Instant::now();
    let mut last_ack = 0u64;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child output");
        // libtest may print "test <name> ... " before the child's first line.
        if let Some((_, index)) = line.split_once("ACK ") {
            last_ack = index.parse().expect("ack index");
            if last_ack >= KILL_AFTER_ACKS {
                break;
            }
        }
        assert!(started.elapsed() < CHILD_DEADLINE, "child too slow");
    }
    // SIGKILL on Unix: no destructor, no flush on drop.
    child.kill().expect("kill child");
    let status = child.wait().expect("reap child");
    assert!(!status.success(), "the child must have been killed");
    assert!(
        last_ack >= KILL_AFTER_ACKS,
        "child stopped after {last_ack} acks"
    );

    let runtime = runtime();
    runtime.block_on(async {
        let (_log, mut recovered) = raft::open(dir.path(), "region-eu").expect("reopen");
        let (applied, _) = recovered.applied_state().await.expect("applied state");
        let applied = applied.map_or(0, |id| id.index);
        // Each flush finished before the acknowledgement of its entry was printed.
        let flushed = KILL_AFTER_ACKS / FLUSH_EVERY_ENTRIES * FLUSH_EVERY_ENTRIES;
        assert!(applied >= flushed, "applied {applied} < flushed {flushed}");
        let end = ENTRIES_MAX.min(last_ack + 100);
        // What openraft does at startup: re-apply from the entry after the last
        // applied one (the membership entry too, when it was lost).
        for index in applied + 1..=end {
            let entry = if index == 1 {
                membership_entry(1)
            } else {
                order_entry(index)
            };
            let outcomes = recovered.apply([entry]).await.expect("re-apply");
            assert!(
                index == 1 || is_created(&outcomes[0]),
                "entry {index} after the recovered last applied {applied} was applied before: {outcomes:?}"
            );
        }

        let reference_dir = tempfile::tempdir().expect("tempdir");
        let (_log, mut reference) = raft::open(reference_dir.path(), "region-eu").expect("open");
        reference
            .apply([membership_entry(1)])
            .await
            .expect("membership");
        reference
            .apply((2..=end).map(order_entry))
            .await
            .expect("apply");
        assert_eq!(
            recovered.entries_for_tests(),
            reference.entries_for_tests(),
            "the recovered region differs from one that applied every entry once"
        );
        assert_eq!(
            recovered.applied_state().await.expect("applied"),
            reference.applied_state().await.expect("applied")
        );
    });
}
