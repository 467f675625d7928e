//! A region group replicated over the nodes' Raft transport: three voters of
//! `region-eu` in this process, each with its own data directory and its own Raft
//! listener on 127.0.0.1 port 0 serving the group's router
//! (`/raft/region-eu/...`). Commands written on the leader are answered once a
//! majority holds them; the routes refuse a caller without the node credential
//! (401 `unauthenticated`); after the leader's Raft and listener stop (its task
//! killed), the other two elect a new leader that holds every acknowledged command
//! (each replays) and takes new ones. And a node with an empty directory, added as
//! a learner after the leader purged its log behind a snapshot, catches up by
//! that snapshot sent in chunks over the same transport. A learner that cannot
//! take more than a few entries per AppendEntries within the RPC timeout still
//! receives the whole log: the leader's connection shrinks its appends after a
//! timeout instead of sending the same ones again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keyhold_store::limits::REGION_RPC_TIMEOUT_MS;
use openraft::raft::AppendEntriesRequest;

use keyhold_registry::{group_router, HttpNetwork, NodeCredentials, NodeId, NodeInfo};
use keyhold_store::raft::{Bootstrap, Member, RegionConfig, RegionGroup};
use keyhold_store::{Applied, Error, OrderOutcome};
use tokio::sync::oneshot;

// The store's own test commands.
#[path = "../../store/tests/common/mod.rs"]
mod common;

const GROUP: &str = "region-eu";
const CREDENTIAL: &str = "region-raft-test-credential-0123456789";
const VOTERS: [NodeId; 3] = [1, 2, 3];
const ORDERS: u64 = 40;
/// Elections and replication on a loaded machine.
const WAIT: Duration = Duration::from_secs(20);

/// One voter: its group, its Raft listener's task and the way to stop both.
struct Voter {
    id: NodeId,
    group: RegionGroup,
    stop_http: Option<oneshot::Sender<()>>,
    http: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Voter {
    async fn start(
        id: NodeId,
        listener: tokio::net::TcpListener,
        info: NodeInfo,
        bootstrap: Bootstrap,
    ) -> Voter {
        Voter::start_with(id, listener, info, bootstrap, None, None).await
    }

    /// `start`, its Raft listener behind `slow`: a member that answers an
    /// AppendEntries of more entries than it can take only after the RPC
    /// timeout; each AppendEntries it sends bounded to `append_bytes_max`.
    async fn start_with(
        id: NodeId,
        listener: tokio::net::TcpListener,
        info: NodeInfo,
        bootstrap: Bootstrap,
        slow: Option<SlowAppends>,
        append_bytes_max: Option<usize>,
    ) -> Voter {
        let dir = tempfile::tempdir().unwrap();
        let credentials = NodeCredentials::parse(CREDENTIAL).unwrap();
        let member = Member {
            group: GROUP.into(),
            node: id,
            info,
        };
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut network = HttpNetwork::<RegionConfig>::new(client, GROUP, id, credentials.clone());
        if let Some(bytes) = append_bytes_max {
            network = network.with_append_bytes_max(bytes);
        }
        let group = RegionGroup::start(dir.path(), &member, network, bootstrap)
            .await
            .expect("start the region group");
        let mut router = group_router(GROUP, group.raft().clone(), credentials);
        if let Some(slow) = slow {
            router = router.layer(axum::middleware::from_fn(move |request, next| {
                slow.clone().serve(request, next)
            }));
        }
        let (stop_http, stopped) = oneshot::channel::<()>();
        let http = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("raft listener");
        });
        Voter {
            id,
            group,
            stop_http: Some(stop_http),
            http,
            _dir: dir,
        }
    }

    /// Stops the voter's Raft and closes its listener, as if its process died.
    async fn kill(mut self) {
        self.group.raft().shutdown().await.expect("raft shutdown");
        if let Some(stop) = self.stop_http.take() {
            let _ = stop.send(());
        }
        self.http.abort();
        let _ = self.http.await;
    }
}

/// A member too busy for large appends: an AppendEntries of more than
/// `entries_max` entries is answered 503 after twice the RPC timeout, unread,
/// as when a loaded machine cannot decode and store it in time (the leader
/// has given up on it by then). Counts those it refused.
#[derive(Clone)]
struct SlowAppends {
    entries_max: usize,
    refused: Arc<AtomicU64>,
}

impl SlowAppends {
    async fn serve(self, request: HttpRequest<Body>, next: Next) -> Response {
        if !request.uri().path().ends_with("/append") {
            return next.run(request).await;
        }
        let (parts, body) = request.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let append: AppendEntriesRequest<RegionConfig> =
            keyhold_raftlog::codec::decode(&bytes).expect("an AppendEntries");
        if append.entries.len() > self.entries_max {
            self.refused.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2 * REGION_RPC_TIMEOUT_MS)).await;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        next.run(HttpRequest::from_parts(parts, Body::from(bytes)))
            .await
    }
}

fn at(voters: &[Voter], id: NodeId) -> usize {
    voters.iter().position(|v| v.id == id).unwrap()
}

/// The leader the voters agree on, other than `not`.
async fn leader(voters: &[Voter], not: Option<NodeId>) -> NodeId {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen: Vec<Option<NodeId>> = voters
            .iter()
            .map(|v| v.group.raft().metrics().borrow().current_leader)
            .collect();
        if let Some(Some(id)) = seen.first() {
            if seen.iter().all(|s| *s == Some(*id)) && Some(*id) != not {
                return *id;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no agreed leader: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_replicate_over_http_and_survive_the_leaders_loss() {
    let mut listeners = Vec::new();
    let mut addresses: Vec<SocketAddr> = Vec::new();
    for _ in VOTERS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.push(listener.local_addr().unwrap());
        listeners.push(listener);
    }
    let infos: BTreeMap<NodeId, NodeInfo> = VOTERS
        .iter()
        .zip(&addresses)
        .map(|(id, addr)| (*id, NodeInfo::new("eu", "-", addr.to_string())))
        .collect();
    let mut voters = Vec::new();
    for (id, listener) in VOTERS.into_iter().zip(listeners) {
        let bootstrap = Bootstrap::Voters(infos.clone());
        voters.push(Voter::start(id, listener, infos[&id].clone(), bootstrap).await);
    }

    // Without the node credential the group's routes answer 401, before decoding.
    let refused = reqwest::Client::new()
        .post(format!("http://{}/raft/{GROUP}/vote", addresses[0]))
        .body(vec![0u8; 8])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert!(problem["type"]
        .as_str()
        .unwrap()
        .ends_with("/unauthenticated"));

    let first = leader(&voters, None).await;
    let writes = (1..=ORDERS).map(|n| {
        let group = voters[at(&voters, first)].group.clone();
        tokio::spawn(async move { group.execute(common::new_order(n)).await })
    });
    for write in writes.collect::<Vec<_>>() {
        let answer = write.await.unwrap().expect("write on the leader").value;
        assert!(
            matches!(answer, Applied::Order(OrderOutcome::Created { .. })),
            "{answer:?}"
        );
    }
    // A follower's writer appends nothing and names the leader.
    let follower = voters.iter().find(|v| v.id != first).unwrap();
    match follower.group.execute(common::new_order(ORDERS + 1)).await {
        Err(Error::NotLeader { leader }) => assert_eq!(leader, Some(first)),
        other => panic!("a follower took a write: {other:?}"),
    }

    let old = voters.remove(at(&voters, first));
    old.kill().await;
    let second = leader(&voters, Some(first)).await;
    let group = voters[at(&voters, second)].group.clone();
    // Every acknowledged command is on the new leader: each replays.
    for n in 1..=ORDERS {
        let answer = group
            .execute(common::new_order(n))
            .await
            .expect("replay")
            .value;
        assert!(
            matches!(answer, Applied::Order(OrderOutcome::Replayed { .. })),
            "order {n}: {answer:?}"
        );
    }
    let answer = group
        .execute(common::new_order(ORDERS + 2))
        .await
        .expect("new write")
        .value;
    assert!(
        matches!(answer, Applied::Order(OrderOutcome::Created { .. })),
        "{answer:?}"
    );
    // Both survivors hold the same region.
    let applied = group.raft().metrics().borrow().last_applied;
    for voter in &voters {
        voter
            .group
            .raft()
            .wait(Some(WAIT))
            .applied_index_at_least(applied.map(|id| id.index), "caught up")
            .await
            .expect("caught up");
    }
    assert_eq!(
        voters[0].group.state_machine().entries_for_tests(),
        voters[1].group.state_machine().entries_for_tests()
    );
    for voter in voters {
        voter.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_learner_catches_up_by_snapshot_over_http() {
    let mut listeners = Vec::new();
    let mut infos = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        infos.push(NodeInfo::new("eu", "-", addr));
        listeners.push(listener);
    }
    let mut listeners = listeners.into_iter();
    let voters = Bootstrap::Voters(BTreeMap::from([(1, infos[0].clone())]));
    let leader = Voter::start(1, listeners.next().unwrap(), infos[0].clone(), voters).await;
    let raft = leader.group.raft().clone();
    raft.wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    for n in 1..=ORDERS {
        let answer = leader
            .group
            .execute(common::new_order(n))
            .await
            .unwrap()
            .value;
        assert!(matches!(
            answer,
            Applied::Order(OrderOutcome::Created { .. })
        ));
    }
    // A snapshot, and the log purged behind it: a new member can only get the
    // region from the snapshot.
    let applied = raft.metrics().borrow().last_applied.unwrap();
    raft.trigger().snapshot().await.unwrap();
    // An entry may still be applied before the snapshot is taken: the test
    // needs one that covers every order, and uses the one it got.
    let last = raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= applied.index),
            "snapshot of every order",
        )
        .await
        .unwrap()
        .snapshot
        .unwrap();
    raft.trigger().purge_log(last.index).await.unwrap();
    raft.wait(Some(WAIT))
        .purged(Some(last), "log purged up to the snapshot")
        .await
        .unwrap();

    let learner = Voter::start(
        2,
        listeners.next().unwrap(),
        infos[1].clone(),
        Bootstrap::Joiner,
    )
    .await;
    raft.add_learner(2, infos[1].clone(), true)
        .await
        .expect("add the learner");
    learner
        .group
        .raft()
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last.index), "the learner has the snapshot")
        .await
        .unwrap();
    let snapshot = learner.group.raft().metrics().borrow().snapshot;
    assert_eq!(snapshot, Some(last), "installed from the leader's snapshot");
    assert_eq!(
        learner.group.state_machine().entries_for_tests(),
        leader.group.state_machine().entries_for_tests()
    );

    // What a region-survival answer waits for: the learner holds each new
    // entry on the leader's word; a member that does not exist never does,
    // and with two replicas a majority is both.
    let written = leader
        .group
        .execute(common::new_order(ORDERS + 1))
        .await
        .unwrap();
    assert!(leader.group.wait_matched(&[2], written.index, WAIT).await);
    let short = Duration::from_millis(300);
    assert!(!leader.group.wait_matched(&[3], written.index, short).await);
    assert!(
        !leader
            .group
            .wait_matched(&[2, 3], written.index, short)
            .await
    );
    assert!(!leader.group.wait_matched(&[], written.index, short).await);
    // A follower knows nothing of what others hold.
    assert!(!learner.group.wait_matched(&[2], 1, short).await);
    learner.kill().await;
    let unheld = leader
        .group
        .execute(common::new_order(ORDERS + 2))
        .await
        .unwrap();
    assert!(unheld.index > written.index);
    assert!(!leader.group.wait_matched(&[2], unheld.index, short).await);
    leader.kill().await;
}

/// A learner that joins late and cannot take more than 4 entries per
/// AppendEntries within the RPC timeout (`SlowAppends`) still receives the
/// whole log, from the log: after a timeout the leader's connection halves
/// the entries it sends (down to what the learner takes) and raises them one
/// at a time. Before, openraft sent the same 16 entries again after every
/// timeout and the learner stayed at index 0, the leader retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_learner_too_slow_for_large_appends_still_receives_the_log() {
    let mut listeners = Vec::new();
    let mut infos = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        infos.push(NodeInfo::new("eu", "-", addr));
        listeners.push(listener);
    }
    let mut listeners = listeners.into_iter();
    let voters = Bootstrap::Voters(BTreeMap::from([(1, infos[0].clone())]));
    let leader = Voter::start(1, listeners.next().unwrap(), infos[0].clone(), voters).await;
    let raft = leader.group.raft().clone();
    raft.wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    for n in 1..=ORDERS {
        let answer = leader
            .group
            .execute(common::new_order(n))
            .await
            .unwrap()
            .value;
        assert!(matches!(
            answer,
            Applied::Order(OrderOutcome::Created { .. })
        ));
    }
    let last = raft.metrics().borrow().last_applied.unwrap();
    assert!(last.index > ORDERS, "one entry per order at least: {last}");
    let slow = SlowAppends {
        entries_max: 4,
        refused: Arc::new(AtomicU64::new(0)),
    };
    let learner = Voter::start_with(
        2,
        listeners.next().unwrap(),
        infos[1].clone(),
        Bootstrap::Joiner,
        Some(slow.clone()),
        None,
    )
    .await;
    raft.add_learner(2, infos[1].clone(), false)
        .await
        .expect("add the learner");
    // Each timeout halves the appends and only full ones raise them again, so
    // the leader does not keep sending what the learner cannot take: a few
    // refusals per dozen entries, where the old code sent the same 16 entries
    // again and again. (The deadline only bounds a hang.)
    let deadline = tokio::time::Instant::now() + 3 * WAIT;
    loop {
        let refused = slow.refused.load(Ordering::SeqCst);
        assert!(
            refused <= ORDERS / 4,
            "{refused} appends over the learner's 4 entries"
        );
        let applied = learner.group.raft().metrics().borrow().last_applied;
        if applied.is_some_and(|a| a.index >= last.index) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the learner is at {applied:?} of {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        learner.group.raft().metrics().borrow().snapshot,
        None,
        "from the log, not a snapshot"
    );
    assert_eq!(
        learner.group.state_machine().entries_for_tests(),
        leader.group.state_machine().entries_for_tests()
    );
    learner.kill().await;
    leader.kill().await;
}

/// With its AppendEntries bounded to one byte, the leader sends a learner
/// that joins late one entry per request (the longest prefix within the
/// bound, at least one entry) and reports each as a partial success: the
/// learner still receives the whole log, entry by entry, and holds the same
/// region. Had a cut request been reported as a full success, the leader
/// would take the learner for caught up and send it nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_bound_on_appends_sends_a_learner_the_log_in_prefixes() {
    let mut listeners = Vec::new();
    let mut infos = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        infos.push(NodeInfo::new("eu", "-", addr));
        listeners.push(listener);
    }
    let mut listeners = listeners.into_iter();
    let voters = Bootstrap::Voters(BTreeMap::from([(1, infos[0].clone())]));
    let one_byte = Some(1);
    let leader = Voter::start_with(
        1,
        listeners.next().unwrap(),
        infos[0].clone(),
        voters,
        None,
        one_byte,
    )
    .await;
    let raft = leader.group.raft().clone();
    raft.wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    for n in 1..=ORDERS {
        let answer = leader
            .group
            .execute(common::new_order(n))
            .await
            .unwrap()
            .value;
        assert!(matches!(
            answer,
            Applied::Order(OrderOutcome::Created { .. })
        ));
    }
    let last = raft.metrics().borrow().last_applied.unwrap();
    assert!(last.index > ORDERS, "one entry per order at least: {last}");
    let learner = Voter::start(
        2,
        listeners.next().unwrap(),
        infos[1].clone(),
        Bootstrap::Joiner,
    )
    .await;
    raft.add_learner(2, infos[1].clone(), true)
        .await
        .expect("add the learner");
    learner
        .group
        .raft()
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last.index), "the learner has the whole log")
        .await
        .unwrap();
    assert_eq!(
        learner.group.raft().metrics().borrow().snapshot,
        None,
        "from the log, not a snapshot"
    );
    assert_eq!(
        learner.group.state_machine().entries_for_tests(),
        leader.group.state_machine().entries_for_tests()
    );
    learner.kill().await;
    leader.kill().await;
}
