//! Store tests of a failover's import, through the public handle on real sled:
//! a promoted copy offers the outbox events some consumer had not handled,
//! each with the consumers that had; the importing store holds them once
//! (by event id) under the failover's `Importing` guard, out of its relays'
//! sight; only ownership under that very failover lifts the guard at the
//! import's epoch, and appends them to the outbox, marked processed for
//! those consumers (once the failover is done, `ReleaseHeld` appends them
//! first, in pages bounded by bytes); a failed failover's import drops them.

mod common;

use keyhold_core::{TenantId, UnixMillis};
use keyhold_store::{
    Applied, CarriedEvent, Command, Consumer, GuardOutcome, OrderOutcome, Store, TenantGuard,
};

fn tenant() -> TenantId {
    TenantId::parse("t1").unwrap()
}

/// Every event `source` would carry, read one event per page.
async fn carried(source: &Store) -> Vec<CarriedEvent> {
    let consumers = Consumer::ALL;
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let (page, next) = source
            .unhandled_events(&tenant(), &consumers, after, 1)
            .await
            .unwrap();
        assert!(page.len() <= 1, "pages are bounded by bytes");
        all.extend(page);
        match next {
            Some(seq) => after = seq,
            None => return all,
        }
    }
}

async fn outbox_ids(store: &Store) -> Vec<String> {
    let outbox = store.outbox_after(0, 100).await.unwrap();
    outbox.into_iter().map(|e| e.event_id).collect()
}

async fn guard(outcome: Result<GuardOutcome, keyhold_store::Error>) -> GuardOutcome {
    outcome.expect("a guard command answers")
}

#[tokio::test]
async fn unhandled_events_are_carried_once_and_the_failover_owns_the_tenant() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    for n in 1..=4 {
        let created = source.execute(common::new_order(n)).await.unwrap();
        assert!(matches!(
            created,
            Applied::Order(OrderOutcome::Created { .. })
        ));
    }
    // Inventory handled events 1 and 2; payments only event 3 (its effect is
    // durable, its cursor did not move yet).
    let advanced = Command::AdvanceCursor {
        consumer: Consumer::Inventory,
        seq: 2,
        generation: 0,
    };
    source.execute(advanced).await.unwrap();
    let paid = Command::ConsumePayment {
        event_id: "evt_ord_3".into(),
        order_id: "ord_3".into(),
        charge_id: "ch_3".into(),
        paid: true,
        now: common::T0,
        processed_ttl_ms: common::HOUR_MS,
    };
    source.execute(paid).await.unwrap();

    let events = carried(&source).await;
    let by_id: Vec<(&str, &[Consumer])> = events
        .iter()
        .map(|c| (c.event.event_id.as_str(), c.handled_by.as_slice()))
        .collect();
    assert_eq!(
        by_id,
        vec![
            ("evt_ord_1", &[Consumer::Inventory][..]),
            ("evt_ord_2", &[Consumer::Inventory][..]),
            ("evt_ord_3", &[Consumer::Payments][..]),
            ("evt_ord_4", &[][..]),
        ]
    );

    // The target has an event of its own tenant already: the carried ones
    // follow it.
    target.execute(common::tenant_order("t2", 7)).await.unwrap();
    let now = UnixMillis(common::T0.0 + 10);
    let import =
        |events: Vec<CarriedEvent>| target.import_events(tenant(), "f1".into(), 2, events, now);
    let first = guard(import(events.clone()).await).await;
    assert_eq!(
        first,
        GuardOutcome::Accepted {
            guard: TenantGuard::Importing {
                operation_id: "f1".into(),
                epoch: 2
            },
            imported: 4
        }
    );
    // Held: no relay sees them while the failover may still fail, and no
    // consumer is marked as having handled them here yet.
    assert_eq!(outbox_ids(&target).await, ["evt_ord_t2_000000000007"]);
    assert_eq!(target.held_events(&tenant()).unwrap(), 4);
    assert!(!target
        .is_processed(Consumer::Inventory, "evt_ord_1")
        .await
        .unwrap());
    // Again (a retry, a new leader): nothing new.
    let state = target.state_for_tests();
    let again = guard(import(events.clone()).await).await;
    assert!(matches!(again, GuardOutcome::Accepted { imported: 0, .. }));
    assert_eq!(
        target.state_for_tests(),
        state,
        "the repeat changed nothing"
    );

    // Nothing executes for the tenant while it is imported.
    assert!(matches!(
        target.execute(common::new_order(9)).await.unwrap(),
        Applied::Order(OrderOutcome::Fenced)
    ));
    // Ownership at the import's epoch: only under this failover.
    assert!(matches!(
        guard(target.own(tenant(), 2).await).await,
        GuardOutcome::Refused { .. }
    ));
    assert!(matches!(
        guard(target.own_imported(tenant(), "f0".into(), 2).await).await,
        GuardOutcome::Refused { .. }
    ));
    assert_eq!(
        guard(target.own_imported(tenant(), "f1".into(), 2).await).await,
        GuardOutcome::Accepted {
            guard: TenantGuard::Owned { epoch: 2 },
            imported: 0
        }
    );
    // Owned: the held events join the outbox after t2's, in the failed
    // region's order, marked processed for the consumers that handled them.
    assert_eq!(target.held_events(&tenant()).unwrap(), 0);
    let outbox = target.outbox_after(0, 100).await.unwrap();
    let ids: Vec<_> = outbox.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "evt_ord_t2_000000000007",
            "evt_ord_1",
            "evt_ord_2",
            "evt_ord_3",
            "evt_ord_4"
        ]
    );
    let seqs: Vec<_> = outbox.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(target.tenant_last_event_seq(&tenant()).unwrap(), 5);
    assert_eq!(
        outbox[1].payload,
        source.outbox_after(0, 1).await.unwrap()[0].payload,
        "an event keeps its payload"
    );
    for (event, consumer, handled) in [
        ("evt_ord_1", Consumer::Inventory, true),
        ("evt_ord_1", Consumer::Payments, false),
        ("evt_ord_3", Consumer::Inventory, false),
        ("evt_ord_3", Consumer::Payments, true),
        ("evt_ord_4", Consumer::Payments, false),
    ] {
        assert_eq!(
            target.is_processed(consumer, event).await.unwrap(),
            handled,
            "{consumer} and {event}"
        );
    }

    assert!(matches!(
        target.execute(common::new_order(9)).await.unwrap(),
        Applied::Order(OrderOutcome::Created { .. })
    ));
    // A late import of the same failover is refused once owned.
    assert!(matches!(
        guard(import(events).await).await,
        GuardOutcome::Refused { .. }
    ));
}

/// A repeated import keeps an order whose payment this store settled
/// meanwhile (a payment recorded here between the two imports).
#[tokio::test]
async fn a_repeated_import_keeps_an_order_settled_here() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    source.execute(common::new_order(1)).await.unwrap();
    let (entries, _) = source
        .export_tenant(&tenant(), None, usize::MAX)
        .await
        .unwrap();
    let import = || target.import(tenant(), "f1".into(), 2, entries.clone());
    assert!(matches!(
        guard(import().await).await,
        GuardOutcome::Accepted { .. }
    ));
    let paid = Command::ConsumePayment {
        event_id: "evt_ord_1".into(),
        order_id: "ord_1".into(),
        charge_id: "ch_1".into(),
        paid: true,
        now: common::T0,
        processed_ttl_ms: common::HOUR_MS,
    };
    target.execute(paid).await.unwrap();
    assert!(matches!(
        guard(import().await).await,
        GuardOutcome::Accepted { .. }
    ));
    let order = target.order("ord_1").await.unwrap().unwrap();
    assert_eq!(order.status, keyhold_core::OrderStatus::Paid);
    // The record and marker were written again all the same.
    assert_eq!(
        target.tenant_entry_count(&tenant()).unwrap(),
        entries.len() as u64
    );
}

/// A failed failover's import is erased page by page with its guard and its
/// events' marks: another failover at the same epoch (refused before) then
/// imports and carries every event again; the other tenants' data stays.
#[tokio::test]
async fn a_failed_failovers_import_is_abandoned_and_a_later_one_starts_clean() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    for n in 1..=3 {
        source.execute(common::new_order(n)).await.unwrap();
    }
    target.execute(common::tenant_order("t2", 7)).await.unwrap();
    let other_tenant = target.state_for_tests();
    let (entries, _) = source
        .export_tenant(&tenant(), None, usize::MAX)
        .await
        .unwrap();
    let events = carried(&source).await;
    assert_eq!(events.len(), 3);
    let import_all = |op: &'static str| {
        let (entries, events) = (entries.clone(), events.clone());
        let target = target.clone();
        async move {
            let first = guard(target.import(tenant(), op.into(), 2, entries).await).await;
            let second = guard(
                target
                    .import_events(tenant(), op.into(), 2, events, common::T0)
                    .await,
            )
            .await;
            (first, second)
        }
    };
    let (first, carried_events) = import_all("f1").await;
    assert!(matches!(first, GuardOutcome::Accepted { .. }));
    assert!(matches!(
        carried_events,
        GuardOutcome::Accepted { imported: 3, .. }
    ));
    // Another failover at the same epoch is refused while f1's guard stands.
    let (refused, _) = import_all("f2").await;
    assert!(matches!(refused, GuardOutcome::Refused { .. }));

    // Another operation's abandonment touches nothing.
    let consumers = Consumer::ALL.to_vec();
    let none = target
        .abandon_import(tenant(), "f0".into(), 2, consumers.clone())
        .await
        .unwrap();
    assert_eq!((none.entries, none.more), (0, false));
    let mut pages = 0;
    loop {
        let page = target
            .abandon_import(tenant(), "f1".into(), 2, consumers.clone())
            .await
            .unwrap();
        pages += 1;
        if !page.more {
            break;
        }
    }
    assert!(pages > 1, "erased in pages");
    assert_eq!(target.guard(&tenant()).unwrap(), None);
    assert_eq!(target.tenant_entry_count(&tenant()).unwrap(), 0);
    assert_eq!(target.held_events(&tenant()).unwrap(), 0);
    let left: Vec<_> = target
        .outbox_after(0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(left, ["evt_ord_t2_000000000007"]);
    // What remains of t2 is as it was (expiry index entries of the erased
    // entries aside, which the sweeper drops as stale).
    let t2_now: Vec<_> = target
        .state_for_tests()
        .into_iter()
        .filter(|(k, _)| k.first() != Some(&b'e'))
        .collect();
    let t2_before: Vec<_> = other_tenant
        .into_iter()
        .filter(|(k, _)| k.first() != Some(&b'e'))
        .collect();
    assert_eq!(t2_now, t2_before);

    let (again, carried_again) = import_all("f2").await;
    assert!(matches!(again, GuardOutcome::Accepted { .. }));
    assert!(
        matches!(carried_again, GuardOutcome::Accepted { imported: 3, .. }),
        "{carried_again:?}"
    );
}

/// Held events live only under the import that carried them: a later
/// failover's import at a higher epoch (the first failed, and this store has
/// not abandoned it yet) holds them again under its own guard; ownership by
/// any other way than that failover's own (`Own` at a later epoch) drops
/// them with their marks, since that failover never gave the tenant here.
#[tokio::test]
async fn held_events_follow_the_import_that_holds_them() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    for n in 1..=3 {
        source.execute(common::new_order(n)).await.unwrap();
    }
    let events = carried(&source).await;
    let import = |op: &'static str, epoch: u64| {
        let (target, events) = (target.clone(), events.clone());
        async move {
            guard(
                target
                    .import_events(tenant(), op.into(), epoch, events, common::T0)
                    .await,
            )
            .await
        }
    };
    assert!(matches!(
        import("f1", 2).await,
        GuardOutcome::Accepted { imported: 3, .. }
    ));
    assert!(matches!(
        import("f2", 3).await,
        GuardOutcome::Accepted { imported: 3, .. }
    ));
    assert_eq!(target.held_events(&tenant()).unwrap(), 3);
    assert!(matches!(
        guard(target.own(tenant(), 4).await).await,
        GuardOutcome::Accepted { .. }
    ));
    assert_eq!(target.held_events(&tenant()).unwrap(), 0);
    assert!(outbox_ids(&target).await.is_empty(), "nothing released");
    assert!(
        matches!(
            import("f3", 5).await,
            GuardOutcome::Accepted { imported: 3, .. }
        ),
        "the marks went with the held events"
    );
}

/// Events of other tenants are never carried, and an event of another tenant
/// in an import is refused as a rejection.
#[tokio::test]
async fn only_the_tenants_own_events_travel() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    source.execute(common::new_order(1)).await.unwrap();
    source.execute(common::tenant_order("t2", 2)).await.unwrap();
    let events = carried(&source).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event.tenant, tenant());
    let other = TenantId::parse("t2").unwrap();
    let refused = target
        .import_events(other, "f1".into(), 2, events, common::T0)
        .await;
    assert!(
        matches!(refused, Err(keyhold_store::Error::Rejected(_))),
        "{refused:?}"
    );
}

/// Once the failover is done, its carried events join the outbox in pages
/// bounded by their payload bytes (`ReleaseHeld`; at least one event a page,
/// in the failed region's order), only under that failover's `Importing`
/// guard; `OwnImported` then finds nothing left and owns the tenant.
#[tokio::test]
async fn held_events_are_released_in_pages_bounded_by_bytes() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = common::open(source_dir.path()).await;
    let target = common::open(target_dir.path()).await;
    for n in 1..=5 {
        source.execute(common::new_order(n)).await.unwrap();
    }
    let events = carried(&source).await;
    let payload = events[0].event.payload.len() as u32;
    assert!(events
        .iter()
        .all(|c| c.event.payload.len() as u32 == payload));
    let imported = target.import_events(tenant(), "f1".into(), 2, events, common::T0);
    assert!(matches!(
        guard(imported.await).await,
        GuardOutcome::Accepted { imported: 5, .. }
    ));
    let page = |operation: &str, epoch: u64, bytes_max: u32| {
        let released = target.release_held(tenant(), operation.into(), epoch, bytes_max);
        async move {
            let page = released.await.unwrap();
            (page.entries, page.more)
        }
    };
    // Not this failover's guard: nothing moves.
    assert_eq!(page("f0", 2, u32::MAX).await, (0, false));
    assert_eq!(page("f1", 3, u32::MAX).await, (0, false));
    // At least one event a page; then two events' bytes a page.
    assert_eq!(page("f1", 2, 0).await, (1, true));
    assert_eq!(outbox_ids(&target).await, ["evt_ord_1"]);
    assert_eq!(target.held_events(&tenant()).unwrap(), 4);
    assert_eq!(page("f1", 2, 2 * payload).await, (2, true));
    assert_eq!(page("f1", 2, 2 * payload).await, (2, false));
    assert_eq!(page("f1", 2, 2 * payload).await, (0, false));
    let outbox = target.outbox_after(0, 100).await.unwrap();
    let ids: Vec<_> = outbox.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "evt_ord_1",
            "evt_ord_2",
            "evt_ord_3",
            "evt_ord_4",
            "evt_ord_5"
        ]
    );
    let seqs: Vec<_> = outbox.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(target.tenant_last_event_seq(&tenant()).unwrap(), 5);
    assert_eq!(target.held_events(&tenant()).unwrap(), 0);

    assert_eq!(
        target.guard(&tenant()).unwrap(),
        Some(TenantGuard::Importing {
            operation_id: "f1".into(),
            epoch: 2
        }),
        "released, not yet owned"
    );
    let state = target.state_for_tests();
    assert_eq!(
        guard(target.own_imported(tenant(), "f1".into(), 2).await).await,
        GuardOutcome::Accepted {
            guard: TenantGuard::Owned { epoch: 2 },
            imported: 0
        }
    );
    assert_eq!(target.state_for_tests(), state, "nothing released twice");
    // Owned: a page releases nothing any more.
    assert_eq!(page("f1", 2, u32::MAX).await, (0, false));
}
