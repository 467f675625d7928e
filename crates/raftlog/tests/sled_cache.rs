//! sled's page cache as keyhold patches it (vendor/sled/KEYHOLD.md, change 7):
//! the record sled keeps in memory for every page, cached or not, counts
//! against the cache's capacity, so that a `Db` whose cache is n bytes holds
//! about n bytes of pages and page records together however many pages it has,
//! down to a floor share of the capacity kept for cached pages. sled counted
//! cached pages alone, and the records of a growing store came on top
//! (docs/benchmarks.md, "Page records inside the cache").

use keyhold_raftlog::limits::SLED_CACHE_SHARDS as SHARDS;
use sled::{Lru, CACHED_SHARE_MIN_DIVISOR, PAGE_RECORD_BYTES};

/// A cache of 64 KiB per shard, so pages of `PAGE_BYTES` are small beside a
/// shard and the rule, not the last page a shard keeps, sets what it holds.
const CAPACITY_BYTES: u64 = SHARDS * 64 * 1024;
/// The size of each page accessed (a power of two: the cache rounds up to one).
const PAGE_BYTES: u64 = 1024;

/// A shard takes its accesses in blocks of this many.
const SHARD_BLOCK_ACCESSES: u64 = 64;

/// Accesses `pages` distinct pages of `PAGE_BYTES` in passes over them all,
/// enough that every shard has taken in a block after the first pass (the
/// stats count only what a shard took in), and returns the cache's stats.
fn after_accessing(pages: u64) -> sled::CacheStats {
    let lru = Lru::new(CAPACITY_BYTES);
    let passes = 2 + SHARDS * SHARD_BLOCK_ACCESSES / pages;
    for _ in 0..passes {
        for pid in 0..pages {
            let guard = sled::pin();
            lru.accessed(pid, PAGE_BYTES, &guard);
        }
    }
    lru.stats()
}

#[test]
fn page_records_count_against_the_capacity() {
    // Records of half the capacity: sled's rule kept the whole capacity of
    // cached pages beside them, 1.5x the capacity in all.
    let pages = CAPACITY_BYTES / 2 / PAGE_RECORD_BYTES;
    let stats = after_accessing(pages);
    assert_eq!(stats.capacity_bytes, CAPACITY_BYTES);
    assert!(
        stats.page_records >= pages - SHARDS * SHARD_BLOCK_ACCESSES,
        "records of nearly every page: {stats:?}"
    );
    let records_bytes = stats.page_records * PAGE_RECORD_BYTES;
    assert!(
        stats.cached_bytes + records_bytes <= CAPACITY_BYTES,
        "cached pages and page records within the capacity: {stats:?}"
    );
    // ... and the rest of the capacity is used: every shard is within a page
    // of its share.
    assert!(
        stats.cached_bytes + records_bytes >= CAPACITY_BYTES - SHARDS * PAGE_BYTES,
        "{stats:?}"
    );
}

#[test]
fn cached_pages_keep_a_floor_share_of_the_capacity() {
    // Records of twice the capacity: what a store of far more pages than its
    // cache can keep records of looks like. Cached pages still get their floor.
    let pages = 2 * CAPACITY_BYTES / PAGE_RECORD_BYTES;
    let stats = after_accessing(pages);
    let floor = CAPACITY_BYTES / CACHED_SHARE_MIN_DIVISOR;
    assert!(stats.cached_bytes <= floor, "{stats:?}");
    assert!(
        stats.cached_bytes >= floor - SHARDS * PAGE_BYTES,
        "{stats:?}"
    );
}

#[test]
fn few_pages_leave_the_cache_to_cached_pages() {
    // A small store: the records of its pages take little, and the cache
    // holds as many pages as sled's rule did, less their records.
    let pages = CAPACITY_BYTES / PAGE_BYTES / 4;
    let stats = after_accessing(pages);
    assert_eq!(stats.cached_bytes, pages * PAGE_BYTES, "{stats:?}");
}

#[test]
fn a_db_reports_its_cache() {
    // The stats through a real `Db`: its configured capacity, and the pages
    // it wrote, counted as the cache takes their accesses in.
    let dir = tempfile::tempdir().unwrap();
    let db = keyhold_raftlog::open_db(
        &sled::Config::new()
            .path(dir.path())
            .cache_capacity(CAPACITY_BYTES),
    )
    .expect("open sled");
    for n in 0..5_000u64 {
        db.insert(format!("k{n:012}"), vec![7u8; 600]).unwrap();
    }
    let stats = db.cache_stats();
    assert_eq!(stats.capacity_bytes, CAPACITY_BYTES);
    assert!(stats.page_records > 0, "{stats:?}");
    assert!(stats.cached_bytes > 0, "{stats:?}");
    assert!(
        stats.cached_bytes + stats.page_records * PAGE_RECORD_BYTES <= CAPACITY_BYTES,
        "{stats:?}"
    );
}
