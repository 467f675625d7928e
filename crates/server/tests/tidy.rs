//! Keeps every call to another node in `src/peers.rs` (`Peers`): reads the
//! sources of `src/` and fails when another file names the node credential
//! header, builds an HTTP client, or reaches the node's pooled client to build
//! a request itself. A call built by hand is how the credential, the timeout
//! and the reading of failures came to differ between a dozen sites; this
//! keeps a new one from starting that again.
//!
//! The exceptions are named with their reason: `node.rs` builds the one pooled
//! client (and hands it to `Peers` and to the Raft networks, whose transport
//! is the registry crate's), and `downstream.rs` calls the payment provider,
//! which is not a node.
//!
//! The same way, every question of which move or failover runs for a tenant
//! or a region is asked of `src/operations.rs`: the registry state's running
//! and done failovers and the drivers' leases are read there only (the
//! mover's own scheduling of drivers excepted: which moves this node drives is
//! the mover's decision, not a question of what runs).

use std::path::{Path, PathBuf};

/// What only `peers.rs` may write, and the files also allowed to, each for
/// the reason in the module doc.
const RULES: [(&str, &[&str]); 5] = [
    ("NODE_CREDENTIAL_HEADER", &[]),
    ("send_to_region", &[]),
    ("RequestBuilder", &[]),
    ("reqwest::Client", &["node.rs", "downstream.rs"]),
    (".http()", &["downstream.rs"]),
];

const HOME: &str = "peers.rs";

/// What only `operations.rs` may read of the registry replica.
const OPERATION_RULES: [(&str, &[&str]); 3] = [
    (".failover_running_from(", &[]),
    (".failovers_from(", &[]),
    (".drivers.get(", &["mover.rs"]),
];

const OPERATIONS_HOME: &str = "operations.rs";

/// The violations in one file's text: `(line, what)` for every code line
/// (comments are prose) that writes a rule's pattern outside its allowed files.
fn violations(file: &str, text: &str) -> Vec<(usize, &'static str)> {
    violations_of(file, text, HOME, &RULES)
}

fn violations_of(
    file: &str,
    text: &str,
    home: &str,
    rules: &[(&'static str, &[&str])],
) -> Vec<(usize, &'static str)> {
    if file == home {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for &(pattern, allowed) in rules {
            if code.contains(pattern) && !allowed.contains(&file) {
                found.push((n + 1, pattern));
            }
        }
    }
    found
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every violation of `rules` in `src/`, one line each with `advice`; the
/// rules' home file must exist.
fn report(home: &str, rules: &[(&'static str, &[&str])], advice: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with(home)),
        "src/{home} is gone: it is where {advice}"
    );
    let mut report = Vec::new();
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 name");
        let text = std::fs::read_to_string(path).expect("readable source");
        for (line, what) in violations_of(name, &text, home, rules) {
            report.push(format!(
                "{}:{line}: `{what}` outside src/{home}: {advice}",
                path.strip_prefix(&src).unwrap_or(path).display()
            ));
        }
    }
    report
}

#[test]
fn every_inter_node_call_goes_through_peers() {
    let found = report(HOME, &RULES, "call other nodes through `Peers`");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check itself finds what it is for, and passes what it allows.
#[test]
fn the_check_finds_a_hand_built_call() {
    let hand_built =
        "let r = node\n    .http()\n    .get(url)\n    .header(NODE_CREDENTIAL_HEADER, c)\n";
    assert_eq!(
        violations("mover.rs", hand_built),
        vec![(2, ".http()"), (4, "NODE_CREDENTIAL_HEADER")]
    );
    assert!(violations(HOME, hand_built).is_empty());
    assert_eq!(violations("downstream.rs", "node.http()"), vec![]);
    assert_eq!(
        violations("lease.rs", "// NODE_CREDENTIAL_HEADER, in prose"),
        vec![]
    );
    assert_eq!(
        violations("lease.rs", "reqwest::Client::new()"),
        vec![(1, "reqwest::Client")]
    );
}

#[test]
fn every_question_of_what_runs_goes_through_operations() {
    let found = report(
        OPERATIONS_HOME,
        &OPERATION_RULES,
        "ask `operations` what runs",
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
    let asked_by_hand = "let f = node.registry().read(|s| s.failover_running_from(r).is_some());";
    assert_eq!(
        violations_of("lease.rs", asked_by_hand, OPERATIONS_HOME, &OPERATION_RULES),
        vec![(1, ".failover_running_from(")]
    );
}
