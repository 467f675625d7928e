//! Crash recovery of the store over its region group: a child process (this test
//! binary re-invoked with `CRASH_CHILD_DIR` set) has the store refuse an import of
//! another tenant's entries, a payment for a missing order and an order whose marker
//! names a missing order, then runs `WRITERS` concurrent writers of new orders and
//! prints `ACK n` for each acknowledged one; the parent SIGKILLs it mid-load. sled
//! persists the region tree only in the background, so the kill takes applied
//! entries out of the tree, and the Raft log must bring them back.
//!
//! The parent reopens the store: refusals are values that replay to the same
//! refusal, so the store opens; every acknowledged order is there; and no command
//! was applied twice: each order has exactly one outbox event, and the outbox's
//! sequence numbers run from 1 without a gap or a repeat.

mod common;

use common::{create, HOUR_MS, T0};
use keyhold_core::{TenantId, UnixMillis};
use keyhold_store::{Applied, Command, Consumer, EntryKind, Error, OrderOutcome, Rejection, Store};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

const CHILD_DIR_ENV: &str = "CRASH_CHILD_DIR";
const CHILD_DEADLINE: Duration = Duration::from_secs(60);
/// Concurrent writers in the child: enough that entries carry several commands.
const WRITERS: u64 = 32;
/// Orders each writer creates at most (the parent kills the child long before).
const ORDERS_PER_WRITER_MAX: u64 = 100_000;
/// The parent kills the child after reading this many acknowledgements.
const KILL_AFTER_ACKS: usize = 600;

fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).unwrap()
}

async fn created(store: &Store, command: Command) -> bool {
    matches!(
        store.execute(command).await,
        Ok(Applied::Order(OrderOutcome::Created { .. }))
    )
}

fn loaded_order(n: u64) -> Command {
    create(
        &format!("load-{n}"),
        &format!("load-{n}"),
        "fp",
        &format!("ord_load_{n}"),
        UnixMillis(T0.0 + n),
    )
}

/// Child side; returns at once in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    // Entries of tenant t1 with one order, exported from a scratch store.
    let scratch = tempfile::tempdir().unwrap();
    let source = common::open(scratch.path()).await;
    assert!(created(&source, create("k0", "c0", "fp", "ord_src", T0)).await);
    let (entries, _) = source
        .export_tenant(&tenant("t1"), None, 100)
        .await
        .unwrap();
    let marker: Vec<_> = entries
        .iter()
        .filter(|e| e.key.first() == Some(&b'm'))
        .cloned()
        .collect();
    assert_eq!(marker.len(), 1);

    let store = common::open(&dir).await;
    // Another tenant's entries: refused.
    let foreign = Command::Import {
        tenant: tenant("t2"),
        operation_id: "op1".into(),
        epoch: 1,
        entries: entries.clone(),
    };
    assert!(store.execute(foreign).await.is_err());
    // A payment for an order this store does not hold: refused.
    let payment = Command::ConsumePayment {
        event_id: "evt_nowhere".into(),
        order_id: "ord_nowhere".into(),
        charge_id: "ch_1".into(),
        paid: true,
        now: T0,
        processed_ttl_ms: HOUR_MS,
    };
    assert!(store.execute(payment).await.is_err());
    // A marker without its order (a partial import), then an order that hits it.
    let partial = Command::Import {
        tenant: tenant("t1"),
        operation_id: "op1".into(),
        epoch: 1,
        entries: marker,
    };
    assert!(store.execute(partial).await.is_ok());
    // The move completed: this store owns t1 (a later epoch) and executes.
    let own = Command::Own {
        tenant: tenant("t1"),
        epoch: 2,
    };
    assert!(store.execute(own).await.is_ok());
    assert!(store
        .execute(create("k1", "c0", "fp", "ord_x", T0))
        .await
        .is_err());
    // The load the parent kills.
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let store = store.clone();
        writers.spawn(async move {
            for i in 0..ORDERS_PER_WRITER_MAX {
                let n = 1 + writer * ORDERS_PER_WRITER_MAX + i;
                assert!(created(&store, loaded_order(n)).await, "order {n}");
                println!("ACK {n}");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
}

#[test]
fn a_kill_mid_load_loses_no_acknowledged_order_and_applies_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::spawn_child("crash_child_entry_point", CHILD_DIR_ENV, dir.path());
    let stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut acked = BTreeSet::new();
    // Kept open until the kill, so the child never writes to a closed pipe.
    let mut lines = BufReader::new(stdout).lines();
    for line in &mut lines {
        // libtest may print "test <name> ... " before the child's first line.
        if let Some((_, n)) = line.unwrap().split_once("ACK ") {
            acked.insert(n.parse::<u64>().unwrap());
            if acked.len() >= KILL_AFTER_ACKS {
                break;
            }
        }
        assert!(started.elapsed() < CHILD_DEADLINE, "child took too long");
    }
    // SIGKILL: no destructor, no flush of the region tree.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    drop(lines);
    assert!(
        !status.success(),
        "the child must have been killed: {status}"
    );
    assert_eq!(acked.len(), KILL_AFTER_ACKS, "the child stopped early");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // What the region tree kept by itself (sled flushes it only in the
    // background): the orders the log must bring back are the difference.
    let kept = {
        let db = sled::open(dir.path().join("db")).unwrap();
        let tree = db.open_tree(keyhold_store::raft::REGION_TREE).unwrap();
        tree.scan_prefix(b"oord_load_").count()
    };
    runtime.block_on(async {
        let store = Store::open(dir.path(), common::member())
            .await
            .unwrap_or_else(|e| panic!("the store does not reopen: {e}"));
        for n in &acked {
            let order = store.order(&format!("ord_load_{n}")).await.unwrap();
            assert!(order.is_some(), "acknowledged order {n} is lost");
        }
        assert!(store.order("ord_x").await.unwrap().is_none());
        // The refusals replayed as refusals: nothing of them was written.
        assert!(store.order("ord_src").await.unwrap().is_none());
        assert!(!store
            .is_processed(Consumer::Payments, "evt_nowhere")
            .await
            .unwrap());
        // Exactly once: one outbox event per order, numbered 1, 2, 3, ...
        let orders = store.count_prefix(EntryKind::Order);
        let events = store.outbox_after(0, usize::MAX).await.unwrap();
        assert_eq!(events.len(), orders, "outbox events vs orders");
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=orders as u64).collect::<Vec<_>>());
        let ordered: BTreeSet<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
        assert_eq!(ordered.len(), orders, "an order with two events");
        eprintln!(
            "{} acknowledged, {kept} loaded orders in the tree after the kill, \
             {orders} orders after the restart",
            acked.len()
        );
    });
}

#[tokio::test]
async fn refusals_are_typed_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let before = store.state_for_tests();
    let payment = Command::ConsumePayment {
        event_id: "evt_1".into(),
        order_id: "ord_missing".into(),
        charge_id: "ch_1".into(),
        paid: false,
        now: T0,
        processed_ttl_ms: HOUR_MS,
    };
    match store.execute(payment).await {
        Err(Error::Rejected(Rejection::PaymentForMissingOrder { order_id })) => {
            assert_eq!(order_id, "ord_missing")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let bad = Command::Import {
        tenant: tenant("t1"),
        operation_id: "op1".into(),
        epoch: 1,
        entries: vec![keyhold_store::ExportEntry {
            key: b"rt1\0whatever".to_vec(),
            payload: vec![0xff, 0xff, 0xff],
        }],
    };
    assert!(matches!(
        store.execute(bad).await,
        Err(Error::Rejected(Rejection::ImportUndecodable {
            index: 0,
            ..
        }))
    ));
    let odd = Command::Import {
        tenant: tenant("t1"),
        operation_id: "op1".into(),
        epoch: 1,
        entries: vec![keyhold_store::ExportEntry {
            key: b"zzz".to_vec(),
            payload: vec![],
        }],
    };
    assert!(matches!(
        store.execute(odd).await,
        Err(Error::Rejected(Rejection::ImportUnexpectedKind {
            index: 0
        }))
    ));
    assert_eq!(store.state_for_tests(), before);
}
