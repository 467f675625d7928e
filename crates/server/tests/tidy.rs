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
//!
//! And no function outside tests, in any crate's `src/`, is longer than
//! `FUNCTION_LINES_MAX` lines: past that a function no longer reads on a
//! screen or two, and a long one only grows (issue 38).

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

/// Directories whose files are not the crate's code proper: tests, benches,
/// examples and vendored crates.
const NOT_SOURCE_DIRS: [&str; 4] = ["tests", "benches", "examples", "vendor"];

/// Every `.rs` file below `dir`, outside `NOT_SOURCE_DIRS`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            if !path
                .file_name()
                .is_some_and(|n| NOT_SOURCE_DIRS.iter().any(|d| n == *d))
            {
                sources(&path, out);
            }
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

/// The longest a function outside tests may be, from its `fn` line to its
/// closing brace.
const FUNCTION_LINES_MAX: usize = 150;

/// The name of the function a line declares (`fn` after any of `pub`,
/// `pub(crate)`, `async`, `const`, `unsafe`, `extern "C"`), if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    let mut word = words.next()?;
    while word == "pub"
        || word.starts_with("pub(")
        || ["async", "const", "unsafe", "extern", "\"C\"", "default"].contains(&word)
    {
        word = words.next()?;
    }
    if word != "fn" {
        return None;
    }
    let name = words.next()?;
    let end = name.find(['(', '<']).unwrap_or(name.len());
    Some(&name[..end])
}

/// The functions of one file's text longer than `max` lines: `(line, name,
/// length)`, `line` of the `fn` line. Text from a `#[cfg(test)]` line on is
/// tests and is not read.
///
/// Assumes rustfmt's layout instead of parsing: a body opens where a line of
/// the signature ends with `{` (one ending with `;` first is a declaration
/// without a body, one ending with `{}` an empty body), and closes at the
/// first later line that is the `fn` line's indentation followed by `}` and
/// nothing else. Braces inside strings, characters and comments are never
/// counted, since no brace is; a line at that indentation inside a body
/// (a string literal's continuation, say) would end it early, which rustfmt
/// never writes.
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let Some(name) = declared_fn(code) else {
            continue;
        };
        let Some(open) = lines[start..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        let open_line = lines[start + open].trim_end();
        if open_line.ends_with(';') || open_line.ends_with("{}") {
            continue;
        }
        let closing = format!("{}}}", &line[..line.len() - code.len()]);
        let Some(end) = lines[start + open..].iter().position(|l| *l == closing) else {
            continue;
        };
        let length = open + end + 1;
        if length > max {
            found.push((start + 1, name.to_owned(), length));
        }
    }
    found
}

#[test]
fn no_function_outside_tests_is_too_long() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf();
    let root = crates.parent().expect("the workspace");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("readable crates/") {
        let src = entry.expect("dir entry").path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    assert!(
        files.iter().any(|f| f.ends_with("store/src/machine.rs")),
        "the walk of crates/*/src found no sources"
    );
    files.sort();
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable source");
        for (line, name, length) in long_functions(&text, FUNCTION_LINES_MAX) {
            found.push(format!(
                "{}:{line}: {name} is {length} lines (at most {FUNCTION_LINES_MAX}): \
                 split it into named steps",
                path.strip_prefix(root).unwrap_or(path).display()
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The length check counts from the `fn` line to its closing brace, passes
/// declarations and tests, and is not ended by a brace in a string.
#[test]
fn the_check_measures_a_function() {
    let text = "impl A {\n    pub(crate) async fn long<T>(\n        x: T,\n    ) {\n        \
                let s = \"}\";\n        {\n        }\n    }\n\n    fn short() {}\n}\n\
                trait B {\n    fn declared(&self);\n}\n#[cfg(test)]\nfn in_tests() {\n\n}\n";
    assert_eq!(long_functions(text, 4), vec![(2, "long".to_owned(), 7)]);
    assert_eq!(long_functions(text, 7), vec![]);
    assert_eq!(declared_fn("pub const unsafe fn f() {"), Some("f"));
    assert_eq!(declared_fn("let f = |x| x;"), None);
}
