//! A single-voter region group end to end: concurrent writers share entries (group
//! commit over Raft: fewer log appends than commands), every command gets its own
//! answer, a duplicate key replays, a refusal comes back as `Error::Rejected`, and
//! after a restart on the same directory the group leads again and replays what it
//! acknowledged.

use keyhold_raftlog::NodeInfo;
use keyhold_store::raft::RegionGroup;
use keyhold_store::{Applied, Error, OrderOutcome, Rejection};

use crate::helpers::new_order;

const WRITERS: u64 = 64;
const ORDERS_PER_WRITER: u64 = 20;

async fn start(dir: &std::path::Path) -> RegionGroup {
    RegionGroup::start_single_voter(dir, "region-eu", 1, NodeInfo::new("eu", "-", "-"))
        .await
        .expect("start the region group")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commands_share_entries_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let group = start(dir.path()).await;

    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let group = group.clone();
        writers.spawn(async move {
            let mut indexes = Vec::new();
            for i in 0..ORDERS_PER_WRITER {
                let n = 1 + writer * ORDERS_PER_WRITER + i;
                let answer = group.execute(new_order(n)).await.expect("execute");
                assert!(
                    matches!(answer.value, Applied::Order(OrderOutcome::Created { .. })),
                    "order {n}: {answer:?}"
                );
                indexes.push(answer.index);
            }
            indexes
        });
    }
    // Each answer names the entry that carried its command: commands of one
    // entry share its index, so there are as many indexes as entries.
    let mut indexes = std::collections::BTreeSet::new();
    while let Some(done) = writers.join_next().await {
        indexes.extend(done.expect("writer"));
    }
    let stats = group.stats();
    let commands = WRITERS * ORDERS_PER_WRITER;
    eprintln!(
        "{commands} commands in {} entries (log appends)",
        stats.batches()
    );
    assert_eq!(stats.commands(), commands);
    assert_eq!(indexes.len() as u64, stats.batches(), "{indexes:?}");
    // Group commit over Raft: with 64 writers waiting, entries carry several
    // commands, so there are fewer log appends (fsyncs) than commands.
    assert!(
        stats.batches() < commands / 2,
        "{} entries for {commands} commands",
        stats.batches()
    );

    let replay = group.execute(new_order(7)).await.expect("replay");
    assert!(
        matches!(replay.value, Applied::Order(OrderOutcome::Replayed { .. })),
        "{replay:?}"
    );
    let refused = group
        .execute(keyhold_store::Command::ConsumePayment {
            event_id: "evt".into(),
            order_id: "ord_missing".into(),
            charge_id: "ch".into(),
            paid: true,
            now: crate::common::T0,
            processed_ttl_ms: 1_000,
        })
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Rejected(Rejection::PaymentForMissingOrder { .. }))
        ),
        "{refused:?}"
    );
    let before = group.state_machine().entries_for_tests();
    group.shutdown().await.expect("shutdown");
    drop(group);

    let group = start(dir.path()).await;
    assert_eq!(group.state_machine().entries_for_tests(), before);
    let again = group.execute(new_order(WRITERS)).await.expect("replay");
    assert!(
        matches!(again.value, Applied::Order(OrderOutcome::Replayed { .. })),
        "{again:?}"
    );
    group.shutdown().await.expect("shutdown");
}
