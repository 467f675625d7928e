//! Exactly-once apply across kill -9: a child process (this test binary re-invoked
//! with `APPLY_CHILD_DIR` set) applies entries of `COMMANDS_PER_ENTRY` new orders each
//! to a region state machine, with sled persisting in the background every
//! millisecond and flushing now and then, so that the state on disk is some prefix
//! of what it applied (cut at any sled batch), and the parent SIGKILLs it mid-stream. After
//! reopening, the record of what was applied must match the effects exactly: the
//! orders present are the first `p` of the log, exactly those of the applied
//! entries (an entry is one sled batch); re-applying every
//! entry after the last applied one, as openraft does from the log at startup,
//! creates each missing order anew and writes none twice, and the region ends up
//! identical to a replica that applied every entry once.
//!
//! The same again with a child that writes each command in its own sled batch with
//! the entry's progress (`APPLY_PER_COMMAND_CHILD_DIR`: as an entry over the batch
//! limit is written, and as every entry was before one batch per entry), reopened
//! by the ordinary state machine: besides the applied entries' orders there may be
//! part of the next entry's, and re-applying that entry writes only the rest.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use keyhold_store::raft::{self, Entry, RegionStateMachine};
use openraft::storage::RaftStateMachine;

use crate::helpers::{answers, commands_entry, is_created, membership_entry, new_order};

const CHILD_DIR_ENV: &str = "APPLY_CHILD_DIR";
const PER_COMMAND_CHILD_DIR_ENV: &str = "APPLY_PER_COMMAND_CHILD_DIR";
/// Entries of the whole run; the child stops by itself after them.
const ENTRIES_MAX: u64 = 2_000;
const COMMANDS_PER_ENTRY: u64 = 3;
/// The parent kills the child after reading this many acknowledgements.
const KILL_AFTER_ACKS: u64 = 300;
/// The child makes sled durable after every this many entries.
const FLUSH_EVERY_ENTRIES: u64 = 37;
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// Entry `index` (from 2; entry 1 is the membership) carries the orders numbered
/// `COMMANDS_PER_ENTRY * (index - 2) + 1` and on.
fn orders_entry(index: u64) -> Entry {
    let first = COMMANDS_PER_ENTRY * (index - 2) + 1;
    commands_entry(
        index,
        (first..first + COMMANDS_PER_ENTRY).map(new_order).collect(),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Child side, one sled batch per entry; returns at once in a normal test run.
#[test]
fn apply_child_entry_point() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        run_child(&dir, keyhold_store::limits::ENTRY_BATCH_BYTES_MAX);
    }
}

/// Child side, one sled batch per command; returns at once in a normal test run.
#[test]
fn apply_per_command_child_entry_point() {
    if let Ok(dir) = std::env::var(PER_COMMAND_CHILD_DIR_ENV) {
        run_child(&dir, 0);
    }
}

fn run_child(dir: &str, entry_batch_bytes_max: usize) {
    runtime().block_on(async {
        // The layout of `raft::open`, with sled persisting in the background every
        // millisecond, so that the kill finds states in the middle of entries too.
        let dir = std::path::Path::new(&dir);
        let db = sled::Config::new()
            .path(dir.join("db"))
            .flush_every_ms(Some(1))
            .open()
            .expect("open db");
        let tree = db.open_tree(raft::REGION_TREE).expect("tree");
        let mut state_machine = RegionStateMachine::open_with_entry_batch_bytes_max(
            db,
            tree,
            &dir.join("snapshots"),
            entry_batch_bytes_max,
        )
        .expect("open");
        state_machine
            .apply([membership_entry(1)])
            .await
            .expect("membership");
        for index in 2..=ENTRIES_MAX {
            let outcomes = state_machine
                .apply([orders_entry(index)])
                .await
                .expect("apply");
            assert!(answers(&outcomes[0]).iter().all(is_created), "{outcomes:?}");
            if index % FLUSH_EVERY_ENTRIES == 0 {
                state_machine.flush().await.expect("flush");
            }
            println!("ACK {index}");
        }
    });
}

#[test]
fn an_entry_is_applied_exactly_once_across_sigkill() {
    kill_and_recover("exactly_once::apply_child_entry_point", CHILD_DIR_ENV, true);
}

#[test]
fn an_entry_written_per_command_resumes_exactly_once_across_sigkill() {
    kill_and_recover(
        "exactly_once::apply_per_command_child_entry_point",
        PER_COMMAND_CHILD_DIR_ENV,
        false,
    );
}

/// Runs child `test`, kills it, reopens its state machine and checks it; with
/// `whole_entries`, no part of an entry may be in the tree without the rest.
fn kill_and_recover(test: &str, env: &str, whole_entries: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = crate::common::spawn_child(test, env, dir.path());
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

    runtime().block_on(async {
        let (_log, mut recovered) = raft::open(dir.path(), "region-eu").expect("reopen");
        let (applied, _) = recovered.applied_state().await.expect("applied state");
        let applied = applied.map_or(0, |id| id.index);
        // Each flush finished before the acknowledgement of its entry was printed.
        let flushed = KILL_AFTER_ACKS / FLUSH_EVERY_ENTRIES * FLUSH_EVERY_ENTRIES;
        assert!(applied >= flushed, "applied {applied} < flushed {flushed}");

        // The orders in the tree are a prefix of the log's: ord_1 ..= ord_p.
        let orders: Vec<u64> = recovered
            .entries_for_tests()
            .iter()
            .filter_map(|(key, _)| key.strip_prefix(b"oord_"))
            .map(|n| String::from_utf8_lossy(n).parse().expect("order number"))
            .collect();
        let present = orders.len() as u64;
        let mut sorted = orders.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=present).collect::<Vec<_>>());
        // Every command of the applied entries is there, and besides them (an
        // entry written per command) at most part of the next entry.
        let of_applied = COMMANDS_PER_ENTRY * applied.saturating_sub(1);
        let at_most = if whole_entries {
            of_applied
        } else {
            of_applied + COMMANDS_PER_ENTRY - 1
        };
        assert!(
            (of_applied..=at_most).contains(&present),
            "{present} orders present, entries up to {applied} applied"
        );

        // What openraft does at startup: re-apply from the entry after the last
        // applied one (the membership entry too, when it was lost).
        let end = ENTRIES_MAX.min(last_ack + 100);
        for index in applied + 1..=end {
            let entry = if index == 1 {
                membership_entry(1)
            } else {
                orders_entry(index)
            };
            let outcomes = recovered.apply([entry]).await.expect("re-apply");
            for (position, answer) in answers(&outcomes[0]).iter().enumerate() {
                let n = COMMANDS_PER_ENTRY * (index - 2) + 1 + position as u64;
                assert_eq!(
                    is_created(answer),
                    n > present,
                    "order {n} of entry {index} ({present} were present): {answer:?}"
                );
            }
        }

        let reference_dir = tempfile::tempdir().expect("tempdir");
        let (_log, mut reference) = raft::open(reference_dir.path(), "region-eu").expect("open");
        reference
            .apply([membership_entry(1)])
            .await
            .expect("membership");
        reference
            .apply((2..=end).map(orders_entry))
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
