//! Commands shared by the store's test binaries.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use keyhold_core::scope::Namespace;
use keyhold_core::{
    IdempotencyKey, Item, Operation, Order, OrderRequest, OrderStatus, Scope, TenantId, UnixMillis,
};
use keyhold_store::Command;

pub const HOUR_MS: u64 = 3_600_000;
pub const T0: UnixMillis = UnixMillis(1_800_000_000_000);

pub fn scope(namespace: Namespace, key: &str) -> Scope {
    Scope {
        namespace,
        tenant: TenantId::parse("t1").unwrap(),
        operation: Operation::orders_create(),
        key: IdempotencyKey::parse(key).unwrap(),
    }
}

pub fn create(
    key: &str,
    client_order_id: &str,
    fingerprint: &str,
    order_id: &str,
    now: UnixMillis,
) -> Command {
    Command::CreateOrder {
        scope: scope(Namespace::Orders, key),
        fingerprint: fingerprint.into(),
        order: Box::new(Order {
            order_id: order_id.into(),
            tenant: TenantId::parse("t1").unwrap(),
            request: OrderRequest {
                client_order_id: client_order_id.into(),
                cart_id: "cart".into(),
                amount: 100,
                currency: "EUR".into(),
                shipping_address_id: None,
                items: vec![],
                quote_id: None,
                metadata: None,
            },
            status: OrderStatus::Confirmed,
            home_region: "eu".into(),
            created_at: now,
        }),
        now,
        response_ttl_ms: HOUR_MS,
        marker_ttl_ms: 24 * HOUR_MS,
        processed_ttl_ms: 48 * HOUR_MS,
    }
}

/// A new order numbered `n`, with its own key, ids and instant.
pub fn new_order(n: u64) -> Command {
    create(
        &format!("key-{n}"),
        &format!("client-{n}"),
        "fp",
        &format!("ord_{n}"),
        UnixMillis(T0.0 + n),
    )
}

/// An order of `tenant` numbered `n` like the ones `keyhold loadgen` creates (one
/// item line), with the tenant in its key, ids and client order id.
pub fn tenant_order(tenant: &str, n: u64) -> Command {
    let mut command = create(
        &format!("key-{tenant}-{n}"),
        &format!("client-{tenant}-{n}"),
        "sha256:0f4e2a6c1b3d5f7e9a8c6b4d2f0e1a3c5b7d9f8e6a4c2b0d1f3e5a7c9b8d6f4e",
        &format!("ord_{tenant}_{n:012}"),
        UnixMillis(T0.0 + n),
    );
    if let Command::CreateOrder { scope, order, .. } = &mut command {
        let t = TenantId::parse(tenant).expect("tenant id");
        scope.tenant = t.clone();
        order.tenant = t;
        order.request.items = vec![Item {
            sku: "sku-1".into(),
            quantity: 1,
        }];
    }
    command
}

/// Re-runs this test binary as a child process that runs only the test `test`, with
/// `env` set to `dir` (the child's cue to do its work) and its stdout piped to the
/// caller, which reads the child's acknowledgements and then kills or reaps it.
pub fn spawn_child(test: &str, env: &str, dir: &std::path::Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

/// The identity test stores take in their single-voter region group.
pub fn member() -> keyhold_store::raft::Member {
    keyhold_store::raft::Member {
        group: "region-eu".into(),
        node: 1,
        info: keyhold_raftlog::NodeInfo::new("eu", "-", "-"),
    }
}

/// Opens (or creates) a store in `dir` as the only voter of its region group.
pub async fn open(dir: &std::path::Path) -> keyhold_store::Store {
    keyhold_store::Store::open(dir, member())
        .await
        .expect("open the store")
}

/// Asserts that the outbox holds exactly the events numbered 1 to `last`.
pub async fn assert_outbox_gapless(store: &keyhold_store::Store, last: u64) {
    let seqs: Vec<u64> = store
        .outbox_after(0, 1_000)
        .await
        .expect("read the outbox")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>());
}
