//! Raft RPC over HTTP for every Raft group of a node (the registry and the region
//! groups), generic over the group's type configuration. The client side is
//! openraft's `RaftNetworkFactory` (`HttpNetwork`): one shared `reqwest::Client`
//! POSTs bincode bodies to `/raft/{group}/append|vote|snapshot` on the target's
//! `raft_addr`, bounded by openraft's `RPCOption::hard_ttl()`. The server side is
//! `group_router`, an axum router to merge into the node's Raft listener;
//! `raft_router` is the registry's, which also serves `/raft/registry/write`, where
//! followers forward client writes to the leader.
//!
//! A network may bound the bytes of one AppendEntries (`with_append_bytes_max`):
//! openraft 0.9 bounds a request by its entry count only, and a group whose
//! entries vary in size (a region group's entries are whole commit batches)
//! would otherwise have to pick a count small enough for its largest entries.
//! A request over the bound carries the longest prefix of its entries within
//! it (at least one), and the follower's success is reported to openraft as
//! `PartialSuccess` up to the last entry sent: openraft sends the rest next,
//! and a follower commits no further than the last entry it holds.
//!
//! An AppendEntries that times out shrinks the next ones to that member
//! (`AppendCap`): openraft 0.9 times an RPC out after a fixed period and then
//! sends the very same entries again, so a member that cannot take them within
//! it (large entries on a busy machine: a region group's import entries are
//! 128 KiB each) would never receive another entry, while both sides spend
//! their CPU on the futile retries. The connection halves the entries it lets
//! through after each timeout (down to one) by answering an AppendEntries over
//! its cap with `PayloadTooLarge` before sending anything, which makes
//! openraft read and send fewer at once; each AppendEntries that carried the
//! whole cap and succeeded raises it again by `APPEND_CAP_GROWTH_ENTRIES`.
//!
//! openraft 0.9 drops an AppendEntries at its `heartbeat_interval`, the same
//! for every member and every size, and then sends it again. A network may
//! give an AppendEntries longer (`with_append_timeouts`): more per byte it
//! carries, and a floor for learners in other regions (a standby's copies,
//! an inter-region round trip and a slow fsync away, where the region's own
//! timeout is sized for its own members). Such a call goes on in a task of
//! its own past openraft's timeout (`InFlight`), and the AppendEntries
//! openraft sends next from the same position waits for its answer instead
//! of sending the entries again: a large entry, or a learner across a slow
//! link, still gets through, where each attempt used to be dropped unanswered.
//!
//! A region group's network may answer the empty AppendEntries (heartbeats and
//! commit-index updates) to its learners in other regions at once and send them
//! in the background (`with_learner_heartbeats_detached`, `detached.rs`), so
//! that a new entry for a standby does not wait a round trip behind one.
//!
//! A network may note the vote answers that show a longer log than the
//! candidate's (`with_longer_logs_noted`, `LongerLogs`): a group that times its
//! own elections holds back a node that just learned its log is behind, as
//! openraft's own election timer does.
//!
//! Every request carries the cluster's node credential (`credential.rs`); the router
//! answers anything else with 401 `unauthenticated` (problem+json) before decoding it,
//! so a forged vote, append or write changes nothing.
//!
//! Routes are registered with the literal group name (`/raft/registry/...`,
//! `/raft/region-eu/...`) instead of a `{group}` parameter, so that each group of a
//! node merges its own router into the same listener without conflicting paths.

// openraft's network trait fixes the error type (`RPCError`, > 300 bytes); the helpers
// that settle an AppendEntries' answer return it as the trait does.
#![allow(clippy::result_large_err)]

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::post;
use axum::Router;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, LogId, RPCTypes, RaftLogId, RaftTypeConfig, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite};

use crate::codec;
use crate::config::GROUP;
use crate::credential::{NodeCredentials, NODE_CREDENTIAL_HEADER};
use crate::detached::{Courier, Detached};
use crate::limits::{APPEND_CAP_GROWTH_ENTRIES, REFUSED_LOG_INTERVAL_MS, RPC_BODY_BYTES_MAX};
use crate::state::Request;
use crate::types::{NodeId, NodeInfo, RaftError, RpcError, TypeConfig};
use crate::Registry;
use keyhold_raftlog::{Contacts, LongerLogs, NotesVotes};

const CONTENT_TYPE_BINCODE: &str = "application/octet-stream";

/// A group whose members are keyhold nodes (their ids and `NodeInfo`, with the Raft
/// listener's address, are the ones every group shares) and whose snapshots arrive
/// in chunks written into their `SnapshotData`.
pub trait NodeGroup:
    RaftTypeConfig<NodeId = NodeId, Node = NodeInfo, SnapshotData: SnapshotChunks>
{
}
impl<C> NodeGroup for C where
    C: RaftTypeConfig<NodeId = NodeId, Node = NodeInfo, SnapshotData: SnapshotChunks>
{
}

/// What openraft needs of `SnapshotData` to install a snapshot sent in chunks.
pub trait SnapshotChunks: AsyncRead + AsyncWrite + AsyncSeek + Unpin {}
impl<T: AsyncRead + AsyncWrite + AsyncSeek + Unpin> SnapshotChunks for T {}

/// Path of an RPC of group `group`, relative to a Raft listener.
pub(crate) fn rpc_path(group: &str, rpc: &str) -> String {
    format!("/raft/{group}/{rpc}")
}

/// URL of an RPC of group `group` on the node whose Raft listener is `raft_addr`.
pub(crate) fn rpc_url(raft_addr: &str, group: &str, rpc: &str) -> String {
    format!("http://{raft_addr}{}", rpc_path(group, rpc))
}

/// The `RaftNetworkFactory` of one group: hands out connections that share one
/// `reqwest::Client` (and so its connection pool) and name the group in every path.
#[derive(Debug)]
pub struct HttpNetwork<C = TypeConfig> {
    client: reqwest::Client,
    local_id: NodeId,
    credentials: NodeCredentials,
    group: Arc<str>,
    append_bytes_max: Option<usize>,
    append_timeouts: Option<AppendTimeouts>,
    /// The region whose nodes are the group's voters, when empty AppendEntries
    /// to members of other regions (its learners) are detached.
    detach_beyond: Option<Arc<str>>,
    longer_logs: Option<LongerLogs>,
    contacts: Option<Contacts>,
    config: PhantomData<fn() -> C>,
}

/// How long an AppendEntries may take beyond openraft's own timeout
/// (`HttpNetwork::with_append_timeouts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendTimeouts {
    /// The least time an AppendEntries to a learner in another region gets
    /// (members of other regions only with `with_learner_heartbeats_detached`,
    /// which names the voters' region).
    pub learner: Duration,
    /// Every AppendEntries gets one more second per this many bytes of
    /// entries it carries.
    pub bytes_per_second: u64,
}

impl AppendTimeouts {
    /// The time an AppendEntries of `bytes` bytes of entries gets, with
    /// openraft's `hard_ttl`, to a learner in another region or not.
    fn ttl(&self, hard_ttl: Duration, learner: bool, bytes: usize) -> Duration {
        let floor = match learner {
            true => hard_ttl.max(self.learner),
            false => hard_ttl,
        };
        let per_byte = bytes as u64 * 1000 / self.bytes_per_second.max(1);
        floor + Duration::from_millis(per_byte)
    }
}

impl<C> Clone for HttpNetwork<C> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            local_id: self.local_id,
            credentials: self.credentials.clone(),
            group: self.group.clone(),
            append_bytes_max: self.append_bytes_max,
            append_timeouts: self.append_timeouts,
            detach_beyond: self.detach_beyond.clone(),
            longer_logs: self.longer_logs.clone(),
            contacts: self.contacts.clone(),
            config: PhantomData,
        }
    }
}

impl<C> HttpNetwork<C> {
    /// The network of group `group` (for example `region-eu`) as seen from node
    /// `local_id`, sending `credentials`' current credential with every RPC.
    pub fn new(
        client: reqwest::Client,
        group: &str,
        local_id: NodeId,
        credentials: NodeCredentials,
    ) -> Self {
        Self {
            client,
            local_id,
            credentials,
            group: group.into(),
            append_bytes_max: None,
            append_timeouts: None,
            detach_beyond: None,
            longer_logs: None,
            contacts: None,
            config: PhantomData,
        }
    }

    /// Bounds each AppendEntries to `bytes` of encoded entries (at least one
    /// entry goes whatever its size); see the module's documentation.
    pub fn with_append_bytes_max(mut self, bytes: usize) -> Self {
        self.append_bytes_max = Some(bytes);
        self
    }

    /// Lets an AppendEntries run past openraft's timeout as `timeouts` says;
    /// see the module's documentation.
    pub fn with_append_timeouts(mut self, timeouts: AppendTimeouts) -> Self {
        self.append_timeouts = Some(timeouts);
        self
    }

    /// Answers the empty AppendEntries to members outside `home_region` at once
    /// and sends them in the background (`detached.rs`). Only for a group whose
    /// voters are all in `home_region`, so that every member elsewhere is a
    /// learner: a region group, whose learners are its standby's copies.
    pub fn with_learner_heartbeats_detached(mut self, home_region: &str) -> Self {
        self.detach_beyond = Some(home_region.into());
        self
    }

    /// Notes in `notes` every vote answer whose log is longer than the
    /// candidate's; see the module's documentation.
    pub fn with_longer_logs_noted(mut self, notes: LongerLogs) -> Self {
        self.longer_logs = Some(notes);
        self
    }

    /// Notes in `contacts` when each member last answered an AppendEntries
    /// (detached ones included: their real answers); see `Contacts`.
    pub fn with_contacts_noted(mut self, contacts: Contacts) -> Self {
        self.contacts = Some(contacts);
        self
    }
}

impl<C> NotesVotes for HttpNetwork<C> {
    fn longer_logs(&self) -> Option<LongerLogs> {
        self.longer_logs.clone()
    }
    fn contacts(&self) -> Option<Contacts> {
        self.contacts.clone()
    }
}

impl<C: NodeGroup> RaftNetworkFactory<C> for HttpNetwork<C> {
    type Network = HttpConnection<C>;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Self::Network {
        let learner = self
            .detach_beyond
            .as_deref()
            .is_some_and(|home| home != node.region);
        let detached = learner.then(|| {
            Detached::new(Courier {
                client: self.client.clone(),
                credentials: self.credentials.clone(),
                url: rpc_url(&node.raft_addr, &self.group, "append"),
                contacts: self.contacts.clone().map(|c| (c, target)),
            })
        });
        HttpConnection {
            client: self.client.clone(),
            local_id: self.local_id,
            credentials: self.credentials.clone(),
            group: self.group.clone(),
            append_bytes_max: self.append_bytes_max,
            append_timeouts: self.append_timeouts,
            target,
            raft_addr: node.raft_addr.clone(),
            append_cap: AppendCap::default(),
            in_flight: None,
            detached,
            longer_logs: self.longer_logs.clone(),
            contacts: self.contacts.clone(),
            config: PhantomData,
        }
    }
}

/// A connection to one member; openraft keeps one per replication stream.
#[derive(Debug)]
pub struct HttpConnection<C: RaftTypeConfig = TypeConfig> {
    client: reqwest::Client,
    local_id: NodeId,
    credentials: NodeCredentials,
    group: Arc<str>,
    append_bytes_max: Option<usize>,
    append_timeouts: Option<AppendTimeouts>,
    target: NodeId,
    raft_addr: String,
    append_cap: AppendCap,
    /// An AppendEntries given longer than openraft's timeout, still running.
    in_flight: Option<InFlight>,
    /// For a learner in another region: its empty AppendEntries go in the
    /// background.
    detached: Option<Detached<C>>,
    longer_logs: Option<LongerLogs>,
    contacts: Option<Contacts>,
    config: PhantomData<fn() -> C>,
}

/// An AppendEntries that runs in a task of its own, so that openraft's
/// timeout does not end it: the next AppendEntries openraft sends from the
/// same position (`vote`, `prev`) waits for its answer (see the module's
/// documentation). Dropped, it stops the call.
#[derive(Debug)]
struct InFlight {
    sent: Sent,
    answer: tokio::task::JoinHandle<Result<AppendEntriesResponse<NodeId>, RpcError>>,
}

/// What an AppendEntries carried.
#[derive(Debug, Clone, Copy)]
struct Sent {
    vote: Vote<NodeId>,
    prev: Option<LogId<NodeId>>,
    /// The last entry it carried (`prev` without entries).
    last: Option<LogId<NodeId>>,
    entries: u64,
    /// When it was sent (`Contacts`).
    at: std::time::Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.answer.abort();
    }
}

/// How many entries one AppendEntries to a member may carry, learned from its
/// timeouts: none until one times out, then half of what that one carried (at
/// least one), raised by `APPEND_CAP_GROWTH_ENTRIES` after each success that
/// carried the whole cap.
#[derive(Debug, Default)]
struct AppendCap {
    /// `None`: as many as openraft sends.
    entries: Option<u64>,
    /// The entries of the AppendEntries under way. Still set when the next one
    /// starts, it means openraft dropped that one at its timeout (openraft
    /// wraps the whole call, encoding included, in its own timeout).
    under_way: Option<u64>,
}

impl AppendCap {
    /// Before sending `entries` entries: `Err(cap)` when they are more than the
    /// cap allows, and the AppendEntries must not go.
    fn admit(&mut self, entries: u64) -> Result<(), u64> {
        if let Some(dropped) = self.under_way.take() {
            self.timed_out(dropped);
        }
        match self.entries {
            Some(cap) if entries > cap => Err(cap),
            _ => {
                self.under_way = Some(entries);
                Ok(())
            }
        }
    }

    /// An AppendEntries of `entries` entries got an answer in time.
    fn answered(&mut self, entries: u64) {
        self.under_way = None;
        if let Some(cap) = self.entries.filter(|cap| entries >= *cap) {
            self.entries = Some(cap.saturating_add(APPEND_CAP_GROWTH_ENTRIES));
        }
    }

    /// An AppendEntries of `entries` entries timed out: the next carry half.
    /// Heartbeats and single entries cannot be cut; they leave the cap alone.
    fn timed_out(&mut self, entries: u64) {
        self.under_way = None;
        if entries > 1 {
            let half = entries / 2;
            self.entries = Some(self.entries.map_or(half, |cap| cap.min(half)));
        }
    }

    /// The AppendEntries under way failed otherwise (unreachable, refused):
    /// nothing learned about its size.
    fn failed(&mut self) {
        self.under_way = None;
    }
}

/// The outcome of one HTTP exchange, before the remote's own result is interpreted.
pub(crate) enum Exchange {
    /// Could not connect: the node is down or not listening (openraft backs off).
    Unreachable(reqwest::Error),
    /// No answer within the deadline; the request may or may not have taken effect.
    TimedOut,
    /// Anything else on the way (reset connection, non-2xx status, bad body).
    Failed(AnyError),
}

/// POSTs `body` to `url` with the node credential and decodes the reply as `Resp`.
pub(crate) async fn exchange<Req: Serialize, Resp: DeserializeOwned>(
    client: &reqwest::Client,
    credentials: &NodeCredentials,
    url: &str,
    body: &Req,
    timeout: Duration,
) -> Result<Resp, Exchange> {
    let body = codec::encode(body).map_err(|e| Exchange::Failed(AnyError::new(&e)))?;
    let sent = client
        .post(url)
        .timeout(timeout)
        .header(header::CONTENT_TYPE, CONTENT_TYPE_BINCODE)
        .header(NODE_CREDENTIAL_HEADER, credentials.current())
        .body(body)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Err(Exchange::Unreachable(e)),
        Err(e) if e.is_timeout() => return Err(Exchange::TimedOut),
        Err(e) => return Err(Exchange::Failed(AnyError::new(&e))),
    };
    let status = response.status();
    let bytes = match response.bytes().await {
        Ok(bytes) => bytes,
        Err(e) if e.is_timeout() => return Err(Exchange::TimedOut),
        Err(e) => return Err(Exchange::Failed(AnyError::new(&e))),
    };
    if !status.is_success() {
        return Err(Exchange::Failed(AnyError::error(format!(
            "{url}: HTTP {status}: {}",
            String::from_utf8_lossy(&bytes)
        ))));
    }
    codec::decode(&bytes).map_err(|e| Exchange::Failed(AnyError::new(&e)))
}

/// One RPC to one member, its errors as openraft's.
#[derive(Clone)]
struct Call {
    client: reqwest::Client,
    credentials: NodeCredentials,
    local_id: NodeId,
    target: NodeId,
    url: String,
    action: RPCTypes,
}

impl Call {
    async fn send<Req, Resp, E>(self, request: &Req, ttl: Duration) -> Result<Resp, RpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply: Result<Resp, RaftError<E>> =
            match exchange(&self.client, &self.credentials, &self.url, request, ttl).await {
                Ok(reply) => reply,
                Err(Exchange::Unreachable(e)) => {
                    return Err(RPCError::Unreachable(Unreachable::new(&e)))
                }
                Err(Exchange::TimedOut) => {
                    return Err(RPCError::Timeout(Timeout {
                        action: self.action,
                        id: self.local_id,
                        target: self.target,
                        timeout: ttl,
                    }))
                }
                Err(Exchange::Failed(e)) => return Err(RPCError::Network(NetworkError::new(&e))),
            };
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl<C: NodeGroup> HttpConnection<C> {
    fn rpc(&self, action: RPCTypes, rpc: &str) -> Call {
        Call {
            client: self.client.clone(),
            credentials: self.credentials.clone(),
            local_id: self.local_id,
            target: self.target,
            url: rpc_url(&self.raft_addr, &self.group, rpc),
            action,
        }
    }

    async fn call<Req, Resp, E>(
        &self,
        action: RPCTypes,
        rpc: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        self.rpc(action, rpc).send(request, option.hard_ttl()).await
    }

    /// Waits for the answer of `flight`, kept in the connection meanwhile: if
    /// openraft drops this call at its timeout, the next one finds it.
    async fn answer_of(&mut self, flight: InFlight) -> (Sent, AppendResult) {
        let flight = self.in_flight.insert(flight);
        let answer = (&mut flight.answer).await;
        let sent = self.in_flight.take().expect("kept while awaited").sent;
        let answer = answer.unwrap_or_else(|e| Err(RPCError::Network(NetworkError::new(&e))));
        (sent, answer)
    }

    /// Learns from the member's answer to `sent` (its cap, what it
    /// acknowledged), and answers openraft, which asked for everything up to
    /// `asked_last`: a success for less is a partial one.
    fn settle(
        &mut self,
        sent: &Sent,
        result: AppendResult,
        asked_last: Option<LogId<NodeId>>,
    ) -> AppendResult {
        if let (Ok(_), Some(contacts)) = (&result, &self.contacts) {
            contacts.answered(self.target, sent.at);
        }
        match &result {
            Ok(_) => self.append_cap.answered(sent.entries),
            Err(RPCError::Timeout(_)) => self.append_cap.timed_out(sent.entries),
            Err(_) => self.append_cap.failed(),
        }
        if let Some(detached) = &self.detached {
            let acked = matches!(result, Ok(AppendEntriesResponse::Success))
                .then_some((sent.vote, sent.last));
            detached.answered(acked);
        }
        match result? {
            AppendEntriesResponse::Success if sent.last < asked_last => {
                Ok(AppendEntriesResponse::PartialSuccess(sent.last))
            }
            other => Ok(other),
        }
    }
}

type AppendResult = Result<AppendEntriesResponse<NodeId>, RpcError>;

impl<C: NodeGroup> RaftNetwork<C> for HttpConnection<C> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let learner = self.detached.is_some();
        let floor = match self.append_timeouts {
            Some(timeouts) => timeouts.ttl(option.hard_ttl(), learner, 0),
            None => option.hard_ttl(),
        };
        let mut rpc = match &self.detached {
            Some(detached) => match detached.take(rpc, floor) {
                // It carries nothing the member's answer could change.
                Ok(()) => return Ok(AppendEntriesResponse::Success),
                Err(rpc) => rpc,
            },
            None => rpc,
        };
        let asked_last = rpc
            .entries
            .last()
            .map(|e| *e.get_log_id())
            .or(rpc.prev_log_id);
        if let Some(flight) = self.in_flight.take() {
            if flight.sent.vote == rpc.vote && flight.sent.prev == rpc.prev_log_id {
                // openraft gave up on it at its timeout and asks again from
                // the same position: the answer under way is this one's.
                let (sent, result) = self.answer_of(flight).await;
                return self.settle(&sent, result, asked_last);
            }
            // Another position (a new leader, a conflict): it is moot.
            drop(flight);
        }
        let sizes = match (self.append_bytes_max, self.append_timeouts) {
            (None, None) => Vec::new(),
            _ => {
                let sizes = rpc.entries.iter().map(codec::encoded_len);
                let sizes: Result<Vec<usize>, _> = sizes.collect();
                sizes.map_err(|e| RPCError::Network(NetworkError::new(&e)))?
            }
        };
        let cut = match self.append_bytes_max {
            Some(budget) if rpc.entries.len() > 1 => prefix_within(&sizes, budget),
            _ => None,
        };
        let entries = cut.unwrap_or(rpc.entries.len()) as u64;
        if let Err(cap) = self.append_cap.admit(entries) {
            // openraft sends the same entries again at once, at most `cap` of them.
            tracing::debug!(group = %self.group, target = self.target, entries, cap, "append cut to the member's cap");
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(cap),
            ));
        }
        if let Some(cut) = cut {
            rpc.entries.truncate(cut);
        }
        let bytes: usize = sizes.iter().take(entries as usize).sum();
        let ttl = match self.append_timeouts {
            Some(timeouts) => timeouts.ttl(option.hard_ttl(), learner, bytes),
            None => option.hard_ttl(),
        };
        let sent = Sent {
            vote: rpc.vote,
            prev: rpc.prev_log_id,
            last: rpc
                .entries
                .last()
                .map(|e| *e.get_log_id())
                .or(rpc.prev_log_id),
            entries,
            at: std::time::Instant::now(),
        };
        let call = self.rpc(RPCTypes::AppendEntries, "append");
        let (sent, result) = if ttl > option.hard_ttl() {
            let answer = tokio::spawn(async move { call.send(&rpc, ttl).await });
            self.answer_of(InFlight { sent, answer }).await
        } else {
            (sent, call.send(&rpc, ttl).await)
        };
        self.settle(&sent, result, asked_last)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<C>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        self.call(RPCTypes::InstallSnapshot, "snapshot", &rpc, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let answer: VoteResponse<NodeId> = self.call(RPCTypes::Vote, "vote", &rpc, &option).await?;
        if let Some(notes) = &self.longer_logs {
            if answer.last_log_id > rpc.last_log_id {
                notes.seen(std::time::Instant::now());
            }
        }
        Ok(answer)
    }
}

/// How many of the entries of `sizes` (bytes each) one AppendEntries carries
/// within `budget`: `None` when all of them fit, else the longest prefix that
/// does, at least one entry.
fn prefix_within(sizes: &[usize], budget: usize) -> Option<usize> {
    let mut total = 0usize;
    for (i, size) in sizes.iter().enumerate() {
        total = total.saturating_add(*size);
        if total > budget {
            return Some(i.max(1));
        }
    }
    None
}

/// The axum router serving one group's Raft RPCs, to be merged at the root of the
/// node's Raft listener: `POST /raft/{group}/append`, `/vote`, `/snapshot`.
///
/// Bodies are bincode (`codec`); the reply is always HTTP 200 with the encoded
/// `Result`, except for undecodable requests (400) and requests without the node
/// credential (401 `unauthenticated`, checked before the body is read).
pub fn group_router<C: NodeGroup>(
    group: &str,
    raft: openraft::Raft<C>,
    credentials: NodeCredentials,
) -> Router {
    Router::new()
        .route(&rpc_path(group, "append"), post(append::<C>))
        .route(&rpc_path(group, "vote"), post(vote::<C>))
        .route(&rpc_path(group, "snapshot"), post(snapshot::<C>))
        .layer(DefaultBodyLimit::max(RPC_BODY_BYTES_MAX))
        .route_layer(middleware::from_fn_with_state(
            credentials,
            require_credential,
        ))
        .with_state(raft)
}

/// Where a replaceable group's current Raft instance is found, request by
/// request (`None`: the node has none right now).
pub type RaftSource<C> = Arc<dyn Fn() -> Option<openraft::Raft<C>> + Send + Sync>;

/// `group_router` for a group whose Raft instance this node may replace while
/// it runs (a standby copy deleted and re-created after a failover): each
/// request is served by the instance `source` gives then; without one it is
/// answered 503, which the sender treats as a failed RPC and retries.
pub fn replaceable_group_router<C: NodeGroup>(
    group: &str,
    source: RaftSource<C>,
    credentials: NodeCredentials,
) -> Router {
    Router::new()
        .route(&rpc_path(group, "append"), post(append_from::<C>))
        .route(&rpc_path(group, "vote"), post(vote_from::<C>))
        .route(&rpc_path(group, "snapshot"), post(snapshot_from::<C>))
        .layer(DefaultBodyLimit::max(RPC_BODY_BYTES_MAX))
        .route_layer(middleware::from_fn_with_state(
            credentials,
            require_credential,
        ))
        .with_state(source)
}

fn no_instance() -> HttpResponse {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "this node has no instance of the group right now",
    )
        .into_response()
}

async fn append_from<C: NodeGroup>(
    State(source): State<RaftSource<C>>,
    body: Bytes,
) -> HttpResponse {
    match source() {
        Some(raft) => append(State(raft), body).await,
        None => no_instance(),
    }
}

async fn vote_from<C: NodeGroup>(State(source): State<RaftSource<C>>, body: Bytes) -> HttpResponse {
    match source() {
        Some(raft) => vote(State(raft), body).await,
        None => no_instance(),
    }
}

async fn snapshot_from<C: NodeGroup>(
    State(source): State<RaftSource<C>>,
    body: Bytes,
) -> HttpResponse {
    match source() {
        Some(raft) => snapshot(State(raft), body).await,
        None => no_instance(),
    }
}

/// The registry's router: its group's RPCs (`group_router`) and
/// `POST /raft/registry/write`, a client write executed on this node (forwarded here
/// by a follower's `Registry::write`), which answers `ForwardToLeader` if this node
/// is no longer the leader and never forwards again itself.
pub fn raft_router(registry: Registry) -> Router {
    // `group_router`'s routes, but the registry's appends are noted (`Heard`)
    // on their way to the replica.
    let with_registry = Router::new()
        .route(&rpc_path(GROUP, "append"), post(append_heard))
        .route(&rpc_path(GROUP, "write"), post(write))
        .with_state(registry.clone());
    let with_raft = Router::new()
        .route(
            &rpc_path(GROUP, "vote"),
            post(vote::<crate::types::TypeConfig>),
        )
        .route(
            &rpc_path(GROUP, "snapshot"),
            post(snapshot::<crate::types::TypeConfig>),
        )
        .with_state(registry.raft().clone());
    with_registry
        .merge(with_raft)
        .layer(DefaultBodyLimit::max(RPC_BODY_BYTES_MAX))
        .route_layer(middleware::from_fn_with_state(
            registry.credentials().clone(),
            require_credential,
        ))
}

/// Refused Raft calls of this process, summarised in the log: a sweep of the
/// Raft paths with wrong credentials wrote one WARN line per call (probe
/// d44e5cf, O5). Each refusal is counted in `keyhold_node_credential_refused_total`
/// (the metric the API listener's inter-node routes count in too).
static REFUSALS: RefusalLog = RefusalLog {
    state: Mutex::new(RefusalState {
        logged_at: None,
        unlogged: 0,
    }),
};

struct RefusalLog {
    state: Mutex<RefusalState>,
}

struct RefusalState {
    logged_at: Option<std::time::Instant>,
    /// Refusals since the last line.
    unlogged: u64,
}

impl RefusalLog {
    /// Counts a refusal at `now`; when a line is due (the first refusal, then
    /// at most one per `REFUSED_LOG_INTERVAL_MS`), how many it reports.
    fn note(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock().expect("refusal log lock");
        state.unlogged += 1;
        let interval = Duration::from_millis(REFUSED_LOG_INTERVAL_MS);
        if state
            .logged_at
            .is_some_and(|at| now.saturating_duration_since(at) < interval)
        {
            return None;
        }
        state.logged_at = Some(now);
        Some(std::mem::take(&mut state.unlogged))
    }
}

/// 401 `unauthenticated` (problem+json, the contract's slug) unless the caller
/// presents the node credential.
async fn require_credential(
    State(credentials): State<NodeCredentials>,
    request: HttpRequest,
    next: Next,
) -> HttpResponse {
    if credentials.check(request.headers()) {
        return next.run(request).await;
    }
    metrics::counter!("keyhold_node_credential_refused_total").increment(1);
    if let Some(refused) = REFUSALS.note(std::time::Instant::now()) {
        tracing::warn!(
            refused,
            last_path = %request.uri().path(),
            "raft requests without the node credential refused (at most one line per {} s)",
            REFUSED_LOG_INTERVAL_MS / 1000
        );
    }
    let body = serde_json::json!({
        "type": "https://keyhold.dev/problems/unauthenticated",
        "title": "Unauthenticated",
        "status": 401,
        "detail": "inter-node endpoints accept only the cluster's node credential",
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

fn reply<T: Serialize>(value: &T) -> HttpResponse {
    match codec::encode(value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, CONTENT_TYPE_BINCODE)], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn bad_request(e: bincode::error::DecodeError) -> HttpResponse {
    (StatusCode::BAD_REQUEST, format!("undecodable body: {e}")).into_response()
}

async fn append<C: NodeGroup>(State(raft): State<openraft::Raft<C>>, body: Bytes) -> HttpResponse {
    let request: AppendEntriesRequest<C> = match codec::decode(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    reply(&raft.append_entries(request).await)
}

/// `append` for the registry's own group: notes when it handled an
/// AppendEntries of the sender's term, after handling it (the sender's answer
/// leaves later still).
async fn append_heard(State(registry): State<Registry>, body: Bytes) -> HttpResponse {
    let request: AppendEntriesRequest<crate::types::TypeConfig> = match codec::decode(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    let term = request.vote.leader_id().term;
    let answer = registry.raft().append_entries(request).await;
    registry.heard().note(term, std::time::Instant::now());
    reply(&answer)
}

async fn vote<C: NodeGroup>(State(raft): State<openraft::Raft<C>>, body: Bytes) -> HttpResponse {
    let request: VoteRequest<NodeId> = match codec::decode(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    reply(&raft.vote(request).await)
}

async fn snapshot<C: NodeGroup>(
    State(raft): State<openraft::Raft<C>>,
    body: Bytes,
) -> HttpResponse {
    let request: InstallSnapshotRequest<C> = match codec::decode(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    reply(&raft.install_snapshot(request).await)
}

async fn write(State(registry): State<Registry>, body: Bytes) -> HttpResponse {
    let request: Request = match codec::decode(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    reply(&registry.write_here(request).await)
}

#[cfg(test)]
mod tests {
    use super::{prefix_within, AppendCap, RefusalLog, RefusalState, REFUSED_LOG_INTERVAL_MS};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// The first refusal is logged; the next line comes an interval later at
    /// the earliest and reports every refusal in between.
    #[test]
    fn refusals_are_summarised_once_per_interval() {
        let log = RefusalLog {
            state: Mutex::new(RefusalState {
                logged_at: None,
                unlogged: 0,
            }),
        };
        let start = Instant::now();
        assert_eq!(log.note(start), Some(1));
        let interval = Duration::from_millis(REFUSED_LOG_INTERVAL_MS);
        for i in 1..1_000u32 {
            let at = start + interval * i / 1_000;
            assert_eq!(log.note(at), None, "a second line within the interval");
        }
        assert_eq!(log.note(start + interval), Some(1_000));
        assert_eq!(log.note(start + interval), None);
    }

    /// No cap until a timeout; then half of what timed out, one more entry
    /// per full success; a timeout under the cap halves what was sent.
    #[test]
    fn a_timeout_halves_the_cap_and_full_successes_raise_it() {
        let mut cap = AppendCap::default();
        assert_eq!(cap.admit(64), Ok(()));
        cap.answered(64);
        assert_eq!(cap.entries, None, "no cap before a timeout");
        assert_eq!(cap.admit(16), Ok(()));
        cap.timed_out(16);
        assert_eq!(cap.admit(16), Err(8));
        assert_eq!(cap.admit(8), Ok(()));
        cap.answered(8);
        assert_eq!(cap.entries, Some(9));
        // A success short of the cap says nothing about the cap.
        assert_eq!(cap.admit(3), Ok(()));
        cap.answered(3);
        assert_eq!(cap.entries, Some(9));
        assert_eq!(cap.admit(6), Ok(()));
        cap.timed_out(6);
        assert_eq!(cap.entries, Some(3));
    }

    /// openraft drops the call at its own timeout, so the connection learns it
    /// from the next call: the one under way never finished.
    #[test]
    fn an_append_dropped_under_way_counts_as_a_timeout() {
        let mut cap = AppendCap::default();
        assert_eq!(cap.admit(16), Ok(()));
        // (dropped here: neither answered nor timed_out)
        assert_eq!(cap.admit(16), Err(8));
        assert_eq!(cap.admit(8), Ok(()));
        assert_eq!(cap.admit(8), Err(4));
        assert_eq!(cap.admit(0), Ok(()), "a heartbeat always goes");
        cap.answered(0);
        assert_eq!(cap.entries, Some(4));
    }

    /// One entry is the floor: it cannot be cut, so it goes whatever happened.
    #[test]
    fn single_entries_and_heartbeats_leave_the_cap_alone() {
        let mut cap = AppendCap::default();
        assert_eq!(cap.admit(2), Ok(()));
        cap.timed_out(2);
        assert_eq!(cap.entries, Some(1));
        assert_eq!(cap.admit(1), Ok(()));
        cap.timed_out(1);
        assert_eq!(cap.entries, Some(1));
        assert_eq!(cap.admit(0), Ok(()));
        cap.failed();
        assert_eq!(cap.admit(1), Ok(()));
        cap.answered(1);
        assert_eq!(cap.entries, Some(2));
    }

    #[test]
    fn an_append_carries_the_longest_prefix_within_its_bytes_and_at_least_one_entry() {
        assert_eq!(prefix_within(&[10, 10, 10], 30), None, "all fit");
        assert_eq!(prefix_within(&[10, 10, 10], 29), Some(2));
        assert_eq!(prefix_within(&[10, 25, 10], 30), Some(1));
        assert_eq!(
            prefix_within(&[40, 1], 30),
            Some(1),
            "one entry goes anyway"
        );
        assert_eq!(prefix_within(&[], 30), None);
        assert_eq!(prefix_within(&[usize::MAX, 1], 30), Some(1));
    }
}

#[cfg(test)]
mod vote_tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Vote};

    /// A member that answers every vote request refusing it, with a log
    /// ending at `last`.
    async fn member_with_log(last: u64) -> String {
        let answer = move |body: Bytes| async move {
            let request: VoteRequest<NodeId> = codec::decode(&body).expect("a vote request");
            let answer: Result<VoteResponse<NodeId>, RaftError> = Ok(VoteResponse::new(
                request.vote,
                Some(LogId::new(CommittedLeaderId::new(1, 2), last)),
                false,
            ));
            reply(&answer)
        };
        let router = Router::new().route("/raft/g/vote", post(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    }

    async fn campaign(notes: &LongerLogs, own_last: u64, member_last: u64) {
        let addr = member_with_log(member_last).await;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let credentials = NodeCredentials::parse("vote-test-credential-0123456789ab").unwrap();
        let mut network = HttpNetwork::<TypeConfig>::new(client, "g", 1, credentials)
            .with_longer_logs_noted(notes.clone());
        assert!(network.longer_logs().is_some());
        let mut connection = network
            .new_client(2, &NodeInfo::new("a", "127.0.0.1:1", addr))
            .await;
        let request = VoteRequest::new(
            Vote::new(3, 1),
            Some(LogId::new(CommittedLeaderId::new(1, 2), own_last)),
        );
        let answer = connection
            .vote(request, RPCOption::new(Duration::from_secs(10)))
            .await
            .expect("an answer");
        assert!(!answer.vote_granted);
    }

    #[tokio::test]
    async fn a_vote_answer_with_a_longer_log_is_noted_and_others_are_not() {
        let notes = LongerLogs::default();
        campaign(&notes, 10, 10).await;
        campaign(&notes, 10, 9).await;
        assert_eq!(notes.last_seen(), None, "no answer showed a longer log");
        let before = std::time::Instant::now();
        campaign(&notes, 10, 11).await;
        assert!(notes.last_seen().is_some_and(|at| at >= before));
    }

    #[test]
    fn a_network_notes_nothing_unless_asked() {
        let credentials = NodeCredentials::parse("vote-test-credential-0123456789ab").unwrap();
        let network = HttpNetwork::<TypeConfig>::new(reqwest::Client::new(), "g", 1, credentials);
        assert!(network.longer_logs().is_none());
    }
}
