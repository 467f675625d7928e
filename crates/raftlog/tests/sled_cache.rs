//! sled's page cache as keyhold patches it (vendor/sled/KEYHOLD.md, changes 7
//! and 8): the record sled keeps in memory for every page, cached or not,
//! counts against the cache's capacity, so that a `Db` whose cache is n bytes
//! holds about n bytes of pages and page records together however many pages
//! it has, down to a floor share of the capacity kept for cached pages. sled
//! counted cached pages alone, and the records of a growing store came on top
//! (docs/benchmarks.md, "Page records inside the cache"). And a page an
//! iterator reads from disk is the first to leave the cache, so a scan does
//! not push out the pages in use ("A scan leaves the cache to the pages in
//! use").

use std::collections::HashSet;

use keyhold_raftlog::limits::SLED_CACHE_SHARDS as SHARDS;
use sled::{Admission, Lru, CACHED_SHARE_MIN_DIVISOR, PAGE_RECORD_BYTES};

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

/// Pages `0..in_use` accessed by key until every shard holds them all, then
/// `scanned` more read once the way `admission` says: the pages the cache
/// gave up among those in use.
fn in_use_evicted_by_a_scan(in_use: u64, scanned: u64, admission: Admission) -> HashSet<u64> {
    let lru = Lru::new(CAPACITY_BYTES);
    let mut evicted = HashSet::new();
    let passes = 2 + SHARDS * SHARD_BLOCK_ACCESSES / in_use;
    for _ in 0..passes {
        for pid in 0..in_use {
            let guard = sled::pin();
            assert!(
                lru.accessed(pid, PAGE_BYTES, &guard).is_empty(),
                "the pages in use fit"
            );
        }
    }
    for pid in in_use..in_use + scanned {
        let guard = sled::pin();
        evicted.extend(lru.admitted(pid, PAGE_BYTES, admission, &guard));
    }
    // The scan's last accesses, still queued, taken in by a key's access of
    // a page in use in every shard.
    for pid in 0..SHARDS * SHARD_BLOCK_ACCESSES {
        let guard = sled::pin();
        evicted.extend(lru.accessed(pid % in_use, PAGE_BYTES, &guard));
    }
    evicted.retain(|pid| *pid < in_use);
    evicted
}

#[test]
fn a_scan_leaves_the_cache_to_the_pages_in_use() {
    // A quarter of each shard in use, then a scan of twice the cache: few
    // enough pages that their records leave room for the pages in use.
    let in_use = CAPACITY_BYTES / PAGE_BYTES / 4;
    let scanned = 2 * CAPACITY_BYTES / PAGE_BYTES;
    assert!((in_use + scanned) * PAGE_RECORD_BYTES < CAPACITY_BYTES / 2);
    let by_scan = in_use_evicted_by_a_scan(in_use, scanned, Admission::Scan);
    assert!(
        by_scan.is_empty(),
        "a scan pushed out {} pages in use",
        by_scan.len()
    );
    // sled's rule, every page read to the most recently used end: the same
    // scan pushes them all out.
    let by_key = in_use_evicted_by_a_scan(in_use, scanned, Admission::Recent);
    assert_eq!(by_key.len() as u64, in_use);
}

#[test]
fn a_scan_of_a_tree_larger_than_the_cache_reads_it_whole() {
    // Pages read by an iterator leave the cache first, often before the
    // iterator is done with them: it still reads every key once, in order,
    // both ways, beside reads by key.
    const KEYS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let config = sled::Config::new()
        .path(dir.path())
        .cache_capacity(SHARDS * 4 * 1024);
    let key = |n: u64| format!("k{n:012}").into_bytes();
    {
        let db = keyhold_raftlog::open_db(&config).expect("open sled");
        for n in 0..KEYS {
            db.insert(key(n), vec![(n % 251) as u8; 600]).unwrap();
        }
        db.flush().unwrap();
    }
    // Reopened, so the scan reads its pages from disk.
    let db = keyhold_raftlog::open_db(&config).expect("reopen sled");
    let mut n = 0;
    for item in db.iter() {
        let (k, v) = item.unwrap();
        assert_eq!(k.as_ref(), key(n).as_slice());
        assert_eq!(v.as_ref(), vec![(n % 251) as u8; 600].as_slice());
        if n % 97 == 0 {
            let by_key = db.get(key(KEYS - 1 - n)).unwrap().expect("present");
            assert_eq!(by_key.len(), 600);
        }
        n += 1;
    }
    assert_eq!(n, KEYS);
    let backwards: Vec<_> = db.iter().rev().map(|item| item.unwrap().0).collect();
    assert_eq!(backwards.len() as u64, KEYS);
    assert!(backwards.windows(2).all(|pair| pair[0] > pair[1]));
    let stats = db.cache_stats();
    assert!(stats.cached_bytes <= stats.capacity_bytes, "{stats:?}");
}
