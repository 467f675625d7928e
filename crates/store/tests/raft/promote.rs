//! Promotion of a standby copy (a learner of a failed region's group): the
//! learner holds entries it received but never learned were committed; once
//! promoted, its state covers its whole log, promoting again (also after a
//! restart) answers the same index, and the promoted replica takes no entry
//! from a leader any more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use keyhold_core::TenantId;
use keyhold_raftlog::NodeInfo;
use keyhold_store::raft::{Bootstrap, Entry, GroupOptions, Member, NoPeers};
use keyhold_store::{LogTail, Store};
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, Vote};

use crate::common::new_order;
use crate::helpers::{log_id, order_entry};

/// The learner's node id; node 1 plays the region's leader.
const LEARNER: u64 = 2;

fn info(n: u64) -> NodeInfo {
    NodeInfo::new("eu", format!("api-{n}"), format!("raft-{n}"))
}

/// Opens the learner's replica as a standby copy is opened: a joiner that
/// waits for the leader.
async fn open_learner(dir: &Path) -> Store {
    open_member(dir, LEARNER).await
}

/// Opens node `node`'s replica as a joiner that waits for a leader.
async fn open_member(dir: &Path, node: u64) -> Store {
    let member = Member {
        group: "region-eu".into(),
        node,
        info: info(node),
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
    let (prev, commit) = (prev.map(|i| log_id(1, i)), log_id(1, commit));
    append_from(store, (1, 1), prev, entries, commit).await
}

/// Sends `entries` from the leader of `(term, node)`.
async fn append_from(
    store: &Store,
    (term, node): (u64, u64),
    prev: Option<LogId<u64>>,
    entries: Vec<Entry>,
    commit: LogId<u64>,
) -> bool {
    let request = AppendEntriesRequest {
        vote: Vote::new_committed(term, node),
        prev_log_id: prev,
        entries,
        leader_commit: Some(commit),
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

        // Entries 3 to 5 were applied unconfirmed; the leader of term 1 wrote them.
        let tail = LogTail::of(2, (3..=5).map(|i| log_id(1, i)));
        assert_eq!(store.promote().await.unwrap(), tail);
        for n in 1..=5 {
            assert!(
                store.order(&format!("ord_{n}")).await.unwrap().is_some(),
                "order {n} is in the promoted state"
            );
        }
        assert_eq!(store.applied_index().unwrap(), 5);
        let state = store.state_for_tests();
        assert_eq!(store.promote().await.unwrap(), tail, "promoting again");
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
    let tail = LogTail::of(2, (3..=5).map(|i| log_id(1, i)));
    assert_eq!(
        store.promote().await.unwrap(),
        tail,
        "kept across a restart"
    );
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
    assert_eq!(store.promote().await.unwrap(), LogTail::confirmed(3));
    assert_eq!(store.state_for_tests(), before);
    store.shutdown().await.unwrap();
}

/// An entry at `index` written by the leader of `(term, node)`, carrying the
/// order numbered `n`.
fn order_by(leader: (u64, u64), index: u64, n: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(leader.0, leader.1), index),
        payload: EntryPayload::Normal(keyhold_store::raft::CommandBatch {
            commands: vec![new_order(n)],
        }),
    }
}

/// The order ids among `orphans`, sorted.
fn orphan_orders(orphans: &[keyhold_store::Orphan]) -> Vec<String> {
    let mut ids: Vec<String> = orphans.iter().filter_map(|o| o.order_id.clone()).collect();
    ids.sort();
    ids
}

/// The membership entry and orders 1 to `last` by the leader of term 1.
fn log_up_to(last: u64) -> Vec<Entry> {
    std::iter::once(membership())
        .chain((1..=last).map(order_entry))
        .collect()
}

/// A standby copy that holds entries up to 4 and learned only 2 committed.
async fn copy_cut_off_at_2(dir: &Path) -> Store {
    let copy = open_learner(dir).await;
    assert!(append(&copy, None, log_up_to(4), 2).await);
    wait_applied(&copy, 2).await;
    copy
}

/// The defect a bare log index as the failover's position hid: the copy was
/// cut off holding entries 3 and 4 that the leader of term 1 never got
/// committed; the region elected node 3 (term 2), which wrote and committed
/// other orders at 3, 4 and 5. The copy's position is 4, but it holds only
/// entries 1 and 2 of the region's: the region's orders at 3 and 4 are lost
/// with the failover, so they are orphans as much as the one at 5.
#[tokio::test]
async fn entries_another_leader_wrote_at_the_copys_unconfirmed_indexes_are_orphans() {
    let (copy_dir, region_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let copy = copy_cut_off_at_2(copy_dir.path()).await;

    // A replica of the region (node 4) that followed both leaders.
    let region = open_member(region_dir.path(), 4).await;
    assert!(append(&region, None, log_up_to(2), 2).await);
    let term2 = (2, 3);
    let rewritten = (3..=5).map(|i| order_by(term2, i, 10 + i)).collect();
    let last = LogId::new(CommittedLeaderId::new(2, 3), 5);
    assert!(append_from(&region, term2, Some(log_id(1, 2)), rewritten, last).await);
    wait_applied(&region, 5).await;

    let tail = copy.promote().await.unwrap();
    assert_eq!(tail, LogTail::of(2, (3..=4).map(|i| log_id(1, i))));
    assert!(copy.order("ord_4").await.unwrap().is_some());
    assert!(copy.order("ord_13").await.unwrap().is_none());

    let cut = region.failover_cut(&tail).unwrap();
    assert_eq!(cut, 2, "the copy holds the region's entries up to 2 only");
    let t1 = [TenantId::parse("t1").unwrap()];
    let (orphans, omitted) = region.orphans(&t1, cut).unwrap();
    assert_eq!(omitted, 0);
    assert_eq!(
        orphan_orders(&orphans),
        ["ord_13", "ord_14", "ord_15"],
        "every order the region acknowledged beyond the cut"
    );
    // The position alone would have listed the order at 5 only.
    let (by_position, _) = region.orphans(&t1, tail.last).unwrap();
    assert_eq!(orphan_orders(&by_position), ["ord_15"]);
    copy.shutdown().await.unwrap();
    region.shutdown().await.unwrap();
}

/// Where the region's leader wrote the copy's unconfirmed entries itself,
/// the copy holds them alike: the cut is the copy's position.
#[tokio::test]
async fn unconfirmed_entries_the_same_leader_wrote_here_are_held_alike() {
    let (copy_dir, region_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let copy = copy_cut_off_at_2(copy_dir.path()).await;
    let region = open_member(region_dir.path(), 4).await;
    assert!(append(&region, None, log_up_to(6), 6).await);
    wait_applied(&region, 6).await;

    let tail = copy.promote().await.unwrap();
    assert_eq!(region.failover_cut(&tail).unwrap(), 4);
    let t1 = [TenantId::parse("t1").unwrap()];
    let (orphans, _) = region.orphans(&t1, 4).unwrap();
    assert_eq!(orphan_orders(&orphans), ["ord_5", "ord_6"]);
    copy.shutdown().await.unwrap();
    region.shutdown().await.unwrap();
}
