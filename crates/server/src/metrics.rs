//! The Prometheus recorder. `metrics` has one global recorder per process, so
//! every node in the process (tests start several) shares it; series carry no
//! tenant ids, only routes and outcomes.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Seconds buckets from 100 µs to 10 s, for request and fsync latencies.
const SECONDS_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0,
];
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .expect("buckets are not empty")
            .set_buckets_for_metric(
                Matcher::Full("keyhold_store_batch_commands".into()),
                &BATCH_BUCKETS,
            )
            .expect("buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may be installed already (an embedding program's);
        // then this handle renders only what it saw, which is nothing. Say so.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
        }
        handle
    })
}
