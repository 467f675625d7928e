//! A probe of the disk a log lives on: how many small synchronous writes per second it
//! takes right now. Benchmarks of durable paths print it beside their figures because
//! this machine's fsync rate drifts from minute to minute, and a figure without it
//! cannot be compared.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Bytes of each probe write: one page, as a small log append.
const PROBE_WRITE_BYTES: usize = 4096;

/// Writes and `sync_data`s `writes` blocks of `PROBE_WRITE_BYTES` to a file `probe` in
/// `dir` and returns the rate achieved, in fsyncs per second.
pub fn fsyncs_per_second(dir: &Path, writes: u32) -> std::io::Result<f64> {
    let mut file = std::fs::File::create(dir.join("probe"))?;
    let block = [7u8; PROBE_WRITE_BYTES];
    let started = Instant::now();
    for _ in 0..writes {
        file.write_all(&block)?;
        file.sync_data()?;
    }
    Ok(f64::from(writes) / started.elapsed().as_secs_f64())
}
