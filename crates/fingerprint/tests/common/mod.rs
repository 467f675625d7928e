//! Shared helpers for the integration tests: locating the conformance vectors
//! checked out next to the repository (`../shared/vectors`).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

/// `shared/vectors`, next to the repository root. Missing vectors fail the
/// test: a silent pass would hide that conformance was never checked.
pub fn vectors_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors");
    assert!(
        dir.is_dir(),
        "conformance vectors not found at {}: check out `shared/` next to the repository",
        dir.display()
    );
    dir
}
