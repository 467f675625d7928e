//! keyhold's registry: the Raft-replicated table that gives every tenant a home region.
//! It owns regions, member nodes, tenants (home region, epoch, token hash, limits, move
//! state) and tenant-move operations, replicated with openraft over HTTP and stored in
//! sled. It knows nothing of orders or idempotency records.
//!
//! A `Registry` is one replica. Writes (`Registry::write`) go through Raft and may be
//! sent from any member: a follower forwards them to the leader. Reads
//! (`Registry::tenant`, ...) come from the local replica, which may lag the leader; use
//! `Registry::wait_applied` with the `log_index` of a `Written` to read your own write.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use keyhold_registry::{raft_router, NodeCredentials, NodeInfo, Registry, RegistryConfig};
//! // Bind the Raft listener first so that its address can go into the NodeInfo.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7101").await?;
//! let raft_addr = listener.local_addr()?.to_string();
//! let info = NodeInfo::new("eu", "127.0.0.1:7001", raft_addr);
//! // Every member shares the node credential; the first listed is sent.
//! let credentials = NodeCredentials::parse(&std::env::var("KEYHOLD_NODE_CREDENTIAL")?)?;
//! let config = RegistryConfig::new(1, info.clone(), "/var/lib/keyhold/registry", credentials);
//! let registry = Registry::start(config).await?;
//! let router = raft_router(registry.clone());
//! tokio::spawn(async move { axum::serve(listener, router).await });
//! registry.initialize([(1, info)].into()).await?;
//! # Ok(()) }
//! ```

mod codec;
mod config;
pub mod credential;
mod detached;
mod error;
mod failover;
pub mod heard;
pub mod limits;
pub mod network;
pub mod standbys;
pub mod state;
pub mod store;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::ClientWriteError as OpenraftClientWriteError;
use openraft::error::InitializeError as OpenraftInitializeError;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use crate::config::{RegistryConfig, GROUP};
pub use crate::credential::{NodeCredentials, NODE_CREDENTIAL_HEADER};
pub use crate::error::Error;
pub use crate::network::{
    group_router, raft_router, replaceable_group_router, AppendTimeouts, HttpNetwork, NodeGroup,
    RaftSource,
};
pub use crate::state::{
    DriverLease, FailoverResult, LostEstimate, Operation, OperationKind, OperationState,
    RegionRecord, RegistryState, Rejection, Request, Response, RetiredToken, Survival,
    TenantRecord, TenantState,
};
pub use crate::types::{NodeId, NodeInfo, RaftMetrics};
pub use keyhold_raftlog::{Contacts, LongerLogs};

use crate::limits::{WRITE_ATTEMPTS_MAX, WRITE_NO_LEADER_WAIT_MS};
use crate::network::{exchange, rpc_url, Exchange};
use crate::store::StateMachineStore;
use crate::types::{ClientWriteError, Raft, RaftError};

/// A committed write: the state machine's answer and the log index it was applied at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Written {
    /// Index of the entry in the registry log. `Registry::wait_applied(log_index, ..)`
    /// makes the write visible to local reads on any replica.
    pub log_index: u64,
    /// The state machine's answer; `Response::Rejected` means nothing changed.
    pub response: Response,
}

/// Reply of `POST /raft/registry/write`.
type WriteReply = Result<Written, RaftError<ClientWriteError>>;

/// One replica of the registry group. Cheap to clone; all clones share the replica.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    config: RegistryConfig,
    raft: Raft,
    state_machine: StateMachineStore,
    /// The one HTTP client of this replica (Raft RPCs and forwarded writes).
    client: reqwest::Client,
    /// The task sending the leader's heartbeats: stopped by `shutdown`, or when the
    /// last handle goes, since its clone of `raft` would otherwise keep the replica's
    /// Raft core running after nobody can reach it.
    heartbeats: tokio::task::AbortHandle,
    /// When this replica last handled each leader term's AppendEntries.
    heard: heard::Heard,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("node_id", &self.inner.config.node_id)
            .field("node", &self.inner.config.node)
            .finish()
    }
}

impl Registry {
    /// Opens the replica's storage in `config.data_dir` and starts its Raft instance.
    ///
    /// The node's Raft listener must serve `raft_router` at `config.node.raft_addr`
    /// (bind it before starting, so the address is known). A fresh replica does nothing
    /// until it is made a member: by `initialize` on one node, or by the leader's
    /// `add_learner`. A restarted replica rejoins with its persisted state.
    pub async fn start(config: RegistryConfig) -> Result<Self, Error> {
        Self::start_with_client(config, None).await
    }

    /// Like `start`, sharing `client` (for example the server's) instead of building one.
    /// Proxies configured on `client` also apply to Raft traffic.
    pub async fn start_with_client(
        config: RegistryConfig,
        client: Option<reqwest::Client>,
    ) -> Result<Self, Error> {
        // Before the Raft instance exists: nothing is handled before it.
        let started = std::time::Instant::now();
        let raft_config = Arc::new(config.raft_config()?);
        let client = match client {
            Some(client) => client,
            // Raft traffic between members never goes through an HTTP proxy.
            None => reqwest::Client::builder()
                .no_proxy()
                .build()
                .map_err(|e| Error::Config(format!("http client: {e}")))?,
        };
        let data_dir = config.data_dir.clone();
        let (log_store, state_machine) =
            tokio::task::spawn_blocking(move || store::open(&data_dir))
                .await
                .map_err(|e| Error::Storage(format!("open task: {e}")))??;
        let network = HttpNetwork::new(
            client.clone(),
            config::GROUP,
            config.node_id,
            config.credentials.clone(),
        );
        let raft = Raft::new(
            config.node_id,
            raft_config,
            network,
            log_store,
            state_machine.clone(),
        )
        .await
        .map_err(|e| Error::Fatal(e.to_string()))?;
        let heartbeats =
            tokio::spawn(heartbeats(raft.clone(), config.heartbeat_interval())).abort_handle();
        tracing::debug!(node_id = config.node_id, node = %config.node, "registry replica started");
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                raft,
                state_machine,
                client,
                heartbeats,
                heard: heard::Heard::new(started),
            }),
        })
    }

    /// When this replica last handled each leader term's AppendEntries
    /// (served by `raft_router`).
    pub fn heard(&self) -> &heard::Heard {
        &self.inner.heard
    }

    /// This replica's node id.
    pub fn id(&self) -> NodeId {
        self.inner.config.node_id
    }

    /// The node credentials this replica sends and accepts.
    pub fn credentials(&self) -> &NodeCredentials {
        &self.inner.config.credentials
    }

    /// This replica's region and addresses.
    pub fn node(&self) -> &NodeInfo {
        &self.inner.config.node
    }

    /// The underlying openraft instance, for what this API does not cover (for example
    /// `ensure_linearizable` before a read that must not be stale).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Creates the cluster with `members` as its voters. Call it on one node, once all
    /// members are started and serving `raft_router`. Idempotent: a node that already
    /// has a membership (initialized before, or joined by replication) answers `Ok`.
    pub async fn initialize(&self, members: BTreeMap<NodeId, NodeInfo>) -> Result<(), Error> {
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(OpenraftInitializeError::NotAllowed(_))) => Ok(()),
            Err(RaftError::APIError(e)) => Err(Error::Initialize(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(Error::Fatal(e.to_string())),
        }
    }

    /// Adds `id` as a learner (it receives the log but does not vote) and waits until it
    /// has caught up. Must run on the leader: elsewhere it fails with
    /// `Error::Membership` naming the leader. Adding an existing member updates its info.
    pub async fn add_learner(&self, id: NodeId, info: NodeInfo) -> Result<(), Error> {
        let result = self.inner.raft.add_learner(id, info, true).await;
        result.map(|_| ()).map_err(membership_error)
    }

    /// Makes `voters` the voting members. Members not in `voters` are removed from the
    /// cluster entirely (not kept as learners); every id in `voters` must already be a
    /// learner or voter. Must run on the leader. Remove a node this way before wiping its
    /// data: a member that comes back empty makes the leader panic.
    pub async fn change_membership(&self, voters: BTreeSet<NodeId>) -> Result<(), Error> {
        let result = self.inner.raft.change_membership(voters, false).await;
        result.map(|_| ()).map_err(membership_error)
    }

    /// Replicates `request` and returns the state machine's answer once the entry is
    /// committed and applied on the leader.
    ///
    /// Any member may call it: a follower forwards to the leader's
    /// `/raft/registry/write`. While no leader is known (an election is running) or the
    /// leader does not answer, it retries up to `limits::WRITE_ATTEMPTS_MAX` times, then
    /// fails with `Error::NoLeader`; the whole call is bounded by
    /// `RegistryConfig::write_timeout_ms` (`Error::WriteTimeout`). A retried or timed-out
    /// request may still be applied, even twice; every `Request` is defined so that a
    /// second application answers like the first, so retrying after an error is safe.
    pub async fn write(&self, request: Request) -> Result<Written, Error> {
        let timeout = self.inner.config.write_timeout();
        match tokio::time::timeout(timeout, self.write_with_retries(request)).await {
            Ok(result) => result,
            Err(_) => Err(Error::WriteTimeout {
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    async fn write_with_retries(&self, request: Request) -> Result<Written, Error> {
        let mut last_error = String::from("none");
        for attempt in 1..=WRITE_ATTEMPTS_MAX {
            let leader_seen = self.leader();
            let hint = match self.write_here(request.clone()).await {
                Ok(written) => return Ok(written),
                Err(RaftError::Fatal(e)) => return Err(Error::Fatal(e.to_string())),
                Err(RaftError::APIError(OpenraftClientWriteError::ForwardToLeader(hint))) => hint,
                Err(RaftError::APIError(e)) => return Err(Error::Membership(e.to_string())),
            };
            match (hint.leader_id, hint.leader_node) {
                (Some(leader), Some(node)) if leader != self.id() => {
                    match self.forward(leader, &node, &request).await {
                        Ok(Some(written)) => return Ok(written),
                        Ok(None) => last_error = format!("node {leader} is no longer the leader"),
                        Err(Retry(reason)) => last_error = reason,
                    }
                }
                _ => last_error = "no leader known".to_string(),
            }
            tracing::debug!(attempt, %request, %last_error, "registry write retry");
            self.wait_for_new_leader(leader_seen).await;
        }
        Err(Error::NoLeader {
            attempts: WRITE_ATTEMPTS_MAX,
            last_error,
        })
    }

    /// `client_write` on this node only (no forwarding); served at `/raft/registry/write`.
    pub(crate) async fn write_here(&self, mut request: Request) -> WriteReply {
        // Only the leader's client_write succeeds, so this is the leader's clock.
        request.stamp_leader_time(unix_now_ms());
        let response = self.inner.raft.client_write(request).await?;
        Ok(Written {
            log_index: response.log_id.index,
            response: response.data,
        })
    }

    /// Sends `request` to `leader`. `Ok(None)`: it is not the leader any more.
    async fn forward(
        &self,
        leader: NodeId,
        node: &NodeInfo,
        request: &Request,
    ) -> Result<Option<Written>, Retry> {
        let url = rpc_url(&node.raft_addr, config::GROUP, "write");
        let timeout = self.inner.config.write_forward_timeout();
        let credentials = &self.inner.config.credentials;
        let reply: WriteReply =
            match exchange(&self.inner.client, credentials, &url, request, timeout).await {
                Ok(reply) => reply,
                Err(Exchange::Unreachable(e)) => {
                    return Err(Retry(format!("leader {leader} unreachable: {e}")))
                }
                Err(Exchange::TimedOut) => {
                    return Err(Retry(format!(
                        "leader {leader} timed out after {timeout:?}"
                    )))
                }
                Err(Exchange::Failed(e)) => return Err(Retry(format!("leader {leader}: {e}"))),
            };
        match reply {
            Ok(written) => Ok(Some(written)),
            Err(RaftError::APIError(OpenraftClientWriteError::ForwardToLeader(_))) => Ok(None),
            // The leader is shutting down or failed; another one will be elected.
            Err(e) => Err(Retry(format!("leader {leader}: {e}"))),
        }
    }

    /// Waits up to `WRITE_NO_LEADER_WAIT_MS` for the metrics to name a leader other
    /// than `seen`.
    async fn wait_for_new_leader(&self, seen: Option<NodeId>) {
        let mut metrics = self.inner.raft.metrics();
        let changed = async {
            loop {
                let leader = metrics.borrow_and_update().current_leader;
                if leader.is_some() && leader != seen {
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        };
        let _elapsed =
            tokio::time::timeout(Duration::from_millis(WRITE_NO_LEADER_WAIT_MS), changed).await;
    }

    /// The tenant as this replica knows it.
    pub fn tenant(&self, tenant_id: &str) -> Option<TenantRecord> {
        self.inner
            .state_machine
            .read(|s| s.tenants.get(tenant_id).cloned())
    }

    /// All tenants, ordered by id.
    pub fn tenants(&self) -> Vec<TenantRecord> {
        self.inner
            .state_machine
            .read(|s| s.tenants.values().cloned().collect())
    }

    /// The operation as this replica knows it.
    pub fn operation(&self, operation_id: &str) -> Option<Operation> {
        self.inner
            .state_machine
            .read(|s| s.operations.get(operation_id).cloned())
    }

    /// Members of the group (voters and learners) with their region and addresses.
    pub fn nodes(&self) -> BTreeMap<NodeId, NodeInfo> {
        self.inner.state_machine.read(|s| s.nodes.clone())
    }

    /// Known regions, ordered by name.
    pub fn regions(&self) -> Vec<RegionRecord> {
        self.inner
            .state_machine
            .read(|s| s.regions.values().cloned().collect())
    }

    /// A copy of the whole replicated state (for admin views and tests).
    pub fn state(&self) -> RegistryState {
        self.inner.state_machine.read(Clone::clone)
    }

    /// Runs `f` on the local state without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&RegistryState) -> R) -> R {
        self.inner.state_machine.read(f)
    }

    /// The leader this replica currently follows, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// A snapshot of openraft's metrics (role, term, log and applied indexes, membership).
    pub fn metrics(&self) -> RaftMetrics {
        self.inner.raft.metrics().borrow().clone()
    }

    /// Last log index applied to this replica's state (0 before the first).
    pub fn applied_index(&self) -> u64 {
        *self.inner.state_machine.subscribe().borrow()
    }

    /// A receiver of the last applied log index, updated after every applied batch.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.state_machine.subscribe()
    }

    /// Waits until this replica has applied `index` (for example a `Written::log_index`
    /// from a write made through another node), or fails with `Error::Timeout`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), Error> {
        let mut applied = self.subscribe();
        let reached = tokio::time::timeout(timeout, applied.wait_for(|a| *a >= index)).await;
        match reached {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Fatal("state machine closed".to_string())),
            Err(_) => Err(Error::Timeout {
                index,
                applied: self.applied_index(),
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// Stops the Raft instance and makes everything written durable. The HTTP listener
    /// serving `raft_router` belongs to the caller: stop it too (its handlers answer
    /// "stopped" after this).
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.inner.heartbeats.abort();
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| Error::Fatal(format!("raft shutdown: {e}")))?;
        self.inner.state_machine.flush().await?;
        tracing::debug!(node_id = self.id(), "registry replica stopped");
        Ok(())
    }
}

/// The wall clock in Unix milliseconds, read only to stamp driver leases.
fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sends the leader's heartbeats every `interval` (a no-op on followers) until
/// the Raft instance stops. openraft's own heartbeat is off because its period
/// is also its RPC timeout; this keeps the two apart.
async fn heartbeats(raft: Raft, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if raft.trigger().heartbeat().await.is_err() {
            return;
        }
    }
}

/// A forwarding failure worth another attempt, with its description.
struct Retry(String);

fn membership_error(e: RaftError<ClientWriteError>) -> Error {
    match e {
        RaftError::APIError(OpenraftClientWriteError::ForwardToLeader(hint)) => {
            Error::Membership(format!(
                "not the leader; run it on node {:?} ({})",
                hint.leader_id,
                hint.leader_node
                    .map(|n| n.raft_addr)
                    .unwrap_or_else(|| "unknown".to_string())
            ))
        }
        RaftError::APIError(e) => Error::Membership(e.to_string()),
        RaftError::Fatal(e) => Error::Fatal(e.to_string()),
    }
}
