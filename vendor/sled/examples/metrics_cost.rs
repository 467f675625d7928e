//! keyhold: what sled's global metrics cost, with and without its default
//! `no_metrics` feature (review d44e5cf, N7; `KEYHOLD.md`, "The manifest").
//! Two threads insert, read and scan their own keys in one tree (no flush:
//! the CPU path every operation takes, where the metrics' `rdtscp` pairs and
//! shared histogram adds sit), then a short fsync probe of the same disk.
//!
//! `cargo run --release --manifest-path vendor/sled/Cargo.toml --example metrics_cost`
//! and again with `--no-default-features` (metrics on); run them alternately
//! and compare within one run. Results go in docs/benchmarks.md.

use std::io::Write;
use std::time::{Duration, Instant};

/// Keys each thread writes, reads and scans per round.
const KEYS_PER_THREAD: u64 = 200_000;
const THREADS: u64 = 2;
/// Bytes of each value: a small record, as the region tree's.
const VALUE_BYTES: usize = 100;
/// How long the fsync probe writes and syncs.
const PROBE: Duration = Duration::from_millis(1_000);

fn main() {
    let dir = std::env::temp_dir().join(format!("sled-metrics-cost-{}", std::process::id()));
    let db = sled::Config::new().path(&dir).open().expect("open");
    let tree = db.open_tree("t").expect("tree");
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let tree = tree.clone();
            scope.spawn(move || {
                let value = vec![7u8; VALUE_BYTES];
                let key = |n: u64| (t << 56 | n).to_be_bytes();
                for n in 0..KEYS_PER_THREAD {
                    tree.insert(key(n), value.as_slice()).expect("insert");
                }
                for n in 0..KEYS_PER_THREAD {
                    assert!(tree.get(key(n)).expect("get").is_some());
                }
                // Scans of 16 keys, as the store's short range reads.
                for n in (0..KEYS_PER_THREAD).step_by(16) {
                    assert_eq!(tree.range(key(n)..key(n + 16)).count(), 16);
                }
            });
        }
    });
    let elapsed = started.elapsed();
    let operations = THREADS * KEYS_PER_THREAD * 3;
    let metrics = if cfg!(feature = "no_metrics") {
        "off"
    } else {
        "on"
    };
    drop(tree);
    drop(db);
    let probe = fsync_probe(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "metrics {metrics}: {:.0} ns per operation ({operations} operations in {:.2} s), fsync probe {probe:.0}/s",
        elapsed.as_nanos() as f64 / operations as f64,
        elapsed.as_secs_f64()
    );
}

/// Appends and syncs 4 KiB for `PROBE`; syncs per second.
fn fsync_probe(dir: &std::path::Path) -> f64 {
    let path = dir.join("probe");
    let mut file = std::fs::File::create(&path).expect("probe file");
    let (started, mut syncs) = (Instant::now(), 0u64);
    while started.elapsed() < PROBE {
        file.write_all(&[0u8; 4096]).expect("write");
        file.sync_all().expect("sync");
        syncs += 1;
    }
    syncs as f64 / started.elapsed().as_secs_f64()
}
