//! Reopening a store finds the log, vote, applied state and snapshot it had; a snapshot
//! installed on another store reproduces the same state; a purge survives a reopen.

use std::path::Path;

use keyhold_registry::store::{self, LogStore, StateMachineStore};
use keyhold_registry::types::{Entry, Vote};
use keyhold_registry::{RegistryState, Request, Response};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};

use crate::common::{add_region, entry, log_id, tenant};

fn requests() -> Vec<Request> {
    vec![
        add_region("eu"),
        add_region("us"),
        Request::CreateTenant {
            record: tenant("t1", "eu"),
        },
        Request::BeginMove {
            tenant_id: "t1".to_string(),
            to: "us".to_string(),
            operation_id: "op1".to_string(),
            now_ms: 10,
        },
        Request::CompleteMove {
            tenant_id: "t1".to_string(),
            operation_id: "op1".to_string(),
            now_ms: 20,
        },
    ]
}

fn open(dir: &Path) -> (LogStore, StateMachineStore) {
    store::open(dir).expect("open store")
}

fn state_of(state_machine: &StateMachineStore) -> RegistryState {
    state_machine.read(Clone::clone)
}

#[tokio::test]
async fn stores_survive_reopen_and_snapshots_reproduce_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let entries: Vec<Entry> = requests()
        .into_iter()
        .zip(1u64..)
        .map(|(request, index)| entry(1, index, request))
        .collect();
    let vote = Vote::new_committed(1, 1);

    let (snapshot_meta, snapshot_data, state_before) = {
        let (mut log, mut state_machine) = open(dir.path());
        log.save_vote(&vote).await.expect("save vote");
        log.blocking_append(entries.clone()).await.expect("append");
        log.save_committed(Some(log_id(1, 5)))
            .await
            .expect("commit");
        let responses = state_machine.apply(entries.clone()).await.expect("apply");
        let Some(Response::MoveUpdated { record, .. }) = responses.last() else {
            panic!("unexpected responses {responses:?}");
        };
        assert_eq!((record.home_region.as_str(), record.epoch), ("us", 2));
        assert_eq!(*state_machine.subscribe().borrow(), 5);

        let mut builder = state_machine.get_snapshot_builder().await;
        let snapshot = builder.build_snapshot().await.expect("snapshot");
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 5)));
        state_machine.flush().await.expect("flush");
        (
            snapshot.meta,
            snapshot.snapshot.into_inner(),
            state_of(&state_machine),
        )
    };

    // Reopen: everything is where it was.
    {
        let (mut log, mut state_machine) = open(dir.path());
        assert_eq!(log.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            log.read_committed().await.expect("committed"),
            Some(log_id(1, 5))
        );
        let log_state = log.get_log_state().await.expect("log state");
        assert_eq!(log_state.last_log_id, Some(log_id(1, 5)));
        let read = log.try_get_log_entries(1..=5).await.expect("read");
        assert_eq!(format!("{read:?}"), format!("{entries:?}"));
        let (applied, _) = state_machine.applied_state().await.expect("applied");
        assert_eq!(applied, Some(log_id(1, 5)));
        assert_eq!(state_of(&state_machine), state_before);
        assert_eq!(*state_machine.subscribe().borrow(), 5);
        let current = state_machine
            .get_current_snapshot()
            .await
            .expect("current snapshot")
            .expect("a snapshot");
        assert_eq!(current.meta, snapshot_meta);

        // Purge the first three entries; the marker and the deletion persist together.
        log.purge(log_id(1, 3)).await.expect("purge");
    }
    {
        let (mut log, _state_machine) = open(dir.path());
        let log_state = log.get_log_state().await.expect("log state");
        assert_eq!(log_state.last_purged_log_id, Some(log_id(1, 3)));
        assert_eq!(log_state.last_log_id, Some(log_id(1, 5)));
        let left = log.try_get_log_entries(0..10).await.expect("read");
        let indexes: Vec<u64> = left.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, vec![4, 5]);
    }

    // A fresh replica installing the snapshot ends up with the same state, also after
    // its own reopen.
    let other = tempfile::tempdir().expect("tempdir");
    {
        let (_log, mut state_machine) = open(other.path());
        state_machine
            .install_snapshot(
                &snapshot_meta,
                Box::new(std::io::Cursor::new(snapshot_data)),
            )
            .await
            .expect("install");
        assert_eq!(state_of(&state_machine), state_before);
        assert_eq!(*state_machine.subscribe().borrow(), 5);
    }
    let (_log, mut state_machine) = open(other.path());
    assert_eq!(state_of(&state_machine), state_before);
    let (applied, _) = state_machine.applied_state().await.expect("applied");
    assert_eq!(applied, Some(log_id(1, 5)));
}
