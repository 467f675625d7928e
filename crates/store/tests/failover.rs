//! Store tests of a failover's import, through the public handle on real sled:
//! a promoted copy offers the outbox events some consumer had not handled,
//! each with the consumers that had; the importing store appends them once
//! (by event id) under the failover's `Importing` guard, marked processed
//! for those consumers; and only ownership under that very failover lifts
//! the guard at the import's epoch.

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
/// meanwhile (the carried event was delivered here between the two imports).
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
