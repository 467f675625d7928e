//! Store tests of a move's online copy: the change index a tracked tenant's
//! writes and deletions keep (in the same batch as the change), and the
//! property a move relies on: a first pass read while the old home still
//! executes, plus the final pass of what changed since, under the fence,
//! gives the new home exactly the old home's content.

mod common;

use common::{create, scope, HOUR_MS, T0};
use keyhold_core::scope::Namespace;
use keyhold_core::{Outcome, StoredResponse, TenantId, UnixMillis};
use keyhold_store::{
    Applied, ClaimOutcome, Command, ExportEntry, GuardOutcome, Store, TenantGuard,
};
use proptest::prelude::*;

const OP: &str = "op_1";
const EPOCH: u64 = 1;

fn t1() -> TenantId {
    TenantId::parse("t1").unwrap()
}

fn track() -> Command {
    Command::TrackChanges {
        tenant: t1(),
        operation_id: OP.into(),
        epoch: EPOCH,
    }
}

fn end_tracking(operation_id: &str, entries_max: u32) -> Command {
    Command::EndTracking {
        tenant: t1(),
        operation_id: operation_id.into(),
        entries_max,
    }
}

/// One change of the old home's state while the move copies it.
#[derive(Debug, Clone)]
enum Step {
    /// Creates (or replays) order `n` of t1.
    Order(u8),
    /// Creates order `n` of another tenant: it must not travel.
    Foreign(u8),
    /// Claims claim key `n` and completes it at once.
    Claim(u8),
    /// Records a payment for order `n` (if it exists).
    Pay(u8),
    /// Sweeps what expired `hours` after the start (records expire after one).
    Sweep(u8),
}

async fn apply(store: &Store, step: &Step) {
    match step {
        Step::Order(n) => {
            let command = create(
                &format!("k{n}"),
                &format!("c{n}"),
                "fp",
                &format!("ord_{n}"),
                T0,
            );
            store.execute(command).await.unwrap();
        }
        Step::Foreign(n) => {
            let mut command = create(
                &format!("k{n}"),
                &format!("c{n}"),
                "fp",
                &format!("ford_{n}"),
                T0,
            );
            if let Command::CreateOrder { scope, order, .. } = &mut command {
                scope.tenant = TenantId::parse("t2").unwrap();
                order.tenant = TenantId::parse("t2").unwrap();
            }
            store.execute(command).await.unwrap();
        }
        Step::Claim(n) => {
            let key = format!("job{n}");
            let claimed = store
                .execute(Command::Claim {
                    scope: scope(Namespace::Claims, &key),
                    fingerprint: "fp".into(),
                    lease_ms: HOUR_MS,
                    nonce: u64::from(*n),
                    now: T0,
                    response_ttl_ms: HOUR_MS,
                })
                .await
                .unwrap();
            let Applied::Claim(ClaimOutcome::Acquired { token, .. }) = claimed else {
                return;
            };
            store
                .execute(Command::Complete {
                    scope: scope(Namespace::Claims, &key),
                    token,
                    outcome: Outcome::Succeeded,
                    response: Some(StoredResponse {
                        status: 201,
                        headers: vec![],
                        body: vec![*n; 100],
                    }),
                    resource_id: None,
                    now: T0.plus_ms(1),
                    response_ttl_ms: HOUR_MS,
                })
                .await
                .unwrap();
        }
        Step::Pay(n) => {
            // A payment for an order that does not exist is refused, as it should.
            let _ = store
                .execute(Command::ConsumePayment {
                    event_id: format!("evt_ord_{n}"),
                    order_id: format!("ord_{n}"),
                    charge_id: format!("ch_{n}"),
                    paid: n % 2 == 0,
                    now: T0,
                    processed_ttl_ms: HOUR_MS,
                })
                .await;
        }
        Step::Sweep(hours) => {
            // The sweeper's call: the outbox and index walk, then the scan
            // of records and markers.
            store
                .sweep(
                    UnixMillis(T0.0 + u64::from(*hours) * HOUR_MS + 1),
                    1_000,
                    vec![],
                )
                .await
                .unwrap();
        }
    }
}

/// Every movable entry of t1 in the store, in key order.
async fn content(store: &Store) -> Vec<ExportEntry> {
    let mut out = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let (page, next) = store
            .export_tenant(&t1(), cursor.as_deref(), 1 << 20)
            .await
            .unwrap();
        out.extend(page);
        match next {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

fn accepted(applied: Applied) -> bool {
    matches!(applied, Applied::Guard(GuardOutcome::Accepted { .. }))
}

/// What each of a move's later passes carried (keys copied or removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Carried {
    /// The online catch-up: every change since tracking began.
    catch_up: usize,
    /// The fenced final pass: the changes after the catch-up's mark.
    last: usize,
}

/// One pass of the change index since `since`, page by page with a step of
/// `between` applied at the old home after each page; what it carried.
async fn changes_pass(
    old: &Store,
    new: &Store,
    since: u64,
    between: &[Step],
    page_bytes: usize,
) -> usize {
    let mut between = between.iter();
    let mut carried = 0;
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let (page, next) = old
            .export_changes(&t1(), cursor.as_deref(), page_bytes, since)
            .await
            .unwrap();
        carried += page.entries.len() + page.removed.len();
        let import = Command::ImportChanges {
            tenant: t1(),
            operation_id: OP.into(),
            epoch: EPOCH,
            page,
        };
        assert!(accepted(new.execute(import).await.unwrap()));
        if let Some(step) = between.next() {
            apply(old, step).await;
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    for step in between {
        apply(old, step).await;
    }
    carried
}

/// Moves t1 from `old` to `new` as a move does: track, first pass in pages of
/// `page_bytes` with `during` applied between pages (the old home executes),
/// then the online catch-up (tracking again gives its mark, the index of the
/// entry that carried it; every change since tracking began travels, with
/// `catching` applied between its pages), `after` once it is done, then fence
/// and the final pass of what changed after the mark.
async fn move_online(
    old: &Store,
    new: &Store,
    during: &[Step],
    catching: &[Step],
    after: &[Step],
    page_bytes: usize,
) -> Carried {
    assert!(accepted(old.execute(track()).await.unwrap()));
    let mut during = during.iter();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let (entries, next) = old
            .export_tenant(&t1(), cursor.as_deref(), page_bytes)
            .await
            .unwrap();
        let import = Command::Import {
            tenant: t1(),
            operation_id: OP.into(),
            epoch: EPOCH,
            entries,
        };
        assert!(accepted(new.execute(import).await.unwrap()));
        if let Some(step) = during.next() {
            apply(old, step).await;
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    for step in during {
        apply(old, step).await;
    }
    let mark = old.track_changes(t1(), OP.into(), EPOCH).await.unwrap();
    assert!(matches!(mark.value, GuardOutcome::Accepted { .. }));
    let catch_up = changes_pass(old, new, 0, catching, page_bytes).await;
    for step in after {
        apply(old, step).await;
    }
    let fence = Command::Fence {
        tenant: t1(),
        operation_id: OP.into(),
        epoch: EPOCH,
    };
    assert!(accepted(old.execute(fence).await.unwrap()));
    let last = changes_pass(old, new, mark.index, &[], page_bytes).await;
    Carried { catch_up, last }
}

#[tokio::test]
async fn writes_and_deletions_of_a_tracked_tenant_only_enter_its_change_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    apply(&store, &Step::Order(1)).await;
    assert_eq!(store.change_count(&t1()), 0, "untracked: no index");

    assert!(accepted(store.execute(track()).await.unwrap()));
    // Record, marker, order index and order of a new order.
    apply(&store, &Step::Order(2)).await;
    assert_eq!(store.change_count(&t1()), 4);
    // A replay writes nothing; another tenant's order is not t1's change.
    apply(&store, &Step::Order(2)).await;
    apply(&store, &Step::Foreign(3)).await;
    assert_eq!(store.change_count(&t1()), 4);
    // A payment rewrites an order that was there before tracking began.
    apply(&store, &Step::Pay(1)).await;
    assert_eq!(store.change_count(&t1()), 5);
    // The sweeper deletes both orders' records: a deletion is a change too
    // (order 2's record is noted already).
    apply(&store, &Step::Sweep(2)).await;
    assert_eq!(store.change_count(&t1()), 6);
    let (page, next) = store.export_changes(&t1(), None, 1 << 20, 0).await.unwrap();
    assert_eq!(next, None);
    assert_eq!(page.entries.len() + page.removed.len(), 6);
    assert_eq!(page.removed.len(), 2, "both records are gone: {page:?}");
    assert!(page.removed.iter().all(|k| k.first() == Some(&b'r')));

    // The end of another move leaves this one's tracking alone.
    let other = store.execute(end_tracking("op_other", 100)).await.unwrap();
    assert_eq!(
        other,
        Applied::Erased {
            entries: 0,
            more: false
        }
    );
    assert_eq!(store.tracked_tenants().unwrap().len(), 1);
    // Its own end prunes the index page by page and stops the tracking.
    let first = store.execute(end_tracking(OP, 4)).await.unwrap();
    assert_eq!(
        first,
        Applied::Erased {
            entries: 4,
            more: true
        }
    );
    assert!(store.tracked_tenants().unwrap().is_empty());
    apply(&store, &Step::Order(4)).await;
    let last = store.execute(end_tracking(OP, 4)).await.unwrap();
    assert_eq!(
        last,
        Applied::Erased {
            entries: 2,
            more: false
        }
    );
    assert_eq!(store.change_count(&t1()), 0);
}

#[tokio::test]
async fn tracking_is_refused_once_the_store_moved_past_the_move() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    let own = Command::Own {
        tenant: t1(),
        epoch: EPOCH + 1,
    };
    assert!(accepted(store.execute(own).await.unwrap()));
    let refused = store.execute(track()).await.unwrap();
    assert_eq!(
        refused,
        Applied::Guard(GuardOutcome::Refused {
            current: TenantGuard::Owned { epoch: EPOCH + 1 }
        })
    );
    assert!(store.tracked_tenants().unwrap().is_empty());
    apply(&store, &Step::Order(1)).await;
    assert_eq!(store.change_count(&t1()), 0);
}

#[tokio::test]
async fn a_successor_driver_tracks_again_under_the_moves_own_fence() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    assert!(accepted(store.execute(track()).await.unwrap()));
    apply(&store, &Step::Order(1)).await;
    let fence = Command::Fence {
        tenant: t1(),
        operation_id: OP.into(),
        epoch: EPOCH,
    };
    assert!(accepted(store.execute(fence).await.unwrap()));
    // Starting over keeps the index: what changed before the fence still travels.
    assert!(accepted(store.execute(track()).await.unwrap()));
    assert_eq!(store.change_count(&t1()), 4);
}

#[tokio::test]
async fn cut_plus_changes_equals_the_old_home() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (old, new) = (common::open(a.path()).await, common::open(b.path()).await);
    for n in 0..30 {
        apply(&old, &Step::Order(n)).await;
    }
    for n in 0..5 {
        apply(&old, &Step::Claim(n)).await;
    }
    let during: Vec<Step> = (30..40)
        .map(Step::Order)
        .chain([Step::Pay(3), Step::Foreign(1), Step::Claim(9)])
        .collect();
    let catching = [Step::Order(41), Step::Pay(32)];
    let after = [
        Step::Order(5),
        Step::Pay(31),
        Step::Sweep(2),
        Step::Order(50),
    ];
    let carried = move_online(&old, &new, &during, &catching, &after, 600).await;
    let (from, to) = (content(&old).await, content(&new).await);
    assert!(!from.is_empty());
    assert_eq!(
        to, from,
        "the new home holds exactly the old home's content"
    );
    // The catch-up carried what changed during the first pass, not the whole
    // tenant; the fenced pass only what changed after the catch-up began,
    // fewer keys than every change since tracking began.
    let (all, _) = old.export_changes(&t1(), None, 1 << 20, 0).await.unwrap();
    let since_tracking = all.entries.len() + all.removed.len();
    assert!(carried.catch_up < from.len(), "{carried:?}");
    assert!(carried.last > 0, "{carried:?}");
    assert!(
        carried.last < since_tracking,
        "{carried:?} of {since_tracking}"
    );
}

/// The fenced pass since the catch-up's mark carries exactly the keys written
/// or deleted after it: a key changed before and again after is in it, one
/// changed only before is not.
#[tokio::test]
async fn changes_since_a_mark_are_the_keys_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path()).await;
    assert!(accepted(store.execute(track()).await.unwrap()));
    apply(&store, &Step::Order(1)).await;
    apply(&store, &Step::Order(2)).await;
    let mark = store.track_changes(t1(), OP.into(), EPOCH).await.unwrap();
    assert!(mark.index > 0);
    // Order 1 paid after the mark: only its order entry changes again.
    apply(&store, &Step::Pay(1)).await;
    // The sweep deletes both records after the mark.
    apply(&store, &Step::Sweep(2)).await;
    let keys = |page: &keyhold_store::ChangePage| -> Vec<(u8, bool)> {
        let mut keys: Vec<(u8, bool)> = page
            .entries
            .iter()
            .map(|e| (e.key[0], true))
            .chain(page.removed.iter().map(|k| (k[0], false)))
            .collect();
        keys.sort();
        keys
    };
    let (all, _) = store.export_changes(&t1(), None, 1 << 20, 0).await.unwrap();
    assert_eq!(all.entries.len() + all.removed.len(), 8, "{all:?}");
    let (since, next) = store
        .export_changes(&t1(), None, 1 << 20, mark.index)
        .await
        .unwrap();
    assert_eq!(next, None);
    // Order 1 (rewritten) and the two records (removed).
    assert_eq!(
        keys(&since),
        vec![(b'o', true), (b'r', false), (b'r', false)],
        "{since:?}"
    );
    let (none, _) = store
        .export_changes(&t1(), None, 1 << 20, u64::MAX)
        .await
        .unwrap();
    assert!(none.entries.is_empty() && none.removed.is_empty());
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..24).prop_map(Step::Order),
        1 => (0u8..4).prop_map(Step::Foreign),
        2 => (0u8..6).prop_map(Step::Claim),
        2 => (0u8..24).prop_map(Step::Pay),
        1 => (0u8..3).prop_map(Step::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the old home does before, during and after the first pass
    /// and during the catch-up, the three passes leave the new home equal to it.
    #[test]
    fn any_history_copies_exactly(
        before in prop::collection::vec(step(), 0..30),
        during in prop::collection::vec(step(), 0..20),
        catching in prop::collection::vec(step(), 0..10),
        after in prop::collection::vec(step(), 0..10),
        page_bytes in 1usize..2_000,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let (old, new) = (common::open(a.path()).await, common::open(b.path()).await);
            for s in &before {
                apply(&old, s).await;
            }
            move_online(&old, &new, &during, &catching, &after, page_bytes).await;
            assert_eq!(content(&new).await, content(&old).await);
        });
    }
}
