//! Memory, disk and the new-order rate of one region store as it fills: does the
//! process's memory stay flat while the stored data grows (issue 13)?
//!
//! One store (in process, through the public `Store` API, a single-voter region
//! group) is filled to each checkpoint of stored orders, and at each it records
//! the process's resident memory (`VmRSS`, and the peak so far, `VmHWM`), the
//! store's bytes on disk per stored order, and the rate of real new orders:
//! `CreateOrder` from 64 concurrent callers of one tenant for a few seconds,
//! with an fsync probe of the same disk beside it.
//!
//! Filling goes through `Import`, a move's page command, because creating
//! millions of orders one command at a time would take hours here: a template
//! tenant's orders are created for real (`CreateOrder`), exported page by page,
//! and imported again as many other tenants, each page with the template's
//! tenant id replaced by the new tenant's (same length, so every encoded string
//! keeps its length prefix); each imported tenant is then owned (`Own`), as after
//! a completed move. Imported entries are the same keys and values a created
//! order writes (record, marker, order index, order), minus its outbox event.
//!
//! A write the region group's writer could not get committed within its wait
//! (`Unavailable`, outcome unknown) is sent again, as a node's caller would, and
//! counted in each row's "unanswered writes".
//!
//! Each cache setting runs in a child process of its own (this binary again), so
//! that one setting's memory does not show in the other's: the region tree's
//! cache at the node's default (`REGION_TREE_CACHE_BYTES_DEFAULT`) and at sled's
//! own default (1 GiB). Filling stops early when the disk has less than
//! `DISK_FREE_BYTES_MIN` left.
//!
//! The process allocator is jemalloc, as in the node binary (`keyhold`), and each
//! row ends with jemalloc's own count of the heap in use (`stats.allocated`) and
//! of its resident pages (`stats.resident`): RSS growing with the heap in use is
//! memory something still holds; RSS growing above it is the allocator's.
//! jemalloc's options are the node's, built in from `.cargo/config.toml`;
//! `_RJEM_MALLOC_CONF` (its prefixed `MALLOC_CONF`) overrides them, so a child
//! can be run with other decay settings.
//!
//! `cargo bench -p keyhold-store --bench memory` (release build); environment:
//! `KEYHOLD_BENCH_MEMORY_CHECKPOINTS` (stored orders, comma-separated) and
//! `KEYHOLD_BENCH_MEMORY_CACHES` (bytes, comma-separated) replace the defaults.
//! Results go in docs/benchmarks.md.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyhold_core::TenantId;
use keyhold_store::limits::REGION_TREE_CACHE_BYTES_DEFAULT;
use keyhold_store::raft::GroupOptions;
use keyhold_store::{Applied, EntryKind, Error, ExportEntry, GuardOutcome, Store};

#[path = "../tests/common/mod.rs"]
mod common;

/// The node binary's allocator (crates/cli), so that RSS here is what a node's
/// would be.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Checkpoints of stored orders under `cargo bench`.
const CHECKPOINTS: [u64; 5] = [100_000, 250_000, 500_000, 1_000_000, 2_000_000];
/// Checkpoints when the target runs as a test (`cargo test --all-targets`): a
/// smoke run of every step, not a measurement.
const SMOKE_CHECKPOINTS: [u64; 2] = [600, 1_200];
/// Orders of the template tenant (created for real), and so of each imported one.
const TEMPLATE_ORDERS: u64 = 5_000;
const SMOKE_TEMPLATE_ORDERS: u64 = 200;
/// How long the new-order rate is measured at each checkpoint.
const MEASURE_MS: u64 = 4_000;
const SMOKE_MEASURE_MS: u64 = 200;
/// Concurrent callers creating orders (the template's and each checkpoint's).
const CLIENTS: u64 = 64;
/// Bytes of keys and payloads per import command: the server's
/// `MOVE_IMPORT_COMMAND_BYTES_MAX`, the size a move's pages are cut into.
const PAGE_BYTES: usize = 128 * 1024;
/// Writes of the fsync probe.
const PROBE_FSYNCS: u32 = 200;
/// sled's own default cache per `Db`, the setting before `store_cache_bytes`.
const SLED_DEFAULT_CACHE_BYTES: u64 = 1024 * 1024 * 1024;
/// Filling stops when the disk holding the store has less than this free
/// (the machine's disk is shared with other builds).
const DISK_FREE_BYTES_MIN: u64 = 12 * 1000 * 1000 * 1000;
/// The template tenant and the imported ones: ids of one length (see the doc).
const TEMPLATE_TENANT: &str = "TPL-000000";
const LIVE_TENANT: &str = "live-00000";
/// Set in a child process: the region tree cache it runs with, in bytes.
const CHILD_ENV: &str = "KEYHOLD_BENCH_MEMORY_CHILD_CACHE";

fn imported_tenant(i: u64) -> String {
    let id = format!("blk-{i:06}");
    assert_eq!(id.len(), TEMPLATE_TENANT.len(), "tenant ids of one length");
    id
}

/// A number from the environment list `var`, or the defaults.
fn list(var: &str, defaults: &[u64]) -> Vec<u64> {
    match std::env::var(var) {
        Ok(text) => text
            .split(',')
            .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{var}: {n:?}")))
            .collect(),
        Err(_) => defaults.to_vec(),
    }
}

/// A value of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Free bytes of the file system holding `dir` (`df`, to need no libc binding).
fn disk_free_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .expect("df");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df's available bytes")
}

/// Bytes the files under `dir` take (`du`; the store's own walk is private).
fn dir_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-sb"])
        .arg(dir)
        .output()
        .expect("du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Writes answered `Unavailable` (not committed within the writer's wait, the
/// outcome unknown) and sent again, as a node's caller would; each row shows
/// how many there were since the previous one.
static UNANSWERED: AtomicU64 = AtomicU64::new(0);

/// `write` until it is answered with anything but `Unavailable`. Sending a
/// command again is safe: an import page writes the same entries, an order
/// with the same key replays.
async fn answered<T, F, Fut>(write: F) -> Result<T, Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    loop {
        match write().await {
            Err(Error::Unavailable) => {
                UNANSWERED.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

/// jemalloc's heap in use and its resident bytes (`stats.allocated`,
/// `stats.resident`), as of now: its statistics are refreshed by advancing
/// its epoch.
fn jemalloc_bytes() -> (u64, u64) {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().expect("jemalloc epoch");
    let allocated = stats::allocated::read().expect("jemalloc stats.allocated");
    let resident = stats::resident::read().expect("jemalloc stats.resident");
    (allocated as u64, resident as u64)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// `CLIENTS` callers creating new orders of `tenant`, numbered from `first`,
/// until `orders` are created or, with `until`, until that long has passed.
/// Returns the orders created and the time taken.
async fn create(
    store: &Store,
    tenant: &'static str,
    first: u64,
    orders: u64,
    until: Option<Duration>,
) -> (u64, Duration) {
    let next = Arc::new(AtomicU64::new(first));
    let created = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (store, next, created, stop) =
            (store.clone(), next.clone(), created.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= first + orders {
                    break;
                }
                let answer = answered(|| store.execute(common::tenant_order(tenant, n))).await;
                assert!(matches!(answer, Ok(Applied::Order(_))), "{answer:?}");
                created.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    if let Some(until) = until {
        tokio::time::sleep(until).await;
        stop.store(true, Ordering::Relaxed);
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("creating task");
    }
    (created.load(Ordering::Relaxed), started.elapsed())
}

/// The template tenant's entries as import pages of `PAGE_BYTES`.
async fn template_pages(store: &Store) -> Vec<Vec<ExportEntry>> {
    let tenant = TenantId::parse(TEMPLATE_TENANT).expect("tenant id");
    let mut pages = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let (page, next) = store
            .export_tenant(&tenant, cursor.as_deref(), PAGE_BYTES)
            .await
            .expect("export");
        pages.push(page);
        match next {
            Some(c) => cursor = Some(c),
            None => return pages,
        }
    }
}

/// `bytes` with every occurrence of the template tenant's id replaced by `tenant`.
fn retenant(bytes: &[u8], tenant: &[u8]) -> Vec<u8> {
    let from = TEMPLATE_TENANT.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(tenant);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

/// Imports the template's pages as tenant `tenant` and owns it.
async fn import_as(store: &Store, pages: &[Vec<ExportEntry>], tenant: &str) {
    let id = TenantId::parse(tenant).expect("tenant id");
    for page in pages {
        let entries = page
            .iter()
            .map(|e| ExportEntry {
                key: retenant(&e.key, tenant.as_bytes()),
                payload: retenant(&e.payload, tenant.as_bytes()),
            })
            .collect::<Vec<_>>();
        let answer =
            answered(|| store.import(id.clone(), "op-fill".into(), 1, entries.clone())).await;
        assert!(
            matches!(answer, Ok(GuardOutcome::Accepted { .. })),
            "{answer:?}"
        );
    }
    let answer = answered(|| store.own(id.clone(), 2)).await;
    assert!(
        matches!(answer, Ok(GuardOutcome::Accepted { .. })),
        "{answer:?}"
    );
}

/// One run in this process: fills a store with the region tree's cache at
/// `cache_bytes` and prints a table row per checkpoint.
async fn run(cache_bytes: u64, checkpoints: &[u64], template_orders: u64, measure: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = GroupOptions {
        tree_cache_bytes: cache_bytes,
        ..GroupOptions::default()
    };
    let idle = status_bytes("VmRSS");
    let store = Store::open_with(
        &dir.path().join("store"),
        common::member(),
        keyhold_store::raft::NoPeers,
        options,
    )
    .await
    .expect("open store");
    let (created, took) = create(&store, TEMPLATE_TENANT, 0, template_orders, None).await;
    assert_eq!(created, template_orders);
    let pages = template_pages(&store).await;
    let page_entries: usize = pages.iter().map(Vec::len).sum();
    assert_eq!(
        page_entries as u64,
        template_orders * 4,
        "4 entries an order"
    );
    println!(
        "cache {:.0} MiB: RSS {:.1} MiB before opening; template: {template_orders} orders in {:.1} s, {} pages",
        mib(cache_bytes),
        mib(idle),
        took.as_secs_f64(),
        pages.len(),
    );
    println!();
    println!("| cache MiB | stored orders | RSS MiB | peak RSS MiB | disk bytes/order | tree / log / snapshot MiB | new orders/s (64 callers) | fsync probe (/s) | unanswered writes | elapsed s | heap in use / jemalloc resident MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let (mut stored, mut live, mut tenants) = (template_orders, 0u64, 0u64);
    let started = Instant::now();
    for &checkpoint in checkpoints {
        let mut out_of_disk = false;
        while stored + template_orders <= checkpoint {
            if disk_free_bytes(dir.path()) < DISK_FREE_BYTES_MIN {
                out_of_disk = true;
                break;
            }
            tenants += 1;
            import_as(&store, &pages, &imported_tenant(tenants)).await;
            stored += template_orders;
        }
        let (created, took) = create(&store, LIVE_TENANT, live, u64::MAX / 2, Some(measure)).await;
        live += created;
        stored += created;
        let probe = keyhold_raftlog::probe::fsyncs_per_second(dir.path(), PROBE_FSYNCS)
            .expect("fsync probe");
        let part = |name: &str| mib(dir_bytes(&dir.path().join("store").join(name)));
        let (heap, resident) = jemalloc_bytes();
        println!(
            "| {:.0} | {stored} | {:.1} | {:.1} | {:.0} | {:.0} / {:.0} / {:.0} | {:.0} | {probe:.0} | {} | {:.0} | {:.0} / {:.0} |",
            mib(cache_bytes),
            mib(status_bytes("VmRSS")),
            mib(status_bytes("VmHWM")),
            store.size_on_disk() as f64 / stored as f64,
            part("db"),
            part("log"),
            part("snapshots"),
            created as f64 / took.as_secs_f64(),
            UNANSWERED.swap(0, Ordering::Relaxed),
            started.elapsed().as_secs_f64(),
            mib(heap),
            mib(resident),
        );
        if out_of_disk {
            println!(
                "(stopped filling: under {} GB free on the store's disk)",
                DISK_FREE_BYTES_MIN / 1_000_000_000
            );
            break;
        }
    }
    // Every order counted above is in the store: the imports wrote what they
    // claim, and no tenant's orders overwrote another's.
    assert_eq!(store.count_prefix(EntryKind::Order) as u64, stored);
    store.shutdown().await.expect("shutdown");
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(cache) = std::env::var(CHILD_ENV) {
        let cache: u64 = cache.parse().expect("child's cache bytes");
        let (checkpoints, template, measure) = if bench {
            let c = list("KEYHOLD_BENCH_MEMORY_CHECKPOINTS", &CHECKPOINTS);
            (c, TEMPLATE_ORDERS, MEASURE_MS)
        } else {
            (
                SMOKE_CHECKPOINTS.to_vec(),
                SMOKE_TEMPLATE_ORDERS,
                SMOKE_MEASURE_MS,
            )
        };
        runtime.block_on(run(
            cache,
            &checkpoints,
            template,
            Duration::from_millis(measure),
        ));
        return;
    }
    let caches = list(
        "KEYHOLD_BENCH_MEMORY_CACHES",
        &[REGION_TREE_CACHE_BYTES_DEFAULT, SLED_DEFAULT_CACHE_BYTES],
    );
    for cache in caches {
        let status = std::process::Command::new(std::env::current_exe().expect("this binary"))
            .args(std::env::args().skip(1))
            .env(CHILD_ENV, cache.to_string())
            .status()
            .expect("run a child");
        assert!(status.success(), "the run with cache {cache} failed");
        println!();
    }
}
