//! Unauthenticated endpoints: health, readiness, metrics, the OpenAPI document,
//! the idempotency policy and the fingerprint specs.

use super::json_response;
use crate::node::Node;
use crate::problem::ApiError;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use keyhold_core::limits::{KEY_LENGTH_MAX, LEASE_MS_MAX, LEASE_MS_MIN};
use keyhold_core::{Problem, Retention};
use keyhold_registry::OperationState;
use std::sync::Arc;

/// The OpenAPI document, kept in docs/ and compiled in so every node serves the
/// same text the docs describe.
const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

pub async fn healthz() -> Response {
    json_response(200, br#"{"status":"ok"}"#.to_vec())
}

/// Ready: the store is healthy and this node's registry replica knows a leader
/// and every region. Without a leader no tenant can be created or moved and the
/// replica may be cut off from the cluster, so a load balancer should prefer
/// another node.
pub async fn readyz(State(node): State<Arc<Node>>) -> Response {
    if !node.store().is_healthy() {
        return ApiError::new(Problem::StoreUnavailable)
            .detail("the region store is not healthy")
            .into_response();
    }
    if !crate::cluster::is_ready(&node) {
        return ApiError::new(Problem::StoreUnavailable)
            .detail("registry: this node knows no leader, or not every region yet")
            .into_response();
    }
    if !node.lease().holds() {
        return ApiError::new(Problem::StoreUnavailable)
            .detail("no recent contact with the registry's majority (region lease)")
            .into_response();
    }
    json_response(200, br#"{"status":"ready"}"#.to_vec())
}

pub async fn metrics(State(node): State<Arc<Node>>) -> Response {
    let stats = node.store().stats();
    metrics::gauge!("keyhold_store_batches").set(stats.batches() as f64);
    metrics::gauge!("keyhold_store_commands").set(stats.commands() as f64);
    metrics::gauge!("keyhold_store_size_on_disk_bytes").set(node.store().size_on_disk() as f64);
    metrics::gauge!("keyhold_tenants").set(node.tenants.len() as f64);
    metrics::gauge!("keyhold_inflight_scopes").set(node.inflight.len() as f64);
    health_gauges(&node);
    let text = crate::metrics::handle().render();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

/// The gauges the alert rules in deploy/prometheus watch, sampled when scraped:
/// whether the store and the registry can serve, the state of every Raft group
/// this node is a member of (role, term, indexes, follower lag, elections), and
/// how long running operations have gone without progress.
fn health_gauges(node: &Node) {
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    metrics::gauge!("keyhold_store_healthy").set(flag(node.store().is_healthy()));
    let registry = node.registry();
    metrics::gauge!("keyhold_registry_has_leader").set(flag(registry.leader().is_some()));
    crate::metrics::record_raft_group(
        "registry",
        &registry.metrics(),
        registry.nodes().into_keys(),
    );
    // The region group, and the groups of the regions this node keeps a
    // standby copy of (as a learner).
    let region_group = format!("region-{}", node.region());
    let (_, members) = node.store().group().members();
    crate::metrics::record_raft_group(
        &region_group,
        &node.store().group().raft().metrics().borrow(),
        members.into_keys(),
    );
    for copy in node.standby_copies() {
        let (_, members) = copy.store.group().members();
        crate::metrics::record_raft_group(
            &format!("region-{}", copy.region),
            &copy.store.group().raft().metrics().borrow(),
            members.into_keys(),
        );
    }
    let now_ms = crate::node::now().0;
    let mut running = 0u64;
    let mut stalled_ms = 0u64;
    registry.read(|state| {
        for op in state.operations.values() {
            if matches!(op.state, OperationState::Pending | OperationState::Running) {
                running += 1;
                stalled_ms = stalled_ms.max(now_ms.saturating_sub(op.updated_at_ms));
            }
        }
    });
    metrics::gauge!("keyhold_operations_running").set(running as f64);
    metrics::gauge!("keyhold_operation_stalled_seconds").set(stalled_ms as f64 / 1000.0);
}

pub async fn openapi() -> Response {
    json_response(200, OPENAPI.as_bytes().to_vec())
}

pub async fn policy(State(node): State<Arc<Node>>) -> Response {
    let p = node.policy();
    let status_codes: serde_json::Map<String, serde_json::Value> = Problem::ALL
        .iter()
        .map(|p| (p.slug().to_owned(), p.status().into()))
        .collect();
    let horizon = node.config().horizon();
    let seconds = |r: Retention| r.ms().map(|ms| ms / 1000);
    let stages: Vec<serde_json::Value> = horizon
        .stages
        .iter()
        .map(|(stage, retention)| {
            serde_json::json!({
                "stage": stage.name(),
                "setting": stage.setting(),
                "ttl_seconds": seconds(*retention),
                "guards": stage.guards(),
            })
        })
        .collect();
    let (first, first_retention) = horizon.ends_first();
    let body = serde_json::json!({
        "response_ttl_seconds": p.response_ttl_ms / 1000,
        "marker_ttl_seconds": p.marker_ttl_ms / 1000,
        "processed_ttl_seconds": p.processed_ttl_ms / 1000,
        "inflight_wait_ms": p.inflight_wait_ms,
        "key_max_length": KEY_LENGTH_MAX,
        "body_bytes_max": node.config().body_bytes_max,
        "lease_ms_min": LEASE_MS_MIN,
        "lease_ms_max": LEASE_MS_MAX,
        "psp_key_retention_seconds": seconds(horizon.stages[3].1),
        // Every stage of duplicate protection in the order a duplicate meets
        // them; the first to forget is the real limit (null: never forgets).
        "dedupe_horizon": {
            "stages": stages,
            "ends_first": first.name(),
            "window_seconds": seconds(first_retention),
        },
        "replayed_header": "Idempotent-Replayed",
        "fingerprint_header": "Idempotency-Fingerprint",
        "status_codes": {
            "created": 201,
            "replayed": "status of the first response",
            "marker_hit": 200,
            "problems": status_codes,
        },
    });
    json_response(200, serde_json::to_vec(&body).expect("json"))
}

pub async fn specs(State(node): State<Arc<Node>>) -> Response {
    let mut out = String::from("{\"data\":[");
    for (i, spec) in node.specs().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&spec.to_json());
    }
    out.push_str("]}");
    json_response(200, out.into_bytes())
}
