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
//! timeout instead of sending the same ones again. And a standby learner a
//! round trip away gets each new entry in one round trip: the leader's
//! heartbeats to it do not hold its stream. A command larger than a member's
//! body limit is refused before the log, and the largest one the log takes
//! crosses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keyhold_registry::limits::RPC_BODY_BYTES_MAX;
use keyhold_store::limits::{
    ENTRY_COMMANDS_BYTES_MAX, REGION_APPEND_BYTES_PER_SECOND_MIN, REGION_LEARNER_RPC_TIMEOUT_MS,
    REGION_RPC_TIMEOUT_MS,
};
use openraft::raft::AppendEntriesRequest;

use keyhold_core::scope::Namespace;
use keyhold_core::{Outcome, OwnerToken, StoredResponse, UnixMillis};
use keyhold_registry::limits::{INTER_REGION_RTT_MS_MAX, LOG_FSYNC_MS_MAX};
use keyhold_registry::{
    group_router, AppendTimeouts, HttpNetwork, NodeCredentials, NodeId, NodeInfo,
};
use keyhold_store::raft::{Bootstrap, Member, RegionConfig, RegionGroup};
use keyhold_store::{Applied, Command, Error, OrderOutcome};
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
        Voter::start_with(id, listener, info, bootstrap, Setup::default()).await
    }

    /// `start` as `setup` says.
    async fn start_with(
        id: NodeId,
        listener: tokio::net::TcpListener,
        info: NodeInfo,
        bootstrap: Bootstrap,
        setup: Setup,
    ) -> Voter {
        let Setup {
            slow,
            append_bytes_max,
            delay,
            detach_beyond,
            append_timeouts,
        } = setup;
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
        if let Some(home) = detach_beyond {
            network = network.with_learner_heartbeats_detached(home);
        }
        if append_timeouts {
            network = network.with_append_timeouts(AppendTimeouts {
                learner: Duration::from_millis(REGION_LEARNER_RPC_TIMEOUT_MS),
                bytes_per_second: REGION_APPEND_BYTES_PER_SECOND_MIN,
            });
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
        if let Some(delay) = delay {
            router = router.layer(axum::middleware::from_fn(move |request, next| {
                delay.clone().serve(request, next)
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

    /// Starts member `id` as `setup` says and adds it to this leader's group
    /// as a learner; with `Catchup::Awaited`, returns once it caught up.
    async fn join_learner(
        &self,
        id: NodeId,
        listener: tokio::net::TcpListener,
        info: &NodeInfo,
        setup: Setup,
        catchup: Catchup,
    ) -> Voter {
        let learner = Voter::start_with(id, listener, info.clone(), Bootstrap::Joiner, setup).await;
        let blocking = catchup == Catchup::Awaited;
        self.group
            .raft()
            .add_learner(id, info.clone(), blocking)
            .await
            .expect("add the learner");
        learner
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

/// Whether adding a learner waits for it to catch up.
#[derive(Debug, PartialEq, Eq)]
enum Catchup {
    Awaited,
    Later,
}

/// How a test member differs from a plain one.
#[derive(Default)]
struct Setup {
    /// Its Raft listener behind `SlowAppends`: a member that answers an
    /// AppendEntries of more entries than it can take only after the RPC
    /// timeout.
    slow: Option<SlowAppends>,
    /// Each AppendEntries it sends bounded to this many bytes.
    append_bytes_max: Option<usize>,
    /// Its Raft listener one `DelayedAppends` round trip away.
    delay: Option<DelayedAppends>,
    /// The region of its group's voters, when its heartbeats to members of
    /// other regions are detached (`with_learner_heartbeats_detached`).
    detach_beyond: Option<&'static str>,
    /// Its AppendEntries may run past openraft's timeout as a node's do.
    append_timeouts: bool,
}

/// A member a round trip away: every AppendEntries waits `round_trip` before
/// it is handled. Counts those that carried entries and those that did not,
/// and wakes `empty_arrived`'s waiters when one without entries arrives.
#[derive(Clone)]
struct DelayedAppends {
    round_trip: Duration,
    with_entries: Arc<AtomicU64>,
    empty: Arc<AtomicU64>,
    empty_arrived: Arc<tokio::sync::Notify>,
}

impl DelayedAppends {
    async fn serve(self, request: HttpRequest<Body>, next: Next) -> Response {
        if !request.uri().path().ends_with("/append") {
            return next.run(request).await;
        }
        let (parts, body) = request.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let append: AppendEntriesRequest<RegionConfig> =
            keyhold_raftlog::codec::decode(&bytes).expect("an AppendEntries");
        let count = match append.entries.is_empty() {
            true => &self.empty,
            false => &self.with_entries,
        };
        count.fetch_add(1, Ordering::SeqCst);
        if append.entries.is_empty() {
            self.empty_arrived.notify_waiters();
        }
        tokio::time::sleep(self.round_trip).await;
        next.run(HttpRequest::from_parts(parts, Body::from(bytes)))
            .await
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
    create_orders(&leader).await;
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
    let last = create_orders(&leader).await;
    let slow = SlowAppends {
        entries_max: 4,
        refused: Arc::new(AtomicU64::new(0)),
    };
    let setup = Setup {
        slow: Some(slow.clone()),
        ..Setup::default()
    };
    let learner = leader
        .join_learner(
            2,
            listeners.next().unwrap(),
            &infos[1],
            setup,
            Catchup::Later,
        )
        .await;
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
        if applied.is_some_and(|a| a.index >= last) {
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
        Setup {
            append_bytes_max: one_byte,
            ..Setup::default()
        },
    )
    .await;
    let raft = leader.group.raft().clone();
    raft.wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    let last = create_orders(&leader).await;
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
        .applied_index_at_least(Some(last), "the learner has the whole log")
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

/// A standby learner a round trip away (`DelayedAppends`, 200 ms): each
/// client write reaches it in one round trip, as a region-survival write
/// needs, although a relay-like upkeep command follows every write 5 ms
/// later, or a heartbeat just went before it. openraft 0.9 sends a member one
/// AppendEntries at a time, so before, the upkeep's entry went out alone as
/// the write was answered and held the next write a round trip, and so did
/// a heartbeat or commit-index update. Now upkeep rides with the next client command
/// (`ride_along` in the store's writer), and empty AppendEntries to the
/// learner are answered at once and delivered in the background
/// (`with_learner_heartbeats_detached`). The learner still learns the commit
/// index and applies every entry, upkeep included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_learners_entries_do_not_wait_behind_its_heartbeats() {
    let mut listeners = Vec::new();
    let mut infos = Vec::new();
    for region in ["eu", "us"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        infos.push(NodeInfo::new(region, "-", addr));
        listeners.push(listener);
    }
    let mut listeners = listeners.into_iter();
    let voters = Bootstrap::Voters(BTreeMap::from([(1, infos[0].clone())]));
    let leader = Voter::start_with(
        1,
        listeners.next().unwrap(),
        infos[0].clone(),
        voters,
        Setup {
            detach_beyond: Some("eu"),
            ..Setup::default()
        },
    )
    .await;
    let raft = leader.group.raft().clone();
    raft.wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    let delay = DelayedAppends {
        round_trip: Duration::from_millis(200),
        with_entries: Arc::new(AtomicU64::new(0)),
        empty: Arc::new(AtomicU64::new(0)),
        empty_arrived: Arc::new(tokio::sync::Notify::new()),
    };
    let setup = Setup {
        delay: Some(delay.clone()),
        ..Setup::default()
    };
    let learner = leader
        .join_learner(
            2,
            listeners.next().unwrap(),
            &infos[1],
            setup,
            Catchup::Awaited,
        )
        .await;

    // Closed loop, each write followed by upkeep.
    let mut took = Vec::new();
    let mut upkeep = Vec::new();
    for n in 1..=7 {
        let started = tokio::time::Instant::now();
        let written = leader.group.execute(common::new_order(n)).await.unwrap();
        let group = leader.group.clone();
        upkeep.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let sweep = Command::Sweep {
                now: UnixMillis(n),
                entries_max: 1,
                consumers: Vec::new(),
            };
            group.execute(sweep).await
        }));
        assert!(leader.group.wait_matched(&[2], written.index, WAIT).await);
        took.push(started.elapsed());
    }
    for sweep in upkeep {
        sweep.await.unwrap().expect("the upkeep command is applied");
    }
    // One round trip and the two nodes' work (debug build, busy machine)
    // against two round trips or more: the bound sits between them. Before,
    // every other write took two.
    let round_trips_15 = delay.round_trip * 3 / 2;
    let slow = took.iter().filter(|t| **t >= round_trips_15).count();
    assert!(
        slow <= 1,
        "{slow} of 7 writes after upkeep took 1.5 round trips or more: {took:?}"
    );

    // After a pause, each write right after a heartbeat reached the learner
    // (the leader's ticker sends them every 100 ms while nothing else goes).
    let mut took = Vec::new();
    for n in 8..=12 {
        tokio::time::sleep(delay.round_trip).await;
        let heartbeat = delay.empty_arrived.notified();
        tokio::time::timeout(WAIT, heartbeat)
            .await
            .expect("a heartbeat reaches the learner");
        let started = tokio::time::Instant::now();
        let written = leader.group.execute(common::new_order(n)).await.unwrap();
        assert!(leader.group.wait_matched(&[2], written.index, WAIT).await);
        took.push(started.elapsed());
    }
    let slow = took.iter().filter(|t| **t >= round_trips_15).count();
    assert!(
        slow <= 1,
        "{slow} of 5 writes after a heartbeat took 1.5 round trips or more: {took:?}"
    );
    assert!(delay.with_entries.load(Ordering::SeqCst) >= 12);
    assert!(
        delay.empty.load(Ordering::SeqCst) > 0,
        "the heartbeats still reach the learner"
    );
    // The commit index reached it in the background: it applies every write.
    let last = raft.metrics().borrow().last_applied;
    let last = last.expect("the leader applied its writes").index;
    learner_holds_the_log(leader, learner, last).await;
}

/// A region group's only voter (id 1, region `eu`), its network set up as a
/// node's (byte bound, append timeouts, heartbeats to other regions
/// detached), once it leads.
async fn lone_region_leader(listener: tokio::net::TcpListener) -> Voter {
    let info = NodeInfo::new("eu", "-", listener.local_addr().unwrap().to_string());
    let voters = Bootstrap::Voters(BTreeMap::from([(1, info.clone())]));
    let setup = Setup {
        detach_beyond: Some("eu"),
        append_timeouts: true,
        append_bytes_max: Some(keyhold_store::limits::REGION_APPEND_BYTES_MAX),
        ..Setup::default()
    };
    let leader = Voter::start_with(1, listener, info, voters, setup).await;
    leader
        .group
        .raft()
        .wait(Some(WAIT))
        .current_leader(1, "the only voter leads")
        .await
        .unwrap();
    leader
}

/// Asserts that `learner` (member 2) matched and applied `leader`'s log up
/// to `last` and holds what the leader holds; then stops both.
async fn learner_holds_the_log(leader: Voter, learner: Voter, last: u64) {
    assert!(
        leader.group.wait_matched(&[2], last, WAIT).await,
        "the learner matched {:?} of {last}",
        leader.group.lag_of(&[2])
    );
    learner
        .group
        .raft()
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last), "the learner applies")
        .await
        .expect("the learner applies every entry");
    assert_eq!(
        learner.group.state_machine().entries_for_tests(),
        leader.group.state_machine().entries_for_tests()
    );
    learner.kill().await;
    leader.kill().await;
}

/// A standby learner across the slowest link the timing is sized for: the
/// proxy delays each byte 250 ms each way, a round trip of
/// `INTER_REGION_RTT_MS_MAX` plus a `LOG_FSYNC_MS_MAX` fsync on the learner,
/// more than the region group's `REGION_RPC_TIMEOUT_MS`. The learner's matched
/// index still reaches the leader's last entry, and a write made after it
/// joined reaches it too: its AppendEntries run past openraft's timeout
/// (`REGION_LEARNER_RPC_TIMEOUT_MS`) and openraft's next attempt takes their
/// answer. Before, openraft dropped every AppendEntries with entries at its
/// timeout, the cap fell to one entry, which did not cross in time either,
/// and the learner never advanced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_learner_across_a_slow_link_advances() {
    let one_way = Duration::from_millis((INTER_REGION_RTT_MS_MAX + LOG_FSYNC_MS_MAX) / 2);
    assert!(2 * one_way > Duration::from_millis(REGION_RPC_TIMEOUT_MS));
    let leader =
        lone_region_leader(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()).await;
    let learner_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = keyhold_netem::Proxy::start(
        proxy_listener,
        learner_listener.local_addr().unwrap(),
        one_way,
    )
    .unwrap();
    let learner_info = NodeInfo::new("us", "-", proxy.addr().to_string());
    let last = create_orders(&leader).await;
    let learner = leader
        .join_learner(
            2,
            learner_listener,
            &learner_info,
            Setup::default(),
            Catchup::Later,
        )
        .await;
    assert!(
        leader.group.wait_matched(&[2], last, WAIT).await,
        "the learner matched {:?} of {last}",
        leader.group.lag_of(&[2])
    );
    let written = leader
        .group
        .execute(common::new_order(ORDERS + 1))
        .await
        .unwrap();
    learner_holds_the_log(leader, learner, written.index).await;
}

/// A claim's completion of `bytes` bytes in all, as encoded (its stored
/// response takes them): a command of any size. There is no such claim, so
/// it changes nothing.
fn completion_of_bytes(bytes: usize) -> Command {
    let completion = |body| Command::Complete {
        scope: common::scope(Namespace::Claims, "large-response"),
        token: OwnerToken {
            generation: 1,
            nonce: 1,
        },
        outcome: Outcome::Succeeded,
        response: Some(StoredResponse {
            status: 200,
            headers: Vec::new(),
            body: vec![b'x'; body],
        }),
        resource_id: None,
        now: UnixMillis(1),
        response_ttl_ms: 3_600_000,
    };
    let mut body = bytes - 1024;
    loop {
        let encoded = keyhold_raftlog::codec::encoded_len(&completion(body)).unwrap();
        match encoded.cmp(&bytes) {
            std::cmp::Ordering::Equal => return completion(body),
            std::cmp::Ordering::Less => body += bytes - encoded,
            std::cmp::Ordering::Greater => body -= 1,
        }
    }
}

/// A region's only voter and its standby learner (a copy in another region,
/// as a node streams it): a command larger than the body a member accepts is
/// refused at once (`CommandTooLarge`), and the stream goes on: the largest
/// command the log takes crosses to the learner, and so do the orders after
/// it (its AppendEntries gets time for its bytes,
/// `REGION_APPEND_BYTES_PER_SECOND_MIN`: a debug build took longer than
/// `REGION_RPC_TIMEOUT_MS` for it). Before, the writer appended any command:
/// the voter committed it alone, the learner refused its AppendEntries (413)
/// again and again, and never received another entry (review d44e5cf, N3: the
/// standby wedged). A learner, since voters would campaign while one entry
/// crosses for longer than `REGION_CAMPAIGN_AFTER_LEADER_MS`, as 8 MiB does in
/// a debug build.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_larger_than_an_entry_is_refused_and_the_standby_goes_on() {
    let leader =
        lone_region_leader(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()).await;
    let learner_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let learner_addr = learner_listener.local_addr().unwrap().to_string();
    let learner_info = NodeInfo::new("us", "-", learner_addr);
    let learner = leader
        .join_learner(
            2,
            learner_listener,
            &learner_info,
            Setup::default(),
            Catchup::Awaited,
        )
        .await;
    let group = leader.group.clone();

    let larger = completion_of_bytes(RPC_BODY_BYTES_MAX + 1024 * 1024);
    match group.execute(larger).await {
        Err(Error::CommandTooLarge { bytes, max }) => {
            assert_eq!(max, ENTRY_COMMANDS_BYTES_MAX);
            assert!(bytes > RPC_BODY_BYTES_MAX, "{bytes}");
        }
        other => panic!("a command above the body limit was not refused: {other:?}"),
    }
    let largest = completion_of_bytes(ENTRY_COMMANDS_BYTES_MAX);
    let swept = tokio::time::timeout(WAIT, group.execute(largest))
        .await
        .expect("the largest command commits")
        .expect("the largest command the log takes");
    assert!(matches!(swept.value, Applied::Complete(_)), "{swept:?}");
    let last = create_orders(&leader).await;
    learner_holds_the_log(leader, learner, last).await;
}

/// Creates `ORDERS` orders on `leader`, one after another, each in an entry of
/// its own; returns the index of the last. The index comes from the answer,
/// not from the metrics: those are published after the apply and may still
/// show an earlier entry.
async fn create_orders(leader: &Voter) -> u64 {
    let mut last = 0;
    for n in 1..=ORDERS {
        let logged = leader.group.execute(common::new_order(n)).await.unwrap();
        assert!(matches!(
            logged.value,
            Applied::Order(OrderOutcome::Created { .. })
        ));
        last = logged.index;
    }
    assert!(last > ORDERS, "one entry per order at least: {last}");
    last
}
