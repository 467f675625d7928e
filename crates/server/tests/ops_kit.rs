//! The operations kit under deploy/ stays true to the nodes: every metric the
//! Grafana dashboard and the Prometheus alert rules query is one a node
//! exports (names taken from the `metrics::counter!/gauge!/histogram!` calls in
//! the crates' sources, histograms with their `_bucket`/`_sum`/`_count`
//! series), the rules pass `promtool check rules`, and every alert has its
//! runbook section in docs/operations.md.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every series name a node can export: each `keyhold_*` literal right after
/// a `counter!(`, `gauge!(` or `histogram!(` in a crate's `src/`.
fn exported() -> BTreeSet<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(repo().join("crates")).expect("crates/") {
        let src = entry.expect("dir entry").path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable source");
        for (macro_name, suffixes) in [
            ("counter!(", &[""][..]),
            ("gauge!(", &[""][..]),
            ("histogram!(", &["_bucket", "_sum", "_count"][..]),
        ] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = text[at + macro_name.len()..].trim_start();
                let Some(rest) = rest.strip_prefix('"') else {
                    continue;
                };
                let name = &rest[..rest.find('"').expect("closed literal")];
                if name.starts_with("keyhold_") {
                    for suffix in suffixes {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
            }
        }
    }
    names
}

/// The `keyhold_*` identifiers a PromQL expression names.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(found) = expr[i..].find("keyhold_") {
        let start = i + found;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.push(expr[start..end].to_owned());
        }
        i = end;
    }
    out
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s) if k == "expr" => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

fn alert_rules() -> String {
    std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml")).expect("alert rules")
}

#[test]
fn the_source_scan_finds_the_metrics_the_alerts_rest_on() {
    // Guards the scan itself: were it to find nothing, every check below
    // would pass vacuously.
    let names = exported();
    for name in [
        "keyhold_http_requests_total",
        "keyhold_store_fsync_seconds_bucket",
        "keyhold_store_healthy",
        "keyhold_outbox_lag_seconds",
        "keyhold_operation_stalled_seconds",
        "keyhold_raft_replication_lag_entries",
        "keyhold_raft_elections_total",
    ] {
        assert!(names.contains(name), "{name} not found in {names:?}");
    }
    assert!(!names.contains("keyhold_http_requests_total_bucket"));
    assert_eq!(
        metric_names("rate(keyhold_a_total{x=\"1\"}[5m]) / my_keyhold_b + keyhold_c"),
        vec!["keyhold_a_total", "keyhold_c"]
    );
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let path = repo().join("deploy/grafana/keyhold.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert!(dashboard["uid"].is_string() && dashboard["panels"].is_array());
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard has its queries");
    let exported = exported();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query over no keyhold metric: {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "the dashboard queries {name}, which no node exports: {expr}"
            );
        }
    }
}

#[test]
fn alert_rules_name_only_exported_metrics_and_have_runbooks() {
    let rules = alert_rules();
    let exported = exported();
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert_eq!(exprs.len(), alerts.len(), "one single-line expr per alert");
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "an alert over no keyhold metric: {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "an alert queries {name}, which no node exports: {expr}"
            );
        }
    }
    let operations =
        std::fs::read_to_string(repo().join("docs/operations.md")).expect("operations.md");
    for topic in [
        "StoreUnavailable",
        "ReplicationLag",
        "OutboxLag",
        "Fsync",
        "5xx",
        "OperationStuck",
    ] {
        assert!(
            alerts.iter().any(|a| a.contains(topic)),
            "an alert for {topic} in {alerts:?}"
        );
    }
    // deploy/README.md names every alert, so its list cannot fall behind
    // (issue 44: three were missing).
    let deploy_readme =
        std::fs::read_to_string(repo().join("deploy/README.md")).expect("deploy/README.md");
    for alert in &alerts {
        assert!(
            deploy_readme.contains(&format!("`{alert}`")),
            "deploy/README.md does not list the alert {alert}"
        );
    }
    for alert in alerts {
        assert!(
            operations.contains(&format!("### {alert}\n")),
            "docs/operations.md has no runbook section `### {alert}`"
        );
        let anchor = format!("docs/operations.md#{}", alert.to_lowercase());
        assert!(
            rules.contains(&anchor),
            "{alert} links its runbook {anchor}"
        );
    }
}

#[test]
fn promtool_accepts_the_alert_rules() {
    // scripts/test installs Debian's prometheus package, which carries promtool.
    let output = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(repo().join("deploy/prometheus/alerts.yaml"))
        .output()
        .expect("promtool runs (apt-get install prometheus; scripts/test does)");
    assert!(
        output.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
