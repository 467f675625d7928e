//! The storage format of a region store's directory: a marker file, `FORMAT`, that
//! names the layout the directory holds, written before anything else on first
//! open and checked on every open.
//!
//! Format 1 (no marker) was a sled tree with a write-ahead log beside it
//! (`db/`, `commands.wal`); format 2 keeps the region in its Raft group's log
//! and state machine (`log/`, `db/`, `snapshots/`, see `raft`). A format-1
//! directory is migrated in place (`format1.rs`: the log's missing batches are
//! applied to the tree in `db/`, which format 2's state machine keeps, and the
//! log is removed), and the marker is written last: it is the migration's
//! commit point, and a crash before it migrates again on the next open. Never is
//! a format-1 `db/` taken for the state machine without the commands only its log
//! held. A directory of another format, or a non-empty one without any format, is
//! refused with an error naming it and what to do.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::{format1, Error};

/// The format this build reads and writes.
pub const STORAGE_FORMAT: u32 = 2;
const MARKER: &str = "FORMAT";
const MARKER_TEMPORARY: &str = "FORMAT.tmp";

fn refuse(dir: &Path, reason: impl Into<String>) -> Error {
    Error::DataDir {
        dir: dir.to_path_buf(),
        reason: reason.into(),
    }
}

/// Checks that `dir` holds a region store of `STORAGE_FORMAT`, migrates one of
/// format 1 to it, or makes an empty (or missing) `dir` one by writing the
/// marker. Blocking.
pub(crate) fn check_or_create(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(Error::Io)?;
    match std::fs::read_to_string(dir.join(MARKER)) {
        Ok(text) => return check_marker(dir, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::Io(e)),
    }
    if format1::ENTRIES.iter().any(|name| dir.join(name).exists()) {
        format1::migrate(dir, &[MARKER_TEMPORARY])?;
        return write_marker(dir);
    }
    for entry in std::fs::read_dir(dir).map_err(Error::Io)? {
        let name = entry.map_err(Error::Io)?.file_name();
        // A crash between writing the temporary marker and renaming it leaves only it.
        if name != MARKER_TEMPORARY {
            return Err(refuse(
                dir,
                format!(
                    "it is not empty ({name:?}) but has no {MARKER} marker: not a keyhold \
                     region store; point the node at an empty directory"
                ),
            ));
        }
    }
    write_marker(dir)
}

fn check_marker(dir: &Path, text: &str) -> Result<(), Error> {
    match text.trim().parse::<u32>() {
        Ok(STORAGE_FORMAT) => Ok(()),
        Ok(found) => Err(refuse(
            dir,
            format!(
                "it holds storage format {found}, this release reads format \
                 {STORAGE_FORMAT}; run the release that wrote it"
            ),
        )),
        Err(_) => Err(refuse(
            dir,
            format!("its {MARKER} marker is unreadable ({text:?})"),
        )),
    }
}

/// Writes the marker atomically (temporary file, sync, rename, sync of the
/// directory), so a crash leaves either no marker or a whole one.
fn write_marker(dir: &Path) -> Result<(), Error> {
    let temporary = dir.join(MARKER_TEMPORARY);
    let mut file = File::create(&temporary).map_err(Error::Io)?;
    writeln!(file, "{STORAGE_FORMAT}").map_err(Error::Io)?;
    file.sync_all().map_err(Error::Io)?;
    std::fs::rename(&temporary, dir.join(MARKER)).map_err(Error::Io)?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_dir_gets_the_marker_and_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("region");
        check_or_create(&store).unwrap();
        assert_eq!(
            std::fs::read_to_string(store.join(MARKER)).unwrap().trim(),
            STORAGE_FORMAT.to_string()
        );
        std::fs::create_dir(store.join("log")).unwrap();
        check_or_create(&store).unwrap();
    }

    #[test]
    fn a_format_1_dir_with_an_empty_log_or_without_one_is_migrated() {
        for entry in format1::ENTRIES {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(entry);
            if entry == "db" {
                std::fs::create_dir(&path).unwrap();
            } else {
                std::fs::write(&path, b"").unwrap();
            }
            check_or_create(dir.path()).unwrap();
            assert!(dir.path().join(MARKER).exists());
            assert!(dir.path().join("db").exists());
            assert!(!dir.path().join("commands.wal").exists());
            check_or_create(dir.path()).unwrap();
        }
    }

    #[test]
    fn another_format_or_a_foreign_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MARKER), "3\n").unwrap();
        let error = check_or_create(dir.path()).unwrap_err().to_string();
        assert!(error.contains("format 3"), "{error}");

        let foreign = tempfile::tempdir().unwrap();
        std::fs::write(foreign.path().join("notes.txt"), "x").unwrap();
        let error = check_or_create(foreign.path()).unwrap_err().to_string();
        assert!(error.contains("not a keyhold region store"), "{error}");
    }

    #[test]
    fn a_crash_before_the_rename_is_finished_on_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MARKER_TEMPORARY), "").unwrap();
        check_or_create(dir.path()).unwrap();
        assert!(dir.path().join(MARKER).exists());
    }
}
