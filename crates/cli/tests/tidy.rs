//! Tidy: the mechanical rules of our style, checked by `cargo test` over every
//! Rust file in the repository. Every file opens with a `//!` paragraph saying what
//! it owns; nothing on main uses the dbg, todo or unimplemented macros or ignored tests.
//! `vendor/` is left out: it holds other projects' code as they published it.

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
