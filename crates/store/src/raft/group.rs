//! A region group running on one node: the openraft instance over the region's log
//! and state machine, and the writer that gathers waiting commands into one entry.
//!
//! The writer is group commit over Raft: it takes the first waiting command, every
//! other one already queued (up to `BATCH_COMMANDS_MAX` commands and
//! `BATCH_BYTES_MAX` bytes, so that the entry crosses to a member in one
//! AppendEntries; a command that would pass either starts the next entry, and
//! a larger command, up to `ENTRY_COMMANDS_BYTES_MAX`, goes alone),
//! submits them as one
//! `CommandBatch` with `client_write`, and answers every waiter once the entry is
//! applied (applied implies committed, which implies durable in the log of a majority;
//! with one voter, the local log's flush). While one entry is in flight new commands
//! queue up and form the next, so one log fsync carries many commands under load,
//! although openraft 0.9 flushes once per `client_write` (see `CommandBatch`).
//! Upkeep commands that arrive alone (`Command::lane`: the relay's effects,
//! sweeps) while the last entry is still on its way to a follower (another
//! voter of the region, or a learner in another region) wait briefly for a
//! client's command to share their entry
//! (`ride_along`): openraft sends a member one AppendEntries at a time, and an
//! entry of upkeep alone would hold the next client entry a round trip.
//!
//! A node's store starts its group as the only voter (`start_single_voter`), whose
//! Raft network answers every RPC with `Unreachable`, as a group without peers never
//! sends one. `start` takes any network and `Bootstrap`: the registry crate's HTTP
//! transport (`HttpNetwork`, `/raft/region-<name>/...`) replicates a group across
//! the nodes of a region. A writer on a member that does not lead answers
//! `Error::NotLeader`; it appends nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyhold_raftlog::{Contacts, LogTail, LongerLogs, NodeId, NodeInfo, NotesVotes};
use openraft::error::{ClientWriteError, InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, ChangeMembers, ServerState};
use tokio::sync::{mpsc, watch};

use super::confirmed::Confirmations;
use super::election::{ElectionTimer, Role, Seen};
use super::{
    CommandBatch, EntryOutcome, Member, RegionConfig, RegionLogStore, RegionRaft,
    RegionStateMachine,
};
use crate::command::{Applied, Command, Lane};
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_COMMANDS_MAX, QUEUE_COMMANDS_MAX, REGION_APPEND_ENTRIES_MAX,
    REGION_ELECTION_TIMEOUT_MAX_MS, REGION_ELECTION_TIMEOUT_MIN_MS, REGION_HEARTBEAT_INTERVAL_MS,
    REGION_LEADER_WAIT_MS, REGION_RPC_TIMEOUT_MS, REGION_SNAPSHOT_LOGS_SINCE_LAST,
    REGION_SNAPSHOT_WRITTEN_PERCENT, REGION_TREE_CACHE_BYTES_DEFAULT, REGION_WRITE_WAIT_MS,
    STANDBY_ANSWER_POLL_MS, UPKEEP_RIDE_GRACE_MS, UPKEEP_RIDE_LAG_ENTRIES_MAX, UPKEEP_RIDE_WAIT_MS,
    WRITTEN_ENTRIES_KEPT_MAX,
};
use crate::stats::CommitStats;
use crate::{Error, Job, Logged};

/// How a replica that starts with an empty log enters its group.
#[derive(Debug, Clone)]
pub enum Bootstrap {
    /// It initializes the group with these voters (on a replica that holds a log
    /// already, nothing happens). Every voter may do so with the same set:
    /// openraft writes the same first entry on each.
    Voters(BTreeMap<NodeId, NodeInfo>),
    /// It waits to be added by the leader (as a learner, then perhaps a voter),
    /// receiving the log or a snapshot from it.
    Joiner,
}

/// This member's part in its group right now, from the Raft instance's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// It leads, and has applied an entry of its own term, so every entry committed
    /// before its election is in the region tree (and, restarted as the leader of
    /// the term it led, the whole log it opened with: `Opened`): reads here see
    /// every acknowledged command.
    Ready,
    /// It leads but has not yet applied an entry of its own term (or the log it
    /// opened with): reads could miss a command acknowledged before.
    Elected,
    /// It leads by its own account, but no majority confirmed it within
    /// `REGION_READ_LEASE_MS` (`confirmed.rs`): it may have been cut off and
    /// succeeded without knowing, so its tree may miss acknowledged commands.
    Unconfirmed,
    /// Another member leads (`Some`), or no leader is known yet (`None`).
    Follower(Option<(NodeId, NodeInfo)>),
}

/// Settings of a group that an operator may tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupOptions {
    /// A snapshot is built after this many applied entries, and the log keeps as
    /// many entries behind it (a follower that lags less catches up from the
    /// log; one that lags more, or a new member, by the snapshot).
    pub snapshot_entries: u64,
    /// ... once those entries wrote at least this percent of the last
    /// snapshot's bytes to the region tree (0: after `snapshot_entries` alone).
    pub snapshot_written_percent: u64,
    /// Who purges the log behind a snapshot.
    pub purge: Purge,
    /// sled's cache of the region tree, in bytes of cached pages as sled counts
    /// them (serialized size; the memory they take is a few times this). At
    /// least `REGION_TREE_CACHE_BYTES_MIN`.
    pub tree_cache_bytes: u64,
}

/// Who purges a group's log behind its snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// openraft, keeping `snapshot_entries` entries behind each snapshot.
    Automatic,
    /// Only `RegionGroup::purge_upto`: a region with a standby purges no entry
    /// its standby copy has not matched.
    Manual,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            snapshot_entries: REGION_SNAPSHOT_LOGS_SINCE_LAST,
            snapshot_written_percent: REGION_SNAPSHOT_WRITTEN_PERCENT,
            purge: Purge::Automatic,
            tree_cache_bytes: REGION_TREE_CACHE_BYTES_DEFAULT,
        }
    }
}

/// A running region group on this node. Cheap to clone.
#[derive(Clone)]
pub struct RegionGroup {
    inner: Arc<Inner>,
}

struct Inner {
    raft: RegionRaft,
    state_machine: RegionStateMachine,
    /// The replica's log, shared with openraft: read when the replica is
    /// promoted (`promote`), after its Raft instance stopped.
    log: RegionLogStore,
    jobs: mpsc::Sender<Job>,
    stats: Arc<CommitStats>,
    /// The entries this member's writer appended lately, for replication lag in
    /// commands and seconds.
    written: Arc<Mutex<VecDeque<Written>>>,
    /// When a majority last confirmed this member as leader.
    confirmed: Arc<Confirmations>,
    /// When each member last answered an AppendEntries (`None`: the network
    /// notes no answers, as in-process test networks).
    contacts: Option<Contacts>,
    /// The term and log this replica opened with.
    opened: Opened,
}

/// The term and last log index a replica opened with. openraft 0.9 restarts a
/// member that led its term as the leader of that same term, without a new
/// first entry; the entries a crash took out of its region tree (applied, not
/// yet flushed) are applied again only once they commit anew. Until then an
/// entry of its term is applied (one from before the crash), yet the tree
/// lacks acknowledged commands: chaos seed 1106 read one as 404.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Opened {
    term: u64,
    last_log_index: u64,
}

impl Opened {
    /// Whether a leader of `current_term` that applied up to `applied_index`
    /// holds every entry this replica's log held when it opened in its tree:
    /// in a later term its own first entry, applied, comes after them all.
    fn applied_since(self, current_term: u64, applied_index: u64) -> bool {
        current_term != self.term || applied_index >= self.last_log_index
    }
}

/// One entry this member's writer appended.
#[derive(Debug, Clone, Copy)]
struct Written {
    index: u64,
    commands: u64,
    /// When its first command was submitted.
    at: Instant,
}

/// How far a replica trails the leader.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    /// The last log index the replica holds.
    pub matched_index: u64,
    /// Commands in the entries it does not hold yet.
    pub commands: u64,
    /// Age of the oldest command it does not hold yet; 0 when caught up.
    pub seconds: f64,
}

impl std::fmt::Debug for RegionGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionGroup").finish_non_exhaustive()
    }
}

type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>;

/// The network of a group without peers: there is nobody to reach.
#[derive(Debug, Clone, Copy)]
pub struct NoPeers;

fn unreachable<E: std::error::Error>(target: NodeId) -> RPCError<NodeId, NodeInfo, E> {
    let reason = format!("node {target} is not a member of this single-voter region group");
    RPCError::Unreachable(Unreachable::new(&AnyError::error(reason)))
}

impl NotesVotes for NoPeers {}

impl RaftNetworkFactory<RegionConfig> for NoPeers {
    type Network = NoPeersClient;

    async fn new_client(&mut self, target: NodeId, _node: &NodeInfo) -> Self::Network {
        NoPeersClient { target }
    }
}

/// A connection that never connects.
#[derive(Debug)]
pub struct NoPeersClient {
    target: NodeId,
}

impl RaftNetwork<RegionConfig> for NoPeersClient {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<RegionConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        Err(unreachable(self.target))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<RegionConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        Err(unreachable(self.target))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        Err(unreachable(self.target))
    }
}

fn raft_config(group: &str, options: GroupOptions) -> Result<openraft::Config, Error> {
    assert!(
        options.snapshot_entries > 0,
        "snapshots need a positive interval"
    );
    openraft::Config {
        cluster_name: group.to_string(),
        // openraft 0.9 times every AppendEntries and vote out after its
        // heartbeat period; the heartbeats come from the group's own ticker.
        heartbeat_interval: REGION_RPC_TIMEOUT_MS,
        enable_heartbeat: false,
        max_payload_entries: REGION_APPEND_ENTRIES_MAX,
        election_timeout_min: REGION_ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: REGION_ELECTION_TIMEOUT_MAX_MS,
        // The state machine decides when (`SnapshotPolicy`, which also weighs
        // the bytes written), and `ticks` has openraft build.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        // Manual: far more than any log holds (openraft adds to it, so not MAX).
        max_in_snapshot_log_to_keep: match options.purge {
            Purge::Automatic => options.snapshot_entries,
            Purge::Manual => u64::MAX / 4,
        },
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::Raft(e.to_string()))
}

impl RegionGroup {
    /// Opens the group `group` in `dir` as its only voter, `node` (initializing it on
    /// first start), waits until this node leads it and has applied every committed
    /// entry, and starts the writer.
    pub async fn start_single_voter(
        dir: &Path,
        group: &str,
        node: NodeId,
        info: NodeInfo,
    ) -> Result<RegionGroup, Error> {
        Self::start_single_voter_with(dir, group, node, info, NoPeers, GroupOptions::default())
            .await
    }

    /// `start_single_voter` with `options` instead of the defaults, and `network`
    /// to reach learners the group may gain (a standby region's copies).
    pub async fn start_single_voter_with<N: RaftNetworkFactory<RegionConfig> + NotesVotes>(
        dir: &Path,
        group: &str,
        node: NodeId,
        info: NodeInfo,
        network: N,
        options: GroupOptions,
    ) -> Result<RegionGroup, Error> {
        let member = Member {
            group: group.to_string(),
            node,
            info: info.clone(),
        };
        let voters = Bootstrap::Voters(BTreeMap::from([(node, info)]));
        let started = Self::start_with(dir, &member, network, voters, options).await?;
        let raft = &started.inner.raft;
        let leader_wait = Duration::from_millis(REGION_LEADER_WAIT_MS);
        raft.wait(Some(leader_wait))
            .state(ServerState::Leader, "single voter leads its region group")
            .await
            .map_err(|e| Error::Raft(format!("no leadership: {e}")))?;
        // Leading is not yet having applied: entries a crash took out of the
        // region tree are applied again once this term's first entry commits.
        // Readers read the tree directly, so they must not start before that.
        tokio::time::timeout(leader_wait, raft.ensure_linearizable())
            .await
            .map_err(|_| {
                Error::Raft("the log's committed entries were not applied in time".into())
            })?
            .map_err(|e| Error::Raft(format!("applying the log's committed entries: {e}")))?;
        Ok(started)
    }

    /// Opens `member`'s replica of its group in `dir` with `network` to reach the
    /// other members, initializes the group as `bootstrap` says, and starts the
    /// writer. Returns without waiting for a leader.
    pub async fn start<N: RaftNetworkFactory<RegionConfig> + NotesVotes>(
        dir: &Path,
        member: &Member,
        network: N,
        bootstrap: Bootstrap,
    ) -> Result<RegionGroup, Error> {
        Self::start_with(dir, member, network, bootstrap, GroupOptions::default()).await
    }

    /// `start` with `options` instead of the defaults.
    pub async fn start_with<N: RaftNetworkFactory<RegionConfig> + NotesVotes>(
        dir: &Path,
        member: &Member,
        network: N,
        bootstrap: Bootstrap,
        options: GroupOptions,
    ) -> Result<RegionGroup, Error> {
        let owned_dir = dir.to_path_buf();
        let owned_group = member.group.clone();
        let (log, state_machine) = tokio::task::spawn_blocking(move || {
            super::open_with(&owned_dir, &owned_group, options)
        })
        .await
        .map_err(|e| Error::Raft(format!("open task: {e}")))??;
        let config = Arc::new(raft_config(&member.group, options)?);
        let log_reader = log.clone();
        let longer_logs = network.longer_logs().unwrap_or_default();
        let contacts = network.contacts();
        let raft = RegionRaft::new(member.node, config, network, log, state_machine.clone())
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        let opened = {
            let m = raft.metrics().borrow().clone();
            Opened {
                term: m.current_term,
                last_log_index: m.last_log_index.unwrap_or(0),
            }
        };
        // The group's ticker times the elections (`election.rs`).
        raft.runtime_config().elect(false);
        // Only a pristine replica is initialized: openraft refuses the others anyway,
        // but logs that refusal as an error on every restart.
        let pristine = !raft
            .is_initialized()
            .await
            .map_err(|e| Error::Raft(format!("initialized check: {e}")))?;
        if let (Bootstrap::Voters(voters), true) = (bootstrap, pristine) {
            raft.initialize(voters)
                .await
                .map_err(|e| Error::Raft(format!("initialize: {e}")))?;
        }
        // A promoted replica is final (`promote`): it takes no part in its
        // group again, across restarts; reads of its state go on.
        if state_machine.promoted()?.is_some() {
            raft.shutdown()
                .await
                .map_err(|e| Error::Raft(format!("shutdown of a promoted replica: {e}")))?;
        }
        let timer = ElectionTimer::new(election_seed(member.node));
        tokio::spawn(ticks(
            raft.clone(),
            state_machine.clone(),
            timer,
            longer_logs,
        ));
        let (jobs, rx) = mpsc::channel(QUEUE_COMMANDS_MAX);
        let stats = Arc::new(CommitStats::default());
        let written = Arc::new(Mutex::new(VecDeque::new()));
        tokio::spawn(write_loop(raft.clone(), rx, stats.clone(), written.clone()));
        let confirmed = Arc::new(Confirmations::default());
        tokio::spawn(note_confirmations(raft.metrics(), confirmed.clone()));
        Ok(RegionGroup {
            inner: Arc::new(Inner {
                raft,
                state_machine,
                log: log_reader,
                jobs,
                stats,
                written,
                confirmed,
                contacts,
                opened,
            }),
        })
    }

    /// This member's part in the group now: whether it may execute and read, and
    /// where the leader is when it is not this member.
    pub fn leadership(&self) -> Leadership {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let Some(leader) = m.current_leader else {
            return Leadership::Follower(None);
        };
        if leader != m.id {
            let info = m.membership_config.membership().get_node(&leader).cloned();
            return Leadership::Follower(info.map(|info| (leader, info)));
        }
        if m.state != ServerState::Leader {
            // A leader that stepped down keeps reporting itself for a moment.
            return Leadership::Follower(None);
        }
        let applied_term = m.last_applied.map(|id| id.leader_id.get_term());
        let applied_index = m.last_applied.map_or(0, |id| id.index);
        if applied_term != Some(m.current_term)
            || !self
                .inner
                .opened
                .applied_since(m.current_term, applied_index)
        {
            return Leadership::Elected;
        }
        if self
            .inner
            .confirmed
            .is_current(m.current_term, Instant::now())
        {
            Leadership::Ready
        } else {
            Leadership::Unconfirmed
        }
    }

    /// Adds `node` as a learner and waits, up to `wait`, until it has caught up
    /// with the log (by replication, or by a snapshot where the log was purged).
    /// `Ok(false)`: still catching up when `wait` ran out (it stays a learner;
    /// calling again waits again). Only the leader can; elsewhere `NotLeader`.
    pub async fn add_learner(
        &self,
        node: NodeId,
        info: NodeInfo,
        wait: Duration,
    ) -> Result<bool, Error> {
        let raft = self.inner.raft.clone();
        match tokio::time::timeout(wait, raft.add_learner(node, info, true)).await {
            Err(_) => Ok(false),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) => Err(membership_error(e)),
        }
    }

    /// Adds `node` as a learner without waiting for it: the leader streams the log
    /// (or a snapshot) to it from now on. A member already is left as it is. Only
    /// the leader can; elsewhere `NotLeader`.
    pub async fn add_streaming_learner(&self, node: NodeId, info: NodeInfo) -> Result<(), Error> {
        match self.inner.raft.add_learner(node, info, false).await {
            Ok(_) => Ok(()),
            Err(e) => Err(membership_error(e)),
        }
    }

    /// On the leader, how far the best of `replicas` trails it: `None` elsewhere,
    /// or while none of them is replicated to.
    pub fn lag_of(&self, replicas: &[NodeId]) -> Option<Lag> {
        let metrics = self.inner.raft.metrics().borrow().clone();
        let replication = metrics.replication.as_ref()?;
        let matched = replicas
            .iter()
            .filter_map(|id| replication.get(id))
            .map(|m| m.map_or(0, |l| l.index))
            .max()?;
        let last = metrics.last_log_index.unwrap_or(0);
        if matched >= last {
            return Some(Lag {
                matched_index: matched,
                commands: 0,
                seconds: 0.0,
            });
        }
        let written = self.inner.written.lock().expect("not poisoned");
        let behind = written.iter().filter(|w| w.index > matched);
        let (mut commands, mut oldest, mut entries) = (0u64, None, 0u64);
        for w in behind {
            commands += w.commands;
            entries += 1;
            oldest = Some(oldest.map_or(w.at, |o: Instant| o.min(w.at)));
        }
        // Entries this member did not write (a predecessor's, Raft's own) count
        // as one command each.
        commands += (last - matched).saturating_sub(entries);
        Some(Lag {
            matched_index: matched,
            commands,
            seconds: oldest.map_or(0.0, |at| at.elapsed().as_secs_f64()),
        })
    }

    /// Waits, up to `wait`, until a majority of `replicas` (learners of another
    /// region, say) hold this leader's log up to `index`, durably: openraft counts
    /// an entry as matched by a member only once that member's log flushed it.
    /// False when `wait` runs out first, when this member does not lead (only a
    /// leader knows what its members hold), or when `replicas` is empty.
    pub async fn wait_matched(&self, replicas: &[NodeId], index: u64, wait: Duration) -> bool {
        let mut metrics = self.inner.raft.metrics();
        let reached = async {
            loop {
                let matched = majority_matched(&metrics.borrow_and_update(), replicas);
                if matched.is_some_and(|m| m >= index) {
                    return true;
                }
                if metrics.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(wait, reached).await.unwrap_or(false)
    }

    /// On the leader: true when a majority of `replicas` (the standby region's
    /// copies) hold every entry this member appended more than `max_lag` ago,
    /// and a majority of them answered an AppendEntries this member sent within
    /// `max_lag` (contract section 11, "Bounded loss"). The second half is what
    /// bounds a cut that found the log idle: every entry held, nothing old
    /// unconfirmed, yet the standby gone; without it a write arriving a minute
    /// after the cut would be acknowledged and lost. An entry this member did
    /// not append itself (a predecessor's, openraft's own) has no known age and
    /// counts as older: after a change of leader, writes wait until the standby
    /// holds the log up to this leader's first entries. False on any other
    /// member.
    pub fn standby_confirms_within(&self, replicas: &[NodeId], max_lag: Duration) -> bool {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        self.confirms_within(&m, replicas, max_lag, Instant::now())
    }

    /// On the leader: true when a majority of `replicas` hold its whole log and
    /// a majority answered an AppendEntries it sent within `max_lag` (the
    /// standby is back and caught up). False on any other member.
    pub fn standby_caught_up(&self, replicas: &[NodeId], max_lag: Duration) -> bool {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let matched = majority_matched(&m, replicas);
        let last = m.last_log_index.unwrap_or(0);
        matched.is_some_and(|matched| matched >= last)
            && self.answered_within(replicas, max_lag, Instant::now())
    }

    fn answered_within(&self, replicas: &[NodeId], max_lag: Duration, now: Instant) -> bool {
        match &self.inner.contacts {
            Some(contacts) => {
                let sent: Vec<_> = replicas
                    .iter()
                    .map(|id| contacts.last_answered(*id))
                    .collect();
                answered_within(&sent, max_lag, now)
            }
            None => true,
        }
    }

    fn confirms_within(
        &self,
        m: &openraft::RaftMetrics<NodeId, NodeInfo>,
        replicas: &[NodeId],
        max_lag: Duration,
        now: Instant,
    ) -> bool {
        let matched = majority_matched(m, replicas);
        let last = m.last_log_index.unwrap_or(0);
        let answered = self.answered_within(replicas, max_lag, now);
        let written = self.inner.written.lock().expect("not poisoned");
        answered && confirmed_within(matched, last, &written, max_lag, now)
    }

    /// Waits, up to `wait`, until `standby_confirms_within` holds. More of the
    /// log matched (openraft's reports) or a fresh answer (noted by the network,
    /// which wakes nobody: looked at every `STANDBY_ANSWER_POLL_MS`) can make
    /// it hold.
    pub async fn wait_standby_confirms_within(
        &self,
        replicas: &[NodeId],
        max_lag: Duration,
        wait: Duration,
    ) -> bool {
        let mut metrics = self.inner.raft.metrics();
        let poll = Duration::from_millis(STANDBY_ANSWER_POLL_MS);
        let reached = async {
            loop {
                let held = {
                    let m = metrics.borrow_and_update();
                    self.confirms_within(&m, replicas, max_lag, Instant::now())
                };
                if held {
                    return true;
                }
                tokio::select! {
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            return false;
                        }
                    }
                    () = tokio::time::sleep(poll) => {}
                }
            }
        };
        tokio::time::timeout(wait, reached).await.unwrap_or(false)
    }

    /// Makes `node`, a member already (a learner that caught up), a voter. Only
    /// the leader can; elsewhere `NotLeader`.
    pub async fn add_voter(&self, node: NodeId) -> Result<(), Error> {
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([node]));
        match self.inner.raft.change_membership(change, false).await {
            Ok(_) => Ok(()),
            Err(e) => Err(membership_error(e)),
        }
    }

    /// Takes `node` out of the group entirely (as a voter and as a learner). Only
    /// the leader can; elsewhere `NotLeader`.
    pub async fn remove_member(&self, node: NodeId) -> Result<(), Error> {
        let (voters, _) = self.members();
        let nodes = BTreeSet::from([node]);
        let change = if voters.contains(&node) {
            ChangeMembers::RemoveVoters(nodes)
        } else {
            ChangeMembers::RemoveNodes(nodes)
        };
        match self.inner.raft.change_membership(change, false).await {
            Ok(_) => Ok(()),
            Err(e) => Err(membership_error(e)),
        }
    }

    /// Purges this replica's log up to `index` (only entries behind its last
    /// snapshot ever go; openraft postpones what a replication still reads).
    pub async fn purge_upto(&self, index: u64) -> Result<(), Error> {
        self.inner
            .raft
            .trigger()
            .purge_log(index)
            .await
            .map_err(|e| Error::Raft(format!("purge: {e}")))
    }

    /// The group's voters and learners as this member knows them.
    pub fn members(&self) -> (BTreeSet<NodeId>, BTreeMap<NodeId, NodeInfo>) {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters = membership.voter_ids().collect();
        let nodes = membership
            .nodes()
            .map(|(id, info)| (*id, info.clone()))
            .collect();
        (voters, nodes)
    }

    /// The group's Raft instance: for its RPC router and for metrics.
    pub fn raft(&self) -> &RegionRaft {
        &self.inner.raft
    }

    /// Executes one command; answers once the entry holding it is applied, with
    /// that entry's index. A command the state machine refused reaches the caller
    /// as `Error::Rejected`, as from `Store::execute`.
    pub async fn execute(&self, command: Command) -> Result<Logged<Applied>, Error> {
        crate::submit(&self.inner.jobs, command).await
    }

    /// Entries and commands written, and the time entries took from submission to
    /// applied: `commands() / batches()` is commands per log fsync.
    pub fn stats(&self) -> &CommitStats {
        &self.inner.stats
    }

    /// The group's state machine (reads of the applied state).
    pub fn state_machine(&self) -> &RegionStateMachine {
        &self.inner.state_machine
    }

    /// True while the writer takes commands, its last entry was written and the Raft
    /// instance runs.
    pub fn is_healthy(&self) -> bool {
        !self.inner.jobs.is_closed()
            && !self.inner.stats.failed()
            && self.inner.raft.metrics().borrow().running_state.is_ok()
    }

    /// A receiver of the last applied log index.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.state_machine.subscribe()
    }

    /// Promotes this replica, a standby copy of a failed region, to the final
    /// state of that region as far as it holds the log: stops its Raft
    /// instance for good (it neither votes, nor takes entries from a leader,
    /// nor writes, even after a restart) and applies every entry of its log
    /// beyond its applied index, including those it received but never
    /// learned were committed. Returns its tail then (`LogTail`: the last
    /// index applied, `last`, and the leaders of the entries it applied
    /// without knowing them committed): the same on every call, and after a
    /// restart.
    ///
    /// Entries a deposed leader never got committed may be among them: each is
    /// a command that executed here without its client ever hearing so, which
    /// the client's retry with the same key replays.
    pub async fn promote(&self) -> Result<LogTail, Error> {
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| Error::Raft(format!("shutdown for promotion: {e}")))?;
        if let Some(tail) = self.inner.state_machine.promoted_tail()? {
            return Ok(tail);
        }
        let applied = self.inner.state_machine.applied_index()?;
        let mut log = self.inner.log.clone();
        let entries =
            openraft::storage::RaftLogReader::try_get_log_entries(&mut log, applied + 1..)
                .await
                .map_err(|e| Error::Raft(format!("reading the log for promotion: {e}")))?;
        let at = self.inner.state_machine.promote(entries).await?;
        let tail = self
            .inner
            .state_machine
            .promoted_tail()?
            .expect("promoted just now");
        debug_assert_eq!(tail.last, at);
        tracing::info!(applied, at, leaders = tail.runs.len(), "replica promoted");
        Ok(tail)
    }

    /// The last log index this replica holds (for a promoted one, the index
    /// it was promoted at).
    pub fn last_log_index(&self) -> Result<u64, Error> {
        if let Some(at) = self.inner.state_machine.promoted()? {
            return Ok(at);
        }
        Ok(self
            .inner
            .raft
            .metrics()
            .borrow()
            .last_log_index
            .unwrap_or(0))
    }

    /// The log id (term and index) of the last entry this replica holds, applied
    /// or not (for a promoted one, the entry it was promoted at); `None` for an
    /// empty log. An index alone does not name an entry (`keyhold_raftlog`'s
    /// `tail.rs`): copies are compared by this.
    pub async fn last_log_id(&self) -> Result<Option<openraft::LogId<NodeId>>, Error> {
        let mut log = self.inner.log.clone();
        let state = openraft::storage::RaftLogStorage::get_log_state(&mut log)
            .await
            .map_err(|e| Error::Raft(format!("reading the log's state: {e}")))?;
        Ok(state.last_log_id)
    }

    /// Stops the Raft instance (the writer then answers `Unavailable`) and flushes the
    /// region tree.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| Error::Raft(format!("shutdown: {e}")))?;
        self.inner.state_machine.flush().await
    }
}

/// Gathers waiting commands into one entry at a time until the queue closes or the
/// Raft instance stops.
async fn write_loop(
    raft: RegionRaft,
    mut jobs: mpsc::Receiver<Job>,
    stats: Arc<CommitStats>,
    written: Arc<Mutex<VecDeque<Written>>>,
) {
    let mut entry = Gathering::default();
    while entry.start(&mut jobs).await {
        take_queued(&mut jobs, &mut entry);
        if entry.upkeep_only() {
            ride_along(&raft, &mut jobs, &mut entry).await;
            take_queued(&mut jobs, &mut entry);
        }
        let batch = entry.batch();
        let pending = &mut entry.jobs;
        let started = Instant::now();
        let wait = Duration::from_millis(REGION_WRITE_WAIT_MS);
        let Ok(outcome) = tokio::time::timeout(wait, raft.client_write(batch)).await else {
            // A leader cut off from its peers neither commits nor learns it was
            // deposed until it hears from them: answer rather than hold every
            // later command behind this entry. Whether it commits later is
            // unknown; a retry with the same key replays it if it did.
            tracing::warn!(
                commands = pending.len(),
                "region entry not committed in time"
            );
            for job in pending.drain(..) {
                let _ = job.reply.send(Err(Error::Unavailable));
            }
            continue;
        };
        let (index, answers) = match outcome {
            Ok(response) => {
                remember(&written, response.log_id.index, pending.len(), started);
                match response.data {
                    EntryOutcome::Commands(answers) if answers.len() == pending.len() => {
                        (response.log_id.index, answers)
                    }
                    other => {
                        tracing::error!(?other, "a command entry answered unlike its commands");
                        fail(&stats, pending);
                        return;
                    }
                }
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                // Another member leads (or nobody yet): nothing of this entry was
                // appended here; the callers may go to the leader.
                for job in pending.drain(..) {
                    let _ = job.reply.send(Err(Error::NotLeader {
                        leader: forward.leader_id,
                    }));
                }
                continue;
            }
            Err(e) => {
                // Raft stopped or failed: a caller's retry with the same key replays
                // whatever of this entry was committed.
                tracing::error!(error = %e, "region group write failed; refusing further commands");
                fail(&stats, pending);
                return;
            }
        };
        stats.record(pending.len(), started.elapsed());
        for (job, answer) in pending.drain(..).zip(answers) {
            // A waiter that gave up is fine to skip: its command is applied.
            let _ = job.reply.send(Ok(Logged {
                value: answer,
                index,
            }));
        }
    }
}

/// The commands of the entry the writer gathers: at most `BATCH_COMMANDS_MAX`
/// of them and `BATCH_BYTES_MAX` bytes, or one larger command alone (at most
/// `ENTRY_COMMANDS_BYTES_MAX`: `submit` refuses larger ones). A command that
/// would take the entry past either is held, and starts the next entry.
#[derive(Default)]
struct Gathering {
    jobs: Vec<Job>,
    bytes: usize,
    held: Option<Job>,
}

impl Gathering {
    /// Starts a new entry with the held command, or else the next one to
    /// arrive; false once the queue is closed and nothing is held.
    async fn start(&mut self, jobs: &mut mpsc::Receiver<Job>) -> bool {
        self.jobs.clear();
        self.bytes = 0;
        let first = match self.held.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return false,
            },
        };
        self.offer(first)
    }

    /// Adds `job` to the entry if it has room; otherwise holds it for the next
    /// entry and answers false: this one is full.
    fn offer(&mut self, job: Job) -> bool {
        let room =
            self.jobs.len() < BATCH_COMMANDS_MAX && self.bytes + job.bytes <= BATCH_BYTES_MAX;
        if !room && !self.jobs.is_empty() {
            debug_assert!(self.held.is_none(), "a full entry takes no more offers");
            self.held = Some(job);
            return false;
        }
        self.bytes += job.bytes;
        self.jobs.push(job);
        true
    }

    /// True once the entry takes no more commands.
    fn full(&self) -> bool {
        self.held.is_some() || self.jobs.len() >= BATCH_COMMANDS_MAX
    }

    fn upkeep_only(&self) -> bool {
        self.jobs
            .iter()
            .all(|job| job.command.lane() == Lane::Upkeep)
    }

    fn batch(&self) -> CommandBatch {
        CommandBatch {
            commands: self.jobs.iter().map(|job| job.command.clone()).collect(),
        }
    }
}

/// Moves every command already queued into the entry, until it is full.
fn take_queued(jobs: &mut mpsc::Receiver<Job>, entry: &mut Gathering) {
    while !entry.full() {
        match jobs.try_recv() {
            Ok(job) => {
                entry.offer(job);
            }
            Err(_) => break,
        }
    }
}

/// Where the leader's stream to its followers (the region's other voters and
/// a standby's learners) stands (`stream_to_followers`).
#[derive(Debug, PartialEq, Eq)]
enum FollowerStream {
    /// No follower one round trip away: none at all, one far behind (catching
    /// up) or not replicated to, or this member does not lead.
    Absent,
    /// A follower has not yet matched the leader's last entry: an AppendEntries
    /// is on its way to it, and a new entry would wait for its answer.
    Busy,
    /// Every follower holds the leader's last entry.
    Idle,
}

fn stream_to_followers(metrics: &openraft::RaftMetrics<NodeId, NodeInfo>) -> FollowerStream {
    let Some(replication) = metrics.replication.as_ref() else {
        return FollowerStream::Absent;
    };
    follower_stream(
        metrics.last_log_index.unwrap_or(0),
        waited_for(metrics.id, replication),
    )
}

/// The matched index of each member that `ride_along` waits for: every one
/// the leader replicates to, voter or learner (the leader's own progress is
/// its log's flush, which no AppendEntries holds up). openraft 0.9 sends a
/// voter of the region one AppendEntries at a time as it does a standby's
/// learner, so an upkeep entry sent alone to the region's followers held the
/// next client entry one replication round, at one client on every order
/// (issue 40).
fn waited_for(
    leader: NodeId,
    replication: &BTreeMap<NodeId, Option<openraft::LogId<NodeId>>>,
) -> Vec<Option<u64>> {
    replication
        .iter()
        .filter(|(id, _)| **id != leader)
        .map(|(_, matched)| matched.map(|l| l.index))
        .collect()
}

/// `stream_to_followers` on the leader's last log index and each follower's
/// matched index (`None`: not replicated to yet).
fn follower_stream(last: u64, matched: impl IntoIterator<Item = Option<u64>>) -> FollowerStream {
    let mut learners = 0usize;
    let mut busy = false;
    for matched in matched {
        learners += 1;
        let Some(matched) = matched else {
            return FollowerStream::Absent;
        };
        if matched + UPKEEP_RIDE_LAG_ENTRIES_MAX < last {
            return FollowerStream::Absent;
        }
        busy |= matched < last;
    }
    match (learners, busy) {
        (0, _) => FollowerStream::Absent,
        (_, true) => FollowerStream::Busy,
        (_, false) => FollowerStream::Idle,
    }
}

/// With only upkeep commands in `entry` (`Command::lane`) and a follower one
/// round trip away, waits for a client's command to share their entry: while
/// an AppendEntries is on its way to a follower, and `UPKEEP_RIDE_GRACE_MS`
/// after the followers hold everything, at most `UPKEEP_RIDE_WAIT_MS` in all.
/// Returns at once without followers (a single voter). openraft 0.9 sends a
/// member one AppendEntries at a time, so an entry of upkeep alone (a relay
/// round, just after the order it delivers) sent right before a client's
/// command would hold that command a whole round trip: an inter-region one
/// to a standby, and one replication round (a follower's log flush) to the
/// region's other voters.
async fn ride_along(raft: &RegionRaft, jobs: &mut mpsc::Receiver<Job>, entry: &mut Gathering) {
    let mut metrics = raft.metrics();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(UPKEEP_RIDE_WAIT_MS);
    let mut grace: Option<tokio::time::Instant> = None;
    loop {
        let stream = stream_to_followers(&metrics.borrow_and_update());
        let until = match stream {
            FollowerStream::Absent => return,
            FollowerStream::Busy => deadline,
            FollowerStream::Idle => *grace.get_or_insert_with(|| {
                deadline
                    .min(tokio::time::Instant::now() + Duration::from_millis(UPKEEP_RIDE_GRACE_MS))
            }),
        };
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { return };
                let client = job.command.lane() == Lane::Client;
                if !entry.offer(job) || client || entry.full() {
                    return;
                }
            }
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(until) => return,
        }
    }
}

/// The group's clock until its Raft instance stops: every
/// `REGION_HEARTBEAT_INTERVAL_MS` the leader's heartbeats (a no-op on
/// followers), a campaign when the election timer says one is due
/// (`election.rs`), and the snapshot the state machine's policy called for
/// since the last one.
/// Turns each of openraft's metrics reports into a record of when a majority
/// last confirmed this member as leader (`confirmed.rs`), until the Raft instance
/// stops reporting.
async fn note_confirmations(
    mut metrics: watch::Receiver<openraft::RaftMetrics<NodeId, NodeInfo>>,
    confirmed: Arc<Confirmations>,
) {
    loop {
        {
            let m = metrics.borrow_and_update();
            if m.state == ServerState::Leader {
                let since_ack = m.millis_since_quorum_ack.map(Duration::from_millis);
                confirmed.note(m.current_term, Instant::now(), since_ack);
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

async fn ticks(
    raft: RegionRaft,
    state_machine: RegionStateMachine,
    mut elections: ElectionTimer,
    longer_logs: LongerLogs,
) {
    let mut ticker = tokio::time::interval(Duration::from_millis(REGION_HEARTBEAT_INTERVAL_MS));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if raft.trigger().heartbeat().await.is_err() {
            return;
        }
        let longer_log = longer_logs.last_seen();
        let Ok(seen) = raft
            .with_raft_state(move |state| election_seen(state, longer_log))
            .await
        else {
            return;
        };
        if elections.due(&seen, Instant::now()) && raft.trigger().elect().await.is_err() {
            return;
        }
        // openraft ignores the call while it builds one already; the state
        // machine asks again after that build.
        if state_machine.take_snapshot_wanted() && raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// What the election timer needs: openraft's state, and when the network last
/// noted a longer log.
fn election_seen(
    state: &openraft::RaftState<NodeId, NodeInfo, tokio::time::Instant>,
    longer_log: Option<Instant>,
) -> Seen {
    let role = match state.server_state {
        ServerState::Leader => Role::Leader,
        ServerState::Candidate => Role::Candidate,
        ServerState::Follower => Role::Follower,
        ServerState::Learner | ServerState::Shutdown => Role::NoVoter,
    };
    Seen {
        role,
        voters: state.membership_state.effective().voter_ids().count(),
        vote_committed: state.vote_ref().is_committed(),
        vote_changed: state.vote_last_modified().map(|at| at.into_std()),
        longer_log,
    }
}

/// A seed for a member's election draws: members of a group differ in node
/// id, and a restarted member draws differently from its last run.
fn election_seed(node: NodeId) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ node.rotate_left(32)
}

/// On a leader, the highest log index that a majority of `replicas` hold (a
/// replica the leader does not replicate to holds nothing); `None` on any other
/// member, or without replicas.
fn majority_matched(
    metrics: &openraft::RaftMetrics<NodeId, NodeInfo>,
    replicas: &[NodeId],
) -> Option<u64> {
    let replication = metrics.replication.as_ref()?;
    let held = replicas
        .iter()
        .map(|id| {
            replication
                .get(id)
                .and_then(|m| m.map(|l| l.index))
                .unwrap_or(0)
        })
        .collect();
    held_by_majority(held)
}

/// The highest of `held` (each replica's last index) that a majority of the
/// replicas reach: the (n/2 + 1)-th best. `None` without replicas.
fn held_by_majority(mut held: Vec<u64>) -> Option<u64> {
    if held.is_empty() {
        return None;
    }
    held.sort_unstable_by(|a, b| b.cmp(a));
    Some(held[held.len() / 2])
}

/// True when a majority of the standby's copies answered an AppendEntries sent
/// within `max_lag` of `now` (`sent`: when each copy's latest answered one was
/// sent, `None` when none was).
fn answered_within(sent: &[Option<Instant>], max_lag: Duration, now: Instant) -> bool {
    let fresh = sent
        .iter()
        .filter(|s| s.is_some_and(|s| now.saturating_duration_since(s) <= max_lag))
        .count();
    !sent.is_empty() && fresh > sent.len() / 2
}

/// True when everything of a log ending at `last` that is not `matched` (by a
/// majority of the standby's copies; `None`: unknown) was appended within
/// `max_lag` of `now`, by what `written` remembers (ascending by index). The
/// first entry past `matched` decides, being the oldest; one `written` does
/// not hold has no known age and counts as too old.
fn confirmed_within(
    matched: Option<u64>,
    last: u64,
    written: &VecDeque<Written>,
    max_lag: Duration,
    now: Instant,
) -> bool {
    let Some(matched) = matched else {
        return false;
    };
    if matched >= last {
        return true;
    }
    let first = written.partition_point(|w| w.index <= matched);
    match written.get(first) {
        Some(w) if w.index == matched + 1 => now.saturating_duration_since(w.at) <= max_lag,
        _ => false,
    }
}

/// Keeps the last `WRITTEN_ENTRIES_KEPT_MAX` entries this writer appended.
fn remember(written: &Mutex<VecDeque<Written>>, index: u64, commands: usize, at: Instant) {
    let mut log = written.lock().expect("not poisoned");
    if log.len() >= WRITTEN_ENTRIES_KEPT_MAX {
        log.pop_front();
    }
    log.push_back(Written {
        index,
        commands: commands as u64,
        at,
    });
}

fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>) -> Error {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => Error::NotLeader {
            leader: forward.leader_id,
        },
        RaftError::APIError(e) => Error::Raft(format!("membership change: {e}")),
        RaftError::Fatal(e) => Error::Raft(format!("membership change: {e}")),
    }
}

fn fail(stats: &CommitStats, pending: &mut Vec<Job>) {
    stats.mark_failed();
    for job in pending.drain(..) {
        let _ = job.reply.send(Err(Error::Unavailable));
    }
}

#[cfg(test)]
mod tests {
    use super::{
        answered_within, confirmed_within, follower_stream, held_by_majority, take_queued,
        waited_for, FollowerStream, Gathering, Opened, Written,
    };

    #[test]
    fn a_leader_restarted_in_its_term_reads_only_once_it_applied_the_log_it_opened_with() {
        // Chaos seed 1106: the leader of term 7 crashed with entries up to 40
        // in its log, applied up to 31 in its flushed tree; openraft restarts
        // it as the leader of term 7.
        let opened = Opened {
            term: 7,
            last_log_index: 40,
        };
        assert!(!opened.applied_since(7, 31));
        assert!(!opened.applied_since(7, 39));
        assert!(opened.applied_since(7, 40));
        assert!(opened.applied_since(7, 41));
        // Elected in a later term, its first entry comes after the whole log.
        assert!(opened.applied_since(8, 31));
    }
    use crate::command::Command;
    use crate::limits::{
        BATCH_BYTES_MAX, ENTRY_BYTES_MAX, ENTRY_COMMANDS_BYTES_MAX, QUEUE_COMMANDS_MAX,
        UPKEEP_RIDE_LAG_ENTRIES_MAX,
    };
    use crate::raft::{CommandBatch, Entry, RegionConfig};
    use crate::test_common::{scope, T0};
    use crate::{command_bytes, Error, Job};
    use keyhold_core::scope::Namespace;
    use keyhold_core::{Outcome, OwnerToken, StoredResponse};
    use keyhold_raftlog::codec::encoded_len;
    use keyhold_raftlog::limits::{APPEND_ENVELOPE_BYTES_MAX, RPC_BODY_BYTES_MAX};
    use openraft::raft::AppendEntriesRequest;
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};
    use std::collections::{BTreeMap, VecDeque};
    use std::time::{Duration, Instant};
    use tokio::sync::{mpsc, oneshot};

    /// A majority of the standby's copies must have answered lately: a cut
    /// that found the log idle stops acknowledgements within the lag too.
    #[test]
    fn writes_are_allowed_only_while_a_majority_of_copies_answered_within_the_lag() {
        let start = Instant::now();
        let lag = Duration::from_millis(1_000);
        let at = |ms: u64| start + Duration::from_millis(ms);
        let three = [Some(at(0)), Some(at(500)), None];
        assert!(answered_within(&three, lag, at(1_000)));
        // Only the copy answered at 500 ms is fresh at 1,001 ms: one of three.
        assert!(!answered_within(&three, lag, at(1_001)));
        assert!(answered_within(&[Some(at(0))], lag, at(1_000)));
        assert!(!answered_within(&[Some(at(0))], lag, at(1_001)));
        assert!(!answered_within(&[None, None, None], lag, at(0)));
        // No copies: nothing confirms anything.
        assert!(!answered_within(&[], lag, at(0)));
    }

    #[test]
    fn writes_are_allowed_while_the_oldest_unconfirmed_entry_is_within_the_lag() {
        let start = Instant::now();
        let lag = Duration::from_millis(1_000);
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Entries 5..=7 appended at 0, 400 and 900 ms; 4 and before were
        // appended by a predecessor (no age known).
        let written: VecDeque<Written> = [(5, 0), (6, 400), (7, 900)]
            .into_iter()
            .map(|(index, ms)| Written {
                index,
                commands: 1,
                at: at(ms),
            })
            .collect();
        let allowed = |matched, now| confirmed_within(matched, 7, &written, lag, at(now));
        // Everything confirmed: always allowed, however late.
        assert!(allowed(Some(7), 60_000));
        // 6 and 7 unconfirmed: 6, appended at 400 ms, decides.
        assert!(allowed(Some(5), 1_400));
        assert!(!allowed(Some(5), 1_401));
        assert!(allowed(Some(6), 1_900));
        assert!(!allowed(Some(6), 1_901));
        // The first unconfirmed entry is a predecessor's: unknown age.
        assert!(!allowed(Some(3), 1));
        // Not the leader, or no copy replicated to.
        assert!(!allowed(None, 1));
    }

    /// A claim's completion whose stored response has a body of `body` bytes.
    fn completion(n: u64, body: usize) -> Command {
        Command::Complete {
            scope: scope(Namespace::Claims, &format!("key-{n}")),
            token: OwnerToken {
                generation: n,
                nonce: n,
            },
            outcome: Outcome::Succeeded,
            response: Some(StoredResponse {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: vec![b'x'; body],
            }),
            resource_id: None,
            now: T0,
            response_ttl_ms: 3_600_000,
        }
    }

    /// A completion of exactly `ENTRY_COMMANDS_BYTES_MAX` encoded bytes: the
    /// largest command the log takes.
    fn largest_completion(n: u64) -> Command {
        let mut body = ENTRY_COMMANDS_BYTES_MAX - 1024;
        loop {
            let bytes = command_bytes(&completion(n, body)).unwrap_or(usize::MAX);
            match bytes.cmp(&ENTRY_COMMANDS_BYTES_MAX) {
                std::cmp::Ordering::Equal => return completion(n, body),
                std::cmp::Ordering::Less => body += ENTRY_COMMANDS_BYTES_MAX - bytes,
                std::cmp::Ordering::Greater => body -= 1,
            }
        }
    }

    /// The largest position a log id or vote may name: its varints are longest.
    fn last_log_id() -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(u64::MAX, u64::MAX), u64::MAX)
    }

    /// Every entry the writer gathers from a queue of the largest commands
    /// crosses to a member in one AppendEntries: claim completions with 64
    /// KiB responses, and commands as large as the log takes, queued by the
    /// thousand, make entries of at most `BATCH_BYTES_MAX` of commands (one
    /// larger command alone) and `ENTRY_BYTES_MAX` in all, each of which, with
    /// the request's envelope, stays below the body limit members accept.
    /// Before, the writer took up to `BATCH_COMMANDS_MAX` queued commands
    /// whatever their size: a 64 MiB entry, which no member took, sent again
    /// forever while every later entry waited behind it.
    #[test]
    fn entries_of_the_largest_commands_cross_in_one_append() {
        let (jobs, mut queue) = mpsc::channel(QUEUE_COMMANDS_MAX);
        let mut commands: Vec<Command> = (0..1000).map(|n| completion(n, 64 * 1024)).collect();
        commands.extend((1000..1003).map(largest_completion));
        commands.push(completion(1003, 64 * 1024));
        let queued = commands.len();
        let mut replies = Vec::new();
        for command in commands {
            let (reply, answer) = oneshot::channel();
            let bytes = command_bytes(&command).expect("fits an entry");
            jobs.try_send(Job {
                command,
                bytes,
                reply,
            })
            .unwrap();
            replies.push(answer);
        }
        drop(jobs);
        let mut entry = Gathering::default();
        let (mut taken, mut entries, mut seen) = (0, 0, Vec::new());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        while runtime.block_on(entry.start(&mut queue)) {
            take_queued(&mut queue, &mut entry);
            let entry_bytes = entry.bytes;
            let command_count = entry.jobs.len();
            let log_entry = Entry {
                log_id: last_log_id(),
                payload: EntryPayload::Normal(CommandBatch {
                    commands: entry.jobs.drain(..).map(|job| job.command).collect(),
                }),
            };
            if let EntryPayload::Normal(batch) = &log_entry.payload {
                for command in &batch.commands {
                    if let Command::Complete { token, .. } = command {
                        seen.push(token.generation);
                    }
                }
            }
            let encoded = encoded_len(&log_entry).unwrap();
            assert!(
                command_count == 1 || entry_bytes <= BATCH_BYTES_MAX,
                "{command_count} commands of {entry_bytes} bytes in one entry"
            );
            assert!(
                encoded <= ENTRY_BYTES_MAX,
                "an entry of {command_count} commands ({entry_bytes} bytes) encodes to {encoded}"
            );
            let append = AppendEntriesRequest::<RegionConfig> {
                vote: Vote::new_committed(u64::MAX, u64::MAX),
                prev_log_id: Some(last_log_id()),
                leader_commit: Some(last_log_id()),
                entries: vec![log_entry],
            };
            let body = encoded_len(&append).unwrap();
            assert!(
                body - encoded <= APPEND_ENVELOPE_BYTES_MAX,
                "{body} - {encoded}"
            );
            assert!(
                body < RPC_BODY_BYTES_MAX,
                "an AppendEntries of {body} bytes"
            );
            taken += command_count;
            entries += 1;
        }
        assert_eq!(taken, queued);
        let order: Vec<u64> = (0..queued as u64).collect();
        assert_eq!(seen, order, "every command went, in order, once");
        // 32 completions per entry, and each of the largest alone.
        assert!(entries > 3 + 1000 / 32, "{entries} entries");
        // One byte more than the log takes never reaches the queue.
        let larger = completion(9, ENTRY_COMMANDS_BYTES_MAX);
        let refused = command_bytes(&larger);
        assert!(
            matches!(refused, Err(Error::CommandTooLarge { max, .. }) if max == ENTRY_COMMANDS_BYTES_MAX),
            "{refused:?}"
        );
    }

    /// Upkeep waits only for followers one round trip away: every follower
    /// replicated to and within one append of the leader's last entry.
    #[test]
    fn upkeep_waits_for_a_follower_one_append_behind_and_for_no_other() {
        use FollowerStream::{Absent, Busy, Idle};
        let far = 100 - UPKEEP_RIDE_LAG_ENTRIES_MAX - 1;
        let edge = 100 - UPKEEP_RIDE_LAG_ENTRIES_MAX;
        let cases: &[(&[Option<u64>], FollowerStream)] = &[
            (&[], Absent),
            (&[Some(100)], Idle),
            (&[Some(100), Some(100)], Idle),
            (&[Some(99)], Busy),
            (&[Some(100), Some(97)], Busy),
            (&[Some(edge)], Busy),
            (&[Some(far)], Absent),
            (&[Some(100), Some(far)], Absent),
            (&[None], Absent),
            (&[Some(99), None], Absent),
        ];
        for (matched, stream) in cases {
            assert_eq!(
                follower_stream(100, matched.iter().copied()),
                *stream,
                "{matched:?}"
            );
        }
    }

    /// Upkeep waits for a voter of its own region as for a learner: openraft
    /// sends a voter one AppendEntries at a time too, so an upkeep entry sent
    /// alone held the next client entry a whole replication round (issue 40).
    /// The leader's own progress is not waited for.
    #[test]
    fn upkeep_waits_for_a_voter_one_append_behind() {
        use FollowerStream::{Absent, Busy, Idle};
        let at = |index: u64| {
            Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                index,
            ))
        };
        let voters = |leader, a, b| BTreeMap::from([(1, leader), (2, a), (3, b)]);
        let cases = [
            (voters(at(100), at(99), at(100)), Busy),
            (voters(at(100), at(100), at(100)), Idle),
            (voters(at(99), at(100), at(100)), Idle),
            (voters(at(100), None, at(100)), Absent),
        ];
        for (replication, stream) in cases {
            assert_eq!(
                follower_stream(100, waited_for(1, &replication)),
                stream,
                "{replication:?}"
            );
        }
        let alone = BTreeMap::from([(1, at(100))]);
        assert_eq!(follower_stream(100, waited_for(1, &alone)), Absent);
    }

    #[test]
    fn a_majority_of_replicas_holds_the_middle_index() {
        assert_eq!(held_by_majority(vec![]), None);
        assert_eq!(held_by_majority(vec![7]), Some(7));
        // Two replicas: both must hold it.
        assert_eq!(held_by_majority(vec![9, 4]), Some(4));
        // Three: any two; the laggard does not count.
        assert_eq!(held_by_majority(vec![0, 12, 10]), Some(10));
        assert_eq!(held_by_majority(vec![5, 0, 0]), Some(0));
        // Four: three of them.
        assert_eq!(held_by_majority(vec![8, 8, 3, 9]), Some(8));
    }
}
