//! End-to-end tests of what an operator meets on day one: the start-up log of
//! `keyhold up` (plain text without colour codes when stderr is a file, one
//! line per node and one "cluster ready" summary with the URLs, no library
//! chatter) and its `--log-format json` form.

mod common;

use common::Cluster;
use serde_json::Value;

#[test]
fn startup_log_is_quiet_plain_and_names_the_urls() {
    let cluster = Cluster::start("a,b,c", &[]);
    let log = cluster.stderr_log();
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI escapes when stderr is a file:\n{log}"
    );
    let lines: Vec<&str> = log.lines().collect();
    let listening = lines
        .iter()
        .filter(|l| l.contains("keyhold node listening"))
        .count();
    assert_eq!(listening, 3, "one line per node:\n{log}");
    let ready: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("cluster ready"))
        .collect();
    assert_eq!(ready.len(), 1, "one summary:\n{log}");
    for region in &cluster.info.regions {
        assert!(
            ready[0].contains(&format!("{}={}", region.name, region.api_url)),
            "the summary names {}:\n{log}",
            region.api_url
        );
    }
    assert!(ready[0].contains("/demo/"), "{log}");
    // Library chatter (openraft's start-up vote warnings among it) stays below
    // the default level; nothing else is logged on a clean start.
    assert!(
        !log.contains("openraft") && !log.contains("WARN") && !log.contains("ERROR"),
        "{log}"
    );
    assert!(lines.len() <= 6, "a quiet start:\n{log}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let cluster = Cluster::start("a,b", &["--log-format", "json"]);
    let log = cluster.stderr_log();
    let mut ready = None;
    for line in log.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{v}");
        if v["message"] == "cluster ready" {
            ready = Some(v);
        }
    }
    let ready = ready.unwrap_or_else(|| panic!("no cluster ready line:\n{log}"));
    let demo = format!("{}/demo/", cluster.info.regions[0].api_url);
    assert_eq!(ready["demo"], demo.as_str(), "{ready}");
}
