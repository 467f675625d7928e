//! Ranges of sled as keyhold patches it (vendor/sled/KEYHOLD.md, change 9): a
//! forward range with nothing in the leaf it starts in ends there without
//! copying that leaf. The store looks for keys that are usually absent on
//! every write (loss marks: a prefix scan per consumer command, per effect then),
//! and sled used to clone the whole leaf before finding nothing. Also: ranges
//! and prefix scans still return exactly what a sorted map of the same writes
//! holds, empty or not.

use proptest::prelude::*;
use std::collections::BTreeMap;

/// jemalloc, for its count of the bytes each thread allocated: sled's
/// background threads do not blur the count of the test's own.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Bytes this thread allocated while running `f`.
fn allocated_by(f: impl FnOnce()) -> u64 {
    let counter = tikv_jemalloc_ctl::thread::allocatedp::read().expect("thread.allocatedp");
    let before = counter.get();
    f();
    counter.get() - before
}

/// Scans per measurement: enough that one leaf clone per scan dwarfs any
/// fixed cost.
const SCANS: u64 = 1_000;

fn open(dir: &std::path::Path) -> sled::Db {
    keyhold_raftlog::open_db(&sled::Config::new().path(dir)).expect("open sled")
}

/// `k0000`..`k0999`, each with a 40-byte value: leaves of a dozen keys or more.
fn filled(db: &sled::Db) {
    for n in 0..1_000u32 {
        db.insert(format!("k{n:04}"), vec![7u8; 40]).unwrap();
    }
}

#[test]
fn looking_for_absent_keys_copies_no_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    filled(&db);
    // A prefix that falls inside a leaf, between two stored keys, and one
    // before every key; then, for scale, scans that find one key each.
    let absent = allocated_by(|| {
        for _ in 0..SCANS {
            assert!(db.scan_prefix(b"k0500x").next().is_none());
            assert!(db.scan_prefix(b"j").next().is_none());
        }
    });
    let present = allocated_by(|| {
        for _ in 0..SCANS {
            assert!(db.scan_prefix(b"k0500").next().is_some());
            assert!(db.scan_prefix(b"k0000").next().is_some());
        }
    });
    assert!(
        absent * 4 < present,
        "an empty scan allocates {} bytes, a scan finding one key {}: \
         the empty one still copies the leaf it looks in",
        absent / (2 * SCANS),
        present / (2 * SCANS),
    );
}

/// A key from a small alphabet, so that prefixes and ranges often hit and
/// often miss.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 0x7f, 0xff]), 0..5)
}

fn bound() -> impl Strategy<Value = std::ops::Bound<Vec<u8>>> {
    use std::ops::Bound;
    prop_oneof![
        Just(Bound::Unbounded),
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ranges_and_prefixes_hold_what_was_written(
        keys in prop::collection::btree_set(key(), 0..300),
        prefixes in prop::collection::vec(key(), 1..12),
        ranges in prop::collection::vec((bound(), bound()), 1..12),
    ) {
        use std::ops::Bound;
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let mut model = BTreeMap::new();
        for (n, k) in keys.iter().enumerate() {
            // Values of mixed size: some leaves split by size, some by count.
            let v = vec![n as u8; 1 + (n % 7) * 300];
            db.insert(k, v.clone()).unwrap();
            model.insert(k.clone(), v);
        }
        for prefix in &prefixes {
            let got: Vec<(Vec<u8>, Vec<u8>)> = db
                .scan_prefix(prefix)
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
                .collect();
            let want: Vec<(Vec<u8>, Vec<u8>)> = model
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            prop_assert_eq!(got, want, "prefix {:?}", prefix);
        }
        for (lo, hi) in &ranges {
            // BTreeMap panics on a range that ends before it starts; sled's
            // is empty. Compare those by filtering.
            let inside = |k: &Vec<u8>| {
                let above = match lo {
                    Bound::Unbounded => true,
                    Bound::Included(l) => k >= l,
                    Bound::Excluded(l) => k > l,
                };
                let below = match hi {
                    Bound::Unbounded => true,
                    Bound::Included(h) => k <= h,
                    Bound::Excluded(h) => k < h,
                };
                above && below
            };
            let want: Vec<Vec<u8>> = model.keys().filter(|k| inside(k)).cloned().collect();
            let got: Vec<Vec<u8>> = db
                .range::<Vec<u8>, _>((lo.clone(), hi.clone()))
                .map(|r| r.unwrap().0.to_vec())
                .collect();
            prop_assert_eq!(&got, &want, "range {:?}..{:?}", lo, hi);
            let mut back: Vec<Vec<u8>> = db
                .range::<Vec<u8>, _>((lo.clone(), hi.clone()))
                .rev()
                .map(|r| r.unwrap().0.to_vec())
                .collect();
            back.reverse();
            prop_assert_eq!(back, want, "reverse range {:?}..{:?}", lo, hi);
        }
    }
}
