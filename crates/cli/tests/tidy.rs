//! Tidy: the mechanical rules of our style, checked by `cargo test` over every
//! Rust file in the repository. Every file opens with a `//!` paragraph saying what
//! it owns; nothing on main uses the dbg, todo or unimplemented macros or ignored tests.
//! `vendor/` is left out: it holds other projects' code as they published it,
//! except that the vendored sled must keep its published `[features]`.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/cli sits two levels below the root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            let skipped = ["target", "node_modules", "pkg", "vendor"];
            if name.starts_with('.') || skipped.contains(&name.as_ref()) {
                continue;
            }
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_follows_the_mechanical_rules() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 10,
        "found only {} .rs files under {}",
        files.len(),
        root.display()
    );
    // Spelled in pieces so this file does not trip its own check.
    let banned = [
        concat!("db", "g!("),
        concat!("#[", "ignore"),
        concat!("to", "do!("),
        concat!("unimpl", "emented!("),
    ];
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if !first.starts_with("//!") {
            problems.push(format!("{shown}: must start with a //! paragraph"));
        }
        for (n, line) in text.lines().enumerate() {
            for b in banned {
                if line.contains(b) {
                    problems.push(format!("{shown}:{}: contains {b}", n + 1));
                }
            }
        }
    }
    assert!(problems.is_empty(), "tidy found:\n{}", problems.join("\n"));
}

/// The `[features]` table of sled 0.34.7 as published on crates.io: the
/// crate's normalized `Cargo.toml` (`sled-0.34.7/Cargo.toml` in cargo's
/// registry source, fetched with `sled = "=0.34.7"` and no patch).
const SLED_0_34_7_FEATURES: &str = r#"[features]
compression = ["zstd"]
default = ["no_metrics"]
docs = []
event_log = []
failpoints = []
io_uring = ["rio"]
lock_free_delays = []
measure_allocs = []
miri_optimizations = []
mutex = []
no_inline = []
no_logs = ["log/max_level_off"]
no_metrics = []
pretty_backtrace = ["color-backtrace"]
testing = ["event_log", "lock_free_delays", "compression", "failpoints", "backtrace"]"#;

/// The vendored sled's manifest keeps upstream's features, so that its
/// default, `no_metrics`, keeps sled's global metrics compiled out: an
/// earlier vendoring dropped the table and every sled operation timed itself
/// (vendor/sled/KEYHOLD.md, "The manifest").
#[test]
fn the_vendored_sled_keeps_upstreams_features() {
    let path = repo_root().join("vendor/sled/Cargo.toml");
    let manifest = std::fs::read_to_string(&path).expect("the vendored sled's manifest");
    let table: Vec<&str> = manifest
        .lines()
        .skip_while(|line| line.trim() != "[features]")
        .enumerate()
        .take_while(|(i, line)| *i == 0 || !line.trim_start().starts_with('['))
        .map(|(_, line)| line.trim_end())
        .filter(|line| !line.is_empty())
        .collect();
    let upstream: Vec<&str> = SLED_0_34_7_FEATURES.lines().collect();
    assert_eq!(
        table,
        upstream,
        "{} must keep sled 0.34.7's [features] as published",
        path.display()
    );
}
