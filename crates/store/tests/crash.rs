//! Crash recovery with refused commands in the write-ahead log: a child process
//! (this test binary re-invoked with `CRASH_CHILD_DIR` set) has the store refuse
//! an import of another tenant's entries, a payment for a missing order and an
//! order whose marker names a missing order, then creates an order, prints `ACK`
//! once it is acknowledged and aborts before any checkpoint. The parent reopens
//! the store: refusals are values that replay to the same refusal, so the store
//! opens and the acknowledged order is there.
//!
//! An abort leaves sled's unsynced writes in the page cache, so the live
//! directory may need no replay at all. The child therefore also keeps a copy
//! of the directory as it was at open (sled at its checkpoint) and puts the
//! final log into it: the state after a power loss, which must replay every
//! logged command, the refused ones included.

mod common;

use common::{create, HOUR_MS, T0};
use keyhold_core::TenantId;
use keyhold_store::{Applied, Command, Error, OrderOutcome, Rejection, Store};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

const CHILD_DIR_ENV: &str = "CRASH_CHILD_DIR";
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).unwrap()
}

async fn created(store: &Store, command: Command) -> bool {
    matches!(
        store.execute(command).await,
        Ok(Applied::Order(OrderOutcome::Created { .. }))
    )
}

/// Child side; returns at once in a normal test run.
#[tokio::test]
async fn crash_child_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    // Entries of tenant t1 with one order, exported from a scratch store.
    let scratch = tempfile::tempdir().unwrap();
    let source = Store::open(scratch.path()).unwrap();
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

    let live = dir.join("live");
    let cold = dir.join("cold");
    let store = Store::open(&live).unwrap();
    // Opening flushed sled and emptied the log: this copy is sled at its checkpoint.
    copy_dir(&live, &cold);
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
    // The acknowledged order the parent must find.
    assert!(created(&store, create("k2", "c2", "fp", "ord_acked", T0)).await);
    // No checkpoint: the log holds every command above.
    std::fs::copy(live.join("commands.wal"), cold.join("commands.wal")).unwrap();
    println!("ACK");
    std::process::abort();
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn refused_commands_in_the_log_do_not_stop_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::spawn_child("crash_child_entry_point", CHILD_DIR_ENV, dir.path());
    let stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut acked = false;
    for line in BufReader::new(stdout).lines() {
        if line.unwrap().ends_with("ACK") {
            acked = true;
            break;
        }
        assert!(started.elapsed() < CHILD_DEADLINE, "child took too long");
    }
    let status = child.wait().unwrap();
    assert!(acked, "the child never acknowledged its order");
    assert!(!status.success(), "the child must have aborted: {status}");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for kept in ["live", "cold"] {
        runtime.block_on(async {
            let store = Store::open(&dir.path().join(kept))
                .unwrap_or_else(|e| panic!("the {kept} store does not reopen: {e}"));
            let order = store.order("ord_acked").await.unwrap();
            assert!(order.is_some(), "the acknowledged order survived ({kept})");
            assert!(store.order("ord_x").await.unwrap().is_none());
            // The refusals replayed as refusals: nothing of them was written.
            assert!(store.order("ord_src").await.unwrap().is_none());
            assert!(!store.is_processed("payments", "evt_nowhere").await.unwrap());
        });
    }
}

#[tokio::test]
async fn refusals_are_typed_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
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
