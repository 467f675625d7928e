//! One sled batch per entry: a command decides on the writes of its entry's earlier
//! commands, which are not in the tree yet, exactly as it did when each command had
//! its own batch. One entry of commands that read what the ones before them wrote
//! (a second order on the same key, a payment for the order just created, scans of
//! the expiry index, the outbox and a tenant's entries after writes and deletions)
//! is applied in one batch, in batches of a few KiB (an entry larger than the limit)
//! and one command per batch (what earlier releases wrote): the answers and the
//! region must be the same each time, and the answers those of the commands one
//! after the other.

use keyhold_core::{Item, TenantId};
use keyhold_store::raft::{self, EntryOutcome, RegionStateMachine};
use keyhold_store::{
    Applied, Command, ConsumeOutcome, Consumer, CursorOutcome, GuardOutcome, OrderOutcome,
};
use openraft::storage::RaftStateMachine;

use crate::common::{create, tenant_order, HOUR_MS, T0};
use crate::helpers::{answers, commands_entry, membership_entry, record_key};

fn t2() -> TenantId {
    TenantId::parse("t2").unwrap()
}

/// The region tree's key of the order record of `key` (`keys::record`: the
/// record prefix `r`, then the scope's storage key).
/// Commands each reading some state an earlier one of the list wrote.
fn commands() -> Vec<Command> {
    vec![
        // 0: a new order.
        create("k1", "c1", "fp1", "ord_1", T0),
        // 1: the same key and request again: replays the record of 0.
        create("k1", "c1", "fp1", "ord_2", T0.plus_ms(5)),
        // 2: another key, the same client order id: hits the marker of 0.
        create("k2", "c1", "fp1", "ord_3", T0),
        // 3, 4: the inventory consumer, then its duplicate.
        Command::ConsumeInventory {
            event_id: "evt_ord_1".into(),
            order_id: "ord_1".into(),
            items: vec![Item {
                sku: "a".into(),
                quantity: 1,
            }],
            now: T0,
            processed_ttl_ms: HOUR_MS,
        },
        Command::ConsumeInventory {
            event_id: "evt_ord_1".into(),
            order_id: "ord_1".into(),
            items: vec![],
            now: T0,
            processed_ttl_ms: HOUR_MS,
        },
        // 5: the payment of the order of 0 (refused if the order were not seen).
        Command::ConsumePayment {
            event_id: "evt_ord_1".into(),
            order_id: "ord_1".into(),
            charge_id: "ch".into(),
            paid: true,
            now: T0,
            processed_ttl_ms: HOUR_MS,
        },
        // 6: a second order: outbox sequence 2.
        create("k4", "c4", "fp4", "ord_4", T0),
        // 7, 8: the cursor moves to 2, then a move to 1 is behind it.
        Command::AdvanceCursor {
            consumer: Consumer::Inventory,
            seq: 2,
            generation: 0,
        },
        Command::AdvanceCursor {
            consumer: Consumer::Inventory,
            seq: 1,
            generation: 0,
        },
        // 9: a replay counts the outbox events from 1: both of this entry.
        Command::ReplayOutbox {
            from_seq: 1,
            consumers: vec![Consumer::Inventory],
        },
        // 10: the sweeper lists both records (of 0 and 6), due by now and
        // written by this entry: the check sees them.
        Command::SweepKeys {
            now: T0.plus_ms(2 * HOUR_MS),
            keys: vec![record_key("k1"), record_key("k4")],
        },
        // 11: a replay on the swept key: a record no more, the marker decides.
        create("k1", "c1", "fp1", "ord_5", T0.plus_ms(2 * HOUR_MS)),
        // 12: tenant t2's changes are tracked from here on ...
        Command::TrackChanges {
            tenant: t2(),
            operation_id: "m1".into(),
            epoch: 1,
        },
        // 13: ... so its order is noted in its change index ...
        tenant_order("t2", 1),
        // 14: ... which the end of the tracking scans and deletes.
        Command::EndTracking {
            tenant: t2(),
            operation_id: "m1".into(),
            entries_max: 1_000,
        },
        // 15, 16: fenced, t2 executes no more.
        Command::Fence {
            tenant: t2(),
            operation_id: "m2".into(),
            epoch: 2,
        },
        tenant_order("t2", 2),
        // 17: t1's erasure scans its entries, all written by this entry.
        Command::EraseTenant {
            tenant: TenantId::parse("t1").unwrap(),
            entries_max: 1_000,
            consumers: vec![Consumer::Inventory],
        },
        // 18: after the deletions, the scan of the outbox finds t2's event only.
        Command::ReplayOutbox {
            from_seq: 1,
            consumers: vec![Consumer::Payments],
        },
        // 19: and the erased key is new again.
        create("k1", "c1", "fp1", "ord_6", T0.plus_ms(2 * HOUR_MS)),
    ]
}

/// Every entry of a region, as stored.
type Region = Vec<(Vec<u8>, Vec<u8>)>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Applies the membership and then `commands` as entry 2 to a new state machine
/// writing an entry in batches of `batch_bytes`; returns the answers and the region.
fn apply_in_batches_of(batch_bytes: usize) -> (Vec<Applied>, Region) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new()
        .path(dir.path().join("db"))
        .open()
        .expect("db");
    let tree = db.open_tree(raft::REGION_TREE).expect("tree");
    let mut machine = RegionStateMachine::open_with_entry_batch_bytes_max(
        db,
        tree,
        &dir.path().join("snapshots"),
        batch_bytes,
    )
    .expect("open");
    runtime().block_on(async {
        machine
            .apply([membership_entry(1)])
            .await
            .expect("membership");
        let outcomes: Vec<EntryOutcome> = machine
            .apply([commands_entry(2, commands())])
            .await
            .expect("apply");
        let (applied, _) = machine.applied_state().await.expect("applied");
        assert_eq!(applied.map(|id| id.index), Some(2));
        (answers(&outcomes[0]).to_vec(), machine.entries_for_tests())
    })
}

#[test]
fn commands_of_one_entry_see_each_others_writes_in_one_batch() {
    let (answers, region) = apply_in_batches_of(keyhold_store::limits::ENTRY_BATCH_BYTES_MAX);
    assert!(
        matches!(&answers[0], Applied::Order(OrderOutcome::Created { .. })),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(&answers[1], Applied::Order(OrderOutcome::Replayed { .. })),
        "{:?}",
        answers[1]
    );
    match &answers[2] {
        Applied::Order(OrderOutcome::MarkerHit { order }) => assert_eq!(order.order_id, "ord_1"),
        other => panic!("{other:?}"),
    }
    assert_eq!(answers[3], Applied::Consumed(ConsumeOutcome::Applied));
    assert_eq!(answers[4], Applied::Consumed(ConsumeOutcome::Duplicate));
    assert_eq!(answers[5], Applied::Consumed(ConsumeOutcome::Applied));
    assert_eq!(answers[7], Applied::Cursor(CursorOutcome::Advanced));
    assert_eq!(answers[8], Applied::Cursor(CursorOutcome::Behind));
    assert_eq!(answers[9], Applied::Replayed { events: 2 });
    match &answers[10] {
        Applied::Sweep(swept) => assert_eq!(swept.records, 2, "{swept:?}"),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(&answers[11], Applied::Order(OrderOutcome::MarkerHit { .. })),
        "{:?}",
        answers[11]
    );
    assert!(
        matches!(&answers[12], Applied::Guard(GuardOutcome::Accepted { .. })),
        "{:?}",
        answers[12]
    );
    // The order's record, marker, order index and order were noted.
    assert_eq!(
        answers[14],
        Applied::Erased {
            entries: 4,
            more: false
        }
    );
    assert_eq!(answers[16], Applied::Order(OrderOutcome::Fenced));
    match &answers[17] {
        Applied::Erased { entries, more } => assert!(*entries > 0 && !*more, "{entries}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(answers[18], Applied::Replayed { events: 1 });
    assert!(
        matches!(&answers[19], Applied::Order(OrderOutcome::Created { .. })),
        "{:?}",
        answers[19]
    );
    assert!(region.iter().any(|(key, _)| key.as_slice() == b"oord_6"));
}

#[test]
fn an_entry_in_several_batches_answers_and_stores_as_in_one() {
    let whole = apply_in_batches_of(keyhold_store::limits::ENTRY_BATCH_BYTES_MAX);
    // Each command in its own batch, as earlier releases wrote an entry, and
    // batches of a few commands each, as an entry over the limit is written.
    for batch_bytes in [0, 1_500, 4_000] {
        let parts = apply_in_batches_of(batch_bytes);
        assert_eq!(
            parts.0, whole.0,
            "answers in batches of {batch_bytes} bytes"
        );
        assert_eq!(parts.1, whole.1, "region in batches of {batch_bytes} bytes");
    }
    // Not a vacuous comparison: the entry wrote the region.
    assert!(whole.1.len() > 10, "{}", whole.1.len());
}
