//! Native side of the WASM-vs-native benchmark: fingerprints per second of the
//! same ~500-byte order body (`wasm/bench/order.json`) through the same Rust
//! function the WASM export calls (`fingerprint_text`: parse, project,
//! canonicalize, SHA-256). Prints one JSON line.
//!
//! `cargo run -p keyhold-wasm --release --example bench_native [SECONDS]`

use std::hint::black_box;
use std::time::{Duration, Instant};

const BODY: &str = include_str!("../bench/order.json");

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .map_or(3.0, |s| s.parse().expect("SECONDS"));
    let body = BODY.trim_end();
    let expected = keyhold_wasm::fingerprint_text(body, None).expect("the bench body is valid");
    // Warm up, then run batches until the time is up.
    for _ in 0..2_000 {
        black_box(keyhold_wasm::fingerprint_text(black_box(body), None).ok());
    }
    let budget = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut count: u64 = 0;
    while started.elapsed() < budget {
        for _ in 0..1_000 {
            black_box(keyhold_wasm::fingerprint_text(black_box(body), None).ok());
        }
        count += 1_000;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{{\"runtime\":\"native\",\"body_bytes\":{},\"count\":{count},\"seconds\":{elapsed:.3},\"per_second\":{:.0},\"fingerprint\":\"{expected}\"}}",
        body.len(),
        count as f64 / elapsed
    );
}
