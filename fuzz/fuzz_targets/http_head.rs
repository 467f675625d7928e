//! The request-head check of the HTTP edge (`keyhold_httphead`) against hyper's
//! parser on arbitrary bytes: no panic, and `oracle::agree` holds — where
//! httparse and hyper's checks read a head, the check passes it with the same
//! length and framing (or refuses an ambiguous framing on purpose); where the
//! check passes a head, hyper reads it; where both refuse, with one status.
//! The body follower runs on what follows a passed head.
#![no_main]

use keyhold_httphead::oracle::agree;
use keyhold_httphead::{BodyFollower, HeadScan, Limits, Scan, Step};
use libfuzzer_sys::fuzz_target;

/// hyper's limits in the node (`crates/server/src/limits.rs`), with fewer
/// lines so that inputs of libFuzzer's sizes reach the line limit.
const LIMITS: Limits = Limits {
    head_bytes_max: 64 * 1024,
    header_lines_max: 16,
};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = agree(data, LIMITS) {
        panic!("{e}: {:?}", String::from_utf8_lossy(data));
    }
    // Split in two, the scan must give the same answer.
    let cut = data.first().map_or(0, |&b| usize::from(b) % (data.len() + 1));
    let whole = HeadScan::check(data, LIMITS);
    let mut scan = HeadScan::new();
    let split = match scan.scan(&data[..cut], LIMITS) {
        Scan::Partial => scan.scan(data, LIMITS),
        done => done,
    };
    assert_eq!(split, whole, "split at {cut}");
    if let Scan::Complete(head) = whole {
        if let Some(mut body) = BodyFollower::new(head.framing) {
            match body.advance(&data[head.len..]) {
                Step::Ended(n) | Step::Broken(n) => assert!(n <= data.len() - head.len),
                Step::More => {}
            }
        }
    }
});
