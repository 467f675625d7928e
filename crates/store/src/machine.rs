//! The region state machine's decisions: what one command answers and writes.
//!
//! Only the region state machine calls `stage`, one command at a time, so a decision read
//! and the writes that follow from it can never interleave with another command's.
//! A command is decided on a `View` (the tree with the changes of its entry's earlier
//! commands over it) and its writes are collected in `Changes`, which the state
//! machine writes with the rest of its entry in one atomic sled batch: an order is
//! never visible without its record, marker and outbox event.

use crate::codec::{
    decode, decode_plain, encode, encode_raw, event_head, order_tenant, payload, stamp,
};
use crate::command::{
    Applied, BatchOutcome, CarriedEvent, ClaimOutcome, Command, CompleteOutcome, ConsumeOutcome,
    Cursor, CursorOutcome, ExportEntry, GuardOutcome, HeartbeatOutcome, HeldEvent, InventoryEffect,
    OrderOutcome, OutboxEvent, PaymentEffect, Processed, Rejection, Reservation, SweepOutcome,
    TenantGuard, Tracking,
};
use crate::consumer::Consumer;
use crate::keys;
use crate::overlay::{Changes, View};
use crate::reconcile::{self, Disposition, LostTenant, Reconciliation, ReportHead};
use crate::Error;
use keyhold_core::{
    check_owner, decide_claim, decide_order, ClaimDecision, Marker, Order, OrderDecision,
    OrderStatus, OwnerCheck, OwnerToken, Record, RecordState, Scope, TenantId, UnixMillis,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// What deciding one command gives: its answer, or why the state refuses it
/// (`Ok(Err(_))`, which writes nothing); `Err` only when the store itself
/// failed.
type Decided = Result<Result<Applied, Rejection>, Error>;

pub struct Machine {
    tree: sled::Tree,
}

/// What one consumer command wrote so far, for the events after it in the
/// same command: reads see only the tree, not the command's own writes.
struct Round {
    now: UnixMillis,
    processed_ttl_ms: u64,
    /// Event ids whose processed entry this command writes.
    processed: HashSet<String>,
    /// Orders this command read or wrote, as they will be.
    orders: HashMap<String, Order>,
    /// The loss marks of the events' tenants (a consumer command writes none).
    marks: MarksSeen,
}

impl Round {
    fn new(now: UnixMillis, processed_ttl_ms: u64) -> Round {
        Round {
            now,
            processed_ttl_ms,
            processed: HashSet::new(),
            orders: HashMap::new(),
            marks: MarksSeen::default(),
        }
    }
}

/// The loss marks (`Command::MarkLost`) one pass over outbox events reads,
/// each tenant's once, and none at all while the store holds no mark (a
/// region that never lost a tenant in a failover: one scan tells). A pass
/// must not write marks itself: the relay's read of a round, or one consumer
/// command.
#[derive(Debug, Default)]
pub(crate) struct MarksSeen {
    any: Option<bool>,
    of: HashMap<String, Vec<(LostTenant, u64)>>,
}

impl MarksSeen {
    /// Whose an event of `tenant` written at log index `written` is to take
    /// effect for, by the marks `view` holds.
    pub(crate) fn disposition(
        &mut self,
        view: &View<'_>,
        tenant: &str,
        written: u64,
    ) -> Result<Disposition, Error> {
        let any = *self
            .any
            .get_or_insert_with(|| view.scan_prefix(keys::LOST_PREFIX).next().is_some());
        if !any {
            return Ok(Disposition::Ours);
        }
        if !self.of.contains_key(tenant) {
            let id = TenantId::parse(tenant)
                .map_err(|_| Error::Corrupt(format!("stored event of tenant {tenant:?}")))?;
            self.of.insert(tenant.to_owned(), view.loss_marks(&id)?);
        }
        Ok(Disposition::of(written, self.of[tenant].iter().cloned()))
    }
}

/// How long a processed-message entry is kept, which decides whether it
/// needs an expiry index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guards {
    /// Its event is in this store's outbox: the entry is deleted together
    /// with the event (the sweep's walk of the outbox), so it guards against
    /// a second delivery for as long as one can come, and needs no index
    /// entry of its own.
    KeptEvent,
    /// No such event here (a single-event command, which names no outbox
    /// position): the entry is swept on its own clock through the index.
    OwnExpiry,
}

/// The writes of one command, plus the batch number stamped on every value.
/// One page of a move's import, as its command names it.
struct Page<'a> {
    operation_id: &'a str,
    epoch: u64,
    /// The importing driver's lease generation (0: a command without one).
    generation: u64,
    entries: &'a [ExportEntry],
    removed: &'a [Vec<u8>],
}

/// The newest driver generation that imported a tenant under its
/// `Importing` guard of `operation_id` at `epoch` (`keys::import_driver`).
#[derive(Debug, Serialize, Deserialize)]
struct ImportDriver {
    operation_id: String,
    epoch: u64,
    generation: u64,
}

struct Writes {
    changes: Changes,
    number: u64,
    /// `(tenant, key)` of every movable entry of a tenant written or deleted:
    /// noted in the change index of each tenant a move tracks (`note_changes`).
    changed: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Writes {
    fn new(number: u64) -> Writes {
        Writes {
            changes: Changes::default(),
            number,
            changed: Vec::new(),
        }
    }

    /// Writes `value` at `key`; a record, marker or order-index key counts as
    /// a change of its tenant.
    fn put<T: serde::Serialize>(&mut self, key: Vec<u8>, value: &T) {
        if let Some(tenant) = keys::tenant_of(&key) {
            self.changed.push((tenant.to_vec(), key.clone()));
        }
        self.changes.insert(key, encode(self.number, value));
    }

    /// Writes an order (keyed by id alone: its tenant is in the value).
    fn put_order(&mut self, order: &Order) {
        let key = keys::order(&order.order_id);
        self.changed
            .push((order.tenant.as_str().as_bytes().to_vec(), key.clone()));
        self.changes.insert(key, encode(self.number, order));
    }

    /// Deletes a primary entry; a record or marker counts as a change of its
    /// tenant, so that a deletion travels with a move too.
    fn remove(&mut self, key: &[u8]) {
        if let Some(tenant) = keys::tenant_of(key) {
            self.changed.push((tenant.to_vec(), key.to_vec()));
        }
        self.changes.remove(key);
    }
    fn put_expiry(&mut self, at: UnixMillis, primary: &[u8]) {
        self.changes.insert(keys::expiry(at, primary), &[][..]);
    }
}

impl Machine {
    pub fn new(tree: sled::Tree) -> Machine {
        Machine { tree }
    }

    pub fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// Rewrites the fences of a store written before guards existed (a bare
    /// `keys::LEGACY_FENCE_PREFIX` key per fenced tenant) as the guard they
    /// stand for: `Fenced` at epoch 0, which any ownership lifts, stamped with
    /// the fence's own log index; a guard already there is kept. Called when
    /// the state machine opens and when it installs a snapshot, before
    /// anything reads a guard, so that reads need one lookup and
    /// `Store::guards` lists them (the node lifts the fences it lists). Not
    /// flushed: a crash before sled's next flush finds the old keys and
    /// rewrites them again. Returns how many it rewrote.
    pub(crate) fn migrate_legacy_fences(&self) -> Result<usize, Error> {
        let fence = TenantGuard::Fenced {
            operation_id: String::new(),
            epoch: 0,
        };
        let mut batch = sled::Batch::default();
        let mut rewritten = 0usize;
        for item in self.tree.scan_prefix(keys::LEGACY_FENCE_PREFIX) {
            let (key, value) = item?;
            let guard = keys::guard_of_legacy_fence(&key).expect("a key of the prefix");
            if !self.tree.contains_key(&guard)? {
                batch.insert(guard, encode(stamp(&value).unwrap_or(0), &fence));
            }
            batch.remove(key);
            rewritten += 1;
        }
        if rewritten > 0 {
            self.tree.apply_batch(batch)?;
            tracing::info!(
                fences = rewritten,
                "fences of a store before guards rewritten as guards"
            );
        }
        Ok(rewritten)
    }

    /// The tree as it is (reads outside any entry being applied).
    pub(crate) fn view<'a>(&'a self, over: &'a Changes) -> View<'a> {
        View::new(&self.tree, over)
    }

    pub fn get<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, Error> {
        self.view(&Changes::default()).get(key)
    }

    /// The records and markers due at `now` among the next `scan_max` of them
    /// after `after` (key order: markers, then records), at most `due_max`.
    pub fn scan_due(
        &self,
        after: Option<&[u8]>,
        now: UnixMillis,
        scan_max: usize,
        due_max: usize,
    ) -> Result<DueScan, Error> {
        let (mut due, mut scanned) = (Vec::new(), 0usize);
        // Both kinds, in key order (`m` before `r`).
        const KINDS: [u8; 2] = [keys::MARKER, keys::RECORD];
        const _: () = assert!(KINDS[0] < KINDS[1]);
        for kind in KINDS {
            let start = match after {
                Some(key) if key.first() > Some(&kind) => continue,
                Some(key) if key.first() == Some(&kind) => std::ops::Bound::Excluded(key.to_vec()),
                _ => std::ops::Bound::Included(vec![kind]),
            };
            let end = std::ops::Bound::Excluded(vec![kind + 1]);
            for item in self.tree.range::<Vec<u8>, _>((start, end)) {
                let (key, value) = item?;
                scanned += 1;
                let expires_at = if kind == keys::RECORD {
                    decode::<Record>(&value)?.0.expires_at
                } else {
                    decode::<Marker>(&value)?.0.expires_at
                };
                if expires_at <= now {
                    due.push(key.to_vec());
                }
                if scanned >= scan_max || due.len() >= due_max {
                    let next = Some(key.to_vec());
                    return Ok(DueScan { due, next });
                }
            }
        }
        Ok(DueScan { due, next: None })
    }

    /// The tenant's guard (`None`: never moved, executes).
    pub fn guard(&self, tenant: &TenantId) -> Result<Option<TenantGuard>, Error> {
        self.view(&Changes::default()).guard(tenant)
    }

    /// Whose the outbox event at `seq` is to take effect for (`Ours` when no
    /// event `event_id` is there).
    pub fn disposition(&self, seq: u64, event_id: &str) -> Result<Disposition, Error> {
        self.view(&Changes::default()).disposition(seq, event_id)
    }

    pub fn reservations(&self, order_id: &str) -> Result<Vec<Reservation>, Error> {
        self.tree
            .scan_prefix(keys::reservations_of(order_id))
            .map(|item| Ok(decode::<Reservation>(&item?.1)?.0))
            .collect()
    }

    /// Decides one command on the tree with `before` over it (the changes of the
    /// entry's earlier commands, not yet in the tree) and returns its answer with
    /// its own changes, applied to neither (`None` when it writes nothing: fenced
    /// or refused). A command the state refuses is answered with
    /// `Applied::Rejected`; `Err` is kept for failures of the store itself, so the
    /// same log always replays to the same state. The Raft state machine writes an
    /// entry's changes with its last applied log id in one batch, so that an
    /// entry's effect and the record of having applied it reach the tree together.
    pub fn stage(
        &self,
        before: &Changes,
        command: &Command,
        batch_number: u64,
    ) -> Result<(Applied, Option<Changes>), Error> {
        self.view(before).stage(command, batch_number)
    }
}

impl View<'_> {
    pub fn get<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, Error> {
        match self.get_raw(key)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(decode::<T>(&bytes)?.0)),
        }
    }

    fn stage(
        &self,
        command: &Command,
        batch_number: u64,
    ) -> Result<(Applied, Option<Changes>), Error> {
        let mut w = Writes::new(batch_number);
        if let Some(fenced) = self.fenced(command)? {
            return Ok((fenced, None));
        }
        match self.decide(&mut w, command)? {
            Ok(applied) => {
                self.note_changes(&mut w)?;
                Ok((applied, Some(w.changes)))
            }
            // Nothing of a refused command reaches the tree.
            Err(rejection) => Ok((Applied::Rejected(rejection), None)),
        }
    }

    /// Adds to `w` a change index entry for each changed key of a tenant whose
    /// changes a move tracks, so the index and the change commit together.
    fn note_changes(&self, w: &mut Writes) -> Result<(), Error> {
        let mut tracked: Vec<(Vec<u8>, bool)> = Vec::new();
        for (tenant, key) in std::mem::take(&mut w.changed) {
            let on = match tracked.iter().find(|(t, _)| *t == tenant) {
                Some((_, on)) => *on,
                None => {
                    let on = self.contains_key(keys::tracking(&tenant))?;
                    tracked.push((tenant.clone(), on));
                    on
                }
            };
            if on {
                w.changes
                    .insert(keys::change(&tenant, &key), encode(w.number, &()));
            }
        }
        Ok(())
    }

    /// The answer to one command and its writes (collected in `w`), or why the
    /// command is refused: each family of commands is decided by its own
    /// function.
    fn decide(&self, w: &mut Writes, command: &Command) -> Decided {
        match command {
            Command::CreateOrder { .. } => self.decide_orders(w, command),
            Command::Claim { .. } | Command::Complete { .. } | Command::Heartbeat { .. } => {
                self.decide_claims(w, command)
            }
            Command::Sweep { .. } | Command::SweepKeys { .. } | Command::EraseTenant { .. } => {
                self.decide_upkeep(w, command)
            }
            Command::ConsumeInventory { .. } | Command::ConsumePayment { .. } => {
                self.decide_consume(w, command)
            }
            Command::ConsumeInventoryBatch { .. } | Command::ConsumePaymentBatch { .. } => {
                self.decide_round(w, command)
            }
            Command::AdvanceCursor { .. } | Command::ReplayOutbox { .. } => {
                self.decide_outbox(w, command)
            }
            Command::Fence { .. }
            | Command::TrackChanges { .. }
            | Command::EndTracking { .. }
            | Command::Own { .. } => self.decide_moves(w, command),
            Command::Import { .. } | Command::ImportChanges { .. } | Command::ImportPage { .. } => {
                self.decide_imports(w, command)
            }
            Command::StandbyMatched { .. }
            | Command::ReleaseHeld { .. }
            | Command::OwnImported { .. }
            | Command::AbandonImport { .. }
            | Command::ImportEvents { .. } => self.decide_failover(w, command),
            Command::RecordReconciliation { .. }
            | Command::StageOrphans { .. }
            | Command::RecordReport { .. }
            | Command::FinishReconciliation { .. }
            | Command::MarkLost { .. }
            | Command::ReleaseCarriedReservations { .. } => self.decide_reconciliation(w, command),
        }
    }

    /// `Command::CreateOrder`: the order its idempotency key makes, or the
    /// answer of the one it made already.
    fn decide_orders(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::CreateOrder {
                scope,
                fingerprint,
                order,
                now,
                response_ttl_ms,
                marker_ttl_ms,
                processed_ttl_ms,
            } => match self.create_order(
                w,
                scope,
                fingerprint,
                order,
                *now,
                [*response_ttl_ms, *marker_ttl_ms, *processed_ttl_ms],
            )? {
                Ok(outcome) => Applied::Order(outcome),
                Err(rejection) => return Ok(Err(rejection)),
            },
            _ => unreachable!("`decide` routes only an order command here"),
        };
        Ok(Ok(applied))
    }

    /// The claim commands (`Claim`, `Complete`, `Heartbeat`): a lease on a
    /// key's work, the work's result, and the lease kept alive meanwhile.
    fn decide_claims(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::Claim {
                scope,
                fingerprint,
                lease_ms,
                nonce,
                now,
                response_ttl_ms,
            } => Applied::Claim(self.claim(
                w,
                scope,
                fingerprint,
                *lease_ms,
                *nonce,
                *now,
                *response_ttl_ms,
            )?),
            Command::Complete {
                scope,
                token,
                outcome,
                response,
                resource_id,
                now,
                response_ttl_ms,
            } => {
                let key = keys::record(scope);
                let record: Option<Record> = self.get(&key)?;
                Applied::Complete(match check_owner(record.as_ref(), *token, *now) {
                    Err(_) => CompleteOutcome::Stale,
                    Ok(OwnerCheck::AlreadyCompleted) => CompleteOutcome::AlreadyCompleted {
                        state: record.expect("checked").state,
                    },
                    Ok(OwnerCheck::Owner) => {
                        let mut record = record.expect("checked");
                        record.state = outcome.state();
                        record.response = response.clone();
                        record.resource_id = resource_id.clone();
                        record.lease_expires_at = *now;
                        record.expires_at = now.plus_ms(*response_ttl_ms);
                        w.put(key, &record);
                        CompleteOutcome::Completed {
                            state: record.state,
                        }
                    }
                })
            }
            Command::Heartbeat {
                scope,
                token,
                lease_ms,
                now,
            } => {
                let key = keys::record(scope);
                let record: Option<Record> = self.get(&key)?;
                Applied::Heartbeat(match check_owner(record.as_ref(), *token, *now) {
                    Ok(OwnerCheck::Owner) => {
                        let mut record = record.expect("checked");
                        record.lease_expires_at = now.plus_ms(*lease_ms);
                        if record.expires_at < record.lease_expires_at {
                            record.expires_at = record.lease_expires_at;
                        }
                        let lease_expires_at = record.lease_expires_at;
                        w.put(key, &record);
                        HeartbeatOutcome::Extended { lease_expires_at }
                    }
                    // Extending a lease on finished work would be meaningless.
                    Ok(OwnerCheck::AlreadyCompleted) | Err(_) => HeartbeatOutcome::Stale,
                })
            }
            _ => unreachable!("`decide` routes only a claim command here"),
        };
        Ok(Ok(applied))
    }

    /// The upkeep commands: the sweeps of what expired and the erasure of a
    /// deleted tenant.
    fn decide_upkeep(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::Sweep {
                now,
                entries_max,
                consumers,
            } => Applied::Sweep(self.sweep(w, *now, *entries_max as usize, consumers)?),
            Command::SweepKeys { now, keys } => Applied::Sweep(self.sweep_keys(w, *now, keys)?),
            Command::EraseTenant {
                tenant,
                entries_max,
                consumers,
            } => self.erase_tenant(w, tenant, *entries_max as usize, consumers)?,
            _ => unreachable!("`decide` routes only an upkeep command here"),
        };
        Ok(Ok(applied))
    }

    /// A consumer's effect of one outbox event, in a command of its own.
    fn decide_consume(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::ConsumeInventory {
                event_id,
                order_id,
                items,
                now,
                processed_ttl_ms,
            } => {
                let effect = InventoryEffect {
                    seq: 0,
                    event_id: event_id.clone(),
                    order_id: order_id.clone(),
                    items: items.clone(),
                };
                let mut round = Round::new(*now, *processed_ttl_ms);
                Applied::Consumed(self.reserve(w, &mut round, &effect, Guards::OwnExpiry)?)
            }
            Command::ConsumePayment {
                event_id,
                order_id,
                charge_id,
                paid,
                now,
                processed_ttl_ms,
            } => {
                let effect = PaymentEffect {
                    seq: 0,
                    event_id: event_id.clone(),
                    order_id: order_id.clone(),
                    charge_id: charge_id.clone(),
                    paid: *paid,
                };
                let mut round = Round::new(*now, *processed_ttl_ms);
                match self.record_payment(w, &mut round, &effect, Guards::OwnExpiry)? {
                    Ok(outcome) => Applied::Consumed(outcome),
                    Err(rejection) => return Ok(Err(rejection)),
                }
            }
            _ => unreachable!("`decide` routes only a consumer's command here"),
        };
        Ok(Ok(applied))
    }

    /// One relay round of a consumer: its events' effects, and its cursor
    /// moved past them in the same write.
    fn decide_round(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::ConsumeInventoryBatch {
                events,
                now,
                processed_ttl_ms,
                cursor,
            } => Applied::ConsumedBatch(self.consume_round(
                w,
                (Consumer::Inventory, *cursor),
                Round::new(*now, *processed_ttl_ms),
                events.iter().map(|e| (e.seq, e)),
                |m, w, round, effect| {
                    // A lost tenant's event reserves nothing here: the new
                    // home reserves what its copy carried, and an orphan's
                    // order no longer exists anywhere.
                    let (disposition, guards) =
                        m.kept_event(&mut round.marks, effect.seq, &effect.event_id)?;
                    Ok(Ok(match disposition {
                        Disposition::Ours => m.reserve(w, round, effect, guards)?,
                        Disposition::Carried | Disposition::Orphan => ConsumeOutcome::NotOurs,
                    }))
                },
            )?),
            Command::ConsumePaymentBatch {
                events,
                now,
                processed_ttl_ms,
                cursor,
            } => Applied::ConsumedBatch(self.consume_round(
                w,
                (Consumer::Payments, *cursor),
                Round::new(*now, *processed_ttl_ms),
                events.iter().map(|e| (e.seq, e)),
                |m, w, round, effect| {
                    // An orphan's payment is recorded: the relay only looked
                    // it up at the provider (an attempt before the loss may
                    // have charged). A carried one is the new home's.
                    let (disposition, guards) =
                        m.kept_event(&mut round.marks, effect.seq, &effect.event_id)?;
                    match disposition {
                        Disposition::Carried => Ok(Ok(ConsumeOutcome::NotOurs)),
                        Disposition::Ours | Disposition::Orphan => {
                            m.record_payment(w, round, effect, guards)
                        }
                    }
                },
            )?),
            _ => unreachable!("`decide` routes only a relay round here"),
        };
        Ok(Ok(applied))
    }

    /// The consumers' cursors over the outbox: one moved on, or all moved
    /// back for a replay.
    fn decide_outbox(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::AdvanceCursor {
                consumer,
                seq,
                generation,
            } => Applied::Cursor(self.advance_cursor(w, *consumer, *seq, *generation)?),
            Command::ReplayOutbox {
                from_seq,
                consumers,
            } => {
                let back_to = from_seq.saturating_sub(1);
                for &consumer in consumers {
                    let key = keys::cursor(consumer);
                    let current: u64 = self.get(&key)?.unwrap_or(0);
                    if current > back_to {
                        w.put(key, &back_to);
                    }
                    // Always: a round in flight may be about to move the cursor
                    // past `back_to` even if it is not there yet. The new
                    // generation is this batch's number: newer than any a round
                    // can have read, and the same when recovery applies the
                    // command again, so the command stays a no-op on its result.
                    let generation = w.number;
                    w.put(keys::cursor_generation(consumer), &generation);
                }
                let events = self
                    .range(&keys::outbox(*from_seq), &keys::outbox(u64::MAX))
                    .count() as u64;
                Applied::Replayed { events }
            }
            _ => unreachable!("`decide` routes only an outbox command here"),
        };
        Ok(Ok(applied))
    }

    /// A move's commands other than its imports: the fence at the old home,
    /// the tracking of changes while the copy runs, and ownership.
    fn decide_moves(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::Fence {
                tenant,
                operation_id,
                epoch,
            } => {
                let wanted = TenantGuard::Fenced {
                    operation_id: operation_id.clone(),
                    epoch: *epoch,
                };
                Applied::Guard(self.set_guard(w, tenant, wanted, |current| match current {
                    // The owner at this epoch (or an earlier one) fences.
                    TenantGuard::Owned { epoch: owned } => owned <= epoch,
                    other => other.epoch() < *epoch,
                })?)
            }
            Command::TrackChanges {
                tenant,
                operation_id,
                epoch,
            } => {
                let current = self.guard(tenant)?;
                // As a fence: the owner at this epoch (or an earlier one), or
                // this very move's fence when a successor driver starts over.
                let refused = current.clone().filter(|g| match g {
                    TenantGuard::Owned { epoch: owned } => owned > epoch,
                    TenantGuard::Fenced {
                        operation_id: op,
                        epoch: e,
                    } if op == operation_id && e == epoch => false,
                    other => other.epoch() >= *epoch,
                });
                Applied::Guard(match refused {
                    Some(current) => GuardOutcome::Refused { current },
                    None => {
                        let tracking = Tracking {
                            operation_id: operation_id.clone(),
                            epoch: *epoch,
                        };
                        w.put(keys::tracking(tenant.as_str().as_bytes()), &tracking);
                        GuardOutcome::Accepted {
                            guard: current.unwrap_or(TenantGuard::Owned { epoch: *epoch }),
                            imported: 0,
                        }
                    }
                })
            }
            Command::EndTracking {
                tenant,
                operation_id,
                entries_max,
            } => self.end_tracking(w, tenant, operation_id, *entries_max as usize)?,
            Command::Own { tenant, epoch } => {
                let wanted = TenantGuard::Owned { epoch: *epoch };
                Applied::Guard(
                    self.set_guard(w, tenant, wanted, |current| current.epoch() < *epoch)?,
                )
            }
            _ => unreachable!("`decide` routes only a move command here"),
        };
        Ok(Ok(applied))
    }

    /// A move's imports: each writes one page under the move's `Importing`
    /// guard (`import`).
    fn decide_imports(&self, w: &mut Writes, command: &Command) -> Decided {
        let (tenant, page) = match command {
            Command::Import {
                tenant,
                operation_id,
                epoch,
                entries,
            } => {
                let page = Page {
                    operation_id,
                    epoch: *epoch,
                    generation: 0,
                    entries,
                    removed: &[],
                };
                (tenant, page)
            }
            Command::ImportChanges {
                tenant,
                operation_id,
                epoch,
                page,
            } => {
                let page = Page {
                    operation_id,
                    epoch: *epoch,
                    generation: 0,
                    entries: &page.entries,
                    removed: &page.removed,
                };
                (tenant, page)
            }
            Command::ImportPage {
                tenant,
                operation_id,
                epoch,
                generation,
                page,
            } => {
                let page = Page {
                    operation_id,
                    epoch: *epoch,
                    generation: *generation,
                    entries: &page.entries,
                    removed: &page.removed,
                };
                (tenant, page)
            }
            _ => unreachable!("`decide` routes only an import command here"),
        };
        Ok(self.import(w, tenant, page)?.map(Applied::Guard))
    }

    /// The new home's side of a failover: the events it carries, the
    /// ownership it gives, and the release or abandonment of what it held;
    /// with the standby's progress that bounds what the failed region purges.
    fn decide_failover(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::StandbyMatched { index } => {
                let known: u64 = self.get(keys::META_STANDBY_MATCHED)?.unwrap_or(0);
                let index = known.max(*index);
                if index > known {
                    w.put(keys::META_STANDBY_MATCHED.to_vec(), &index);
                }
                Applied::StandbyMatched { index }
            }
            Command::ReleaseHeld {
                tenant,
                operation_id,
                epoch,
                bytes_max,
            } => {
                let importing = TenantGuard::Importing {
                    operation_id: operation_id.clone(),
                    epoch: *epoch,
                };
                let (entries, more) = if self.guard(tenant)? == Some(importing) {
                    self.release_held(w, tenant, *bytes_max as usize)?
                } else {
                    (0, false)
                };
                Applied::Erased { entries, more }
            }
            Command::OwnImported {
                tenant,
                operation_id,
                epoch,
            } => {
                let wanted = TenantGuard::Owned { epoch: *epoch };
                Applied::Guard(self.set_guard(w, tenant, wanted, |current| match current {
                    TenantGuard::Importing {
                        operation_id: op,
                        epoch: e,
                    } if op == operation_id && e == epoch => true,
                    other => other.epoch() < *epoch,
                })?)
            }
            Command::AbandonImport {
                tenant,
                operation_id,
                entries_max,
                consumers,
            } => self.abandon_import(w, tenant, operation_id, *entries_max as usize, consumers)?,
            Command::ImportEvents {
                tenant,
                operation_id,
                epoch,
                events,
                now,
            } => match self.import_events(w, tenant, operation_id, *epoch, events, *now)? {
                Ok(outcome) => Applied::Guard(outcome),
                Err(rejection) => return Ok(Err(rejection)),
            },
            _ => unreachable!("`decide` routes only a failover command here"),
        };
        Ok(Ok(applied))
    }

    /// The returning region's side of a failover: its reconciliation report,
    /// the marks of the tenants it lost, and the release of what they reserved
    /// twice.
    fn decide_reconciliation(&self, w: &mut Writes, command: &Command) -> Decided {
        let applied = match command {
            Command::RecordReconciliation { reconciliation } => {
                let key = keys::reconciliation(&reconciliation.operation_id);
                let stored = match reconcile::recorded(self, &reconciliation.operation_id)? {
                    Some(stored) => stored,
                    None => {
                        w.put(key, reconciliation.as_ref());
                        reconciliation.as_ref().clone()
                    }
                };
                Applied::Reconciliation(Box::new(stored))
            }
            Command::StageOrphans {
                operation_id,
                page,
                orphans,
            } => {
                let recorded = self.contains_key(keys::report(operation_id))?
                    || self.contains_key(keys::reconciliation(operation_id))?;
                if !recorded {
                    w.put(keys::report_page(operation_id, *page), orphans);
                }
                Applied::Staged { recorded }
            }
            Command::RecordReport {
                report,
                pages,
                listed,
            } => return self.record_report(w, report, *pages, *listed),
            Command::FinishReconciliation { operation_id } => {
                let head_key = keys::report(operation_id);
                if let Some(mut head) = self.get::<ReportHead>(&head_key)? {
                    if !head.done {
                        head.done = true;
                        w.put(head_key, &head);
                    }
                    let stored = reconcile::with_orphans(self, &head)?;
                    return Ok(Ok(Applied::Reconciliation(Box::new(stored))));
                }
                let key = keys::reconciliation(operation_id);
                let Some(mut stored) = self.get::<Reconciliation>(&key)? else {
                    return Ok(Err(Rejection::UnknownReconciliation {
                        operation_id: operation_id.clone(),
                    }));
                };
                if !stored.done {
                    stored.done = true;
                    w.put(key, &stored);
                }
                Applied::Reconciliation(Box::new(stored))
            }
            Command::MarkLost {
                tenant,
                operation_id,
                at,
            } => {
                let key = keys::lost(tenant, operation_id);
                let stored = match self.get::<LostTenant>(&key)? {
                    Some(stored) => stored,
                    None => {
                        let mark = LostTenant {
                            operation_id: operation_id.clone(),
                            at: *at,
                        };
                        w.put(key, &mark);
                        mark
                    }
                };
                Applied::Lost(stored)
            }
            Command::ReleaseCarriedReservations {
                tenant,
                operation_id,
                entries_max,
            } => self.release_carried(w, tenant, operation_id, *entries_max as usize)?,
            _ => unreachable!("`decide` routes only a reconciliation command here"),
        };
        Ok(Ok(applied))
    }

    /// Writes one page of a move into `w` under the `Importing` guard of the
    /// move `page.operation_id` at `page.epoch`: `page.entries` as they are at
    /// the old home, and deletions of the tenant's `page.removed` keys. A store
    /// that moved past that move refuses (a value), and so does one where a
    /// driver of a later generation imported under that guard; an entry or key
    /// that is not the tenant's movable data is a rejection.
    fn import(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        page: Page<'_>,
    ) -> Result<Result<GuardOutcome, Rejection>, Error> {
        let Page {
            operation_id,
            epoch,
            generation,
            entries,
            removed,
        } = page;
        let driver_key = keys::import_driver(tenant);
        let newest = self
            .get::<ImportDriver>(&driver_key)?
            .filter(|d| d.operation_id == operation_id && d.epoch == epoch);
        if let Some(newest) = newest.as_ref().filter(|d| d.generation > generation) {
            return Ok(Ok(GuardOutcome::Superseded {
                generation: newest.generation,
            }));
        }
        let outcome = self.guard_for_import(w, tenant, operation_id, epoch)?;
        let GuardOutcome::Accepted { guard, .. } = outcome else {
            return Ok(Ok(outcome));
        };
        // Generation 0 (the commands of older logs) writes what it always did.
        if generation > newest.map_or(0, |d| d.generation) {
            let driver = ImportDriver {
                operation_id: operation_id.to_owned(),
                epoch,
                generation,
            };
            w.put(driver_key, &driver);
        }
        for (index, entry) in entries.iter().enumerate() {
            if self.has_settled(tenant, entry)? {
                continue;
            }
            if let Err(rejection) = import(w, tenant, index, entry) {
                return Ok(Err(rejection));
            }
        }
        for (i, key) in removed.iter().enumerate() {
            let index = entries.len() + i;
            let belongs = match key.first() {
                Some(&keys::RECORD | &keys::MARKER | &keys::ORDER_INDEX) => {
                    keys::tenant_of(key).is_some_and(|t| t == tenant.as_str().as_bytes())
                }
                // Keyed by id alone: only an order of this tenant (or none) goes.
                Some(&keys::ORDER) => self.order_of(key, tenant)?.is_none_or(|mine| mine),
                _ => return Ok(Err(Rejection::ImportUnexpectedKind { index })),
            };
            if !belongs {
                return Ok(Err(Rejection::ImportForeignEntry { index }));
            }
            w.changes.remove(key.as_slice());
        }
        Ok(Ok(GuardOutcome::Accepted {
            guard,
            imported: (entries.len() + removed.len()) as u64,
        }))
    }

    /// Sets the tenant's guard to `Importing` for `operation_id` at `epoch`
    /// (a move's or failover's import), unless the store already knows the
    /// tenant at that epoch or later.
    fn guard_for_import(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        operation_id: &str,
        epoch: u64,
    ) -> Result<GuardOutcome, Error> {
        let wanted = TenantGuard::Importing {
            operation_id: operation_id.to_owned(),
            epoch,
        };
        self.set_guard(w, tenant, wanted, |current| current.epoch() < epoch)
    }

    /// `Command::ImportEvents`: under the tenant's `Importing` guard of the
    /// failover, holds each carried event not imported before (its mark
    /// says 0 until `release_held` gives it a sequence number).
    fn import_events(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        operation_id: &str,
        epoch: u64,
        events: &[CarriedEvent],
        now: UnixMillis,
    ) -> Result<Result<GuardOutcome, Rejection>, Error> {
        let before = self.guard(tenant)?;
        let outcome = self.guard_for_import(w, tenant, operation_id, epoch)?;
        let GuardOutcome::Accepted { guard, .. } = outcome else {
            return Ok(Ok(outcome));
        };
        // A new import superseding another one's guard drops that one's
        // held events and marks in this same batch: their marks (0) do not
        // count, so this import holds those events again.
        let superseded = matches!(&before, Some(g @ TenantGuard::Importing { .. }) if *g != guard);
        let mut fresh = std::collections::HashSet::new();
        for (index, carried) in events.iter().enumerate() {
            let event = &carried.event;
            if &event.tenant != tenant {
                return Ok(Err(Rejection::ImportForeignEntry { index }));
            }
            let mark = keys::imported_event(&event.event_id);
            let imported = match self.get::<u64>(&mark)? {
                Some(0) => !superseded,
                Some(_) => true,
                None => false,
            };
            if imported || !fresh.insert(event.event_id.clone()) {
                continue;
            }
            let held = HeldEvent {
                carried: carried.clone(),
                imported_at: now,
            };
            w.put(keys::held_event(tenant, event.seq), &held);
            w.put(mark, &0u64);
        }
        Ok(Ok(GuardOutcome::Accepted {
            guard,
            imported: fresh.len() as u64,
        }))
    }

    /// Whose the outbox event at `seq` is to take effect for, by the log
    /// index that wrote it and its tenant's marks (`Command::MarkLost`).
    /// `Ours` when no event `event_id` is there (a single-event command's
    /// `seq` is 0).
    fn disposition(&self, seq: u64, event_id: &str) -> Result<Disposition, Error> {
        Ok(self.kept_event(&mut MarksSeen::default(), seq, event_id)?.0)
    }

    /// `disposition`, and how long a processed entry of the event is kept:
    /// with the event when it is in the outbox at `seq`. Reads the event's
    /// head alone, and the marks through `marks`.
    fn kept_event(
        &self,
        marks: &mut MarksSeen,
        seq: u64,
        event_id: &str,
    ) -> Result<(Disposition, Guards), Error> {
        let Some(raw) = self.get_raw(&keys::outbox(seq))? else {
            return Ok((Disposition::Ours, Guards::OwnExpiry));
        };
        let head = event_head(payload(&raw)?)?;
        if head.event_id != event_id {
            return Ok((Disposition::Ours, Guards::OwnExpiry));
        }
        let disposition = marks.disposition(self, head.tenant, stamp(&raw)?)?;
        Ok((disposition, Guards::KeptEvent))
    }

    /// The tenant's loss marks (`Command::MarkLost`), each with the index of
    /// the entry that wrote it.
    fn loss_marks(&self, tenant: &TenantId) -> Result<Vec<(LostTenant, u64)>, Error> {
        let mut marks = Vec::new();
        for item in self.scan_prefix(keys::lost_of(tenant)) {
            let (_, value) = item?;
            marks.push(decode::<LostTenant>(&value)?);
        }
        Ok(marks)
    }

    /// A page of `Command::ReleaseCarriedReservations`: scans the outbox
    /// for the tenant's events at or below the mark's `at` whose inventory
    /// processed entry is above it, and deletes their reservations.
    fn release_carried(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        operation_id: &str,
        entries_max: usize,
    ) -> Result<Applied, Error> {
        let mut released = 0u64;
        let Some(mark) = self.get::<LostTenant>(&keys::lost(tenant, operation_id))? else {
            return Ok(Applied::Erased {
                entries: 0,
                more: false,
            });
        };
        for item in self.scan_prefix([keys::OUTBOX]) {
            let (event, written) = decode::<OutboxEvent>(&item?.1)?;
            if &event.tenant != tenant || written > mark.at {
                continue;
            }
            let processed = keys::processed(Consumer::Inventory, &event.event_id);
            let Some(raw) = self.get_raw(&processed)? else {
                continue;
            };
            if decode::<Processed>(&raw)?.1 <= mark.at {
                // Handled before the copy's position: the copy had it handled.
                continue;
            }
            for item in self.scan_prefix(keys::reservations_of(&event.order_id)) {
                let (key, value) = item?;
                if decode::<Reservation>(&value)?.0.event_id != event.event_id {
                    continue;
                }
                if released as usize >= entries_max {
                    return Ok(Applied::Erased {
                        entries: released,
                        more: true,
                    });
                }
                w.changes.remove(key);
                released += 1;
            }
        }
        Ok(Applied::Erased {
            entries: released,
            more: false,
        })
    }

    /// The tenant's held events, in the failed region's order, with their keys.
    fn held_events(&self, tenant: &TenantId) -> Result<Vec<(Vec<u8>, HeldEvent)>, Error> {
        let mut out = Vec::new();
        for item in self.scan_prefix(keys::held_events_of(tenant)) {
            let (key, value) = item?;
            out.push((key.to_vec(), decode::<HeldEvent>(&value)?.0));
        }
        Ok(out)
    }

    /// The failover that carried the tenant's held events is done here
    /// (`Command::OwnImported`, or a page of `Command::ReleaseHeld` before
    /// it): each becomes a new outbox event with the same event id, after
    /// every event already there, marked processed for the consumers that
    /// handled it in the failed region. Stops once the events released carry
    /// `bytes_max` payload bytes (after at least one); returns how many it
    /// released and whether any is left.
    fn release_held(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        bytes_max: usize,
    ) -> Result<(u64, bool), Error> {
        let mut seq = self.get::<u64>(keys::META_OUTBOX_SEQ)?.unwrap_or(0);
        let (mut released, mut bytes, mut more) = (0u64, 0usize, false);
        for item in self.scan_prefix(keys::held_events_of(tenant)) {
            if released > 0 && bytes >= bytes_max {
                more = true;
                break;
            }
            let (key, value) = item?;
            let HeldEvent {
                carried,
                imported_at,
            } = decode::<HeldEvent>(&value)?.0;
            bytes = bytes.saturating_add(carried.event.payload.len());
            released += 1;
            seq += 1;
            let event = OutboxEvent {
                seq,
                ..carried.event
            };
            // No expiry index entries: the sweep walks the outbox in order
            // and deletes the event with these processed entries.
            w.put(keys::outbox(seq), &event);
            w.put(keys::imported_event(&event.event_id), &seq);
            for consumer in carried.handled_by {
                let key = keys::processed(consumer, &event.event_id);
                let entry = Processed {
                    consumer,
                    event_id: event.event_id.clone(),
                    at: imported_at,
                    expires_at: event.expires_at,
                };
                w.put(key, &entry);
            }
            w.changes.remove(key.to_vec());
        }
        if released > 0 {
            w.put(keys::META_OUTBOX_SEQ.to_vec(), &seq);
            w.put(keys::tenant_last_event(tenant), &seq);
        }
        Ok((released, more))
    }

    /// Drops the tenant's held events and their marks (a later failover
    /// carries them again): the import that carried them ended without
    /// becoming the tenant's owner here.
    fn drop_held(&self, w: &mut Writes, tenant: &TenantId) -> Result<(), Error> {
        for (key, held) in self.held_events(tenant)? {
            w.changes.remove(key);
            w.changes
                .remove(keys::imported_event(&held.carried.event.event_id));
        }
        Ok(())
    }

    /// True when `entry` is an order of `tenant` still `Confirmed` whose
    /// payment this store already settled (`Paid` or `PaymentFailed`): the
    /// import keeps the settled order. A failover's import may be repeated
    /// after this store's payments consumer handled the order's carried
    /// event; its processed entry stops a second delivery, so overwriting
    /// the status would lose the payment's result for good. (A move never
    /// meets this: the new home gets no event before it owns the tenant.)
    fn has_settled(&self, tenant: &TenantId, entry: &ExportEntry) -> Result<bool, Error> {
        if entry.key.first() != Some(&keys::ORDER) {
            return Ok(false);
        }
        let Ok(imported) = decode_plain::<Order>(&entry.payload) else {
            return Ok(false);
        };
        if &imported.tenant != tenant || imported.status != OrderStatus::Confirmed {
            return Ok(false);
        }
        Ok(self
            .get::<Order>(&entry.key)?
            .is_some_and(|here| &here.tenant == tenant && here.status != OrderStatus::Confirmed))
    }

    /// A page of `Command::AbandonImport`.
    fn abandon_import(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        operation_id: &str,
        entries_max: usize,
        consumers: &[Consumer],
    ) -> Result<Applied, Error> {
        let ours = matches!(self.guard(tenant)?,
            Some(TenantGuard::Importing { operation_id: op, .. }) if op == operation_id);
        if !ours {
            return Ok(Applied::Erased {
                entries: 0,
                more: false,
            });
        }
        let erased = self.erase_tenant(w, tenant, entries_max, consumers)?;
        if let Applied::Erased { more: false, .. } = erased {
            w.changes.remove(keys::guard(tenant));
            // The marks of this tenant's carried events whose event is gone
            // (erased now, or swept): a later failover carries them again.
            for item in self.scan_prefix(keys::IMPORTED_EVENT_PREFIX) {
                let (mark, _) = item?;
                // 0: a held event's; this tenant's went with `erase_tenant`.
                let Some(seq) = self.get::<u64>(&mark)?.filter(|&seq| seq > 0) else {
                    continue;
                };
                let event = self.get::<OutboxEvent>(&keys::outbox(seq))?;
                let erased_now = event.as_ref().is_some_and(|e| {
                    &e.tenant == tenant && consumers_pending(consumers, self, e.seq)
                });
                if event.is_none() || erased_now {
                    w.changes.remove(mark);
                }
            }
        }
        Ok(erased)
    }

    /// A page of `Command::EndTracking`: the tracking of `operation_id` stops
    /// and its change index goes, page by page. The tracking of another (later)
    /// move is left alone, index and all.
    fn end_tracking(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        operation_id: &str,
        entries_max: usize,
    ) -> Result<Applied, Error> {
        let t = tenant.as_str().as_bytes();
        let flag = keys::tracking(t);
        match self.get::<Tracking>(&flag)? {
            Some(tracking) if tracking.operation_id != operation_id => {
                return Ok(Applied::Erased {
                    entries: 0,
                    more: false,
                })
            }
            Some(_) => w.changes.remove(flag),
            None => {}
        }
        let mut entries = 0;
        for item in self.scan_prefix(keys::changes_of(t)) {
            if entries as usize >= entries_max {
                return Ok(Applied::Erased {
                    entries,
                    more: true,
                });
            }
            w.changes.remove(item?.0);
            entries += 1;
        }
        Ok(Applied::Erased {
            entries,
            more: false,
        })
    }

    /// Whether the order stored at `key` is `tenant`'s (`None`: no order there),
    /// reading only the head of its payload.
    fn order_of(&self, key: &[u8], tenant: &TenantId) -> Result<Option<bool>, Error> {
        let Some(value) = self.get_raw(key)? else {
            return Ok(None);
        };
        Ok(Some(order_tenant(payload(&value)?)? == tenant.as_str()))
    }

    /// The tenant's guard (`None`: never moved, executes). Fences of stores
    /// written before guards are guards too by the time anything reads
    /// (`Machine::migrate_legacy_fences`).
    fn guard(&self, tenant: &TenantId) -> Result<Option<TenantGuard>, Error> {
        self.get::<TenantGuard>(&keys::guard(tenant))
    }

    /// Moves the tenant's guard to `wanted` when there is none, when it already
    /// is `wanted` (a replay), or when `gives_way` says the current one yields;
    /// otherwise refuses, changing nothing.
    fn set_guard(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        wanted: TenantGuard,
        gives_way: impl FnOnce(&TenantGuard) -> bool,
    ) -> Result<GuardOutcome, Error> {
        let current = self.guard(tenant)?;
        if let Some(current) = &current {
            if *current != wanted && !gives_way(current) {
                return Ok(GuardOutcome::Refused {
                    current: current.clone(),
                });
            }
        }
        // Held events exist only under the `Importing` guard of the failover
        // that carried them: ownership at that very epoch (`OwnImported`, the
        // only way there) releases them, any other change drops them.
        if let Some(TenantGuard::Importing { epoch, .. }) = &current {
            // The generations counted under that guard end with it.
            if current.as_ref() != Some(&wanted) {
                w.remove(&keys::import_driver(tenant));
            }
            if wanted == (TenantGuard::Owned { epoch: *epoch }) {
                // Everything left, as logs written before `ReleaseHeld`
                // expect; the server pages them out first.
                self.release_held(w, tenant, usize::MAX)?;
            } else if current.as_ref() != Some(&wanted) {
                self.drop_held(w, tenant)?;
            }
        }
        w.put(keys::guard(tenant), &wanted);
        Ok(GuardOutcome::Accepted {
            guard: wanted,
            imported: 0,
        })
    }

    /// The answer to a command for a tenant this store does not execute for
    /// (fenced, or still importing), or `None` when the command may run.
    fn fenced(&self, command: &Command) -> Result<Option<Applied>, Error> {
        let scope = match command {
            Command::CreateOrder { scope, .. }
            | Command::Claim { scope, .. }
            | Command::Complete { scope, .. }
            | Command::Heartbeat { scope, .. } => scope,
            _ => return Ok(None),
        };
        if self.guard(&scope.tenant)?.is_none_or(|g| g.executes()) {
            return Ok(None);
        }
        Ok(Some(match command {
            Command::CreateOrder { .. } => Applied::Order(OrderOutcome::Fenced),
            Command::Claim { .. } => Applied::Claim(ClaimOutcome::Fenced),
            Command::Complete { .. } => Applied::Complete(CompleteOutcome::Fenced),
            _ => Applied::Heartbeat(HeartbeatOutcome::Fenced),
        }))
    }

    /// `Command::RecordReport`: records `report` with the `pages` pages staged
    /// for it (and drops the pages of an earlier pass beyond them), unless a
    /// report of its failover is recorded; answers the stored report.
    fn record_report(
        &self,
        w: &mut Writes,
        report: &Reconciliation,
        pages: u32,
        listed: u64,
    ) -> Decided {
        let operation_id = &report.operation_id;
        if let Some(stored) = reconcile::recorded(self, operation_id)? {
            return Ok(Ok(Applied::Reconciliation(Box::new(stored))));
        }
        let missing = |page| Rejection::ReportPagesMissing {
            operation_id: operation_id.clone(),
            pages,
            listed,
            missing: page,
        };
        let orphans = match reconcile::staged(self, operation_id, pages)? {
            Ok(orphans) if orphans.len() as u64 == listed => orphans,
            Ok(_) => return Ok(Err(missing(pages))),
            Err(page) => return Ok(Err(missing(page))),
        };
        let prefix = keys::report_pages(operation_id);
        for item in self.scan_prefix(&prefix) {
            let (key, _) = item?;
            if keys::page_of(&prefix, &key).is_none_or(|page| page >= pages) {
                w.remove(&key);
            }
        }
        w.put(
            keys::report(operation_id),
            &ReportHead::new(report, pages, listed),
        );
        let stored = Reconciliation {
            orphans,
            ..report.clone()
        };
        Ok(Ok(Applied::Reconciliation(Box::new(stored))))
    }

    /// Writes the processed-message entry of `(consumer, event_id)` unless it
    /// exists, in the tree or earlier in this command (`round`); returns whether
    /// it was new (and so whether the effect may happen).
    fn mark_processed(
        &self,
        w: &mut Writes,
        round: &mut Round,
        consumer: Consumer,
        event_id: &str,
        guards: Guards,
    ) -> Result<bool, Error> {
        // Reads see the tree, not this command's own writes: an event twice in
        // one batch is caught here.
        if round.processed.contains(event_id) {
            return Ok(false);
        }
        let key = keys::processed(consumer, event_id);
        if self.contains_key(&key)? {
            return Ok(false);
        }
        let entry = Processed {
            consumer,
            event_id: event_id.to_owned(),
            at: round.now,
            expires_at: round.now.plus_ms(round.processed_ttl_ms),
        };
        if guards == Guards::OwnExpiry {
            w.put_expiry(entry.expires_at, &key);
        }
        w.put(key, &entry);
        round.processed.insert(event_id.to_owned());
        Ok(true)
    }

    /// The inventory consumer's effect of one event: its item lines reserved,
    /// with its processed-message entry, unless processed already.
    fn reserve(
        &self,
        w: &mut Writes,
        round: &mut Round,
        effect: &InventoryEffect,
        guards: Guards,
    ) -> Result<ConsumeOutcome, Error> {
        let fresh = self.mark_processed(w, round, Consumer::Inventory, &effect.event_id, guards)?;
        if fresh {
            for (line, item) in effect.items.iter().enumerate() {
                let line = line as u32;
                let reservation = Reservation {
                    order_id: effect.order_id.clone(),
                    line,
                    sku: item.sku.clone(),
                    quantity: item.quantity,
                    event_id: effect.event_id.clone(),
                    at: round.now,
                };
                w.put(keys::reservation(&effect.order_id, line), &reservation);
            }
        }
        Ok(consumed(fresh))
    }

    /// The payments consumer's effect of one event: the charge's result on its
    /// order, with its processed-message entry, unless processed already. A
    /// missing order refuses the event; nothing of it is written (its
    /// processed entry is taken back out of `w`).
    fn record_payment(
        &self,
        w: &mut Writes,
        round: &mut Round,
        effect: &PaymentEffect,
        guards: Guards,
    ) -> Result<Result<ConsumeOutcome, Rejection>, Error> {
        let key = keys::order(&effect.order_id);
        // An order this command wrote already (two events of one order) is
        // read back from the command, not from the tree.
        let order = match round.orders.remove(&effect.order_id) {
            Some(order) => Some(order),
            None => self.get::<Order>(&key)?,
        };
        let Some(mut order) = order else {
            // Checked before the processed entry, so a refused event leaves no
            // write behind in a batch whose other events do apply.
            if round.processed.contains(effect.event_id.as_str())
                || self.contains_key(keys::processed(Consumer::Payments, &effect.event_id))?
            {
                return Ok(Ok(ConsumeOutcome::Duplicate));
            }
            return Ok(Err(Rejection::PaymentForMissingOrder {
                order_id: effect.order_id.clone(),
            }));
        };
        let fresh = self.mark_processed(w, round, Consumer::Payments, &effect.event_id, guards)?;
        if fresh {
            order.status = if effect.paid {
                OrderStatus::Paid
            } else {
                OrderStatus::PaymentFailed
            };
            w.put_order(&order);
        }
        round.orders.insert(effect.order_id.clone(), order);
        Ok(Ok(consumed(fresh)))
    }

    /// Moves `consumer`'s cursor forward to `seq` for a round that read it at
    /// `generation`, unless an outbox replay happened since.
    fn advance_cursor(
        &self,
        w: &mut Writes,
        consumer: Consumer,
        seq: u64,
        generation: u64,
    ) -> Result<CursorOutcome, Error> {
        let key = keys::cursor(consumer);
        let current: u64 = self.get(&key)?.unwrap_or(0);
        let now_at: u64 = self.get(&keys::cursor_generation(consumer))?.unwrap_or(0);
        // Cursors only move forward here; a replay moves them back, and a
        // round that read the cursor before that replay moves nothing.
        Ok(if generation != now_at {
            CursorOutcome::Superseded
        } else if seq > current {
            w.put(key, &seq);
            CursorOutcome::Advanced
        } else {
            CursorOutcome::Behind
        })
    }

    /// A consumer's batch command: `apply` to each `(seq, effect)` in order,
    /// then the cursor move, stopped just before the first event refused (the
    /// events up to there are all recorded).
    fn consume_round<'a, E: 'a>(
        &self,
        w: &mut Writes,
        (consumer, cursor): (Consumer, Option<Cursor>),
        mut round: Round,
        events: impl Iterator<Item = (u64, &'a E)>,
        apply: impl Fn(
            &Self,
            &mut Writes,
            &mut Round,
            &E,
        ) -> Result<Result<ConsumeOutcome, Rejection>, Error>,
    ) -> Result<BatchOutcome, Error> {
        let mut outcomes = Vec::new();
        let mut first_refused: Option<u64> = None;
        for (seq, effect) in events {
            let outcome = apply(self, w, &mut round, effect)?;
            if outcome.is_err() {
                first_refused = Some(first_refused.map_or(seq, |s| s.min(seq)));
            }
            outcomes.push(outcome);
        }
        let cursor = match cursor {
            None => None,
            Some(Cursor { seq, generation }) => {
                let seq = match first_refused {
                    Some(refused) => seq.min(refused.saturating_sub(1)),
                    None => seq,
                };
                Some(self.advance_cursor(w, consumer, seq, generation)?)
            }
        };
        Ok(BatchOutcome {
            events: outcomes,
            cursor,
        })
    }

    /// `ttls_ms` is `[response, marker, processed]`.
    fn create_order(
        &self,
        w: &mut Writes,
        scope: &Scope,
        fingerprint: &str,
        order: &Order,
        now: UnixMillis,
        ttls_ms: [u64; 3],
    ) -> Result<Result<OrderOutcome, Rejection>, Error> {
        let [response_ttl_ms, marker_ttl_ms, processed_ttl_ms] = ttls_ms;
        let record_key = keys::record(scope);
        let record: Option<Record> = self.get(&record_key)?;
        let marker_key = keys::marker(&order.tenant, &order.request.client_order_id);
        let marker: Option<Marker> = self.get(&marker_key)?;
        match decide_order(record.as_ref(), marker.as_ref(), fingerprint, now) {
            OrderDecision::Replay => Ok(match record.and_then(|r| r.response) {
                Some(response) => Ok(OrderOutcome::Replayed { response }),
                None => Err(Rejection::RecordWithoutResponse),
            }),
            OrderDecision::KeyReused => Ok(Ok(OrderOutcome::KeyReused)),
            OrderDecision::InProgress { retry_after_ms } => {
                Ok(Ok(OrderOutcome::InProgress { retry_after_ms }))
            }
            OrderDecision::MarkerConflict => Ok(Ok(OrderOutcome::MarkerConflict)),
            OrderDecision::MarkerHit { order_id } => {
                Ok(match self.get::<Order>(&keys::order(&order_id))? {
                    Some(order) => Ok(OrderOutcome::MarkerHit {
                        order: Box::new(order),
                    }),
                    None => Err(Rejection::MarkerWithoutOrder { order_id }),
                })
            }
            OrderDecision::Create => {
                let response = order.created_response();
                let generation = record.as_ref().map_or(1, |r| r.generation + 1);
                let record = Record {
                    fingerprint: fingerprint.to_owned(),
                    state: RecordState::Succeeded,
                    generation,
                    nonce: 0,
                    lease_expires_at: now,
                    response: Some(response.clone()),
                    resource_id: Some(order.order_id.clone()),
                    created_at: now,
                    expires_at: now.plus_ms(response_ttl_ms),
                };
                let marker = Marker {
                    order_id: order.order_id.clone(),
                    fingerprint: fingerprint.to_owned(),
                    expires_at: now.plus_ms(marker_ttl_ms),
                };
                let seq = self.get::<u64>(keys::META_OUTBOX_SEQ)?.unwrap_or(0) + 1;
                let event_id = format!("evt_{}", order.order_id);
                let event = OutboxEvent {
                    seq,
                    payload: order.event_json(&event_id),
                    event_id,
                    kind: "order.created".to_owned(),
                    tenant: order.tenant.clone(),
                    order_id: order.order_id.clone(),
                    occurred_at: now,
                    expires_at: now.plus_ms(processed_ttl_ms),
                };
                // Neither the event nor the record and marker have index
                // entries: the sweep walks the outbox, and the sweeper's scan
                // finds due records and markers (`SweepKeys`).
                w.put(record_key, &record);
                w.put(marker_key, &marker);
                w.put(
                    keys::order_index(&order.tenant, &order.request.client_order_id),
                    &order.order_id,
                );
                w.put_order(order);
                w.put(keys::outbox(seq), &event);
                w.put(keys::META_OUTBOX_SEQ.to_vec(), &seq);
                w.put(keys::tenant_last_event(&order.tenant), &seq);
                Ok(Ok(OrderOutcome::Created { response }))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn claim(
        &self,
        w: &mut Writes,
        scope: &Scope,
        fingerprint: &str,
        lease_ms: u64,
        nonce: u64,
        now: UnixMillis,
        response_ttl_ms: u64,
    ) -> Result<ClaimOutcome, Error> {
        let key = keys::record(scope);
        let record: Option<Record> = self.get(&key)?;
        match decide_claim(record.as_ref(), fingerprint, now) {
            ClaimDecision::Replay => Ok(ClaimOutcome::Replay {
                record: record.expect("replay implies a record"),
            }),
            ClaimDecision::InProgress { retry_after_ms } => {
                Ok(ClaimOutcome::InProgress { retry_after_ms })
            }
            ClaimDecision::KeyReused => Ok(ClaimOutcome::KeyReused),
            ClaimDecision::Acquire {
                generation,
                recovery,
            } => {
                let lease_expires_at = now.plus_ms(lease_ms);
                let record = Record {
                    fingerprint: fingerprint.to_owned(),
                    state: RecordState::Processing,
                    generation,
                    nonce,
                    lease_expires_at,
                    response: None,
                    resource_id: None,
                    created_at: now,
                    expires_at: now.plus_ms(response_ttl_ms).max(lease_expires_at),
                };
                let token = OwnerToken::of(&record);
                w.put(key, &record);
                Ok(ClaimOutcome::Acquired {
                    token,
                    lease_expires_at,
                    recovery,
                })
            }
        }
    }

    /// A page of `Command::EraseTenant`. Deleting what is gone already is a
    /// no-op, so a replayed erasure changes nothing.
    fn erase_tenant(
        &self,
        w: &mut Writes,
        tenant: &TenantId,
        entries_max: usize,
        consumers: &[Consumer],
    ) -> Result<Applied, Error> {
        let mut doomed: Vec<Vec<u8>> = Vec::new();
        let full = |doomed: &Vec<Vec<u8>>| doomed.len() >= entries_max;
        for prefix in keys::tenant_prefixes(tenant) {
            for item in self.scan_prefix(&prefix) {
                if full(&doomed) {
                    break;
                }
                let (key, value) = item?;
                // Orders are keyed by id alone: keep other tenants' orders.
                if prefix == [keys::ORDER] && order_tenant(payload(&value)?)? != tenant.as_str() {
                    continue;
                }
                doomed.push(key.to_vec());
            }
        }
        for item in self.scan_prefix(keys::held_events_of(tenant)) {
            if full(&doomed) {
                break;
            }
            let (key, value) = item?;
            let held = decode::<HeldEvent>(&value)?.0;
            doomed.push(keys::imported_event(&held.carried.event.event_id));
            doomed.push(key.to_vec());
        }
        let mut cursors = Vec::with_capacity(consumers.len());
        for &consumer in consumers {
            cursors.push(self.get::<u64>(&keys::cursor(consumer))?.unwrap_or(0));
        }
        for item in self.scan_prefix([keys::OUTBOX]) {
            if full(&doomed) {
                break;
            }
            let (key, _) = item?;
            let Some(event) = self.get::<OutboxEvent>(&key)? else {
                continue;
            };
            let pending = cursors.iter().any(|&c| c < event.seq);
            if &event.tenant == tenant && pending {
                doomed.push(key.to_vec());
                // The entries of consumers that had it go with it: they have
                // no index entry of their own (see `Guards`).
                for consumer in Consumer::ALL {
                    let processed = keys::processed(consumer, &event.event_id);
                    if self.contains_key(&processed)? {
                        doomed.push(processed);
                    }
                }
            }
        }
        let more = full(&doomed);
        for key in &doomed {
            w.changes.remove(key.as_slice());
        }
        Ok(Applied::Erased {
            entries: doomed.len() as u64,
            more,
        })
    }

    /// `Command::SweepKeys`: deletes the listed records and markers that are
    /// due at `now`.
    fn sweep_keys(
        &self,
        w: &mut Writes,
        now: UnixMillis,
        listed: &[Vec<u8>],
    ) -> Result<SweepOutcome, Error> {
        let mut out = SweepOutcome::default();
        for key in listed {
            match self.due(key, now)? {
                Some(Due::Record) => out.records += 1,
                Some(Due::Marker) => out.markers += 1,
                None => {
                    out.stale_index += 1;
                    continue;
                }
            }
            w.remove(key);
        }
        Ok(out)
    }

    /// What the record or marker at `key` is when it is due at `now`;
    /// `None` when it is not due, gone, or another kind of entry.
    pub(crate) fn due(&self, key: &[u8], now: UnixMillis) -> Result<Option<Due>, Error> {
        Ok(match key.first() {
            Some(&keys::RECORD) => self
                .get::<Record>(key)?
                .filter(|r| r.expires_at <= now)
                .map(|_| Due::Record),
            Some(&keys::MARKER) => self
                .get::<Marker>(key)?
                .filter(|m| m.expires_at <= now)
                .map(|_| Due::Marker),
            _ => None,
        })
    }

    /// Deletes what is due, at most `entries_max` entries: delivered outbox
    /// events with their processed entries, then what the expiry index holds.
    fn sweep(
        &self,
        w: &mut Writes,
        now: UnixMillis,
        entries_max: usize,
        consumers: &[Consumer],
    ) -> Result<SweepOutcome, Error> {
        let mut cursors = Vec::with_capacity(consumers.len());
        for &consumer in consumers {
            cursors.push(self.get::<u64>(&keys::cursor(consumer))?.unwrap_or(0));
        }
        let delivered_to_all = |seq: u64| cursors.iter().all(|&c| c >= seq);
        let mut out = SweepOutcome::default();
        // Entries deleted by this command (reads see the tree, not its own
        // writes): a record rewritten several times has several index
        // entries, and a processed entry the outbox walk deleted may be
        // indexed too (by a single-event command or an older release). Events
        // need no place here: the index walk drops every event entry anyway.
        let mut deleted = std::collections::HashSet::new();
        let mut budget = entries_max;

        // The outbox in sequence order, each event with its consumers'
        // processed entries. Events expire in about the order they were
        // written (each at its command's `now` plus the same TTL); cursors only move
        // forward, so the first event not yet due, or not yet had by every
        // consumer, ends the walk: those after it wait for it. Never drop an
        // event a consumer has not had.
        for item in self.range(&[keys::OUTBOX], &keys::outbox(u64::MAX)) {
            if budget == 0 {
                break;
            }
            let (key, value) = item?;
            let event = decode::<OutboxEvent>(&value)?.0;
            if event.expires_at > now {
                break;
            }
            if !delivered_to_all(event.seq) {
                out.deferred += 1;
                break;
            }
            budget -= 1;
            out.events += 1;
            w.remove(&key);
            for consumer in Consumer::ALL {
                let processed = keys::processed(consumer, &event.event_id);
                if self.contains_key(&processed)? {
                    budget = budget.saturating_sub(1);
                    out.processed += 1;
                    w.remove(&processed);
                    deleted.insert(processed);
                }
            }
        }

        // The expiry index in time order: records, markers, processed
        // entries of single-event commands, and whatever an earlier release
        // indexed. An index entry can be stale (its target was rewritten with
        // a later expiry, or is gone); then only the index entry goes.
        let end = keys::expiry(now, &[]);
        for item in self.range(&[keys::EXPIRY], &end).take(budget) {
            let (index_key, _) = item?;
            let Some((_, primary)) = keys::parse_expiry(&index_key) else {
                return Err(Error::Corrupt("malformed expiry index key".into()));
            };
            if deleted.contains(primary) {
                out.stale_index += 1;
                w.changes.remove(index_key);
                continue;
            }
            let due = match primary.first() {
                Some(&keys::RECORD) => self
                    .get::<Record>(primary)?
                    .map(|r| (r.expires_at <= now, &mut out.records)),
                Some(&keys::MARKER) => self
                    .get::<Marker>(primary)?
                    .map(|m| (m.expires_at <= now, &mut out.markers)),
                Some(&keys::PROCESSED) => self
                    .get::<Processed>(primary)?
                    .map(|p| (p.expires_at <= now, &mut out.processed)),
                // Indexed by releases before the outbox walk: the walk above
                // deletes the event when it is due and delivered.
                Some(&keys::OUTBOX) => None,
                _ => return Err(Error::Corrupt("expiry index points at unknown kind".into())),
            };
            match due {
                Some((true, counter)) => {
                    *counter += 1;
                    w.remove(primary);
                    deleted.insert(primary.to_vec());
                }
                Some((false, _)) | None => out.stale_index += 1,
            }
            w.changes.remove(index_key);
        }
        Ok(out)
    }
}

/// One step of the sweeper's scan (`Machine::scan_due`).
pub struct DueScan {
    /// The keys of the due records and markers found.
    pub due: Vec<Vec<u8>>,
    /// The key to go on after; `None` once the scan reached the end.
    pub next: Option<Vec<u8>>,
}

/// What a due entry the sweeper's scan found is (`Machine::due`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    Record,
    Marker,
}

/// Adds one imported entry to `w` under this store's batch stamp. Only the kinds a tenant move carries, of the tenant
/// the import names and whose payload decodes, are accepted.
fn import(
    w: &mut Writes,
    tenant: &TenantId,
    index: usize,
    entry: &ExportEntry,
) -> Result<(), Rejection> {
    let undecodable = |e: Error| Rejection::ImportUndecodable {
        index,
        detail: e.to_string(),
    };
    let belongs = keys::tenant_of(&entry.key).is_some_and(|t| t == tenant.as_str().as_bytes());
    // Decoded to refuse what this store could not read back; records and
    // markers get no index entry (the sweeper's scan finds them when due).
    match entry.key.first() {
        Some(&keys::RECORD) => {
            decode_plain::<Record>(&entry.payload).map_err(undecodable)?;
        }
        Some(&keys::MARKER) => {
            decode_plain::<Marker>(&entry.payload).map_err(undecodable)?;
        }
        Some(&keys::ORDER_INDEX) => {
            decode_plain::<String>(&entry.payload).map_err(undecodable)?;
        }
        Some(&keys::ORDER) => {
            let order: Order = decode_plain(&entry.payload).map_err(undecodable)?;
            if &order.tenant != tenant {
                return Err(Rejection::ImportForeignEntry { index });
            }
        }
        _ => return Err(Rejection::ImportUnexpectedKind { index }),
    }
    if entry.key.first() != Some(&keys::ORDER) && !belongs {
        return Err(Rejection::ImportForeignEntry { index });
    }
    w.changes
        .insert(entry.key.clone(), encode_raw(w.number, &entry.payload));
    Ok(())
}

/// True when some consumer of `consumers` has not had event `seq` yet (its
/// cursor is before it): what `EraseTenant` erases of a tenant's events.
fn consumers_pending(consumers: &[Consumer], view: &View<'_>, seq: u64) -> bool {
    consumers.iter().any(|&c| {
        view.get::<u64>(&keys::cursor(c))
            .ok()
            .flatten()
            .unwrap_or(0)
            < seq
    })
}

fn consumed(fresh: bool) -> ConsumeOutcome {
    if fresh {
        ConsumeOutcome::Applied
    } else {
        ConsumeOutcome::Duplicate
    }
}
