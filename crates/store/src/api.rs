//! The store's typed command API: one method per command kind, each answering
//! with that kind's outcome (`create_order` with an `OrderOutcome`, `fence`
//! with a `GuardOutcome`, ...).
//!
//! Every method builds its `Command` and sends it through `Store::execute`, the
//! one way into the region group (and what the Raft machinery and the tests that
//! replay whole command sequences use). `execute` answers `Applied`, whose
//! variant the command's kind fixes; which variant goes with which outcome is
//! written down here once (`Answer`), so that no caller matches an `Applied` it
//! cannot get. A mismatch would be a bug of the state machine, not a condition
//! to answer: it panics here. TTLs come from the caller's `Policy`, copied into
//! the command, so the command still carries everything its effect depends on.

use crate::command::{
    Applied, BatchOutcome, CarriedEvent, ChangePage, ClaimOutcome, Command, CompleteOutcome,
    ConsumeOutcome, Cursor, CursorOutcome, EraseOutcome, ExportEntry, GuardOutcome,
    HeartbeatOutcome, InventoryEffect, OrderOutcome, PaymentEffect, ReplayOutcome, SweepOutcome,
};
use crate::consumer::Consumer;
use crate::reconcile::{LostTenant, Reconciliation};
use crate::{Error, Logged, Store};
use keyhold_core::{
    Item, Order, Outcome, OwnerToken, Policy, Scope, StoredResponse, TenantId, UnixMillis,
};

/// The outcome of some command kinds: the `Applied` variant the state machine
/// answers them with.
trait Answer: Sized {
    /// The outcome inside `applied`, or `applied` back when it holds another
    /// (boxed, to keep the `Result` small: that case is a bug).
    fn take(applied: Applied) -> Result<Self, Box<Applied>>;
}

macro_rules! answer {
    ($($outcome:ty => $variant:ident),* $(,)?) => {$(
        impl Answer for $outcome {
            fn take(applied: Applied) -> Result<Self, Box<Applied>> {
                match applied {
                    Applied::$variant(outcome) => Ok(outcome),
                    other => Err(Box::new(other)),
                }
            }
        }
    )*};
}

answer! {
    OrderOutcome => Order,
    ClaimOutcome => Claim,
    CompleteOutcome => Complete,
    HeartbeatOutcome => Heartbeat,
    SweepOutcome => Sweep,
    ConsumeOutcome => Consumed,
    CursorOutcome => Cursor,
    GuardOutcome => Guard,
    BatchOutcome => ConsumedBatch,
    LostTenant => Lost,
}

impl Answer for EraseOutcome {
    fn take(applied: Applied) -> Result<Self, Box<Applied>> {
        match applied {
            Applied::Erased { entries, more } => Ok(EraseOutcome { entries, more }),
            other => Err(Box::new(other)),
        }
    }
}

/// The log index the region's standby copy is recorded to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyMatched {
    pub index: u64,
}

impl Answer for StandbyMatched {
    fn take(applied: Applied) -> Result<Self, Box<Applied>> {
        match applied {
            Applied::StandbyMatched { index } => Ok(StandbyMatched { index }),
            other => Err(Box::new(other)),
        }
    }
}

/// How the owner of a claim says its work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub outcome: Outcome,
    /// The answer to replay for the scope, if the work produced one.
    pub response: Option<StoredResponse>,
    pub resource_id: Option<String>,
}

impl Answer for Reconciliation {
    fn take(applied: Applied) -> Result<Self, Box<Applied>> {
        match applied {
            Applied::Reconciliation(reconciliation) => Ok(*reconciliation),
            other => Err(Box::new(other)),
        }
    }
}

/// `StageOrphans`' answer: whether the report was recorded already.
struct Staged {
    recorded: bool,
}

impl Answer for Staged {
    fn take(applied: Applied) -> Result<Self, Box<Applied>> {
        match applied {
            Applied::Staged { recorded } => Ok(Staged { recorded }),
            other => Err(Box::new(other)),
        }
    }
}

impl Answer for ReplayOutcome {
    fn take(applied: Applied) -> Result<Self, Box<Applied>> {
        match applied {
            Applied::Replayed { events } => Ok(ReplayOutcome { events }),
            other => Err(Box::new(other)),
        }
    }
}

impl Store {
    /// Executes `command`, whose kind the state machine answers with a `T`.
    async fn run<T: Answer>(&self, command: Command) -> Result<T, Error> {
        Ok(self.run_logged(command).await?.value)
    }

    /// `run`, with the index of the log entry that carried the command: the
    /// commands a tenant's request executes answer with it, so that the request
    /// can wait for that entry to reach the standby region.
    async fn run_logged<T: Answer>(&self, command: Command) -> Result<Logged<T>, Error> {
        let applied = self.execute_logged(command).await?;
        Ok(applied.map(|applied| {
            T::take(applied).unwrap_or_else(|other| {
                unreachable!(
                    "a command answered with {} got {other:?}",
                    std::any::type_name::<T>()
                )
            })
        }))
    }

    /// Creates `order` under `scope` unless the record or the business marker
    /// decides otherwise (contract section 4). `order` is built by the caller
    /// with a fresh id and `created_at = now`; it is used only if created.
    pub async fn create_order(
        &self,
        scope: Scope,
        fingerprint: String,
        order: Order,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<Logged<OrderOutcome>, Error> {
        self.run_logged(Command::CreateOrder {
            scope,
            fingerprint,
            order: Box::new(order),
            now,
            response_ttl_ms: policy.response_ttl_ms,
            marker_ttl_ms: policy.marker_ttl_ms,
            processed_ttl_ms: policy.processed_ttl_ms,
        })
        .await
    }

    /// Claims `scope` for `lease_ms`; `nonce` is the new owner token's random part.
    pub async fn claim(
        &self,
        scope: Scope,
        fingerprint: String,
        lease_ms: u64,
        nonce: u64,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<Logged<ClaimOutcome>, Error> {
        self.run_logged(Command::Claim {
            scope,
            fingerprint,
            lease_ms,
            nonce,
            now,
            response_ttl_ms: policy.response_ttl_ms,
        })
        .await
    }

    /// The owner `token` finishes its work on `scope` with `completion`.
    pub async fn complete(
        &self,
        scope: Scope,
        token: OwnerToken,
        completion: Completion,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<Logged<CompleteOutcome>, Error> {
        let Completion {
            outcome,
            response,
            resource_id,
        } = completion;
        self.run_logged(Command::Complete {
            scope,
            token,
            outcome,
            response,
            resource_id,
            now,
            response_ttl_ms: policy.response_ttl_ms,
        })
        .await
    }

    /// The owner `token` extends its lease on `scope` to `now + lease_ms`.
    pub async fn heartbeat(
        &self,
        scope: Scope,
        token: OwnerToken,
        lease_ms: u64,
        now: UnixMillis,
    ) -> Result<Logged<HeartbeatOutcome>, Error> {
        self.run_logged(Command::Heartbeat {
            scope,
            token,
            lease_ms,
            now,
        })
        .await
    }

    /// Deletes up to `entries_max` entries due at `now`, keeping outbox events
    /// some consumer in `consumers` has not had (`Command::Sweep`: the outbox
    /// and the expiry index); then reads the next `SWEEP_SCAN_ENTRIES_MAX`
    /// records and markers of this replica's tree and deletes the due ones
    /// among them, at most `entries_max` (`Command::SweepKeys`), a pass over
    /// them in as many calls as it takes. For the region's leader, whose tree
    /// is the most up to date; on another replica the scan is only less
    /// complete, since the command checks each key again when it applies.
    pub async fn sweep(
        &self,
        now: UnixMillis,
        entries_max: u32,
        consumers: Vec<Consumer>,
    ) -> Result<SweepOutcome, Error> {
        let mut out: SweepOutcome = self
            .run(Command::Sweep {
                now,
                entries_max,
                consumers,
            })
            .await?;
        let after = self
            .inner
            .sweep_cursor
            .lock()
            .expect("not poisoned")
            .clone();
        // A pass over up to `SWEEP_SCAN_ENTRIES_MAX` entries of the tree reads
        // sled for milliseconds: off the async threads, which serve requests
        // meanwhile.
        let inner = self.inner.clone();
        let crate::machine::DueScan { due: keys, next } = tokio::task::spawn_blocking(move || {
            inner.machine.scan_due(
                after.as_deref(),
                now,
                crate::limits::SWEEP_SCAN_ENTRIES_MAX,
                entries_max as usize,
            )
        })
        .await
        .map_err(|e| Error::Raft(format!("sweep scan task: {e}")))??;
        if !keys.is_empty() {
            let listed: SweepOutcome = self.run(Command::SweepKeys { now, keys }).await?;
            out.records += listed.records;
            out.markers += listed.markers;
            out.stale_index += listed.stale_index;
        }
        *self.inner.sweep_cursor.lock().expect("not poisoned") = next;
        Ok(out)
    }

    /// Erases up to `entries_max` entries of the deleted `tenant`
    /// (`Command::EraseTenant`); repeat while `more`.
    pub async fn erase_tenant(
        &self,
        tenant: TenantId,
        entries_max: u32,
        consumers: Vec<Consumer>,
    ) -> Result<EraseOutcome, Error> {
        self.run(Command::EraseTenant {
            tenant,
            entries_max,
            consumers,
        })
        .await
    }

    /// The inventory consumer's effect for `event_id`: reserve `items`.
    pub async fn consume_inventory(
        &self,
        event_id: String,
        order_id: String,
        items: Vec<Item>,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<ConsumeOutcome, Error> {
        self.run(Command::ConsumeInventory {
            event_id,
            order_id,
            items,
            now,
            processed_ttl_ms: policy.processed_ttl_ms,
        })
        .await
    }

    /// The payments consumer's effect for `event_id`: the charge's result on
    /// the order.
    pub async fn consume_payment(
        &self,
        event_id: String,
        order_id: String,
        charge_id: String,
        paid: bool,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<ConsumeOutcome, Error> {
        self.run(Command::ConsumePayment {
            event_id,
            order_id,
            charge_id,
            paid,
            now,
            processed_ttl_ms: policy.processed_ttl_ms,
        })
        .await
    }

    /// One relay round of the inventory consumer as one command: every event's
    /// reservations, then (with `cursor`) the cursor move, in one atomic write.
    pub async fn consume_inventory_batch(
        &self,
        events: Vec<InventoryEffect>,
        cursor: Option<Cursor>,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<BatchOutcome, Error> {
        self.run(Command::ConsumeInventoryBatch {
            events,
            now,
            processed_ttl_ms: policy.processed_ttl_ms,
            cursor,
        })
        .await
    }

    /// One relay round of the payments consumer as one command: every event's
    /// charge result, then (with `cursor`) the cursor move, in one atomic
    /// write. An event whose order is missing is refused alone.
    pub async fn consume_payment_batch(
        &self,
        events: Vec<PaymentEffect>,
        cursor: Option<Cursor>,
        now: UnixMillis,
        policy: &Policy,
    ) -> Result<BatchOutcome, Error> {
        self.run(Command::ConsumePaymentBatch {
            events,
            now,
            processed_ttl_ms: policy.processed_ttl_ms,
            cursor,
        })
        .await
    }

    /// `consumer` handled every event up to `seq`, in a round that read its
    /// cursor at `generation`.
    pub async fn advance_cursor(
        &self,
        consumer: Consumer,
        seq: u64,
        generation: u64,
    ) -> Result<CursorOutcome, Error> {
        self.run(Command::AdvanceCursor {
            consumer,
            seq,
            generation,
        })
        .await
    }

    /// Re-publishes kept events from `from_seq` on to `consumers`.
    pub async fn replay_outbox(
        &self,
        from_seq: u64,
        consumers: Vec<Consumer>,
    ) -> Result<ReplayOutcome, Error> {
        self.run(Command::ReplayOutbox {
            from_seq,
            consumers,
        })
        .await
    }

    /// Stops execution for `tenant`, moving away under `operation_id` at `epoch`.
    pub async fn fence(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    ) -> Result<GuardOutcome, Error> {
        self.run(Command::Fence {
            tenant,
            operation_id,
            epoch,
        })
        .await
    }

    /// Writes a first-pass page of `tenant`'s entries for its move
    /// `operation_id` at `epoch`.
    pub async fn import(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        entries: Vec<ExportEntry>,
    ) -> Result<GuardOutcome, Error> {
        self.run(Command::Import {
            tenant,
            operation_id,
            epoch,
            entries,
        })
        .await
    }

    /// Writes one page of `tenant`'s move `operation_id` at `epoch` for the
    /// driver holding the move's lease at `generation`: a first-pass page
    /// (`page.removed` empty) or a final-pass page of changes. Answers
    /// `GuardOutcome::Superseded` once a driver of a later generation
    /// imported for that move.
    pub async fn import_page(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        generation: u64,
        page: ChangePage,
    ) -> Result<GuardOutcome, Error> {
        self.run(Command::ImportPage {
            tenant,
            operation_id,
            epoch,
            generation,
            page,
        })
        .await
    }

    /// Carries `tenant`'s unhandled outbox events over from a failed region's
    /// promoted copy for the failover `operation_id` at `epoch`; the answer's
    /// `imported` counts the events new here.
    pub async fn import_events(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        events: Vec<CarriedEvent>,
        now: UnixMillis,
    ) -> Result<GuardOutcome, Error> {
        self.run(Command::ImportEvents {
            tenant,
            operation_id,
            epoch,
            events,
            now,
        })
        .await
    }

    /// This store owns `tenant` at `epoch`, which the failover `operation_id`
    /// imported it at (`Command::OwnImported`).
    pub async fn own_imported(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    ) -> Result<GuardOutcome, Error> {
        self.run(Command::OwnImported {
            tenant,
            operation_id,
            epoch,
        })
        .await
    }

    /// Moves up to `bytes_max` payload bytes of the events the done failover
    /// `operation_id` carried for `tenant` into the outbox, while its guard
    /// is that failover's `Importing` at `epoch` (`Command::ReleaseHeld`);
    /// repeat while `more`, then `own_imported`.
    pub async fn release_held(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
        bytes_max: u32,
    ) -> Result<EraseOutcome, Error> {
        self.run(Command::ReleaseHeld {
            tenant,
            operation_id,
            epoch,
            bytes_max,
        })
        .await
    }

    /// Erases up to `entries_max` entries of `tenant` that the failed failover
    /// `operation_id` imported here (`Command::AbandonImport`), and at the
    /// end its guard; repeat while `more`.
    pub async fn abandon_import(
        &self,
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
        consumers: Vec<Consumer>,
    ) -> Result<EraseOutcome, Error> {
        self.run(Command::AbandonImport {
            tenant,
            operation_id,
            entries_max,
            consumers,
        })
        .await
    }

    /// This store owns `tenant` at `epoch`: execution may resume or start.
    pub async fn own(&self, tenant: TenantId, epoch: u64) -> Result<GuardOutcome, Error> {
        self.run(Command::Own { tenant, epoch }).await
    }

    /// Starts `tenant`'s change index for its move `operation_id` at `epoch`
    /// (again: the index goes on). Answers with the index of the log entry
    /// that carried the command: every write applied after it carries a
    /// higher one, so `export_changes` since that index misses none of them.
    pub async fn track_changes(
        &self,
        tenant: TenantId,
        operation_id: String,
        epoch: u64,
    ) -> Result<Logged<GuardOutcome>, Error> {
        self.run_logged(Command::TrackChanges {
            tenant,
            operation_id,
            epoch,
        })
        .await
    }

    /// Stops tracking `tenant`'s changes for the ended move `operation_id` and
    /// deletes up to `entries_max` entries of its change index; repeat while
    /// `more`.
    pub async fn end_tracking(
        &self,
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
    ) -> Result<EraseOutcome, Error> {
        self.run(Command::EndTracking {
            tenant,
            operation_id,
            entries_max,
        })
        .await
    }

    /// Records that the region's standby copy holds the log up to `index` (the
    /// record only moves forward); every replica may purge its log up to it.
    pub async fn record_standby_matched(&self, index: u64) -> Result<StandbyMatched, Error> {
        self.run(Command::StandbyMatched { index }).await
    }

    /// Records `reconciliation` unless one is stored for its failover already;
    /// answers the stored one (so a second leader's report never replaces the
    /// first). Its orphans go in pages, a command each (`StageOrphans`), and
    /// the report in a last command that lists them (`RecordReport`): the
    /// whole report may be larger than a log entry.
    pub async fn record_reconciliation(
        &self,
        mut reconciliation: Reconciliation,
    ) -> Result<Reconciliation, Error> {
        let operation_id = reconciliation.operation_id.clone();
        let orphans = std::mem::take(&mut reconciliation.orphans);
        let listed = orphans.len() as u64;
        let pages = crate::reconcile::pages(orphans);
        let page_count = u32::try_from(pages.len()).expect("pages of a bounded report");
        for (page, orphans) in (0..page_count).zip(pages) {
            let staged = self
                .run::<Staged>(Command::StageOrphans {
                    operation_id: operation_id.clone(),
                    page,
                    orphans,
                })
                .await?;
            if staged.recorded {
                // The report is recorded already: the last command answers it.
                break;
            }
        }
        self.run(Command::RecordReport {
            report: Box::new(reconciliation),
            pages: page_count,
            listed,
        })
        .await
    }

    /// Marks that the failover `operation_id` took `tenant` away from this
    /// region from a copy at `at` (`Command::MarkLost`); answers the stored
    /// mark (the first one of that failover).
    pub async fn mark_lost(
        &self,
        tenant: TenantId,
        operation_id: String,
        at: u64,
    ) -> Result<LostTenant, Error> {
        self.run(Command::MarkLost {
            tenant,
            operation_id,
            at,
        })
        .await
    }

    /// Releases up to `entries_max` of `tenant`'s reservations that the
    /// failover `operation_id` made a second time in the new home
    /// (`Command::ReleaseCarriedReservations`); repeat while `more`.
    pub async fn release_carried_reservations(
        &self,
        tenant: TenantId,
        operation_id: String,
        entries_max: u32,
    ) -> Result<EraseOutcome, Error> {
        self.run(Command::ReleaseCarriedReservations {
            tenant,
            operation_id,
            entries_max,
        })
        .await
    }

    /// Marks the reconciliation of `operation_id` done (its tenants' data is
    /// erased); answers it. Refused when none is recorded.
    pub async fn finish_reconciliation(
        &self,
        operation_id: String,
    ) -> Result<Reconciliation, Error> {
        self.run(Command::FinishReconciliation { operation_id })
            .await
    }

    /// The log index the region's standby copy is recorded to hold (0: none yet).
    pub fn standby_matched(&self) -> Result<u64, Error> {
        Ok(self
            .inner
            .machine
            .get::<u64>(crate::keys::META_STANDBY_MATCHED)?
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Rejection, TenantGuard};
    use crate::test_common::{new_order, open, scope, HOUR_MS, T0};
    use keyhold_core::scope::Namespace;
    use keyhold_core::RecordState;

    const POLICY: Policy = Policy {
        response_ttl_ms: HOUR_MS,
        marker_ttl_ms: 24 * HOUR_MS,
        processed_ttl_ms: 48 * HOUR_MS,
        inflight_wait_ms: 1_000,
    };

    /// The order of `new_order(n)`, with its scope and fingerprint.
    fn order_of(n: u64) -> (Scope, String, Order) {
        let Command::CreateOrder {
            scope,
            fingerprint,
            order,
            ..
        } = new_order(n)
        else {
            panic!("new_order builds a CreateOrder")
        };
        (scope, fingerprint, *order)
    }

    fn t(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    /// Every typed method, on a real store, in the states that give its
    /// command kind's outcomes (the four tenant-scoped kinds fenced too): each
    /// answer arrives as the method's outcome, never as a panic of the one
    /// mapping in `Answer`.
    #[tokio::test]
    async fn the_standby_s_recorded_index_only_moves_forward_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path()).await;
            assert_eq!(store.standby_matched().unwrap(), 0);
            let first = store.record_standby_matched(40).await.unwrap();
            assert_eq!(first, StandbyMatched { index: 40 });
            // An older report (a former leader's, say) does not move it back.
            let older = store.record_standby_matched(12).await.unwrap();
            assert_eq!(older, StandbyMatched { index: 40 });
            assert_eq!(store.standby_matched().unwrap(), 40);
            store.shutdown().await.unwrap();
        }
        let store = open(dir.path()).await;
        assert_eq!(store.standby_matched().unwrap(), 40);
    }

    #[tokio::test]
    async fn every_command_kind_answers_through_its_typed_method() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let all = Consumer::ALL.to_vec();

        let (s, fp, order) = order_of(1);
        let created = store
            .create_order(s.clone(), fp.clone(), order.clone(), T0, &POLICY)
            .await
            .unwrap();
        assert!(
            matches!(created.value, OrderOutcome::Created { .. }),
            "{created:?}"
        );
        // The record is stamped with the index of the entry that created it;
        // the replay is a later entry of its own.
        let record = store.record_logged(&s).await.unwrap().unwrap();
        assert_eq!(record.index, created.index);
        let replayed = store
            .create_order(s.clone(), fp, order, T0, &POLICY)
            .await
            .unwrap();
        assert!(
            matches!(replayed.value, OrderOutcome::Replayed { .. }),
            "{replayed:?}"
        );
        assert!(replayed.index > created.index, "{replayed:?} {created:?}");
        let record = store.record_logged(&s).await.unwrap().unwrap();
        assert_eq!(record.index, created.index, "a replay writes nothing");

        let (event, order_id) = ("evt_ord_1".to_owned(), "ord_1".to_owned());
        let reserve =
            || store.consume_inventory(event.clone(), order_id.clone(), vec![], T0, &POLICY);
        assert_eq!(reserve().await.unwrap(), ConsumeOutcome::Applied);
        assert_eq!(reserve().await.unwrap(), ConsumeOutcome::Duplicate);
        let paid = store
            .consume_payment(event.clone(), order_id, "ch_1".into(), true, T0, &POLICY)
            .await
            .unwrap();
        assert_eq!(paid, ConsumeOutcome::Applied);
        let reserved = store
            .consume_inventory_batch(vec![], None, T0, &POLICY)
            .await
            .unwrap();
        assert_eq!(
            reserved,
            BatchOutcome {
                events: vec![],
                cursor: None
            }
        );
        let again = PaymentEffect {
            seq: 1,
            event_id: event.clone(),
            order_id: "ord_1".into(),
            charge_id: "ch_1".into(),
            paid: false,
        };
        let paid = store
            .consume_payment_batch(vec![again], None, T0, &POLICY)
            .await
            .unwrap();
        assert_eq!(paid.events, vec![Ok(ConsumeOutcome::Duplicate)]);
        // A refusal stays an error, as from `execute`.
        let missing = store
            .consume_payment(
                "evt_x".into(),
                "ord_x".into(),
                "ch_2".into(),
                true,
                T0,
                &POLICY,
            )
            .await;
        assert!(
            matches!(
                missing,
                Err(Error::Rejected(Rejection::PaymentForMissingOrder { .. }))
            ),
            "{missing:?}"
        );

        let advanced = store
            .advance_cursor(Consumer::Inventory, 1, 0)
            .await
            .unwrap();
        assert_eq!(advanced, CursorOutcome::Advanced);
        assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 1);
        let replay = store.replay_outbox(1, all.clone()).await.unwrap();
        assert_eq!(replay, ReplayOutcome { events: 1 });
        assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 0);

        let job = scope(Namespace::Claims, "job");
        let ClaimOutcome::Acquired { token, .. } = store
            .claim(job.clone(), "fp".into(), 1_000, 7, T0, &POLICY)
            .await
            .unwrap()
            .value
        else {
            panic!("a first claim acquires")
        };
        let extended = store
            .heartbeat(job.clone(), token, 1_000, T0.plus_ms(1))
            .await;
        assert!(
            matches!(&extended, Ok(e) if matches!(e.value, HeartbeatOutcome::Extended { .. })),
            "{extended:?}"
        );
        let response = StoredResponse {
            status: 200,
            headers: vec![],
            body: b"{}".to_vec(),
        };
        let completed = store
            .complete(
                job.clone(),
                token,
                Completion {
                    outcome: Outcome::Succeeded,
                    response: Some(response.clone()),
                    resource_id: None,
                },
                T0.plus_ms(2),
                &POLICY,
            )
            .await
            .unwrap();
        assert_eq!(
            completed.value,
            CompleteOutcome::Completed {
                state: RecordState::Succeeded
            }
        );
        let swept = store.sweep(T0, 100, all.clone()).await.unwrap();
        assert_eq!(swept, SweepOutcome::default());

        let tracked = store.track_changes(t("t1"), "op1".into(), 1).await.unwrap();
        assert!(
            matches!(tracked.value, GuardOutcome::Accepted { .. }),
            "{tracked:?}"
        );
        assert!(tracked.index > 0);
        let fenced = store.fence(t("t1"), "op1".into(), 1).await.unwrap();
        let guard = TenantGuard::Fenced {
            operation_id: "op1".into(),
            epoch: 1,
        };
        assert_eq!(fenced, GuardOutcome::Accepted { guard, imported: 0 });
        let (s, fp, order) = order_of(2);
        let create = store.create_order(s, fp, order, T0, &POLICY).await.unwrap();
        assert_eq!(create.value, OrderOutcome::Fenced);
        let claim = store
            .claim(job.clone(), "fp".into(), 1_000, 8, T0, &POLICY)
            .await;
        assert_eq!(claim.unwrap().value, ClaimOutcome::Fenced);
        let heartbeat = store.heartbeat(job.clone(), token, 1_000, T0).await;
        assert_eq!(heartbeat.unwrap().value, HeartbeatOutcome::Fenced);
        let complete = store
            .complete(
                job,
                token,
                Completion {
                    outcome: Outcome::Succeeded,
                    response: Some(response),
                    resource_id: None,
                },
                T0,
                &POLICY,
            )
            .await;
        assert_eq!(complete.unwrap().value, CompleteOutcome::Fenced);
        let ended = store
            .end_tracking(t("t1"), "op1".into(), 100)
            .await
            .unwrap();
        assert!(!ended.more, "{ended:?}");
        let erased = store.erase_tenant(t("t1"), 100, all).await.unwrap();
        assert!(erased.entries > 0 && !erased.more, "{erased:?}");

        let imported = store
            .import(t("t2"), "op2".into(), 1, vec![])
            .await
            .unwrap();
        assert!(
            matches!(imported, GuardOutcome::Accepted { .. }),
            "{imported:?}"
        );
        let changes = store
            .import_page(t("t2"), "op2".into(), 1, 3, ChangePage::default())
            .await
            .unwrap();
        assert!(
            matches!(changes, GuardOutcome::Accepted { .. }),
            "{changes:?}"
        );
        let owned = store.own(t("t2"), 2).await.unwrap();
        let guard = TenantGuard::Owned { epoch: 2 };
        assert_eq!(owned, GuardOutcome::Accepted { guard, imported: 0 });
        let refused = store.fence(t("t2"), "op2".into(), 1).await.unwrap();
        assert!(
            matches!(refused, GuardOutcome::Refused { .. }),
            "{refused:?}"
        );
        store.shutdown().await.unwrap();
    }

    /// A store written before guards existed keeps a fence as a bare
    /// `sfence:` key. Opened by this build it is the guard it stands for, a
    /// fence of epoch 0 (listed by `guards`, so the node can lift it): the
    /// tenant's orders are refused and any ownership lifts it. A guard
    /// written beside such a key is kept.
    #[tokio::test]
    async fn a_fence_written_before_guards_is_a_guard_once_opened() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path()).await;
            store.own(t("t2"), 3).await.unwrap();
            let tree = store.inner.machine.tree();
            for tenant in ["t1", "t2"] {
                let mut legacy = crate::keys::LEGACY_FENCE_PREFIX.to_vec();
                legacy.extend_from_slice(tenant.as_bytes());
                tree.insert(legacy, crate::codec::encode(7, &true)).unwrap();
            }
            tree.flush().unwrap();
            store.shutdown().await.unwrap();
        }
        let store = open(dir.path()).await;
        let fence = TenantGuard::Fenced {
            operation_id: String::new(),
            epoch: 0,
        };
        let owned = TenantGuard::Owned { epoch: 3 };
        assert_eq!(
            store.guards().unwrap(),
            [(t("t1"), fence.clone()), (t("t2"), owned)]
        );
        let tree = store.inner.machine.tree();
        assert!(tree
            .scan_prefix(crate::keys::LEGACY_FENCE_PREFIX)
            .next()
            .is_none());
        let stored = tree.get(crate::keys::guard(&t("t1"))).unwrap().unwrap();
        assert_eq!(
            crate::codec::stamp(&stored).unwrap(),
            7,
            "the fence's own index"
        );
        let (s, fp, order) = order_of(1);
        let create = store.create_order(s, fp, order, T0, &POLICY).await.unwrap();
        assert_eq!(create.value, OrderOutcome::Fenced);

        let lifted = store.own(t("t1"), 1).await.unwrap();
        let guard = TenantGuard::Owned { epoch: 1 };
        assert_eq!(lifted, GuardOutcome::Accepted { guard, imported: 0 });
        let (s, fp, order) = order_of(2);
        let create = store.create_order(s, fp, order, T0, &POLICY).await.unwrap();
        assert!(
            matches!(create.value, OrderOutcome::Created { .. }),
            "{create:?}"
        );
        store.shutdown().await.unwrap();
    }
}
