//! Snapshots of a region group: built by streaming the region tree, installed on a
//! new replica and on a lagging one with state of its own, finished after a crash in
//! the middle of an installation, refused when cut short; and a refused command
//! answers the same on every replica; and entries go on applying while a snapshot
//! streams a cut of the tree.

use std::path::Path;

use keyhold_store::raft::{
    self, EntryOutcome, RegionStateMachine, SnapshotMeta, SnapshotPolicy, REGION_TREE,
};
use keyhold_store::{Applied, Command, Rejection};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use tokio::io::AsyncReadExt;

use crate::common::T0;
use crate::helpers::{commands_entry, membership_entry, order_entry};

fn open(dir: &Path) -> RegionStateMachine {
    raft::open(dir, "region-eu").expect("open").1
}

fn payment_for_missing_order(index: u64) -> Command {
    Command::ConsumePayment {
        event_id: format!("evt_{index}"),
        order_id: "ord_missing".into(),
        charge_id: "ch".into(),
        paid: true,
        now: T0,
        processed_ttl_ms: 1_000,
    }
}

/// Applies a membership entry, orders 2..=`last` and, at `refused`, a refused
/// command; returns the outcomes.
async fn fill(
    state_machine: &mut RegionStateMachine,
    last: u64,
    refused: u64,
) -> Vec<EntryOutcome> {
    let entries = std::iter::once(membership_entry(1)).chain((2..=last).map(|index| {
        if index == refused {
            commands_entry(index, vec![payment_for_missing_order(index)])
        } else {
            order_entry(index)
        }
    }));
    state_machine.apply(entries).await.expect("apply")
}

async fn build(state_machine: &mut RegionStateMachine) -> (SnapshotMeta, Vec<u8>) {
    let mut snapshot = state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build snapshot");
    let mut bytes = Vec::new();
    snapshot
        .snapshot
        .read_to_end(&mut bytes)
        .await
        .expect("read snapshot");
    (snapshot.meta, bytes)
}

async fn install(state_machine: &mut RegionStateMachine, meta: &SnapshotMeta, bytes: &[u8]) {
    try_install(state_machine, meta, bytes)
        .await
        .expect("install snapshot");
}

async fn try_install(
    state_machine: &mut RegionStateMachine,
    meta: &SnapshotMeta,
    bytes: &[u8],
) -> Result<(), keyhold_store::raft::StorageError> {
    use tokio::io::AsyncWriteExt;
    let mut receiving = state_machine
        .begin_receiving_snapshot()
        .await
        .expect("begin receiving");
    receiving.write_all(bytes).await.expect("receive");
    receiving.flush().await.expect("flush received");
    state_machine.install_snapshot(meta, receiving).await
}

#[tokio::test]
async fn a_refused_command_answers_the_same_on_every_replica() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let outcomes_a = fill(&mut open(a.path()), 6, 4).await;
    let outcomes_b = fill(&mut open(b.path()), 6, 4).await;
    assert_eq!(
        outcomes_a[3],
        EntryOutcome::Commands(vec![Applied::Rejected(Rejection::PaymentForMissingOrder {
            order_id: "ord_missing".into()
        })])
    );
    assert_eq!(outcomes_a, outcomes_b);
}

#[tokio::test]
async fn a_snapshot_installs_on_a_new_and_on_a_lagging_replica() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    fill(&mut leader, 300, 150).await;
    let (meta, bytes) = build(&mut leader).await;
    assert_eq!(meta.last_log_id.map(|id| id.index), Some(300));
    let current = leader
        .get_current_snapshot()
        .await
        .expect("current")
        .expect("a snapshot");
    assert_eq!(current.meta, meta);

    // A new replica, also after its own reopen.
    let new_dir = tempfile::tempdir().unwrap();
    {
        let mut new = open(new_dir.path());
        install(&mut new, &meta, &bytes).await;
        assert_eq!(new.entries_for_tests(), leader.entries_for_tests());
        assert_eq!(*new.subscribe().borrow(), 300);
    }
    let mut new = open(new_dir.path());
    assert_eq!(new.entries_for_tests(), leader.entries_for_tests());
    assert_eq!(
        new.applied_state().await.unwrap(),
        leader.applied_state().await.unwrap()
    );
    assert_eq!(
        new.get_current_snapshot().await.unwrap().unwrap().meta,
        meta
    );

    // A lagging replica that applied entries the snapshot replaces and more orders
    // of other keys that it does not hold: after installing, only the snapshot's
    // state is left.
    let lagging_dir = tempfile::tempdir().unwrap();
    let mut lagging = open(lagging_dir.path());
    fill(&mut lagging, 40, 0).await;
    lagging
        .apply([commands_entry(
            41,
            vec![crate::common::create(
                "other",
                "other",
                "fp",
                "ord_other",
                T0,
            )],
        )])
        .await
        .unwrap();
    install(&mut lagging, &meta, &bytes).await;
    assert_eq!(lagging.entries_for_tests(), leader.entries_for_tests());

    // Every replica goes on from the snapshot identically.
    let next = [order_entry(301), order_entry(302)];
    let from_leader = leader.apply(next.clone()).await.unwrap();
    let from_lagging = lagging.apply(next.clone()).await.unwrap();
    let from_new = new.apply(next).await.unwrap();
    assert_eq!(from_leader, from_lagging);
    assert_eq!(from_leader, from_new);
    assert_eq!(lagging.entries_for_tests(), leader.entries_for_tests());
}

#[tokio::test]
async fn an_installation_interrupted_by_a_crash_is_finished_on_open() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    fill(&mut leader, 120, 0).await;
    let (meta, bytes) = build(&mut leader).await;

    let replica_dir = tempfile::tempdir().unwrap();
    {
        let mut replica = open(replica_dir.path());
        install(&mut replica, &meta, &bytes).await;
        replica.flush().await.unwrap();
    }
    // The state a crash during the refill leaves: the marker still there, the tree
    // half cleared and holding something the snapshot does not.
    {
        let db = open_released(&replica_dir.path().join("db"));
        let tree = db.open_tree(REGION_TREE).unwrap();
        let keys: Vec<_> = tree.iter().keys().take(50).map(Result::unwrap).collect();
        for key in keys {
            tree.remove(key).unwrap();
        }
        tree.insert(b"ostray", b"not in the snapshot".as_slice())
            .unwrap();
        db.flush().unwrap();
        std::fs::write(replica_dir.path().join("snapshots/install.pending"), b"").unwrap();
    }
    let mut replica = open(replica_dir.path());
    assert_eq!(replica.entries_for_tests(), leader.entries_for_tests());
    assert_eq!(
        replica.applied_state().await.unwrap(),
        leader.applied_state().await.unwrap()
    );
    assert!(!replica_dir
        .path()
        .join("snapshots/install.pending")
        .exists());
}

#[tokio::test]
async fn a_snapshot_cut_short_is_refused_and_changes_nothing() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    fill(&mut leader, 50, 0).await;
    let (meta, bytes) = build(&mut leader).await;

    let replica_dir = tempfile::tempdir().unwrap();
    let mut replica = open(replica_dir.path());
    fill(&mut replica, 10, 0).await;
    let before = replica.entries_for_tests();
    let cut = &bytes[..bytes.len() - 5];
    let result = try_install(&mut replica, &meta, cut).await;
    assert!(result.is_err(), "a snapshot cut short was installed");
    assert_eq!(replica.entries_for_tests(), before);
    assert_eq!(
        replica.applied_state().await.unwrap().0.map(|id| id.index),
        Some(10)
    );
}

/// Opens a sled directory another handle just closed: sled's flusher thread lets go
/// of the directory's lock a moment after the last handle is dropped, later still
/// on a busy machine, so the open is retried until it is released.
fn open_released(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("{} still locked ({e}); retrying", path.display());
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("{} stays locked: {e}", path.display()),
        }
    }
}

/// An order entry at `index` written by the leader of `(term, node)`.
fn order_by((term, node): (u64, u64), index: u64) -> raft::Entry {
    let mut entry = order_entry(index);
    entry.log_id = openraft::LogId::new(openraft::CommittedLeaderId::new(term, node), index);
    entry
}

fn run((term, node): (u64, u64), from_index: u64) -> keyhold_raftlog::LeaderRun {
    keyhold_raftlog::LeaderRun {
        from_index,
        leader: openraft::CommittedLeaderId::new(term, node),
    }
}

/// A replica records one leader per change of leader, a snapshot carries
/// them, and every replica records the next change alike, also after a
/// reopen: what a failover's cut is read from (`Store::failover_cut`).
#[tokio::test]
async fn the_leaders_of_applied_entries_travel_with_a_snapshot() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    fill(&mut leader, 5, 0).await;
    leader
        .apply((6..=8).map(|i| order_by((2, 3), i)))
        .await
        .unwrap();
    let runs = vec![run((1, 1), 1), run((2, 3), 6)];
    assert_eq!(leader.leader_runs(1, 8).unwrap(), runs);
    assert_eq!(leader.leader_runs(7, 8).unwrap(), vec![run((2, 3), 6)]);
    assert_eq!(leader.leader_runs(2, 5).unwrap(), vec![run((1, 1), 1)]);
    let (meta, bytes) = build(&mut leader).await;

    let new_dir = tempfile::tempdir().unwrap();
    {
        let mut new = open(new_dir.path());
        install(&mut new, &meta, &bytes).await;
        assert_eq!(new.leader_runs(1, 8).unwrap(), runs);
        let next = [order_by((2, 3), 9), order_by((3, 1), 10)];
        leader.apply(next.clone()).await.unwrap();
        new.apply(next).await.unwrap();
        assert_eq!(
            new.leader_runs(1, 10).unwrap(),
            leader.leader_runs(1, 10).unwrap()
        );
    }
    let mut new = open(new_dir.path());
    new.apply([order_by((3, 1), 11)]).await.unwrap();
    leader.apply([order_by((3, 1), 11)]).await.unwrap();
    let all = vec![run((1, 1), 1), run((2, 3), 6), run((3, 1), 10)];
    assert_eq!(new.leader_runs(1, 11).unwrap(), all);
    assert_eq!(leader.leader_runs(1, 11).unwrap(), all);
}

/// Entries 301..=320 of `fill`'s store: a new order each, and in 310 the sweep
/// of the records of orders 2..=300 (keys at every place in the tree, behind
/// and ahead of a build's reader).
fn entries_after_fill() -> Vec<raft::Entry> {
    (301..=320)
        .map(|index| match index {
            310 => commands_entry(
                index,
                vec![Command::SweepKeys {
                    now: T0.plus_ms(30 * crate::common::HOUR_MS * 24),
                    keys: (2..=300)
                        .map(|n| crate::helpers::record_key(&format!("key-{n}")))
                        .collect(),
                }],
            ),
            _ => order_entry(index),
        })
        .collect()
}

/// Starts a build of `state_machine` that pauses after its 100th entry until
/// told to go on; returns once it is paused.
async fn paused_build(
    state_machine: &RegionStateMachine,
    recorded_bytes_max: usize,
) -> (
    tokio::task::JoinHandle<(SnapshotMeta, std::fs::File)>,
    std::sync::mpsc::Sender<()>,
) {
    let (paused_tx, paused_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let mut paused_tx = Some(paused_tx);
    let builder = state_machine.clone();
    let build = tokio::spawn(async move {
        builder
            .build_snapshot_with(recorded_bytes_max, move |streamed| {
                if streamed == 100 {
                    paused_tx.take().unwrap().send(()).unwrap();
                    resume_rx.recv().unwrap();
                }
            })
            .await
            .expect("build snapshot")
    });
    paused_rx.await.expect("the build reaches its 100th entry");
    (build, resume_tx)
}

fn read_file(mut file: std::fs::File) -> Vec<u8> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).expect("read snapshot");
    bytes
}

/// Builds a snapshot of a filled store with a cut bounded by
/// `recorded_bytes_max`, applies `entries_after_fill` while the build is paused
/// midway, and checks that they applied meanwhile and that the snapshot holds
/// the tree as it was at its cut.
async fn build_beside_entries(recorded_bytes_max: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut leader = open(dir.path());
    fill(&mut leader, 300, 0).await;
    let at_cut = leader.entries_for_tests();
    let (build, resume) = paused_build(&leader, recorded_bytes_max).await;

    // The build holds its cut, not the apply: entries go on meanwhile (before
    // the cut, this waited for the whole build). Applying blocks its thread,
    // so it runs on another than the one that times it.
    let applied = {
        let mut leader = leader.clone();
        tokio::spawn(async move { leader.apply(entries_after_fill()).await.unwrap() })
    };
    let outcomes = tokio::time::timeout(std::time::Duration::from_secs(20), applied)
        .await
        .expect("entries apply while a snapshot is being built")
        .unwrap();
    let swept = match &outcomes[9] {
        EntryOutcome::Commands(answers) => answers[0].clone(),
        EntryOutcome::Raft => panic!("a sweep entry answers a command"),
    };
    assert!(
        matches!(&swept, Applied::Sweep(outcome) if outcome.records > 0),
        "the sweep deleted records the build has yet to stream: {swept:?}"
    );
    let after = leader.entries_for_tests();
    assert_ne!(after, at_cut);
    resume.send(()).unwrap();
    let (meta, file) = build.await.unwrap();
    assert_eq!(meta.last_log_id.map(|id| id.index), Some(300));

    // The snapshot holds the tree as it was at its cut, and a replica that
    // installs it and applies the same entries reaches the leader's state.
    let replica_dir = tempfile::tempdir().unwrap();
    let mut replica = open(replica_dir.path());
    install(&mut replica, &meta, &read_file(file)).await;
    assert_eq!(replica.entries_for_tests(), at_cut);
    assert_eq!(*replica.subscribe().borrow(), 300);
    assert_eq!(replica.apply(entries_after_fill()).await.unwrap(), outcomes);
    assert_eq!(replica.entries_for_tests(), after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_apply_while_a_snapshot_streams_and_it_holds_the_state_at_its_cut() {
    build_beside_entries(usize::MAX).await;
}

/// A bound of one byte: the first entry applied during the build reaches it,
/// and the build, once it goes on, finishes under the apply lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_whose_cut_records_reach_their_bound_finishes_under_the_apply_lock() {
    build_beside_entries(1).await;
}

#[tokio::test]
async fn a_snapshot_is_wanted_after_its_entries_and_once_they_wrote_the_last_ones_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut machine = open(dir.path());
    machine.set_snapshot_policy(SnapshotPolicy {
        entries: 5,
        written_percent: 100,
    });
    machine.apply([membership_entry(1)]).await.unwrap();
    // No snapshot yet: the entries alone decide the first.
    for index in 2..=4 {
        machine.apply([order_entry(index)]).await.unwrap();
        assert!(!machine.take_snapshot_wanted(), "only {index} entries");
    }
    machine.apply([order_entry(5)]).await.unwrap();
    assert!(machine.take_snapshot_wanted(), "5 entries");
    assert!(!machine.take_snapshot_wanted(), "taken once");
    for index in 6..=40 {
        machine.apply([order_entry(index)]).await.unwrap();
    }
    let (meta, bytes) = build(&mut machine).await;
    assert!(
        bytes.len() > 20_000,
        "a snapshot of 39 orders: {} bytes",
        bytes.len()
    );

    // Five entries of one order each write far less than the snapshot holds
    // (39 orders): not yet.
    let mut index = 41;
    for _ in 0..5 {
        machine.apply([order_entry(index)]).await.unwrap();
        index += 1;
    }
    assert!(
        !machine.take_snapshot_wanted(),
        "5 entries, a fraction written"
    );
    // As many bytes as the snapshot holds: now.
    let mut applied = 5;
    while !machine.take_snapshot_wanted() {
        machine.apply([order_entry(index)]).await.unwrap();
        index += 1;
        applied += 1;
        assert!(applied < 100, "never wanted after {applied} orders");
    }
    assert!(
        applied > 5,
        "wanted only once the snapshot's size was written"
    );

    // A replica that installs a snapshot counts from it; a restarted one
    // counts the entries since its snapshot and its size as written.
    let replica_dir = tempfile::tempdir().unwrap();
    {
        let mut replica = open(replica_dir.path());
        replica.set_snapshot_policy(SnapshotPolicy {
            entries: 5,
            written_percent: 100,
        });
        install(&mut replica, &meta, &bytes).await;
        replica.apply([order_entry(41)]).await.unwrap();
        assert!(!replica.take_snapshot_wanted());
    }
    let mut replica = open(replica_dir.path());
    replica.set_snapshot_policy(SnapshotPolicy {
        entries: 2,
        written_percent: 100,
    });
    replica.apply([order_entry(42)]).await.unwrap();
    assert!(
        replica.take_snapshot_wanted(),
        "2 entries since the snapshot"
    );
}
