//! Promotion of a standby copy (a learner of a failed region's group): the
//! learner holds entries it received but never learned were committed; once
//! promoted, its state covers its whole log, promoting again (also after a
//! restart) answers the same index, and the promoted replica takes no entry
//! from a leader any more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use keyhold_raftlog::NodeInfo;
use keyhold_store::raft::{Bootstrap, Entry, GroupOptions, Member, NoPeers};
use keyhold_store::Store;
use openraft::raft::AppendEntriesRequest;
use openraft::{EntryPayload, Membership, Vote};

use crate::helpers::{log_id, order_entry};

/// The learner's node id; node 1 plays the region's leader.
const LEARNER: u64 = 2;

fn info(n: u64) -> NodeInfo {
    NodeInfo::new("eu", format!("api-{n}"), format!("raft-{n}"))
}

/// Opens the learner's replica as a standby copy is opened: a joiner that
/// waits for the leader.
async fn open_learner(dir: &Path) -> Store {
    let member = Member {
        group: "region-eu".into(),
        node: LEARNER,
        info: info(LEARNER),
    };
    Store::open_replica(
        dir,
        member,
        NoPeers,
        Bootstrap::Joiner,
        GroupOptions::default(),
    )
    .await
    .expect("open the learner")
}

/// The group's first entry (index 0, as openraft's `initialize` writes it):
/// node 1 votes, the learner learns.
fn membership() -> Entry {
    let nodes = BTreeMap::from([(1, info(1)), (LEARNER, info(LEARNER))]);
    Entry {
        log_id: log_id(1, 0),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1])], nodes)),
    }
}

/// Sends `entries` from the leader of term 1, telling the learner that the
/// log is committed up to `commit`.
async fn append(store: &Store, prev: Option<u64>, entries: Vec<Entry>, commit: u64) -> bool {
    let request = AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: prev.map(|i| log_id(1, i)),
        entries,
        leader_commit: Some(log_id(1, commit)),
    };
    match store.group().raft().append_entries(request).await {
        Ok(response) => response.is_success(),
        Err(_) => false,
    }
}

async fn wait_applied(store: &Store, index: u64) {
    let mut applied = store.group().subscribe();
    tokio::time::timeout(Duration::from_secs(10), applied.wait_for(|&i| i >= index))
        .await
        .expect("applied in time")
        .expect("state machine running");
}

#[tokio::test]
async fn a_promoted_copy_applies_its_whole_log_once_and_stays_promoted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_learner(dir.path()).await;
        let mut entries = vec![membership()];
        entries.extend((1..=5).map(order_entry));
        // Entries 0 to 5 are durable here; only 0 to 2 are known committed.
        assert!(append(&store, None, entries, 2).await);
        wait_applied(&store, 2).await;
        assert_eq!(store.applied_index().unwrap(), 2);
        assert_eq!(store.last_log_index().unwrap(), 5);
        assert!(store.order("ord_2").await.unwrap().is_some());
        assert!(store.order("ord_3").await.unwrap().is_none());
        assert_eq!(store.promoted().unwrap(), None);

        assert_eq!(store.promote().await.unwrap(), 5);
        for n in 1..=5 {
            assert!(
                store.order(&format!("ord_{n}")).await.unwrap().is_some(),
                "order {n} is in the promoted state"
            );
        }
        assert_eq!(store.applied_index().unwrap(), 5);
        let state = store.state_for_tests();
        assert_eq!(store.promote().await.unwrap(), 5, "promoting again");
        assert_eq!(store.state_for_tests(), state, "and it changed nothing");
        // The leader's next entry no longer reaches it.
        assert!(!append(&store, Some(5), vec![order_entry(6)], 6).await);
        assert!(store.order("ord_6").await.unwrap().is_none());
        store.shutdown().await.unwrap();
    }
    // Restarted: still promoted at 5, with the same state, and out of the group.
    let store = open_learner(dir.path()).await;
    assert_eq!(store.promoted().unwrap(), Some(5));
    assert_eq!(store.last_log_index().unwrap(), 5);
    assert_eq!(store.promote().await.unwrap(), 5);
    assert!(store.order("ord_5").await.unwrap().is_some());
    assert!(!append(&store, Some(5), vec![order_entry(6)], 6).await);
    assert!(store.order("ord_6").await.unwrap().is_none());
    store.shutdown().await.unwrap();
}

/// A copy that holds nothing beyond what it applied is promoted at its
/// applied index.
#[tokio::test]
async fn a_caught_up_copy_is_promoted_at_its_applied_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_learner(dir.path()).await;
    let mut entries = vec![membership()];
    entries.extend((1..=3).map(order_entry));
    assert!(append(&store, None, entries, 3).await);
    wait_applied(&store, 3).await;
    let before = store.state_for_tests();
    assert_eq!(store.promote().await.unwrap(), 3);
    assert_eq!(store.state_for_tests(), before);
    store.shutdown().await.unwrap();
}
