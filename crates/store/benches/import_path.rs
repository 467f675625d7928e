//! Where a tenant move's import time goes at the new home, below HTTP: a source
//! store holding one tenant's orders is exported page by page
//! (`Store::export_tenant`), and the pages are imported into a fresh store with
//! `Command::Import`, at several page sizes. Beside it the same store's cost of
//! creating those orders in the first place, and the destination's fairness:
//! how many orders per second 16 clients of another tenant get from the
//! destination store alone and while the import runs back to back.
//!
//! Per page size it prints: the export's and the import's wall time and CPU
//! time per entry, the time spent decoding pages (the server does that
//! before the command is queued), and the other tenant's orders per second.
//!
//! `cargo bench -p keyhold-store --bench import_path` (release build). Results go
//! in docs/benchmarks.md.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyhold_core::TenantId;
use keyhold_store::{Applied, Command, ExportEntry, GuardOutcome, Store};

#[path = "../tests/common/mod.rs"]
mod common;

/// Orders of the moved tenant under `cargo bench` (4 entries each).
const ORDERS_PER_RUN: u64 = 25_000;
/// Orders when the target runs as a test (`cargo test --all-targets`): a smoke
/// run, not a measurement.
const ORDERS_PER_SMOKE_RUN: u64 = 200;
/// Page sizes tried, in bytes of keys and payloads.
const PAGE_BYTES: [usize; 4] = [4 << 20, 1 << 20, 256 << 10, 64 << 10];
/// Clients creating orders of the source tenant, and of the destination's own.
const FILL_CLIENTS: u64 = 64;
const OTHER_CLIENTS: u64 = 16;
/// How long the other tenant's clients run alone before an import.
const ALONE_MS: u64 = 2_000;
/// Clock ticks per second of `/proc/self/stat`'s CPU times (Linux's USER_HZ).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds this process has used so far (user and system, every thread).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ")".
    (ticks(11) + ticks(12)) / CLOCK_TICKS_PER_SECOND
}

/// Imports `pages` into `dest` one command per page; returns the entries
/// imported and the time spent decoding pages.
async fn import(dest: &Store, tenant: &TenantId, pages: &[Vec<u8>]) -> (u64, Duration) {
    let (mut decode, mut imported) = (Duration::ZERO, 0u64);
    for page in pages {
        let t = Instant::now();
        let entries = ExportEntry::decode_page(page).expect("decode");
        decode += t.elapsed();
        let answer = dest
            .execute(Command::Import {
                tenant: tenant.clone(),
                operation_id: "op-bench".into(),
                epoch: 1,
                entries,
            })
            .await;
        let Ok(Applied::Guard(GuardOutcome::Accepted { imported: n, .. })) = answer else {
            panic!("import refused: {answer:?}");
        };
        imported += n;
    }
    (imported, decode)
}

/// `clients` tasks creating `orders` orders of `tenant` in all.
async fn fill(store: &Store, tenant: &'static str, orders: u64) -> Duration {
    let per_client = orders / FILL_CLIENTS;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..FILL_CLIENTS {
        let store = store.clone();
        tasks.spawn(async move {
            for i in 0..per_client {
                let answer = store
                    .execute(common::tenant_order(tenant, client * per_client + i))
                    .await;
                assert!(matches!(answer, Ok(Applied::Order(_))), "{answer:?}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("fill task");
    }
    started.elapsed()
}

/// Every page of `tenant`'s export at `bytes_max`, in wire form.
async fn export(store: &Store, tenant: &TenantId, bytes_max: usize) -> Vec<Vec<u8>> {
    let mut pages = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let (page, next) = store
            .export_tenant(tenant, cursor.as_deref(), bytes_max)
            .await
            .expect("export");
        pages.push(ExportEntry::encode_page(&page));
        match next {
            Some(c) => cursor = Some(c),
            None => return pages,
        }
    }
}

/// Orders per second of `OTHER_CLIENTS` clients of tenant `t2` on `store` until
/// `stop` is set.
async fn other_tenant(store: Store, stop: Arc<AtomicBool>, base: u64) -> (u64, Duration) {
    let created = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..OTHER_CLIENTS {
        let (store, stop, created) = (store.clone(), stop.clone(), created.clone());
        tasks.spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let n = base + client * 1_000_000 + i;
                let answer = store.execute(common::tenant_order("t2", n)).await;
                assert!(matches!(answer, Ok(Applied::Order(_))), "{answer:?}");
                created.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("other tenant task");
    }
    (created.load(Ordering::Relaxed), started.elapsed())
}

fn main() {
    let orders = if std::env::args().any(|a| a == "--bench") {
        ORDERS_PER_RUN
    } else {
        ORDERS_PER_SMOKE_RUN
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = Store::open(&dir.path().join("source"), common::member())
            .await
            .expect("open source");
        let cpu = cpu_seconds();
        let took = fill(&source, "t1", orders).await;
        let fill_cpu = cpu_seconds() - cpu;
        let tenant = TenantId::parse("t1").expect("tenant id");
        let entries = source.tenant_entry_count(&tenant).expect("count");
        println!(
            "created {orders} orders ({entries} entries) with {FILL_CLIENTS} clients: {:.2} s, {fill_cpu:.2} CPU s, {:.1} CPU us per entry",
            took.as_secs_f64(),
            fill_cpu * 1e6 / entries as f64
        );
        println!();
        println!("Alone (nothing else runs on the stores):");
        println!();
        println!("| page | pages | export s | export CPU us/entry | import s | import CPU us/entry | decode s |");
        println!("|---|---|---|---|---|---|---|");
        let mut exported = Vec::new();
        for bytes_max in PAGE_BYTES {
            let (cpu, started) = (cpu_seconds(), Instant::now());
            let pages = export(&source, &tenant, bytes_max).await;
            let (export_s, export_cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            let dest = Store::open(&dir.path().join(format!("alone-{bytes_max}")), common::member())
                .await
                .expect("open");
            let (cpu, started) = (cpu_seconds(), Instant::now());
            let (imported, decode) = import(&dest, &tenant, &pages).await;
            let (import_s, import_cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            assert_eq!(imported, entries, "every entry imported");
            let per_entry = |cpu: f64| cpu * 1e6 / entries as f64;
            println!(
                "| {} KiB | {} | {export_s:.2} | {:.1} | {import_s:.2} | {:.1} | {:.2} |",
                bytes_max / 1024,
                pages.len(),
                per_entry(export_cpu),
                per_entry(import_cpu),
                decode.as_secs_f64(),
            );
            exported.push((bytes_max, pages));
        }
        println!();
        println!("With {OTHER_CLIENTS} clients of another tenant creating orders on the destination:");
        println!();
        println!("| page | import s | other tenant alone /s | during import /s |");
        println!("|---|---|---|---|");
        for (run, (bytes_max, pages)) in exported.into_iter().enumerate() {
            let dest = Store::open(&dir.path().join(format!("shared-{bytes_max}")), common::member())
                .await
                .expect("open");
            let base = run as u64 * 100_000_000;
            let stop = Arc::new(AtomicBool::new(false));
            let alone = tokio::spawn(other_tenant(dest.clone(), stop.clone(), base));
            tokio::time::sleep(Duration::from_millis(ALONE_MS)).await;
            stop.store(true, Ordering::Relaxed);
            let (alone_n, alone_t) = alone.await.expect("alone");
            let stop = Arc::new(AtomicBool::new(false));
            let during = tokio::spawn(other_tenant(dest.clone(), stop.clone(), base + 50_000_000));
            let started = Instant::now();
            let (imported, _) = import(&dest, &tenant, &pages).await;
            let import_s = started.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let (during_n, during_t) = during.await.expect("during");
            assert_eq!(imported, entries, "every entry imported");
            println!(
                "| {} KiB | {import_s:.2} | {:.0} | {:.0} |",
                bytes_max / 1024,
                alone_n as f64 / alone_t.as_secs_f64(),
                during_n as f64 / during_t.as_secs_f64(),
            );
        }
    });
}
