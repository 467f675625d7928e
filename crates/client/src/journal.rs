//! A durable list of intents that have not had a final answer yet, so that a
//! process that restarts mid-retry resumes them under the same keys instead of
//! inventing new ones (which would create a second order).
//!
//! The whole list lives in one small JSON file. Every change writes a temporary
//! file, fsyncs it, renames it over the old one and fsyncs the directory, so a
//! crash leaves either the old list or the new one, never a torn mix.

use crate::client::Intent;
use crate::limits::JOURNAL_INTENTS_MAX;
use crate::Error;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Version of the file format, checked on open.
const JOURNAL_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct JournalFile {
    version: u32,
    intents: Vec<Intent>,
}

#[derive(Debug)]
pub struct IntentJournal {
    path: PathBuf,
    /// The file's content; the lock also serializes writers of the file.
    intents: Mutex<Vec<Intent>>,
}

impl IntentJournal {
    /// Opens the journal at `path`, reading the intents a previous process left.
    /// A missing file is an empty journal; the file is created at the first
    /// record.
    pub fn open(path: impl Into<PathBuf>) -> Result<IntentJournal, Error> {
        let path = path.into();
        let intents = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: JournalFile = serde_json::from_slice(&bytes)
                    .map_err(|e| journal_error(&path, std::io::Error::other(e)))?;
                if file.version != JOURNAL_VERSION {
                    return Err(journal_error(
                        &path,
                        std::io::Error::other(format!(
                            "journal version {} (this SDK reads {JOURNAL_VERSION})",
                            file.version
                        )),
                    ));
                }
                file.intents
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(journal_error(&path, e)),
        };
        Ok(IntentJournal {
            path,
            intents: Mutex::new(intents),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Intents still waiting for a final answer, oldest first.
    pub fn pending(&self) -> Vec<Intent> {
        self.lock().clone()
    }

    /// Records an intent before its first send (no-op if already recorded).
    pub fn record(&self, intent: &Intent) -> Result<(), Error> {
        let mut intents = self.lock();
        if intents.iter().any(|i| i.key() == intent.key()) {
            return Ok(());
        }
        if intents.len() >= JOURNAL_INTENTS_MAX {
            return Err(Error::Invalid(format!(
                "the intent journal holds {JOURNAL_INTENTS_MAX} pending intents already"
            )));
        }
        let mut next = intents.clone();
        next.push(intent.clone());
        self.write(&next)?;
        *intents = next;
        Ok(())
    }

    /// Forgets an intent once it had a final answer (no-op if absent).
    pub fn remove(&self, key: &str) -> Result<(), Error> {
        let mut intents = self.lock();
        if !intents.iter().any(|i| i.key() == key) {
            return Ok(());
        }
        let next: Vec<Intent> = intents.iter().filter(|i| i.key() != key).cloned().collect();
        self.write(&next)?;
        *intents = next;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Intent>> {
        // A panic while holding the lock cannot leave the list half-changed: it
        // is replaced only after the file was written.
        self.intents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write-then-fsync-then-rename, then fsync the directory so the rename
    /// itself survives a power cut.
    fn write(&self, intents: &[Intent]) -> Result<(), Error> {
        let err = |e| journal_error(&self.path, e);
        let bytes = serde_json::to_vec_pretty(&JournalFile {
            version: JOURNAL_VERSION,
            intents: intents.to_vec(),
        })
        .map_err(|e| err(std::io::Error::other(e)))?;
        let mut tmp_name = self.path.file_name().unwrap_or_default().to_owned();
        tmp_name.push(".tmp");
        let tmp = self.path.with_file_name(tmp_name);
        let mut file = File::create(&tmp).map_err(err)?;
        file.write_all(&bytes).map_err(err)?;
        file.sync_all().map_err(err)?;
        drop(file);
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        Ok(())
    }
}

fn journal_error(path: &Path, source: std::io::Error) -> Error {
    Error::Journal {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening_and_removal_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intents.json");
        let journal = IntentJournal::open(&path).unwrap();
        assert!(journal.pending().is_empty());
        let a = Intent::with_key("key-a", serde_json::json!({"n": 1}));
        let b = Intent::with_key("key-b", serde_json::json!({"n": 2}));
        journal.record(&a).unwrap();
        journal.record(&b).unwrap();
        journal.record(&a).unwrap();
        assert_eq!(
            IntentJournal::open(&path).unwrap().pending(),
            vec![a.clone(), b.clone()]
        );
        journal.remove("key-a").unwrap();
        assert_eq!(IntentJournal::open(&path).unwrap().pending(), vec![b]);
        assert!(!dir.path().join("intents.json.tmp").exists());
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_an_empty_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intents.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            IntentJournal::open(&path),
            Err(Error::Journal { .. })
        ));
    }
}
