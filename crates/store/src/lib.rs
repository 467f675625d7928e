//! The region store: keyhold's durable state for one region, on sled, as the
//! state machine of the region's openraft group.
//!
//! Every mutation is a [`Command`] sent to the group's writer (`raft::RegionGroup`),
//! which gathers whatever commands are waiting into one log entry: one append and
//! one flush of the Raft log make the whole entry durable (group commit), and each
//! waiter is answered once the entry is applied. Applying is serial, so
//! check-then-write races cannot happen.
//!
//! Reads run concurrently on the caller's thread, straight from the region tree.
//! They wait for nothing: the state machine applies an entry only after it is
//! committed, which in a single-voter group means flushed in the local log (in a
//! larger one, in the logs of a majority), so no value in the tree is one a crash
//! could take back. A crash may lose applied values sled had not flushed yet, but
//! the group applies them again from the log before `Store::open` returns.
//!
//! **Architecture Invariant:** the store knows nothing of HTTP or routing; it
//! speaks in commands and outcomes from `keyhold-core`.

// Unit tests share the integration tests' commands (`tests/common`), which name
// this crate as its users do.
#[cfg(test)]
extern crate self as keyhold_store;
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_common;

mod api;
pub use api::{Completion, StandbyMatched};
mod codec;
pub mod command;
mod consumer;
mod format;
mod format1;
mod keys;
pub mod limits;
mod machine;
mod overlay;
pub mod raft;
mod reconcile;
mod stats;

pub use command::{
    Applied, BatchOutcome, CarriedEvent, ChangePage, ClaimOutcome, Command, CompleteOutcome,
    ConsumeOutcome, Cursor, CursorOutcome, EraseOutcome, ExportEntry, GuardOutcome,
    HeartbeatOutcome, InventoryEffect, Lane, OrderOutcome, OutboxEvent, PaymentEffect, Processed,
    Rejection, ReplayOutcome, Reservation, SweepOutcome, TenantGuard, Tracking,
};
pub use consumer::Consumer;
pub use format::STORAGE_FORMAT;
/// A copy's log beyond what it knew committed (what `Store::promote` answers
/// and `Store::failover_cut` reads).
pub use keyhold_raftlog::LogTail;
pub use reconcile::{Disposition, LostTenant, Orphan, OrphanKind, Reconciliation};
pub use stats::CommitStats;

use keyhold_core::{Marker, Order, Record, Scope, TenantId, UnixMillis};
use machine::MarksSeen;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storage error: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt stored value: {0}")]
    Corrupt(String),
    #[error("the store is not accepting commands (stopped or failed)")]
    Unavailable,
    #[error("the store's command queue is full")]
    Overloaded,
    #[error("store I/O: {0}")]
    Io(std::io::Error),
    /// The state machine refused the command; it wrote nothing.
    #[error("command refused: {0}")]
    Rejected(Rejection),
    /// The region group's Raft log could not be opened.
    #[error("raft log: {0}")]
    RaftLog(#[from] keyhold_raftlog::Error),
    /// The region group's Raft instance failed to start, initialize or stop.
    #[error("region raft: {0}")]
    Raft(String),
    /// Building, reading or installing a region snapshot failed.
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// This member of the region group does not lead it; `leader` does, if known.
    #[error("not the region group's leader (leader: {leader:?})")]
    NotLeader {
        leader: Option<keyhold_raftlog::NodeId>,
    },
    /// The command is larger than a region log entry may hold
    /// (`limits::ENTRY_COMMANDS_BYTES_MAX`): refused before it reached the log,
    /// it wrote nothing and never will.
    #[error(
        "command of {bytes} bytes refused: a region log entry holds at most {max} bytes of commands"
    )]
    CommandTooLarge { bytes: usize, max: usize },
    /// The directory does not hold a region store this release can open.
    #[error("region store in {}: {reason}", dir.display())]
    DataDir { dir: PathBuf, reason: String },
}

/// Checks (or creates, or migrates) the directory's storage format, off the
/// async threads.
async fn check_format(dir: &Path) -> Result<(), Error> {
    let owned = dir.to_path_buf();
    tokio::task::spawn_blocking(move || format::check_or_create(&owned))
        .await
        .map_err(|e| Error::Raft(format!("format check task: {e}")))?
}

struct Job {
    command: Command,
    /// The command's encoded bytes, as its log entry holds it.
    bytes: usize,
    reply: oneshot::Sender<Result<Logged<Applied>, Error>>,
}

/// A value of the region store together with the index of the region log entry
/// it came from: for a command's answer, the entry that carried the command
/// (everything the answer says is in the log up to there); for a stored value,
/// the entry that last wrote it. Whoever must know that an answer is held
/// somewhere else too (a standby region: `"survival": "region"` tenants) waits
/// for that index to be replicated there.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged<T> {
    pub value: T,
    pub index: u64,
}

impl<T> Logged<T> {
    /// The same index with the value turned into another.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Logged<U> {
        Logged {
            value: f(self.value),
            index: self.index,
        }
    }
}

/// Queues `command` for a region group's writer and waits for its answer: a full
/// queue is `Overloaded` at once, a refusal `Error::Rejected`.
async fn submit(jobs: &mpsc::Sender<Job>, command: Command) -> Result<Logged<Applied>, Error> {
    let bytes = command_bytes(&command)?;
    let (reply, rx) = oneshot::channel();
    let job = Job {
        command,
        bytes,
        reply,
    };
    jobs.try_send(job).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => Error::Overloaded,
        mpsc::error::TrySendError::Closed(_) => Error::Unavailable,
    })?;
    let answer = rx.await.map_err(|_| Error::Unavailable)??;
    match answer.value {
        Applied::Rejected(rejection) => Err(Error::Rejected(rejection)),
        _ => Ok(answer),
    }
}

/// `command`'s encoded bytes in a log entry; `CommandTooLarge` for one that no
/// entry may hold, which must not reach the log: an entry a member cannot
/// take in one AppendEntries is sent again forever and holds every later one.
fn command_bytes(command: &Command) -> Result<usize, Error> {
    // Our own plain data types always encode.
    let bytes = keyhold_raftlog::codec::encoded_len(command).expect("a command encodes");
    let max = limits::ENTRY_COMMANDS_BYTES_MAX;
    if bytes > max {
        return Err(Error::CommandTooLarge { bytes, max });
    }
    Ok(bytes)
}

/// A cheap, cloneable handle to one region store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    group: raft::RegionGroup,
    machine: machine::Machine,
    /// Where the sweeper's scan of records and markers goes on (`None`: from
    /// the start). In memory: a new leader, or a restart, starts a new pass.
    sweep_cursor: std::sync::Mutex<Option<Vec<u8>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the store in `dir` as the only voter of its region group,
    /// `member`: checks the directory's storage format (`format.rs`; a directory
    /// of format 1 is migrated first, `format1.rs`), starts the group, and
    /// returns once this node leads it and has applied every committed entry. The
    /// group stops with `shutdown`, or when the last handle is dropped.
    pub async fn open(dir: &Path, member: raft::Member) -> Result<Store, Error> {
        check_format(dir).await?;
        let group =
            raft::RegionGroup::start_single_voter(dir, &member.group, member.node, member.info)
                .await?;
        Ok(Store::over(dir, group))
    }

    /// `open` with `options` instead of the defaults, and `network` to reach the
    /// learners the group may gain (a standby region's copies).
    pub async fn open_with<N>(
        dir: &Path,
        member: raft::Member,
        network: N,
        options: raft::GroupOptions,
    ) -> Result<Store, Error>
    where
        N: openraft::network::RaftNetworkFactory<raft::RegionConfig> + keyhold_raftlog::NotesVotes,
    {
        check_format(dir).await?;
        let group = raft::RegionGroup::start_single_voter_with(
            dir,
            &member.group,
            member.node,
            member.info,
            network,
            options,
        )
        .await?;
        Ok(Store::over(dir, group))
    }

    fn over(dir: &Path, group: raft::RegionGroup) -> Store {
        let machine = machine::Machine::new(group.state_machine().tree().clone());
        Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                group,
                machine,
                sweep_cursor: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Opens (or creates) the store in `dir` as `member` of a region group of several
    /// members, reached through `network`: checks the directory's storage format
    /// as `open` does and starts the group as `bootstrap` says (`Voters`: a
    /// pristine replica initializes the group with them, every voter with the
    /// same set; `Joiner`: it waits to be added by the leader, as a replacement
    /// node does). Returns at once: which member leads is known later
    /// (`leadership`); only the leader's `execute` and reads are current.
    pub async fn open_replica<N>(
        dir: &Path,
        member: raft::Member,
        network: N,
        bootstrap: raft::Bootstrap,
        options: raft::GroupOptions,
    ) -> Result<Store, Error>
    where
        N: openraft::network::RaftNetworkFactory<raft::RegionConfig> + keyhold_raftlog::NotesVotes,
    {
        if let raft::Bootstrap::Voters(voters) = &bootstrap {
            assert!(
                voters.contains_key(&member.node),
                "a bootstrapping replica is one of its group's voters"
            );
        }
        check_format(dir).await?;
        let group =
            raft::RegionGroup::start_with(dir, &member, network, bootstrap, options).await?;
        Ok(Store::over(dir, group))
    }

    /// This replica's part in its region group: only a `Ready` leader executes and
    /// reads what every acknowledged command wrote.
    pub fn leadership(&self) -> raft::Leadership {
        self.inner.group.leadership()
    }

    /// Applies one command; answers once the log entry holding it is committed and
    /// applied. A command the state machine refused (`Applied::Rejected`, a value
    /// in the log) reaches the caller as `Error::Rejected`. Callers that know the
    /// command's kind use its typed method instead (`create_order`, `claim`, ...,
    /// in `api.rs`), which answers with that kind's outcome.
    pub async fn execute(&self, command: Command) -> Result<Applied, Error> {
        Ok(self.execute_logged(command).await?.value)
    }

    /// `execute`, with the index of the log entry that carried the command.
    pub async fn execute_logged(&self, command: Command) -> Result<Logged<Applied>, Error> {
        self.inner.group.execute(command).await
    }

    pub fn stats(&self) -> &CommitStats {
        self.inner.group.stats()
    }

    /// The region group this store writes through (its Raft instance serves the
    /// group's routes on the node's Raft listener).
    pub fn group(&self) -> &raft::RegionGroup {
        &self.inner.group
    }

    /// True while the region group takes commands and its last write succeeded.
    pub fn is_healthy(&self) -> bool {
        self.inner.group.is_healthy()
    }

    /// Stops the region group and flushes the region tree. Commands after it are
    /// answered `Unavailable`.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.inner.group.shutdown().await
    }

    /// Promotes this replica (a standby copy of a failed region) to final:
    /// see `raft::RegionGroup::promote`. Returns its tail (`last` is the last
    /// log index applied), the same on every call.
    pub async fn promote(&self) -> Result<keyhold_raftlog::LogTail, Error> {
        self.inner.group.promote().await
    }

    /// The index this replica was promoted at; `None` while it is an ordinary
    /// replica of its group.
    pub fn promoted(&self) -> Result<Option<u64>, Error> {
        self.inner.group.state_machine().promoted()
    }

    /// The last log index applied to this replica's state.
    pub fn applied_index(&self) -> Result<u64, Error> {
        self.inner.group.state_machine().applied_index()
    }

    /// The last log index this replica holds (applied or not).
    pub fn last_log_index(&self) -> Result<u64, Error> {
        self.inner.group.last_log_index()
    }

    /// The term and index of the last entry this replica holds (applied or not);
    /// `(0, 0)` for an empty log.
    pub async fn last_log_position(&self) -> Result<(u64, u64), Error> {
        let last = self.inner.group.last_log_id().await?;
        Ok(last.map_or((0, 0), |id| (id.leader_id.get_term(), id.index)))
    }

    /// The directory this store lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Reads a value of the applied state. Async so that a replica that is not
    /// its group's leader can later wait here for what a read must see.
    async fn read<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, Error> {
        self.inner.machine.get(key)
    }

    pub async fn record(&self, scope: &Scope) -> Result<Option<Record>, Error> {
        self.read(&keys::record(scope)).await
    }

    /// The scope's record with the index of the log entry that last wrote it
    /// (its stamp; a value migrated from storage format 1 carries its old batch
    /// number instead, which may exceed the log's indexes).
    pub async fn record_logged(&self, scope: &Scope) -> Result<Option<Logged<Record>>, Error> {
        let Some(bytes) = self.inner.machine_tree().get(keys::record(scope))? else {
            return Ok(None);
        };
        let (value, index) = codec::decode::<Record>(&bytes)?;
        Ok(Some(Logged { value, index }))
    }

    pub async fn order(&self, order_id: &str) -> Result<Option<Order>, Error> {
        self.read(&keys::order(order_id)).await
    }

    pub async fn order_by_client_order_id(
        &self,
        tenant: &TenantId,
        client_order_id: &str,
    ) -> Result<Option<Order>, Error> {
        let Some(order_id) = self
            .read::<String>(&keys::order_index(tenant, client_order_id))
            .await?
        else {
            return Ok(None);
        };
        self.order(&order_id).await
    }

    /// The order id of the tenant's business marker for `client_order_id`, or
    /// of its order index entry when the marker is gone (expired and swept):
    /// the order this store holds under that client order id.
    pub async fn order_id_by_marker(
        &self,
        tenant: &TenantId,
        client_order_id: &str,
    ) -> Result<Option<String>, Error> {
        if let Some(marker) = self
            .read::<Marker>(&keys::marker(tenant, client_order_id))
            .await?
        {
            return Ok(Some(marker.order_id));
        }
        self.read::<String>(&keys::order_index(tenant, client_order_id))
            .await
    }

    /// Events in the outbox, oldest first, starting after `after_seq`. Every one
    /// is committed (see the crate's doc), so nothing downstream ever acts on an
    /// order a crash could still take back.
    pub async fn outbox_after(
        &self,
        after_seq: u64,
        max: usize,
    ) -> Result<Vec<OutboxEvent>, Error> {
        self.outbox_stamped(after_seq, max)
            .map(|item| item.map(|(event, _)| event))
            .collect()
    }

    /// `outbox_after`, each event with whose it is to take effect for
    /// (`Disposition`, as `Store::disposition` tells it): from the stamp read
    /// with the event, and the tenant's loss marks read once per tenant, or
    /// not at all while this store holds none (a region that never lost a
    /// tenant in a failover). What the relay reads each round.
    pub async fn outbox_after_disposed(
        &self,
        after_seq: u64,
        max: usize,
    ) -> Result<Vec<(OutboxEvent, Disposition)>, Error> {
        let unchanged = overlay::Changes::default();
        let view = self.inner.machine.view(&unchanged);
        let mut marks = MarksSeen::default();
        let mut events = Vec::new();
        for item in self.outbox_stamped(after_seq, max) {
            let (event, written) = item?;
            let disposition = marks.disposition(&view, event.tenant.as_str(), written)?;
            events.push((event, disposition));
        }
        Ok(events)
    }

    /// At most `max` outbox events after `after_seq`, oldest first, each with
    /// the index of the log entry that wrote it.
    fn outbox_stamped(
        &self,
        after_seq: u64,
        max: usize,
    ) -> impl Iterator<Item = Result<(OutboxEvent, u64), Error>> + '_ {
        self.inner
            .machine_tree()
            .range(keys::outbox(after_seq + 1)..keys::outbox(u64::MAX))
            .take(max)
            .map(|item| codec::decode::<OutboxEvent>(&item?.1))
    }

    /// The sequence number of the first kept event that occurred after `since`
    /// (or of the first kept event), and `None` when there is none.
    pub fn first_outbox_seq_after(&self, since: Option<UnixMillis>) -> Result<Option<u64>, Error> {
        for item in self.inner.machine_tree().scan_prefix([keys::OUTBOX]) {
            let (event, _) = codec::decode::<OutboxEvent>(&item?.1)?;
            if since.is_none_or(|s| event.occurred_at > s) {
                return Ok(Some(event.seq));
            }
        }
        Ok(None)
    }

    /// Where a consumer stands in the outbox: every event up to this is handled.
    pub async fn cursor(&self, consumer: Consumer) -> Result<u64, Error> {
        Ok(self
            .read::<u64>(&keys::cursor(consumer))
            .await?
            .unwrap_or(0))
    }

    /// A consumer's cursor with its generation, as a relay round reads it before
    /// delivering: its `AdvanceCursor` carries the generation.
    pub async fn cursor_at(&self, consumer: Consumer) -> Result<Cursor, Error> {
        // The generation first: a replay between the two reads then leaves an
        // older generation with a rewound seq, and the round's move is dropped.
        let generation = self
            .read::<u64>(&keys::cursor_generation(consumer))
            .await?
            .unwrap_or(0);
        Ok(Cursor {
            seq: self.cursor(consumer).await?,
            generation,
        })
    }

    /// The newest outbox event of one tenant (0 when it has none).
    pub fn tenant_last_event_seq(&self, tenant: &TenantId) -> Result<u64, Error> {
        Ok(self
            .inner
            .machine
            .get::<u64>(&keys::tenant_last_event(tenant))?
            .unwrap_or(0))
    }

    pub async fn is_processed(&self, consumer: Consumer, event_id: &str) -> Result<bool, Error> {
        Ok(self
            .read::<Processed>(&keys::processed(consumer, event_id))
            .await?
            .is_some())
    }

    /// The inventory consumer's reservations for one order, by line.
    pub async fn reservations(&self, order_id: &str) -> Result<Vec<Reservation>, Error> {
        self.inner.machine.reservations(order_id)
    }

    /// The tenant's guard: where this store stands with it by epoch (`None`:
    /// never moved, executes). A read of the applied state; the state machine
    /// decides with the same value.
    pub fn guard(&self, tenant: &TenantId) -> Result<Option<TenantGuard>, Error> {
        self.inner.machine.guard(tenant)
    }

    /// Every tenant with a guard, and the guard.
    pub fn guards(&self) -> Result<Vec<(TenantId, TenantGuard)>, Error> {
        let mut out = Vec::new();
        for item in self.inner.machine_tree().scan_prefix(keys::GUARD_PREFIX) {
            let (key, value) = item?;
            let name = String::from_utf8_lossy(&key[keys::GUARD_PREFIX.len()..]).into_owned();
            let tenant = TenantId::parse(&name)
                .map_err(|_| Error::Corrupt(format!("guard of an invalid tenant id {name:?}")))?;
            out.push((tenant, codec::decode::<TenantGuard>(&value)?.0));
        }
        Ok(out)
    }

    /// One page of a tenant's entries for a move: records (orders' and claims'),
    /// markers, the order index and orders, in key order after `after`, adding
    /// entries while their keys and payloads fit in `bytes_max` (always at least
    /// one, so any entry travels). Returns the page and the cursor of the next
    /// page (`None` when done). While the store executes for the tenant, a page
    /// is a consistent cut only together with the tenant's change index
    /// (`Command::TrackChanges`): whatever changed after the page was read is in
    /// the index.
    pub async fn export_tenant(
        &self,
        tenant: &TenantId,
        after: Option<&[u8]>,
        bytes_max: usize,
    ) -> Result<(Vec<ExportEntry>, Option<Vec<u8>>), Error> {
        let mut page = PageBuilder::new(bytes_max);
        let next = self.visit_tenant(tenant, after, |key, value| page.add(key, value))?;
        // `visit_tenant` stopped at an entry that did not fit: the page ends at the
        // one before it, and the next page starts after that one.
        Ok((page.entries, next.and(page.last)))
    }

    /// One page of the tenant's change index after `after` (a changed key), for
    /// a move's later passes: each entry changed by a log entry above `since`
    /// (0: every change since tracking began), as it is now, or its key among
    /// the removed ones when it is gone; sized like `export_tenant`. Returns
    /// the page and the next page's cursor (`None` when done). An entry of the
    /// change index is stamped by the last write that changed its key, so a
    /// key changed both before and after `since` is in the page.
    pub async fn export_changes(
        &self,
        tenant: &TenantId,
        after: Option<&[u8]>,
        bytes_max: usize,
        since: u64,
    ) -> Result<(ChangePage, Option<Vec<u8>>), Error> {
        let tree = self.inner.machine_tree();
        let prefix = keys::changes_of(tenant.as_str().as_bytes());
        let start = match after {
            Some(a) => {
                let mut k = prefix.clone();
                k.extend_from_slice(a);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut page = PageBuilder::new(bytes_max);
        let mut next = None;
        for item in tree.range(start..) {
            let (index_key, stamped) = item?;
            let Some(changed) = index_key.strip_prefix(prefix.as_slice()) else {
                break;
            };
            if codec::stamp(&stamped)? <= since {
                continue;
            }
            let added = match tree.get(changed)? {
                Some(value) => page.add(changed, &value)?,
                None => page.add_removed(changed),
            };
            if !added {
                next = page.last.clone();
                break;
            }
        }
        Ok((
            ChangePage {
                entries: page.entries,
                removed: page.removed,
            },
            next,
        ))
    }

    /// One page of the tenant's outbox events that some consumer of
    /// `consumers` has not handled here (after its cursor, without its
    /// processed entry), in sequence order after `after_seq`, each with the
    /// consumers that did handle it; bounded by `bytes_max` of payload (at
    /// least one event). Returns the page and the sequence number to continue
    /// after (`None` when done). What a failover carries from a promoted copy.
    pub async fn unhandled_events(
        &self,
        tenant: &TenantId,
        consumers: &[Consumer],
        after_seq: u64,
        bytes_max: usize,
    ) -> Result<(Vec<CarriedEvent>, Option<u64>), Error> {
        let mut cursors = Vec::with_capacity(consumers.len());
        for &consumer in consumers {
            cursors.push((consumer, self.cursor(consumer).await?));
        }
        // Every event at or below the lowest cursor is handled by all.
        let start = cursors
            .iter()
            .map(|c| c.1)
            .min()
            .unwrap_or(u64::MAX)
            .max(after_seq);
        let (mut page, mut bytes) = (Vec::new(), 0usize);
        let tree = self.inner.machine_tree();
        for item in tree.range(keys::outbox(start.saturating_add(1))..keys::outbox(u64::MAX)) {
            let (event, _) = codec::decode::<OutboxEvent>(&item?.1)?;
            if &event.tenant != tenant {
                continue;
            }
            let mut handled_by = Vec::new();
            for &(consumer, cursor) in &cursors {
                if cursor >= event.seq || self.is_processed(consumer, &event.event_id).await? {
                    handled_by.push(consumer);
                }
            }
            if handled_by.len() == cursors.len() {
                continue;
            }
            if !page.is_empty() && bytes + event.payload.len() > bytes_max {
                let last = page.last().map(|c: &CarriedEvent| c.event.seq);
                return Ok((page, last));
            }
            bytes += event.payload.len();
            page.push(CarriedEvent { event, handled_by });
        }
        Ok((page, None))
    }

    /// The move tracking each tenant's changes, for every tracked tenant.
    pub fn tracked_tenants(&self) -> Result<Vec<(TenantId, Tracking)>, Error> {
        let mut out = Vec::new();
        for item in self.inner.machine_tree().scan_prefix(keys::TRACKING_PREFIX) {
            let (key, value) = item?;
            let name = String::from_utf8_lossy(&key[keys::TRACKING_PREFIX.len()..]).into_owned();
            let tenant = TenantId::parse(&name).map_err(|_| {
                Error::Corrupt(format!("tracking of an invalid tenant id {name:?}"))
            })?;
            out.push((tenant, codec::decode::<Tracking>(&value)?.0));
        }
        Ok(out)
    }

    /// How many keys the tenant's change index holds.
    pub fn change_count(&self, tenant: &TenantId) -> usize {
        self.inner
            .machine_tree()
            .scan_prefix(keys::changes_of(tenant.as_str().as_bytes()))
            .count()
    }

    /// How many events a failover carried for the tenant that wait, unseen
    /// by the relays, for that failover to be done (`Command::ImportEvents`).
    pub fn held_events(&self, tenant: &TenantId) -> Result<u64, Error> {
        let held = self
            .inner
            .machine_tree()
            .scan_prefix(keys::held_events_of(tenant));
        let mut count = 0;
        for item in held {
            item?;
            count += 1;
        }
        Ok(count)
    }

    /// How many entries a move of the tenant would carry.
    pub fn tenant_entry_count(&self, tenant: &TenantId) -> Result<u64, Error> {
        let mut count = 0;
        self.visit_tenant(tenant, None, |_, _| {
            count += 1;
            Ok(true)
        })?;
        Ok(count)
    }

    /// Calls `f` with each of the tenant's movable entries after `after`, in key
    /// order, until it returns false; then returns the last key visited (the next
    /// page's cursor), or `None` when every entry was visited.
    fn visit_tenant(
        &self,
        tenant: &TenantId,
        after: Option<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, Error>,
    ) -> Result<Option<Vec<u8>>, Error> {
        let tree = self.inner.machine_tree();
        for prefix in keys::tenant_prefixes(tenant) {
            let start = match after {
                Some(a) if a >= prefix.as_slice() => {
                    let mut next = a.to_vec();
                    next.push(0);
                    next
                }
                _ => prefix.clone(),
            };
            for item in tree.range(start..) {
                let (key, value) = item?;
                if !key.starts_with(&prefix) {
                    break;
                }
                // Orders are keyed by id alone: skip other tenants' orders.
                if prefix == [keys::ORDER]
                    && codec::order_tenant(codec::payload(&value)?)? != tenant.as_str()
                {
                    continue;
                }
                if !f(&key, &value)? {
                    return Ok(Some(key.to_vec()));
                }
            }
        }
        Ok(None)
    }

    /// Every entry but the store's own bookkeeping, as key and payload (without
    /// the batch stamp), in key order: for tests that compare whole states.
    #[doc(hidden)]
    pub fn state_for_tests(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.inner
            .machine_tree()
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| k.first() != Some(&keys::META_PREFIX))
            .map(|(k, v)| {
                let payload = codec::payload(&v).map(<[u8]>::to_vec).unwrap_or_default();
                (k.to_vec(), payload)
            })
            .collect()
    }

    /// Counts entries per kind, for tests and diagnostics.
    pub fn count_prefix(&self, kind: EntryKind) -> usize {
        self.inner
            .machine_tree()
            .scan_prefix([kind.prefix()])
            .count()
    }

    /// Bytes the store's directory occupies on disk: the Raft log, the region
    /// tree and the last snapshot.
    pub fn size_on_disk(&self) -> u64 {
        dir_bytes(&self.inner.dir)
    }
}

/// Kinds of stored entry, for [`Store::count_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Record,
    Order,
    Marker,
    Outbox,
    ExpiryIndex,
    Processed,
    Reservation,
}

impl EntryKind {
    fn prefix(self) -> u8 {
        match self {
            EntryKind::Record => keys::RECORD,
            EntryKind::Order => keys::ORDER,
            EntryKind::Marker => keys::MARKER,
            EntryKind::Outbox => keys::OUTBOX,
            EntryKind::ExpiryIndex => keys::EXPIRY,
            EntryKind::Processed => keys::PROCESSED,
            EntryKind::Reservation => keys::RESERVATION,
        }
    }
}

/// A page of a move under construction, sized by the bytes of its keys and
/// payloads (at least one entry, however large).
struct PageBuilder {
    bytes_max: usize,
    bytes: usize,
    entries: Vec<ExportEntry>,
    /// Keys of deleted entries (only a change page has them).
    removed: Vec<Vec<u8>>,
    /// Entries and removals added.
    count: usize,
    /// The key of the last entry or removal added: the next page's cursor.
    last: Option<Vec<u8>>,
}

impl PageBuilder {
    fn new(bytes_max: usize) -> PageBuilder {
        PageBuilder {
            bytes_max,
            bytes: 0,
            entries: Vec::new(),
            removed: Vec::new(),
            count: 0,
            last: None,
        }
    }

    /// Room for `size` more bytes? Takes them if so.
    fn fits(&mut self, size: usize) -> bool {
        if self.count > 0 && self.bytes + size > self.bytes_max {
            return false;
        }
        self.bytes += size;
        self.count += 1;
        true
    }

    /// Adds a stored entry (its stamped value); false when the page is full.
    fn add(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        let payload = codec::payload(value)?;
        if !self.fits(key.len() + payload.len()) {
            return Ok(false);
        }
        self.entries.push(ExportEntry {
            key: key.to_vec(),
            payload: payload.to_vec(),
        });
        self.last = Some(key.to_vec());
        Ok(true)
    }

    /// Notes a removed key; false when the page is full.
    fn add_removed(&mut self, key: &[u8]) -> bool {
        if !self.fits(key.len()) {
            return false;
        }
        self.removed.push(key.to_vec());
        self.last = Some(key.to_vec());
        true
    }
}

impl Inner {
    fn machine_tree(&self) -> &sled::Tree {
        self.machine.tree()
    }
}

/// The sizes of the files under `dir`, recursively; entries that vanish while it
/// walks (a snapshot being replaced) count as nothing.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}
