//! Store tests through the public handle: the order outcome table applied by the
//! real state machine on sled, group commit, restart, the storage format marker,
//! and the expiry sweep.

use keyhold_core::scope::Namespace;
use keyhold_core::{
    OrderStatus, Outcome, OwnerToken, RecordState, StoredResponse, TenantId, UnixMillis,
};
use keyhold_store::{
    Applied, ClaimOutcome, Command, CompleteOutcome, Consumer, EntryKind, GuardOutcome,
    HeartbeatOutcome, OrderOutcome, Store,
};

mod common;
use common::{create, scope, HOUR_MS, T0};

async fn order(store: &Store, command: Command) -> OrderOutcome {
    match store.execute(command).await.unwrap() {
        Applied::Order(o) => o,
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn order_outcomes_on_sled() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let OrderOutcome::Created { response } =
        order(&store, create("k1", "c1", "fp1", "ord_1", T0)).await
    else {
        panic!("first request creates")
    };
    assert_eq!(response.status, 201);
    // Same scope, same fingerprint: the stored bytes, not a new order.
    assert_eq!(
        order(&store, create("k1", "c1", "fp1", "ord_2", T0.plus_ms(5))).await,
        OrderOutcome::Replayed {
            response: response.clone()
        }
    );
    assert_eq!(
        order(&store, create("k1", "c1", "fp2", "ord_3", T0)).await,
        OrderOutcome::KeyReused
    );
    let OrderOutcome::MarkerHit { order: hit } =
        order(&store, create("k2", "c1", "fp1", "ord_4", T0)).await
    else {
        panic!("marker hit")
    };
    assert_eq!(hit.order_id, "ord_1");
    assert_eq!(
        order(&store, create("k3", "c1", "fp9", "ord_5", T0)).await,
        OrderOutcome::MarkerConflict
    );
    // After the record expired, the same key is decided by the marker.
    let later = T0.plus_ms(HOUR_MS + 1);
    assert!(matches!(
        order(&store, create("k1", "c1", "fp1", "ord_6", later)).await,
        OrderOutcome::MarkerHit { .. }
    ));
    assert_eq!(store.count_prefix(EntryKind::Order), 1);
    assert_eq!(store.count_prefix(EntryKind::Outbox), 1);
    let found = store
        .order_by_client_order_id(&TenantId::parse("t1").unwrap(), "c1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.order_id, "ord_1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_share_flushes_and_create_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                // Half the commands race on one client_order_id.
                let coid = if i % 2 == 0 {
                    "shared".to_owned()
                } else {
                    format!("c{i}")
                };
                order(
                    &store,
                    create(&format!("k{i}"), &coid, "fp", &format!("ord_{i}"), T0),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        if let OrderOutcome::Created { .. } = t.await.unwrap() {
            created += 1;
        }
    }
    // 32 distinct client_order_ids plus one for the shared one.
    assert_eq!(created, 33);
    assert_eq!(store.count_prefix(EntryKind::Order), 33);
    let stats = store.stats();
    assert_eq!(stats.commands(), 64);
    assert!(
        stats.batches() < stats.commands(),
        "batches {} for {} commands",
        stats.batches(),
        stats.commands()
    );
}

#[tokio::test]
async fn reopen_keeps_state_and_reads_do_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path()).await;
        order(&store, create("k1", "c1", "fp1", "ord_1", T0)).await;
        store.shutdown().await.unwrap();
    }
    let store = common::open(dir.path()).await;
    let record = store
        .record(&scope(Namespace::Orders, "k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Succeeded);
    assert!(store.order("ord_1").await.unwrap().is_some());
    // Fresh writes after a restart are readable at once.
    order(&store, create("k2", "c2", "fp2", "ord_2", T0)).await;
    assert!(store.order("ord_2").await.unwrap().is_some());
}

/// A directory of the write-ahead-log layout (storage format 1) is migrated, not
/// opened as if its tree were the whole region (the migration's own tests, with
/// orders in the tree and the log, are in `format1.rs`); a new one gets the
/// format marker, and so does the migrated one, last.
#[tokio::test]
async fn a_format_1_directory_is_migrated_and_a_new_one_is_marked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("db")).unwrap();
    std::fs::write(dir.path().join("commands.wal"), b"").unwrap();
    let migrated = common::open(dir.path()).await;
    assert!(!dir.path().join("commands.wal").exists());
    order(&migrated, create("k1", "c1", "fp", "ord_1", T0)).await;
    migrated.shutdown().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let store = common::open(fresh.path()).await;
    for marked in [dir.path(), fresh.path()] {
        let marker = std::fs::read_to_string(marked.join("FORMAT")).unwrap();
        assert_eq!(marker.trim(), keyhold_store::STORAGE_FORMAT.to_string());
    }
    assert_eq!(keyhold_store::STORAGE_FORMAT, 2);
    store.shutdown().await.unwrap();
}

/// Copies a directory tree (a fixture into a scratch directory).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A directory the previous release wrote (`tests/fixtures/format1-region`: orders
/// 1-4 flushed, orders 5-8 in its write-ahead log after a crash) opens with every
/// order, each retry replaying the stored answer, and the outbox gapless; the
/// store takes new orders and opens again.
#[tokio::test]
async fn a_directory_the_previous_release_wrote_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1-region");
    copy_dir(&fixture, dir.path());
    std::fs::remove_file(dir.path().join("README.md")).unwrap();
    let orders = |last: u64| (1..=last).map(common::new_order).collect::<Vec<_>>();
    for reopen in [false, true] {
        let store = common::open(dir.path()).await;
        let last = if reopen { 9 } else { 8 };
        for (n, command) in (1..=last).zip(orders(last)) {
            let OrderOutcome::Replayed { response } = order(&store, command).await else {
                panic!("order {n} did not replay");
            };
            assert_eq!(response.status, 201);
            let location = ("location".to_string(), format!("/v1/orders/ord_{n}"));
            assert!(response.headers.contains(&location), "order {n}");
        }
        common::assert_outbox_gapless(&store, last).await;
        // The old batch number of the replay is gone (see `format1.rs`).
        assert_eq!(
            store
                .cursor_at(Consumer::Payments)
                .await
                .unwrap()
                .generation,
            0
        );
        if !reopen {
            let created = order(&store, common::new_order(9)).await;
            assert!(
                matches!(created, OrderOutcome::Created { .. }),
                "{created:?}"
            );
        }
        store.shutdown().await.unwrap();
    }
    assert!(!dir.path().join("commands.wal").exists());
    // Its expiry index also holds the outbox events, which the sweep now
    // finds by walking the outbox: every entry still goes once due.
    let store = common::open(dir.path()).await;
    assert!(store.count_prefix(EntryKind::ExpiryIndex) > 18);
    // The sweeper's call walks that index, then scans for the records and
    // markers this release wrote without index entries.
    let out = store
        .sweep(T0.plus_ms(10_000 * HOUR_MS), 1_000, vec![])
        .await
        .unwrap();
    assert_eq!((out.records, out.markers, out.events), (9, 9, 9), "{out:?}");
    for kind in [EntryKind::ExpiryIndex, EntryKind::Outbox, EntryKind::Record] {
        assert_eq!(store.count_prefix(kind), 0, "{kind:?}");
    }
    store.shutdown().await.unwrap();
}

#[tokio::test]
async fn claims_fencing_and_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let s = scope(Namespace::Claims, "job");
    let claim = |now: UnixMillis, nonce: u64| Command::Claim {
        scope: s.clone(),
        fingerprint: "fp".into(),
        lease_ms: 1_000,
        nonce,
        now,
        response_ttl_ms: 10_000,
    };
    let Applied::Claim(ClaimOutcome::Acquired {
        token: first,
        recovery: false,
        ..
    }) = store.execute(claim(T0, 1)).await.unwrap()
    else {
        panic!("acquire")
    };
    assert!(matches!(
        store.execute(claim(T0.plus_ms(10), 2)).await.unwrap(),
        Applied::Claim(ClaimOutcome::InProgress {
            retry_after_ms: 990
        })
    ));
    let Applied::Claim(ClaimOutcome::Acquired {
        token: second,
        recovery: true,
        ..
    }) = store.execute(claim(T0.plus_ms(1_500), 3)).await.unwrap()
    else {
        panic!("takeover after the lease ran out")
    };
    assert!(second.generation > first.generation);
    let complete = |token: OwnerToken, now: UnixMillis| Command::Complete {
        scope: s.clone(),
        token,
        outcome: Outcome::Succeeded,
        response: Some(StoredResponse {
            status: 200,
            headers: vec![],
            body: b"{\"a\":1}".to_vec(),
        }),
        resource_id: Some("r1".into()),
        now,
        response_ttl_ms: 10_000,
    };
    assert_eq!(
        store
            .execute(complete(first, T0.plus_ms(1_600)))
            .await
            .unwrap(),
        Applied::Complete(CompleteOutcome::Stale)
    );
    let heartbeat = Command::Heartbeat {
        scope: s.clone(),
        token: first,
        lease_ms: 500,
        now: T0.plus_ms(1_600),
    };
    assert_eq!(
        store.execute(heartbeat).await.unwrap(),
        Applied::Heartbeat(HeartbeatOutcome::Stale)
    );
    assert_eq!(
        store
            .execute(complete(second, T0.plus_ms(1_700)))
            .await
            .unwrap(),
        Applied::Complete(CompleteOutcome::Completed {
            state: RecordState::Succeeded
        })
    );
    // A retried complete of the same owner is answered, not refused.
    assert_eq!(
        store
            .execute(complete(second, T0.plus_ms(1_800)))
            .await
            .unwrap(),
        Applied::Complete(CompleteOutcome::AlreadyCompleted {
            state: RecordState::Succeeded
        })
    );
    assert!(matches!(
        store.execute(claim(T0.plus_ms(2_000), 4)).await.unwrap(),
        Applied::Claim(ClaimOutcome::Replay { .. })
    ));

    // Records have no index entries (the sweeper's scan finds them). Nothing
    // is due yet; then everything is.
    assert_eq!(store.count_prefix(EntryKind::ExpiryIndex), 0);
    let early = store.sweep(T0.plus_ms(2_000), 100, vec![]).await.unwrap();
    assert_eq!(early.records, 0);
    let late = store.sweep(T0.plus_ms(60_000), 100, vec![]).await.unwrap();
    assert_eq!(late.records, 1, "{late:?}");
    assert_eq!(store.count_prefix(EntryKind::Record), 0);
}

#[test]
fn commands_round_trip_through_their_encoding() {
    let command = create("k1", "c1", "fp1", "ord_1", T0);
    assert_eq!(Command::decode(&command.encode()).unwrap(), command);
    assert!(Command::decode(b"\xff\xff").is_err());
}

/// Found by fuzzing (`store_command`): a length prefix is refused when it claims
/// more than a command may hold, before anything is allocated for it. Without
/// the limit the first input asks the allocator for 2^62 bytes and aborts.
#[test]
fn a_length_prefix_claiming_too_much_is_refused_not_allocated() {
    let fence = Command::Fence {
        tenant: TenantId::parse("a").unwrap(),
        operation_id: "op".into(),
        epoch: 1,
    }
    .encode();
    // [variant, 1, b'a', ...]: the same variant with a tenant name of 2^62 bytes.
    let mut huge = vec![fence[0], 0xfd];
    huge.extend_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(Command::decode(&huge).is_err());
    // The fuzzer's own input: a name of 2.2 GB, 11 bytes in all.
    let mut found = vec![fence[0], 0xfc];
    found.extend_from_slice(&[0xd0, 0x85, 0x85, 0x85, 0x85, 0x85, 0x00, 0x00, 0x2f]);
    assert!(Command::decode(&found).is_err());
}

#[tokio::test]
async fn consumers_apply_once_and_replay_rewinds_cursors() {
    use keyhold_core::Item;
    use keyhold_store::ConsumeOutcome;
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    order(&store, create("k1", "c1", "fp1", "ord_1", T0)).await;
    let events = store.outbox_after(0, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    let event_id = events[0].event_id.clone();
    let reserve = || Command::ConsumeInventory {
        event_id: event_id.clone(),
        order_id: "ord_1".into(),
        items: vec![
            Item {
                sku: "a".into(),
                quantity: 2,
            },
            Item {
                sku: "b".into(),
                quantity: 1,
            },
        ],
        now: T0,
        processed_ttl_ms: HOUR_MS,
    };
    assert_eq!(
        store.execute(reserve()).await.unwrap(),
        Applied::Consumed(ConsumeOutcome::Applied)
    );
    assert_eq!(
        store.execute(reserve()).await.unwrap(),
        Applied::Consumed(ConsumeOutcome::Duplicate)
    );
    assert_eq!(store.reservations("ord_1").await.unwrap().len(), 2);

    let pay = |paid| Command::ConsumePayment {
        event_id: event_id.clone(),
        order_id: "ord_1".into(),
        charge_id: "ch_1".into(),
        paid,
        now: T0,
        processed_ttl_ms: HOUR_MS,
    };
    assert_eq!(
        store.execute(pay(true)).await.unwrap(),
        Applied::Consumed(ConsumeOutcome::Applied)
    );
    // A second delivery cannot flip the outcome.
    assert_eq!(
        store.execute(pay(false)).await.unwrap(),
        Applied::Consumed(ConsumeOutcome::Duplicate)
    );
    assert_eq!(
        store.order("ord_1").await.unwrap().unwrap().status,
        OrderStatus::Paid
    );

    let advance = Command::AdvanceCursor {
        consumer: Consumer::Inventory,
        seq: 1,
        generation: 0,
    };
    store.execute(advance).await.unwrap();
    assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 1);
    let replay = Command::ReplayOutbox {
        from_seq: 1,
        consumers: vec![Consumer::Inventory, Consumer::Payments],
    };
    assert_eq!(
        store.execute(replay).await.unwrap(),
        Applied::Replayed { events: 1 }
    );
    assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 0);
    let generation = store
        .cursor_at(Consumer::Inventory)
        .await
        .unwrap()
        .generation;
    assert_ne!(generation, 0, "a replay moves the generation on");

    // Past its expiry, an event the payments consumer has not acknowledged stays.
    let late = T0.plus_ms(100 * HOUR_MS);
    let sweep = Command::Sweep {
        now: late,
        entries_max: 100,
        consumers: vec![Consumer::Inventory, Consumer::Payments],
    };
    let Applied::Sweep(out) = store.execute(sweep).await.unwrap() else {
        panic!()
    };
    assert_eq!(out.events, 0);
    assert_eq!(out.deferred, 1);
    assert_eq!(out.processed, 2);
    assert_eq!(store.count_prefix(EntryKind::Outbox), 1);
    for consumer in [Consumer::Inventory, Consumer::Payments] {
        let advance = Command::AdvanceCursor {
            consumer,
            seq: 1,
            generation,
        };
        store.execute(advance).await.unwrap();
    }
    let sweep = Command::Sweep {
        now: late.plus_ms(2 * HOUR_MS),
        entries_max: 100,
        consumers: vec![Consumer::Inventory, Consumer::Payments],
    };
    let Applied::Sweep(out) = store.execute(sweep).await.unwrap() else {
        panic!()
    };
    assert_eq!(out.events, 1);
    assert_eq!(store.count_prefix(EntryKind::Outbox), 0);
}

#[tokio::test]
async fn a_fenced_tenant_exports_and_imports_elsewhere() {
    let from_dir = tempfile::tempdir().unwrap();
    let to_dir = tempfile::tempdir().unwrap();
    let from = common::open(from_dir.path()).await;
    let to = common::open(to_dir.path()).await;
    for i in 0..5 {
        order(
            &from,
            create(
                &format!("k{i}"),
                &format!("c{i}"),
                "fp",
                &format!("ord_{i}"),
                T0,
            ),
        )
        .await;
    }
    let claim = Command::Claim {
        scope: scope(Namespace::Claims, "job"),
        fingerprint: "fp".into(),
        lease_ms: 1_000,
        nonce: 7,
        now: T0,
        response_ttl_ms: HOUR_MS,
    };
    from.execute(claim.clone()).await.unwrap();
    // Another tenant's order must not travel.
    let mut other = create("k9", "c9", "fp", "ord_other", T0);
    if let Command::CreateOrder { scope, order, .. } = &mut other {
        scope.tenant = TenantId::parse("t2").unwrap();
        order.tenant = TenantId::parse("t2").unwrap();
    }
    order(&from, other).await;

    let tenant = TenantId::parse("t1").unwrap();
    assert!(matches!(
        from.execute(Command::Fence {
            tenant: tenant.clone(),
            operation_id: "op1".into(),
            epoch: 1,
        })
        .await
        .unwrap(),
        Applied::Guard(GuardOutcome::Accepted { .. })
    ));
    assert_eq!(
        order(&from, create("k7", "c7", "fp", "ord_7", T0)).await,
        OrderOutcome::Fenced
    );

    // Export in small pages, as a move does.
    let mut cursor: Option<Vec<u8>> = None;
    let mut moved = 0;
    loop {
        let (page, next) = from
            .export_tenant(&tenant, cursor.as_deref(), 300)
            .await
            .unwrap();
        assert!(!page.is_empty());
        moved += page.len();
        let command = Command::Import {
            tenant: tenant.clone(),
            operation_id: "op1".into(),
            epoch: 1,
            entries: page,
        };
        assert!(matches!(
            to.execute(command).await.unwrap(),
            Applied::Guard(GuardOutcome::Accepted { .. })
        ));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    // 5 orders x (record, marker, index, order) + 1 claim record.
    assert_eq!(moved, 21);
    // Nothing executes at the new home until it owns the tenant.
    assert_eq!(
        order(&to, create("k1", "c1", "fp", "ord_x", T0)).await,
        OrderOutcome::Fenced
    );
    to.execute(Command::Own {
        tenant: tenant.clone(),
        epoch: 2,
    })
    .await
    .unwrap();
    assert_eq!(to.count_prefix(EntryKind::Order), 5);
    // The new home replays and decides exactly as the old one would have.
    assert!(matches!(
        order(&to, create("k1", "c1", "fp", "ord_x", T0)).await,
        OrderOutcome::Replayed { .. }
    ));
    assert!(matches!(
        order(&to, create("k8", "c1", "fp", "ord_y", T0)).await,
        OrderOutcome::MarkerHit { .. }
    ));
    assert!(matches!(
        to.execute(claim).await.unwrap(),
        Applied::Claim(ClaimOutcome::InProgress { .. })
    ));
    assert!(to.order("ord_other").await.unwrap().is_none());
}

/// Recovery replays logged batches that sled may already hold in part. That is
/// only safe if every command is a no-op on the state it produced itself: apply
/// each kind of command, then the very same command again, and the state must
/// not move.
#[tokio::test]
async fn every_command_is_a_no_op_on_its_own_result() {
    use keyhold_core::Item;
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let claims = scope(Namespace::Claims, "job");
    let token = OwnerToken {
        generation: T0.0,
        nonce: 9,
    };
    let tenant = TenantId::parse("t1").unwrap();
    let commands = vec![
        create("k1", "c1", "fp1", "ord_1", T0),
        create("k2", "c1", "fp1", "ord_2", T0),
        Command::Claim {
            scope: claims.clone(),
            fingerprint: "fp".into(),
            lease_ms: 1_000,
            nonce: 9,
            now: T0,
            response_ttl_ms: HOUR_MS,
        },
        Command::Heartbeat {
            scope: claims.clone(),
            token,
            lease_ms: 5_000,
            now: T0.plus_ms(10),
        },
        Command::Complete {
            scope: claims.clone(),
            token,
            outcome: Outcome::Succeeded,
            response: Some(StoredResponse {
                status: 200,
                headers: vec![],
                body: b"1".to_vec(),
            }),
            resource_id: None,
            now: T0.plus_ms(20),
            response_ttl_ms: HOUR_MS,
        },
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
        Command::ConsumePayment {
            event_id: "evt_ord_1".into(),
            order_id: "ord_1".into(),
            charge_id: "ch".into(),
            paid: true,
            now: T0,
            processed_ttl_ms: HOUR_MS,
        },
        Command::AdvanceCursor {
            consumer: Consumer::Inventory,
            seq: 1,
            generation: 0,
        },
        Command::ReplayOutbox {
            from_seq: 1,
            consumers: vec![Consumer::Inventory],
        },
        Command::Sweep {
            now: T0.plus_ms(2 * HOUR_MS),
            entries_max: 100,
            consumers: vec![],
        },
        Command::Fence {
            tenant: tenant.clone(),
            operation_id: "op1".into(),
            epoch: 1,
        },
        Command::Import {
            tenant: tenant.clone(),
            operation_id: "op2".into(),
            epoch: 2,
            entries: vec![],
        },
        Command::Own { tenant, epoch: 3 },
        Command::EraseTenant {
            tenant: TenantId::parse("t1").unwrap(),
            entries_max: 1_000,
            consumers: vec![Consumer::Inventory],
        },
    ];
    for command in commands {
        store.execute(command.clone()).await.unwrap();
        let after_once = store.state_for_tests();
        store.execute(command.clone()).await.unwrap();
        assert_eq!(
            store.state_for_tests(),
            after_once,
            "applying twice changed the state: {command:?}"
        );
    }
}

/// Review defect 9: a relay round reads the cursor, an outbox replay rewinds it
/// while the round delivers, and the round then reports its progress. The
/// round's move must not undo the replay, or the replayed events would never be
/// delivered again although the replay answered with their count.
#[tokio::test]
async fn a_relay_round_in_flight_cannot_undo_an_outbox_replay() {
    use keyhold_store::CursorOutcome;
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    for i in 0..3 {
        order(
            &store,
            create(
                &format!("k{i}"),
                &format!("c{i}"),
                "fp",
                &format!("ord_{i}"),
                T0,
            ),
        )
        .await;
    }
    // A first round delivers everything.
    let read = store.cursor_at(Consumer::Inventory).await.unwrap();
    let advance = |seq, generation| Command::AdvanceCursor {
        consumer: Consumer::Inventory,
        seq,
        generation,
    };
    assert_eq!(
        store.execute(advance(3, read.generation)).await.unwrap(),
        Applied::Cursor(CursorOutcome::Advanced)
    );
    // The next round reads the cursor (events 4.. would follow) ...
    order(&store, create("k3", "c3", "fp", "ord_3", T0)).await;
    let in_flight = store.cursor_at(Consumer::Inventory).await.unwrap();
    assert_eq!(in_flight.seq, 3);
    // ... an operator replays everything ...
    let replay = Command::ReplayOutbox {
        from_seq: 1,
        consumers: vec![Consumer::Inventory],
    };
    assert_eq!(
        store.execute(replay).await.unwrap(),
        Applied::Replayed { events: 4 }
    );
    // ... and the round finishes with event 4.
    assert_eq!(
        store
            .execute(advance(4, in_flight.generation))
            .await
            .unwrap(),
        Applied::Cursor(CursorOutcome::Superseded)
    );
    let after = store.cursor_at(Consumer::Inventory).await.unwrap();
    assert_eq!(after.seq, 0, "the replay's rewind stands");
    assert_eq!(store.outbox_after(after.seq, 10).await.unwrap().len(), 4);
    // A round that read the cursor after the replay moves it as usual.
    assert_eq!(
        store.execute(advance(4, after.generation)).await.unwrap(),
        Applied::Cursor(CursorOutcome::Advanced)
    );
    assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 4);
}

/// Issue 13: one relay round of a consumer is one command. Each event is
/// deduplicated alone (processed before, or twice in the batch), a payment for
/// a missing order is refused alone (the others apply and the cursor stops
/// just before it), and a replay in between drops the cursor part while the
/// effects stay.
#[tokio::test]
async fn a_consumer_batch_applies_each_event_once_and_moves_the_cursor_with_it() {
    use keyhold_core::Item;
    use keyhold_store::{
        BatchOutcome, ConsumeOutcome, Cursor, CursorOutcome, InventoryEffect, PaymentEffect,
        Rejection,
    };
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    for i in 0..3 {
        let (k, c, id) = (format!("k{i}"), format!("c{i}"), format!("ord_{i}"));
        order(&store, create(&k, &c, "fp", &id, T0)).await;
    }
    let events = store.outbox_after(0, 10).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let reserve = |i: usize| InventoryEffect {
        seq: events[i].seq,
        event_id: events[i].event_id.clone(),
        order_id: format!("ord_{i}"),
        items: vec![
            Item {
                sku: format!("sku{i}"),
                quantity: 1,
            },
            Item {
                sku: "b".into(),
                quantity: 2,
            },
        ],
    };
    // ord_0's event was processed alone before (an older log's command).
    let single = Command::ConsumeInventory {
        event_id: events[0].event_id.clone(),
        order_id: "ord_0".into(),
        items: reserve(0).items,
        now: T0,
        processed_ttl_ms: HOUR_MS,
    };
    assert_eq!(
        store.execute(single).await.unwrap(),
        Applied::Consumed(ConsumeOutcome::Applied)
    );
    let batch = Command::ConsumeInventoryBatch {
        events: vec![reserve(0), reserve(1), reserve(1), reserve(2)],
        now: T0.plus_ms(1),
        processed_ttl_ms: HOUR_MS,
        cursor: Some(Cursor {
            seq: 3,
            generation: 0,
        }),
    };
    assert_eq!(
        store.execute(batch).await.unwrap(),
        Applied::ConsumedBatch(BatchOutcome {
            events: vec![
                Ok(ConsumeOutcome::Duplicate),
                Ok(ConsumeOutcome::Applied),
                Ok(ConsumeOutcome::Duplicate),
                Ok(ConsumeOutcome::Applied),
            ],
            cursor: Some(CursorOutcome::Advanced),
        })
    );
    assert_eq!(store.cursor(Consumer::Inventory).await.unwrap(), 3);
    for (i, event) in events.iter().enumerate() {
        let rs = store.reservations(&format!("ord_{i}")).await.unwrap();
        assert_eq!(rs.len(), 2, "ord_{i}: {rs:?}");
        assert_eq!(rs[0].event_id, event.event_id);
        // ord_0 keeps the single command's reservation time.
        let at = if i == 0 { T0 } else { T0.plus_ms(1) };
        assert!(rs.iter().all(|r| r.at == at), "ord_{i}: {rs:?}");
        assert!(store
            .is_processed(Consumer::Inventory, &event.event_id)
            .await
            .unwrap());
    }

    // Payments: ord_0 twice (the second result cannot flip the first), an
    // event at seq 2 whose order is gone, and ord_2.
    let pay = |seq: u64, event_id: &str, order_id: &str, paid: bool| PaymentEffect {
        seq,
        event_id: event_id.into(),
        order_id: order_id.into(),
        charge_id: format!("ch_{order_id}"),
        paid,
    };
    let generation = store
        .cursor_at(Consumer::Payments)
        .await
        .unwrap()
        .generation;
    let batch = Command::ConsumePaymentBatch {
        events: vec![
            pay(1, &events[0].event_id, "ord_0", true),
            pay(1, &events[0].event_id, "ord_0", false),
            pay(2, "evt_ord_gone", "ord_gone", true),
            pay(3, &events[2].event_id, "ord_2", false),
        ],
        now: T0,
        processed_ttl_ms: HOUR_MS,
        cursor: Some(Cursor { seq: 3, generation }),
    };
    assert_eq!(
        store.execute(batch).await.unwrap(),
        Applied::ConsumedBatch(BatchOutcome {
            events: vec![
                Ok(ConsumeOutcome::Applied),
                Ok(ConsumeOutcome::Duplicate),
                Err(Rejection::PaymentForMissingOrder {
                    order_id: "ord_gone".into()
                }),
                Ok(ConsumeOutcome::Applied),
            ],
            cursor: Some(CursorOutcome::Advanced),
        })
    );
    // The cursor stops just before the refused event; nothing of it is kept.
    assert_eq!(store.cursor(Consumer::Payments).await.unwrap(), 1);
    assert!(!store
        .is_processed(Consumer::Payments, "evt_ord_gone")
        .await
        .unwrap());
    let status = |id: &'static str| {
        let store = &store;
        async move { store.order(id).await.unwrap().unwrap().status }
    };
    assert_eq!(status("ord_0").await, OrderStatus::Paid);
    assert_eq!(status("ord_2").await, OrderStatus::PaymentFailed);
    // The refused event alone, without a cursor: refused again, the command
    // itself is no error, and nothing moves.
    let alone = Command::ConsumePaymentBatch {
        events: vec![pay(2, "evt_ord_gone", "ord_gone", true)],
        now: T0,
        processed_ttl_ms: HOUR_MS,
        cursor: None,
    };
    let Applied::ConsumedBatch(out) = store.execute(alone).await.unwrap() else {
        panic!("a batch answers with a batch outcome")
    };
    assert!(out.events[0].is_err() && out.cursor.is_none(), "{out:?}");

    // A replay between a round's cursor read and its command: the round's
    // effects are kept, its cursor move is dropped.
    let replay = Command::ReplayOutbox {
        from_seq: 1,
        consumers: vec![Consumer::Payments],
    };
    store.execute(replay).await.unwrap();
    let late = store
        .consume_payment_batch(
            vec![pay(2, &events[1].event_id, "ord_1", true)],
            Some(Cursor { seq: 3, generation }),
            T0,
            &keyhold_core::Policy::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        late,
        BatchOutcome {
            events: vec![Ok(ConsumeOutcome::Applied)],
            cursor: Some(CursorOutcome::Superseded),
        }
    );
    assert_eq!(store.cursor(Consumer::Payments).await.unwrap(), 0);
    assert_eq!(status("ord_1").await, OrderStatus::Paid);
    // A batch whose events were all handled before still moves the cursor.
    let current = store.cursor_at(Consumer::Payments).await.unwrap();
    let again = store
        .consume_payment_batch(
            vec![pay(2, &events[1].event_id, "ord_1", false)],
            Some(Cursor {
                seq: 3,
                generation: current.generation,
            }),
            T0,
            &keyhold_core::Policy::default(),
        )
        .await
        .unwrap();
    assert_eq!(again.events, vec![Ok(ConsumeOutcome::Duplicate)]);
    assert_eq!(again.cursor, Some(CursorOutcome::Advanced));
    assert_eq!(store.cursor(Consumer::Payments).await.unwrap(), 3);
    assert_eq!(status("ord_1").await, OrderStatus::Paid);
}

/// A consumer's processed entry goes with its outbox event, not on its own
/// clock: past its TTL, an event one consumer has not had stays, and so does
/// the other consumer's entry, so an outbox replay delivers the event to that
/// consumer again as a duplicate. An order and its consumers' entries index
/// only the record and the marker; once every consumer had the event, the
/// sweep deletes it all.
#[tokio::test]
async fn a_processed_entry_lives_as_long_as_its_event() {
    use keyhold_core::Item;
    use keyhold_store::{ConsumeOutcome, Cursor, InventoryEffect, PaymentEffect, SweepOutcome};
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    order(&store, create("k1", "c1", "fp", "ord_1", T0)).await;
    assert_eq!(
        store.count_prefix(EntryKind::ExpiryIndex),
        0,
        "the sweeper's scan finds records and markers"
    );
    let event = store.outbox_after(0, 1).await.unwrap().remove(0);
    let reserve = |cursor: Option<Cursor>| Command::ConsumeInventoryBatch {
        events: vec![InventoryEffect {
            seq: event.seq,
            event_id: event.event_id.clone(),
            order_id: "ord_1".into(),
            items: vec![Item {
                sku: "a".into(),
                quantity: 1,
            }],
        }],
        now: T0,
        processed_ttl_ms: HOUR_MS,
        cursor,
    };
    let consumed = |applied: Applied| match applied {
        Applied::ConsumedBatch(out) => out.events,
        other => panic!("{other:?}"),
    };
    let first = store
        .execute(reserve(Some(Cursor {
            seq: event.seq,
            generation: 0,
        })))
        .await
        .unwrap();
    assert_eq!(consumed(first), vec![Ok(ConsumeOutcome::Applied)]);
    assert_eq!(store.count_prefix(EntryKind::ExpiryIndex), 0);

    // 100 hours on: the inventory entry's own TTL (1 h) and the event's (48 h)
    // passed, but payments has not had the event.
    let consumers = vec![Consumer::Inventory, Consumer::Payments];
    let late = T0.plus_ms(100 * HOUR_MS);
    let out = store.sweep(late, 100, consumers.clone()).await.unwrap();
    let expected = SweepOutcome {
        records: 1,
        markers: 1,
        deferred: 1,
        ..SweepOutcome::default()
    };
    assert_eq!(out, expected);
    assert!(store
        .is_processed(Consumer::Inventory, &event.event_id)
        .await
        .unwrap());
    let replay = Command::ReplayOutbox {
        from_seq: event.seq,
        consumers: vec![Consumer::Inventory],
    };
    store.execute(replay).await.unwrap();
    let again = store.execute(reserve(None)).await.unwrap();
    assert_eq!(consumed(again), vec![Ok(ConsumeOutcome::Duplicate)]);
    assert_eq!(store.reservations("ord_1").await.unwrap().len(), 1);

    // Every consumer has it now: the event and both entries go together.
    let pay = Command::ConsumePaymentBatch {
        events: vec![PaymentEffect {
            seq: event.seq,
            event_id: event.event_id.clone(),
            order_id: "ord_1".into(),
            charge_id: "ch_1".into(),
            paid: true,
        }],
        now: late,
        processed_ttl_ms: HOUR_MS,
        cursor: Some(Cursor {
            seq: event.seq,
            generation: 0,
        }),
    };
    assert_eq!(
        consumed(store.execute(pay).await.unwrap()),
        vec![Ok(ConsumeOutcome::Applied)]
    );
    let generation = store
        .cursor_at(Consumer::Inventory)
        .await
        .unwrap()
        .generation;
    let advance = Command::AdvanceCursor {
        consumer: Consumer::Inventory,
        seq: event.seq,
        generation,
    };
    store.execute(advance).await.unwrap();
    let out = store.sweep(late.plus_ms(1), 100, consumers).await.unwrap();
    let expected = SweepOutcome {
        events: 1,
        processed: 2,
        ..SweepOutcome::default()
    };
    assert_eq!(out, expected);
    for kind in [
        EntryKind::Outbox,
        EntryKind::Processed,
        EntryKind::ExpiryIndex,
        EntryKind::Record,
        EntryKind::Marker,
    ] {
        assert_eq!(store.count_prefix(kind), 0, "{kind:?}");
    }
}

/// The same order command for another tenant.
fn for_tenant(tenant: &str, mut command: Command) -> Command {
    if let Command::CreateOrder { scope, order, .. } = &mut command {
        scope.tenant = TenantId::parse(tenant).unwrap();
        order.tenant = TenantId::parse(tenant).unwrap();
    }
    command
}

#[tokio::test]
async fn erasing_a_tenant_keeps_other_tenants_and_delivered_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    // t1: ord_1 (its event delivered to every consumer), then ord_2 and ord_3
    // (pending); t2: ord_9, pending.
    order(&store, create("k1", "c1", "fp1", "ord_1", T0)).await;
    for consumer in [Consumer::Inventory, Consumer::Payments] {
        let advance = Command::AdvanceCursor {
            consumer,
            seq: 1,
            generation: 0,
        };
        store.execute(advance).await.unwrap();
    }
    order(&store, create("k2", "c2", "fp2", "ord_2", T0)).await;
    order(&store, create("k3", "c3", "fp3", "ord_3", T0)).await;
    order(
        &store,
        for_tenant("t2", create("k1", "c1", "fp1", "ord_9", T0)),
    )
    .await;
    assert_eq!(store.count_prefix(EntryKind::Outbox), 4);
    // Inventory alone has had ord_2's event: its entry goes with the event.
    let inventory = Command::ConsumeInventoryBatch {
        events: vec![keyhold_store::InventoryEffect {
            seq: 2,
            event_id: "evt_ord_2".into(),
            order_id: "ord_2".into(),
            items: vec![],
        }],
        now: T0,
        processed_ttl_ms: HOUR_MS,
        cursor: Some(keyhold_store::Cursor {
            seq: 2,
            generation: 0,
        }),
    };
    store.execute(inventory).await.unwrap();
    assert_eq!(store.count_prefix(EntryKind::Processed), 1);
    let t1 = TenantId::parse("t1").unwrap();
    let erase = Command::EraseTenant {
        tenant: t1.clone(),
        entries_max: 4,
        consumers: vec![Consumer::Inventory, Consumer::Payments],
    };
    let mut erased = 0;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages < 10, "erasure ends");
        let Applied::Erased { entries, more } = store.execute(erase.clone()).await.unwrap() else {
            panic!("erase answers Erased")
        };
        assert!(entries <= 4, "a page stays within its limit");
        erased += entries;
        if !more {
            break;
        }
    }
    assert!(pages > 1, "the erasure went in pages");
    // Three records, three markers, three index entries, three orders, the
    // two pending events and inventory's entry of one of them.
    assert_eq!(erased, 15);
    assert_eq!(store.count_prefix(EntryKind::Processed), 0);
    assert_eq!(store.tenant_entry_count(&t1).unwrap(), 0);
    for id in ["ord_1", "ord_2", "ord_3"] {
        assert_eq!(store.order(id).await.unwrap(), None, "{id}");
    }
    assert!(store
        .order_by_client_order_id(&t1, "c2")
        .await
        .unwrap()
        .is_none());
    let events = store.outbox_after(0, 10).await.unwrap();
    let kept: Vec<&str> = events.iter().map(|e| e.order_id.as_str()).collect();
    assert_eq!(
        kept,
        vec!["ord_1", "ord_9"],
        "delivered events stay delivered"
    );
    // The other tenant is untouched, and its order replays.
    assert!(store.order("ord_9").await.unwrap().is_some());
    assert!(matches!(
        order(
            &store,
            for_tenant("t2", create("k1", "c1", "fp1", "ord_x", T0))
        )
        .await,
        OrderOutcome::Replayed { .. }
    ));
    // A new request of the erased tenant finds nothing: no replay, no marker.
    assert!(matches!(
        order(&store, create("k2", "c2", "fp2", "ord_4", T0)).await,
        OrderOutcome::Created { .. }
    ));
}

/// The sweeper's scan of records and markers (`Store::sweep`) goes on where
/// the last call stopped, deletes at most `entries_max` a call, and checks
/// each listed key again when it applies: a key rewritten with a later
/// expiry since it was listed stays.
#[tokio::test]
async fn the_sweepers_scan_deletes_due_records_and_markers_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    for n in 1..=5 {
        order(&store, common::new_order(n)).await;
    }
    assert_eq!(store.count_prefix(EntryKind::ExpiryIndex), 0);
    // The records (1 h) are due, the markers (24 h) not.
    let later = T0.plus_ms(2 * HOUR_MS);
    let mut records = Vec::new();
    for _ in 0..3 {
        let out = store.sweep(later, 2, vec![]).await.unwrap();
        assert!(out.records <= 2, "{out:?}");
        assert_eq!(out.markers, 0);
        records.push(out.records);
    }
    assert_eq!(records, [2, 2, 1], "pages of at most two, then the rest");
    assert_eq!(store.count_prefix(EntryKind::Record), 0);
    assert_eq!(store.count_prefix(EntryKind::Marker), 5);
    // A pass that ended starts again from the first key.
    let out = store
        .sweep(T0.plus_ms(25 * HOUR_MS), 100, vec![])
        .await
        .unwrap();
    assert_eq!(out.markers, 5, "{out:?}");
    assert_eq!(store.count_prefix(EntryKind::Marker), 0);

    // A listed key that is not due (or gone) is passed over.
    order(&store, common::new_order(6)).await;
    let record = [
        b"r".as_slice(),
        &scope(Namespace::Orders, "key-6").storage_key(),
    ]
    .concat();
    let listed = |now| Command::SweepKeys {
        now,
        keys: vec![
            record.clone(),
            b"r-gone".to_vec(),
            b"o-not-a-record".to_vec(),
        ],
    };
    let Applied::Sweep(out) = store.execute(listed(T0)).await.unwrap() else {
        panic!()
    };
    assert_eq!((out.records, out.stale_index), (0, 3), "{out:?}");
    assert_eq!(store.count_prefix(EntryKind::Record), 1);
    let Applied::Sweep(out) = store.execute(listed(later.plus_ms(10))).await.unwrap() else {
        panic!()
    };
    assert_eq!((out.records, out.stale_index), (1, 2), "{out:?}");
    assert_eq!(store.count_prefix(EntryKind::Record), 0);
}
