//! A new member catches up by snapshot through openraft itself: a leader writes
//! batches of orders, builds a snapshot, purges its log behind it, and then adds an
//! empty node as a learner; openraft must send the snapshot in chunks (small chunks
//! here, so the receiving file is written at many offsets), the learner installs it,
//! holds the leader's region exactly, and goes on replicating from the log. The
//! network is an in-process router calling the target `Raft` directly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyhold_raftlog::{NodeId, NodeInfo};
use keyhold_store::raft::{self, CommandBatch, RegionConfig, RegionRaft, RegionStateMachine};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, ServerState};

use crate::helpers::new_order;

const WAIT: Duration = Duration::from_secs(30);
const ENTRIES: u64 = 60;
const ORDERS_PER_ENTRY: u64 = 4;

type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>;

/// The members of the test cluster, by id.
#[derive(Clone, Default)]
struct Router {
    members: Arc<Mutex<BTreeMap<NodeId, RegionRaft>>>,
}

impl Router {
    fn get(&self, target: NodeId) -> Option<RegionRaft> {
        let members = self.members.lock().expect("router lock");
        members.get(&target).cloned()
    }
}

fn not_started<E: std::error::Error>() -> RPCError<NodeId, NodeInfo, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error("not started")))
}

struct Connection {
    router: Router,
    target: NodeId,
}

impl RaftNetworkFactory<RegionConfig> for Router {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &NodeInfo) -> Connection {
        Connection {
            router: self.clone(),
            target,
        }
    }
}

impl RaftNetwork<RegionConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<RegionConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let Some(raft) = self.router.get(self.target) else {
            return Err(not_started());
        };
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<RegionConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        let Some(raft) = self.router.get(self.target) else {
            return Err(not_started());
        };
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let Some(raft) = self.router.get(self.target) else {
            return Err(not_started());
        };
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn info(id: NodeId) -> NodeInfo {
    NodeInfo::new("eu", format!("api-{id}"), format!("raft-{id}"))
}

async fn start(
    router: &Router,
    id: NodeId,
    dir: &std::path::Path,
) -> (RegionRaft, RegionStateMachine) {
    let config = openraft::Config {
        cluster_name: "region-eu".into(),
        // Only explicit snapshots, every log entry purged behind them, and small
        // chunks so that the snapshot travels in many pieces.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        snapshot_max_chunk_size: 4096,
        install_snapshot_timeout: 5_000,
        ..Default::default()
    }
    .validate()
    .expect("config");
    let (log, state_machine) = raft::open(dir, "region-eu").expect("open");
    let raft = RegionRaft::new(
        id,
        Arc::new(config),
        router.clone(),
        log,
        state_machine.clone(),
    )
    .await
    .expect("raft");
    router
        .members
        .lock()
        .expect("router lock")
        .insert(id, raft.clone());
    (raft, state_machine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_learner_catches_up_by_snapshot() {
    let router = Router::default();
    let (leader_dir, learner_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (leader, leader_sm) = start(&router, 1, leader_dir.path()).await;
    leader
        .initialize(BTreeMap::from([(1, info(1))]))
        .await
        .expect("initialize");
    leader
        .wait(Some(WAIT))
        .state(ServerState::Leader, "leads")
        .await
        .expect("leadership");
    let mut last = 0;
    for entry in 0..ENTRIES {
        let first = entry * ORDERS_PER_ENTRY + 1;
        let commands = (first..first + ORDERS_PER_ENTRY).map(new_order).collect();
        let written = leader
            .client_write(CommandBatch { commands })
            .await
            .expect("write");
        last = written.log_id.index;
    }
    // The metrics channel may lag the last write's answer: take the index from
    // the answer and wait until the metrics show it applied, so the snapshot
    // below covers exactly that index.
    leader
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last), "last write applied")
        .await
        .expect("last write applied");
    leader.trigger().snapshot().await.expect("snapshot");
    leader
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.map(|s| s.index) == Some(last),
            "snapshot built",
        )
        .await
        .expect("snapshot built");
    leader.trigger().purge_log(last).await.expect("purge");
    leader
        .wait(Some(WAIT))
        .metrics(|m| m.purged.map(|p| p.index) == Some(last), "log purged")
        .await
        .expect("log purged");

    let (learner, learner_sm) = start(&router, 2, learner_dir.path()).await;
    leader
        .add_learner(2, info(2), true)
        .await
        .expect("add learner");
    learner
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.map(|s| s.index) >= Some(last),
            "snapshot installed",
        )
        .await
        .expect("snapshot installed");
    learner
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last + 1), "caught up")
        .await
        .expect("caught up");
    assert_eq!(
        learner_sm.entries_for_tests(),
        leader_sm.entries_for_tests()
    );

    // Replication goes on from the log after the snapshot.
    let more = CommandBatch {
        commands: vec![new_order(100_000)],
    };
    let written = leader.client_write(more).await.expect("write after");
    let index = written.log_id.index;
    learner
        .wait(Some(WAIT))
        .applied_index_at_least(Some(index), "replicated")
        .await
        .expect("replicated");
    assert_eq!(
        learner_sm.entries_for_tests(),
        leader_sm.entries_for_tests()
    );

    learner.shutdown().await.expect("shutdown learner");
    leader.shutdown().await.expect("shutdown leader");
}
