//! Commands: every mutation of the region state as a serializable value.
//!
//! A command carries everything its effect depends on, including `now`, the new
//! order's id and the owner token's nonce, so applying the same command sequence to
//! an empty store gives the same state on any machine. That is what lets the apply
//! loop sit behind a Raft log later without touching the decision logic.

use keyhold_core::{
    Item, Order, Outcome, OwnerToken, Record, RecordState, Scope, StoredResponse, TenantId,
    UnixMillis,
};
use serde::{Deserialize, Serialize};

use crate::consumer::Consumer;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    CreateOrder {
        scope: Scope,
        fingerprint: String,
        /// Built by the caller with a fresh id and `created_at = now`; used only if
        /// the decision is to create.
        order: Box<Order>,
        now: UnixMillis,
        response_ttl_ms: u64,
        marker_ttl_ms: u64,
        /// How long the order's outbox event is kept once delivered.
        processed_ttl_ms: u64,
    },
    Claim {
        scope: Scope,
        fingerprint: String,
        lease_ms: u64,
        nonce: u64,
        now: UnixMillis,
        response_ttl_ms: u64,
    },
    Complete {
        scope: Scope,
        token: OwnerToken,
        outcome: Outcome,
        response: Option<StoredResponse>,
        resource_id: Option<String>,
        now: UnixMillis,
        response_ttl_ms: u64,
    },
    Heartbeat {
        scope: Scope,
        token: OwnerToken,
        lease_ms: u64,
        now: UnixMillis,
    },
    /// Physically deletes up to `entries_max` entries whose expiry passed. An
    /// outbox event is deleted, with its processed entries, only once every
    /// consumer in `consumers` is past it; the first event that is not due or
    /// not yet delivered keeps the ones after it.
    Sweep {
        now: UnixMillis,
        entries_max: u32,
        consumers: Vec<Consumer>,
    },
    /// Erases up to `entries_max` entries of a deleted tenant: its records,
    /// markers, order index and orders, the events a failover carried that
    /// are still held (with their marks), and its outbox events that some
    /// consumer in `consumers` has not had yet (delivered events stay, and so
    /// do the consumers' effects). Repeat until `Erased { more: false }`.
    EraseTenant {
        tenant: TenantId,
        entries_max: u32,
        consumers: Vec<Consumer>,
    },
    /// The inventory consumer's effect: reserve the order's item lines, together
    /// with its processed-message entry, unless the event was processed already.
    ConsumeInventory {
        event_id: String,
        order_id: String,
        items: Vec<Item>,
        now: UnixMillis,
        processed_ttl_ms: u64,
    },
    /// The payments consumer's effect: record the charge's result on the order,
    /// together with its processed-message entry, unless processed already.
    ConsumePayment {
        event_id: String,
        order_id: String,
        charge_id: String,
        paid: bool,
        now: UnixMillis,
        processed_ttl_ms: u64,
    },
    /// A consumer has handled every event up to and including `seq`, in a relay
    /// round that read the cursor at `generation`. If an outbox replay happened
    /// since (the generation moved on), the move is dropped: the round must not
    /// undo the replay's rewind.
    AdvanceCursor {
        consumer: Consumer,
        seq: u64,
        generation: u64,
    },
    /// Re-publishes kept events from `from_seq` on: every consumer's cursor moves
    /// back to just before it and its generation becomes the number of the
    /// batch that applied the replay.
    ReplayOutbox {
        from_seq: u64,
        consumers: Vec<Consumer>,
    },
    /// Stops all execution for a tenant in this region: it is moving away under
    /// `operation_id`, at the tenant's `epoch`. Every command queued before the
    /// fence is applied before it, so once the fence answers, nothing for the
    /// tenant can change here any more. Refused (a value, nothing changes) when
    /// the store's guard belongs to a later epoch or another operation.
    Fence {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    },
    /// Writes a tenant's entries exported by its previous home, for the move
    /// `operation_id` at `epoch`; the tenant is `Importing` here (nothing executes)
    /// until it is owned. Refused when the store has moved past that move: it
    /// owns the tenant at a later epoch, or imports it for another operation.
    Import {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        entries: Vec<ExportEntry>,
    },
    /// The registry says this region owns the tenant at `epoch`: execution may
    /// resume (after an aborted move) or start (after a completed one). Every
    /// fence or import of an earlier epoch is over, and refused from now on.
    Own { tenant: TenantId, epoch: u64 },
    /// A move under `operation_id` at `epoch` starts copying the tenant away
    /// while this store still executes for it: from now on every write or
    /// deletion of one of the tenant's movable entries also notes the key in the
    /// tenant's change index, in the same atomic batch, so that the move's
    /// final pass copies only what changed. Repeating it keeps the index.
    /// Refused (a value, nothing changes) when the store's guard belongs to a
    /// later epoch or is another move's.
    TrackChanges {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    },
    /// The tenant's move `operation_id` ended: stop tracking its changes and
    /// delete up to `entries_max` entries of its change index. Repeat until
    /// `Erased { more: false }`. Tracking for another move is left alone.
    EndTracking {
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
    },
    /// `Import`, for the final pass of a move: writes `entries` and deletes the
    /// tenant's entries `removed` (deleted at the old home since the first pass).
    ImportChanges {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        page: ChangePage,
    },
    /// The region's standby copy holds the log up to `index`: every replica of
    /// the region may purge its log up to there (never further), so that a region
    /// that comes back after a failover still holds what its standby lacked.
    /// Recorded only forward.
    StandbyMatched { index: u64 },
    /// A failover `operation_id` carries `tenant`'s outbox events over from the
    /// failed region's promoted copy (the events some consumer there had not
    /// handled), at the tenant's guard `epoch` (`Importing`, as `Import`).
    /// Each is *held*, outside the outbox, so no relay here sees it while
    /// the failover may still fail (the failed region then keeps the tenant
    /// and delivers the event itself): `OwnImported` makes it a new event of
    /// this outbox with the same event id, marked processed for the
    /// consumers in its `handled_by`, so only the others deliver it; any
    /// other end of the `Importing` guard drops it. An event id imported
    /// before is skipped, so the command can be repeated. `now` dates those
    /// processed entries.
    ImportEvents {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        events: Vec<CarriedEvent>,
        now: UnixMillis,
    },
    /// The registry gives this region `tenant` at `epoch` by the failover
    /// `operation_id`, which imported it here at that same epoch: the store
    /// owns it (as `Own`), its `Importing` guard of that operation and epoch
    /// giving way too, and the events that failover carried join the outbox
    /// (in the failed region's order, after every event already there). A
    /// move's import is of an earlier epoch than the one its completion
    /// gives, so `Own` suffices there; a failover's is not.
    OwnImported {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    },
    /// Stores the report of a failover away from this region (its orphans),
    /// unless one is stored for that failover already: the first stays, since
    /// the orphans cannot be read again once the lost tenants' data is being
    /// erased. Answers the stored report.
    RecordReconciliation {
        reconciliation: Box<crate::reconcile::Reconciliation>,
    },
    /// The lost tenants' data of the recorded reconciliation `operation_id` is
    /// erased: it is done. Refused when none is recorded.
    FinishReconciliation { operation_id: String },
    /// The failover `operation_id` that imported `tenant` here failed: while
    /// the tenant's guard is that failover's `Importing`, erases up to
    /// `entries_max` of its entries, held and undelivered events (as `EraseTenant`),
    /// and with the last page drops the guard and the marks of the events
    /// that failover carried (so a later failover carries them again). Any
    /// other guard is left alone (`Erased { entries: 0, more: false }`).
    /// Repeat until `Erased { more: false }`.
    AbandonImport {
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
        consumers: Vec<Consumer>,
    },
    /// One relay round of the inventory consumer: each event's effect as
    /// `ConsumeInventory` (reserve its item lines with its processed-message
    /// entry, unless processed already, also earlier in this same command),
    /// then, with `cursor`, the cursor move of `AdvanceCursor` in the same
    /// atomic write. The move stops short of any event this command refused.
    /// Answers `Applied::ConsumedBatch`, one outcome per event in order.
    ConsumeInventoryBatch {
        events: Vec<InventoryEffect>,
        now: UnixMillis,
        processed_ttl_ms: u64,
        cursor: Option<Cursor>,
    },
    /// `ConsumeInventoryBatch` for the payments consumer: each event's charge
    /// result as `ConsumePayment`. An event whose order this store does not
    /// hold is refused alone (`Err(PaymentForMissingOrder)` in its place,
    /// nothing of it written, so it is delivered again); the others apply, and
    /// the cursor stops just before it.
    ConsumePaymentBatch {
        events: Vec<PaymentEffect>,
        now: UnixMillis,
        processed_ttl_ms: u64,
        cursor: Option<Cursor>,
    },
    /// The failover `operation_id` re-homed `tenant` away from this region
    /// from the standby's copy of this region's log up to `at`: recorded by
    /// the returning region's reconciliation once the tenant is fenced here,
    /// so that nothing of the tenant's is written after it. From then on this
    /// store's consumers take no effect for an event of the tenant written
    /// before it (`Disposition`): one written at or below `at` is in the
    /// copy, and the failover carried it to the new home, which delivers it;
    /// one written above `at` is an orphan's, which reconciliation lists for a
    /// person to compensate (its payment is only looked up at the provider,
    /// never charged). Events written after it (the tenant moved back) are
    /// this store's again. The first mark of a failover stays. Answers
    /// `Applied::Lost` with the stored mark. Added after every older variant,
    /// so older logs decode as before.
    MarkLost {
        tenant: TenantId,
        operation_id: String,
        at: u64,
    },
    /// Releases up to `entries_max` of the inventory reservations this store
    /// made for `tenant` that the failover `operation_id` (marked with
    /// `MarkLost`) made a second time in the new home: those of an event
    /// the promoted copy held (written at or below `at`) whose inventory
    /// processed entry here was written above `at`. This region handled it
    /// after the last entry the copy received (in the lease's last moments
    /// before an isolation stopped it), so the copy carried the event as
    /// unhandled and the new home reserved it too. The processed entries
    /// stay, so nothing reserves it here again. Without the mark nothing is
    /// released. Answers `Erased`; repeat until `more` is false.
    ReleaseCarriedReservations {
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
    },
    /// The failover `operation_id` that imported `tenant` here at `epoch` is
    /// done (the registry's decision is final; the caller checks, as for
    /// `OwnImported`): while the tenant's guard is that failover's
    /// `Importing`, moves its held events into the outbox as `OwnImported`
    /// does, in the failed region's order, up to `bytes_max` payload bytes
    /// (at least one event). Repeat while `more`, then `OwnImported` lifts
    /// the guard with nothing left to release, so that no one command's
    /// changes grow with the tenant's carried events. Any other guard
    /// releases nothing. Answers `Erased` (`entries`: the events released).
    ReleaseHeld {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        bytes_max: u32,
    },
    /// Deletes each of the records and markers `keys` names that is due at
    /// `now` (its `expires_at` at or before it); a key that is gone, not due
    /// (rewritten with a later expiry since it was listed) or of another kind
    /// is passed over. Sent by the sweeper with the keys its scan of the
    /// leader's tree found due (`Store::sweep`): records and markers have no
    /// expiry index entries (a release before this one wrote them, and
    /// `Sweep` still walks those). Answers `Sweep`.
    SweepKeys { now: UnixMillis, keys: Vec<Vec<u8>> },
    /// Page `page` (from 0) of the orphans of the reconciliation report of
    /// the failover `operation_id`, staged before the report is recorded
    /// (`RecordReport` lists the pages): a full report is tens of megabytes,
    /// more than one log entry may hold. Written only while no report of the
    /// failover is recorded (a page of a recorded one would change it); a
    /// second pass (a new leader) stages its pages over the first's. Answers
    /// `Staged`.
    StageOrphans {
        operation_id: String,
        page: u32,
        orphans: Vec<crate::reconcile::Orphan>,
    },
    /// Records `report` (its `orphans` empty) with the `pages` pages staged
    /// for it, `listed` orphans in all, and drops any page beyond them,
    /// unless a report of its failover is recorded already (the first one
    /// stays, as with `RecordReconciliation`). Answers the stored report;
    /// refused when the staged pages are not those.
    RecordReport {
        report: Box<crate::reconcile::Reconciliation>,
        pages: u32,
        listed: u64,
    },
    /// `Import` or `ImportChanges` by the driver of the move `operation_id`
    /// at `epoch` that holds the move's lease at `generation`: writes
    /// `page.entries` and deletes the tenant's `page.removed` under that
    /// move's `Importing` guard. The store keeps, beside the guard, the
    /// highest generation that imported under it, and refuses a page of a
    /// lower one (`GuardOutcome::Superseded`, nothing changes): a superseded
    /// driver's page, paced or queued behind the registry check that let it
    /// through, must not land over what its successor imported since.
    /// Added after every older variant, so older logs decode as before;
    /// their `Import` and `ImportChanges` count as generation 0.
    ImportPage {
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        generation: u64,
        page: ChangePage,
    },
}

/// One event's inventory effect within `Command::ConsumeInventoryBatch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryEffect {
    /// The event's outbox sequence number: where the cursor stops if the
    /// effect is refused.
    pub seq: u64,
    pub event_id: String,
    pub order_id: String,
    pub items: Vec<Item>,
}

/// One event's payment result within `Command::ConsumePaymentBatch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentEffect {
    /// As in `InventoryEffect`.
    pub seq: u64,
    pub event_id: String,
    pub order_id: String,
    pub charge_id: String,
    pub paid: bool,
}

/// What a consumer's batch command did (`Applied::ConsumedBatch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// One per event of the command, in its order: written now, processed
    /// before, or refused alone (nothing of that event written).
    pub events: Vec<Result<ConsumeOutcome, Rejection>>,
    /// The cursor move's outcome, `None` when the command carried none.
    pub cursor: Option<CursorOutcome>,
}

/// An outbox event a failover carries from the failed region's copy, with
/// the consumers that handled it there already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedEvent {
    pub event: OutboxEvent,
    pub handled_by: Vec<Consumer>,
}

impl CarriedEvent {
    /// The wire form of one page of carried events (bincode 2, standard config).
    pub fn encode_page(events: &[CarriedEvent]) -> Vec<u8> {
        crate::codec::encode_plain(&events)
    }

    pub fn decode_page(bytes: &[u8]) -> Result<Vec<CarriedEvent>, crate::Error> {
        crate::codec::decode_plain(bytes)
    }
}

/// The move whose copy a store tracks a tenant's changes for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracking {
    pub operation_id: String,
    pub epoch: u64,
}

/// One page of a move's final pass: the tenant's entries changed since the
/// first pass began, as they are now, and the keys of those deleted meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangePage {
    pub entries: Vec<ExportEntry>,
    pub removed: Vec<Vec<u8>>,
}

impl ChangePage {
    /// The wire form (bincode 2, standard config).
    pub fn encode(&self) -> Vec<u8> {
        crate::codec::encode_plain(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<ChangePage, crate::Error> {
        crate::codec::decode_plain(bytes)
    }
}

/// Where a region store stands with one tenant, by epoch (the registry's count of
/// ownership changes). A tenant without a guard (never moved) executes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantGuard {
    /// This store executes the tenant's commands; it owns the tenant at `epoch`.
    Owned { epoch: u64 },
    /// Moving away under `operation_id` from `epoch`: nothing executes.
    Fenced { operation_id: String, epoch: u64 },
    /// Arriving under `operation_id` at `epoch`: nothing executes until owned.
    Importing { operation_id: String, epoch: u64 },
}

impl TenantGuard {
    pub fn epoch(&self) -> u64 {
        match self {
            TenantGuard::Owned { epoch }
            | TenantGuard::Fenced { epoch, .. }
            | TenantGuard::Importing { epoch, .. } => *epoch,
        }
    }

    /// True when the tenant's commands may execute under this guard.
    pub fn executes(&self) -> bool {
        matches!(self, TenantGuard::Owned { .. })
    }
}

/// The answer to `Fence`, `Import`, `ImportChanges`, `Own` and `TrackChanges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuardOutcome {
    /// Took effect (or already had): the tenant's guard is now `guard`;
    /// `imported` entries were written.
    Accepted { guard: TenantGuard, imported: u64 },
    /// Nothing changed: the store's guard `current` is of a later epoch or
    /// another operation.
    Refused { current: TenantGuard },
    /// Nothing changed: a driver of the same move at the later lease
    /// `generation` imported under the tenant's guard (`Command::ImportPage`).
    Superseded { generation: u64 },
}

/// One stored entry of a tenant, as moved between regions: the key and the
/// value's payload without the local batch stamp (the importing store stamps
/// its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportEntry {
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

impl ExportEntry {
    /// The wire form of one page of a move (bincode 2, standard config).
    pub fn encode_page(entries: &[ExportEntry]) -> Vec<u8> {
        crate::codec::encode_plain(&entries)
    }

    pub fn decode_page(bytes: &[u8]) -> Result<Vec<ExportEntry>, crate::Error> {
        crate::codec::decode_plain(bytes)
    }
}

impl Command {
    /// The wire and log form of a command (bincode 2, standard config).
    pub fn encode(&self) -> Vec<u8> {
        crate::codec::encode_plain(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Command, crate::Error> {
        crate::codec::decode_plain(bytes)
    }

    /// Whether somebody waits for this command's answer (`Lane::Client`) or it
    /// only keeps the region in order (`Lane::Upkeep`: the relay's effects and
    /// cursor moves, sweeps, the standby's match), so that its entry may wait
    /// a moment for a client's command to ride with (`raft/group.rs`).
    pub fn lane(&self) -> Lane {
        match self {
            Command::ConsumeInventory { .. }
            | Command::ConsumePayment { .. }
            | Command::ConsumeInventoryBatch { .. }
            | Command::ConsumePaymentBatch { .. }
            | Command::AdvanceCursor { .. }
            | Command::Sweep { .. }
            | Command::SweepKeys { .. }
            | Command::StandbyMatched { .. } => Lane::Upkeep,
            // Moves, failovers, reconciliation and outbox replays are driven by
            // an operator's call that waits for them: they go at once.
            _ => Lane::Client,
        }
    }
}

/// Who waits for a command (`Command::lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A client or an operator waits for the answer: the command goes into
    /// the next entry at once.
    Client,
    /// Background upkeep: its entry may wait for a client's command.
    Upkeep,
}

/// One `order.created` event, written in the same atomic batch as its order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEvent {
    pub seq: u64,
    pub event_id: String,
    pub kind: String,
    pub tenant: TenantId,
    pub order_id: String,
    pub occurred_at: UnixMillis,
    /// Kept until then, and after that until every consumer has it.
    pub expires_at: UnixMillis,
    /// The event as JSON: the order body plus its item lines.
    pub payload: Vec<u8>,
}

/// A carried event waiting for the failover that carried it to be done
/// (`Command::ImportEvents`): the event as the failed region's outbox had it
/// with the consumers that handled it there, and when it was imported (the
/// date of its processed entries once `Command::OwnImported` releases it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeldEvent {
    pub carried: CarriedEvent,
    pub imported_at: UnixMillis,
}

/// A consumer's memory of one handled event: `(consumer, event_id)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Processed {
    pub consumer: Consumer,
    pub event_id: String,
    pub at: UnixMillis,
    pub expires_at: UnixMillis,
}

/// One stock reservation of the inventory consumer: one per item line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub order_id: String,
    pub line: u32,
    pub sku: String,
    pub quantity: u64,
    pub event_id: String,
    pub at: UnixMillis,
}

/// Where a consumer stands in the outbox; in a batch command, where its
/// round moves it and the generation that round read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cursor {
    /// Every event up to and including this sequence number is handled.
    pub seq: u64,
    /// The batch number of the last outbox replay (0 before any);
    /// `AdvanceCursor` carries the one it read.
    pub generation: u64,
}

/// What became of an `AdvanceCursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CursorOutcome {
    Advanced,
    /// The cursor is already at or past the sequence number.
    Behind,
    /// An outbox replay happened after the round read the cursor: nothing moved.
    Superseded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsumeOutcome {
    /// The effect was written now.
    Applied,
    /// The event was processed before; nothing was written.
    Duplicate,
    /// The event is not this store's to take effect for (its tenant was lost
    /// in a failover, `Command::MarkLost`); nothing was written, and the
    /// event is settled here: the cursor may move past it.
    NotOurs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OrderOutcome {
    Created {
        response: StoredResponse,
    },
    Replayed {
        response: StoredResponse,
    },
    KeyReused,
    InProgress {
        retry_after_ms: u64,
    },
    MarkerHit {
        order: Box<Order>,
    },
    MarkerConflict,
    /// The tenant is fenced here (moving away): nothing was executed.
    Fenced,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClaimOutcome {
    Acquired {
        token: OwnerToken,
        lease_expires_at: UnixMillis,
        recovery: bool,
    },
    Replay {
        record: Record,
    },
    InProgress {
        retry_after_ms: u64,
    },
    KeyReused,
    Fenced,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CompleteOutcome {
    Completed {
        state: RecordState,
    },
    /// The same owner completed already (its first answer was lost).
    AlreadyCompleted {
        state: RecordState,
    },
    Stale,
    Fenced,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HeartbeatOutcome {
    Extended { lease_expires_at: UnixMillis },
    Stale,
    Fenced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SweepOutcome {
    pub records: u64,
    pub markers: u64,
    pub events: u64,
    pub processed: u64,
    /// 1 when the walk of the outbox stopped at an event past its expiry that
    /// a consumer has not had yet (it and the events after it are kept).
    pub deferred: u64,
    /// Index entries whose target had been rewritten with a later expiry,
    /// and listed keys (`SweepKeys`) no longer due or gone.
    pub stale_index: u64,
}

/// What `EraseTenant` or `EndTracking` did (`Applied::Erased`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EraseOutcome {
    /// Entries removed.
    pub entries: u64,
    /// It stopped at its limit: send it again.
    pub more: bool,
}

/// What `ReplayOutbox` did (`Applied::Replayed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayOutcome {
    /// How many kept events were re-published.
    pub events: u64,
}

/// Why the state machine refused a command. A refused command writes nothing and
/// is an answer like any other: the same log replays to the same refusal, so a
/// refusal in the region's Raft log (where an apply error is fatal on every
/// replica) never stops a restart. Errors of the store itself
/// (I/O, a stored value that does not decode) stay `Error`s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Rejection {
    /// An imported entry's payload does not decode as the kind its key names.
    #[error("imported entry {index} does not decode: {detail}")]
    ImportUndecodable { index: usize, detail: String },
    /// An imported entry belongs to another tenant than the import names.
    #[error("imported entry {index} belongs to another tenant")]
    ImportForeignEntry { index: usize },
    /// An imported entry is of a kind a tenant move does not carry.
    #[error("imported entry {index} is of a kind a move does not carry")]
    ImportUnexpectedKind { index: usize },
    /// A payment result for an order this store does not hold.
    #[error("payment for missing order {order_id}")]
    PaymentForMissingOrder { order_id: String },
    /// The business marker names an order this store does not hold (a partial
    /// import): answering from it would invent an order.
    #[error("marker points at missing order {order_id}")]
    MarkerWithoutOrder { order_id: String },
    /// A completed order record carries no response to replay (a partial or
    /// foreign import).
    #[error("completed order record without a response")]
    RecordWithoutResponse,
    /// `FinishReconciliation` of a failover whose report is not recorded.
    #[error("no reconciliation recorded for failover {operation_id}")]
    UnknownReconciliation { operation_id: String },
    /// `RecordReport` whose pages are not all staged (or hold another
    /// number of orphans): the report would lose orphans.
    #[error(
        "report of failover {operation_id}: {pages} staged pages of {listed} orphans expected, \
         page {missing} missing or the count differs"
    )]
    ReportPagesMissing {
        operation_id: String,
        pages: u32,
        listed: u64,
        missing: u32,
    },
}

/// What applying a command produced; one variant per kind of outcome, plus
/// `Rejected`. Which variant answers which command is the store's business
/// (`api.rs` maps them once); callers use the typed methods of `Store`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// The command was refused and wrote nothing.
    Rejected(Rejection),
    Order(OrderOutcome),
    Claim(ClaimOutcome),
    Complete(CompleteOutcome),
    Heartbeat(HeartbeatOutcome),
    Sweep(SweepOutcome),
    Consumed(ConsumeOutcome),
    Cursor(CursorOutcome),
    /// How many kept events were re-published.
    Replayed {
        events: u64,
    },
    /// `Fence`, `Import`, `ImportChanges`, `Own`, `TrackChanges`,
    /// `ImportEvents` (`imported`: the events new here) or `OwnImported`.
    Guard(GuardOutcome),
    /// `EraseTenant`, `EndTracking`, `AbandonImport` or
    /// `ReleaseCarriedReservations` removed `entries` (`ReleaseHeld`: moved
    /// them into the outbox);
    /// `more` when it stopped at its limit.
    Erased {
        entries: u64,
        more: bool,
    },
    /// `StandbyMatched`: the index now recorded (the larger of the old and new).
    StandbyMatched {
        index: u64,
    },
    /// `RecordReconciliation` or `FinishReconciliation`: the stored report.
    Reconciliation(Box<crate::reconcile::Reconciliation>),
    /// `ConsumeInventoryBatch` or `ConsumePaymentBatch`.
    ConsumedBatch(BatchOutcome),
    /// `MarkLost`: the stored mark (the first one of that failover).
    Lost(crate::reconcile::LostTenant),
    /// `StageOrphans`: whether the failover's report was recorded already,
    /// so that the page was not written.
    Staged {
        recorded: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raft logs written before the batch commands hold the single-event
    /// commands at their old variant indexes: those bytes still decode to the
    /// same command, and the batch commands come after every older variant.
    #[test]
    fn single_event_commands_keep_their_log_form_and_batches_come_last() {
        // bincode 2, standard config: the variant index, then each field
        // (strings as length and bytes, integers as varints).
        let mut reserve = vec![6, 5];
        reserve.extend_from_slice(b"evt_1");
        reserve.push(5);
        reserve.extend_from_slice(b"ord_1");
        reserve.extend_from_slice(&[0, 7, 9]);
        let decoded = Command::decode(&reserve).unwrap();
        assert_eq!(
            decoded,
            Command::ConsumeInventory {
                event_id: "evt_1".into(),
                order_id: "ord_1".into(),
                items: vec![],
                now: UnixMillis(7),
                processed_ttl_ms: 9,
            }
        );
        assert_eq!(decoded.encode(), reserve);

        let mut pay = vec![7, 5];
        pay.extend_from_slice(b"evt_1");
        pay.push(5);
        pay.extend_from_slice(b"ord_1");
        pay.push(4);
        pay.extend_from_slice(b"ch_1");
        pay.extend_from_slice(&[1, 7, 9]);
        let decoded = Command::decode(&pay).unwrap();
        assert_eq!(
            decoded,
            Command::ConsumePayment {
                event_id: "evt_1".into(),
                order_id: "ord_1".into(),
                charge_id: "ch_1".into(),
                paid: true,
                now: UnixMillis(7),
                processed_ttl_ms: 9,
            }
        );
        assert_eq!(decoded.encode(), pay);

        // AbandonImport (21) is the last variant older logs can hold.
        let inventory = Command::ConsumeInventoryBatch {
            events: vec![],
            now: UnixMillis(7),
            processed_ttl_ms: 9,
            cursor: None,
        };
        assert_eq!(inventory.encode(), [22, 0, 7, 9, 0]);
        let payments = Command::ConsumePaymentBatch {
            events: vec![PaymentEffect {
                seq: 3,
                event_id: "e".into(),
                order_id: "o".into(),
                charge_id: String::new(),
                paid: false,
            }],
            now: UnixMillis(7),
            processed_ttl_ms: 9,
            cursor: Some(Cursor {
                seq: 3,
                generation: 2,
            }),
        };
        let bytes = payments.encode();
        assert_eq!(bytes[0], 23);
        assert_eq!(Command::decode(&bytes).unwrap(), payments);
        // MarkLost (issue 12) comes after the batches: the logs written
        // before it decode as they did.
        let lost = Command::MarkLost {
            tenant: TenantId::parse("t1").unwrap(),
            operation_id: "op".into(),
            at: 5,
        };
        let bytes = lost.encode();
        assert_eq!(bytes[0], 24);
        assert_eq!(Command::decode(&bytes).unwrap(), lost);
        let release = Command::ReleaseCarriedReservations {
            tenant: TenantId::parse("t1").unwrap(),
            operation_id: "op".into(),
            entries_max: 3,
        };
        assert_eq!(release.encode()[0], 25);
        let held = Command::ReleaseHeld {
            tenant: TenantId::parse("t1").unwrap(),
            operation_id: "op".into(),
            epoch: 2,
            bytes_max: 3,
        };
        assert_eq!(held.encode()[0], 26);
    }

    /// The generation of a move's imports (`ImportPage`, issue 37) came after
    /// every older variant: the `Import` and `ImportChanges` bytes of older
    /// logs decode to the same commands.
    #[test]
    fn imports_of_older_logs_decode_as_before_and_import_page_comes_last() {
        // `Import` is variant 11, `ImportChanges` 15; the report's pages
        // (28, 29) were the last before `ImportPage`.
        let report = Command::StageOrphans {
            operation_id: "op".into(),
            page: 0,
            orphans: vec![],
        };
        assert_eq!(report.encode()[0], 28);
        let mut old_import = vec![11, 2];
        old_import.extend_from_slice(b"t1");
        old_import.push(2);
        old_import.extend_from_slice(b"op");
        old_import.extend_from_slice(&[3, 1, 1, b'k', 1, b'v']);
        let entry = ExportEntry {
            key: b"k".to_vec(),
            payload: b"v".to_vec(),
        };
        let decoded = Command::decode(&old_import).unwrap();
        assert_eq!(
            decoded,
            Command::Import {
                tenant: TenantId::parse("t1").unwrap(),
                operation_id: "op".into(),
                epoch: 3,
                entries: vec![entry.clone()],
            }
        );
        assert_eq!(decoded.encode(), old_import);
        let mut old_changes = vec![15, 2];
        old_changes.extend_from_slice(b"t1");
        old_changes.push(2);
        old_changes.extend_from_slice(b"op");
        old_changes.extend_from_slice(&[3, 0, 1, 1, b'r']);
        assert_eq!(
            Command::decode(&old_changes).unwrap(),
            Command::ImportChanges {
                tenant: TenantId::parse("t1").unwrap(),
                operation_id: "op".into(),
                epoch: 3,
                page: ChangePage {
                    entries: vec![],
                    removed: vec![b"r".to_vec()],
                },
            }
        );
        let page = Command::ImportPage {
            tenant: TenantId::parse("t1").unwrap(),
            operation_id: "op".into(),
            epoch: 3,
            generation: 2,
            page: ChangePage {
                entries: vec![entry],
                removed: vec![],
            },
        };
        let bytes = page.encode();
        assert_eq!(bytes[0], 30);
        assert_eq!(Command::decode(&bytes).unwrap(), page);
    }
}
