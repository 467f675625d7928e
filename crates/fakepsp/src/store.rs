//! Durable charges: one sled tree keyed by idempotency key.
//!
//! Each entry holds the request fingerprint and the exact answer (HTTP status
//! and body bytes), so a replay returns the same bytes as the first answer.
//! Exactly one charge per key comes from sled's compare-and-swap: the first
//! request to insert into the empty slot wins, every other one reads the
//! winner's entry. No answer leaves before a `flush`, so whatever a client was
//! told survives a crash. All methods block on disk; call them off the runtime.
//!
//! **Architecture Invariant:** the store knows nothing of HTTP or randomness;
//! the caller decides the charge, the store only decides who was first.

use crate::Error;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const CHARGES_TREE: &str = "charges";

/// A stored answer to the first request with one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// Creation order (sled's persistent id generator), for oldest-first lists.
    pub seq: u64,
    /// `charge::fingerprint` of the request that created the charge.
    pub fingerprint: String,
    /// HTTP status of the answer: 201 or 402.
    pub status: u16,
    /// The charge object as JSON, exactly as first answered.
    pub body: String,
}

/// What became of one charge request.
#[derive(Debug)]
pub enum Outcome {
    /// This request created the charge.
    Created(Stored),
    /// An earlier request with the same key and body created it.
    Replayed(Stored),
    /// An earlier request used the same key with another body.
    KeyReused,
}

#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    charges: sled::Tree,
    flushes: Arc<FlushGroup>,
}

/// Group commit for answers: a flush that starts after a write covers it, so
/// concurrent requests share flushes instead of each paying for one.
#[derive(Debug, Default)]
struct FlushGroup {
    started: AtomicU64,
    completed: AtomicU64,
    lock: Mutex<()>,
}

impl Store {
    /// Opens (or creates) the store in `dir`. Background flushing is off:
    /// every write is flushed explicitly before it is answered.
    pub fn open(dir: &Path) -> Result<Store, Error> {
        // sled releases its file lock a moment after the last handle of a
        // previous open is dropped (later on a loaded machine); a restart in the
        // same process waits for it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let db = loop {
            match sled::Config::new().path(dir).flush_every_ms(None).open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if std::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "store still locked; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let charges = db.open_tree(CHARGES_TREE)?;
        Ok(Store {
            db,
            charges,
            flushes: Arc::default(),
        })
    }

    /// Creates the charge for `key` with `make(seq)` unless one exists, and
    /// returns what the client must be told. `make` runs only if no entry was
    /// found, but a racing request may still win the insert; its entry is then
    /// the answer. Returns only after the entry is durable.
    pub fn charge(
        &self,
        key: &str,
        fingerprint: &str,
        make: impl FnOnce(u64) -> Result<(u16, String), Error>,
    ) -> Result<Outcome, Error> {
        let outcome = match self.charges.get(key)? {
            Some(existing) => compare(decode(&existing)?, fingerprint),
            None => {
                let seq = self.db.generate_id()?;
                let (status, body) = make(seq)?;
                let stored = Stored {
                    seq,
                    fingerprint: fingerprint.to_owned(),
                    status,
                    body,
                };
                let bytes = serde_json::to_vec(&stored)?;
                match self
                    .charges
                    .compare_and_swap(key, None::<&[u8]>, Some(bytes))?
                {
                    Ok(()) => Outcome::Created(stored),
                    Err(lost) => {
                        let current = lost.current.ok_or_else(|| {
                            Error::Corrupt(format!("charge {key:?} vanished during insert"))
                        })?;
                        compare(decode(&current)?, fingerprint)
                    }
                }
            }
        };
        // Also covers replays: the winner of a race may not have flushed yet.
        self.durable()?;
        Ok(outcome)
    }

    /// Returns once every write made before the call is on disk.
    fn durable(&self) -> Result<(), Error> {
        let g = &self.flushes;
        // Flush number `need` begins after this load, hence after our write.
        let need = g.started.load(Ordering::SeqCst) + 1;
        let _turn = g
            .lock
            .lock()
            .map_err(|_| Error::Task("flush lock poisoned".into()))?;
        if g.completed.load(Ordering::SeqCst) >= need {
            return Ok(());
        }
        let number = g.started.fetch_add(1, Ordering::SeqCst) + 1;
        self.db.flush()?;
        g.completed.store(number, Ordering::SeqCst);
        Ok(())
    }

    /// The charge stored under `key`, once it is durable (a lookup never
    /// reports a charge a crash could still take back).
    pub fn by_key(&self, key: &str) -> Result<Option<Stored>, Error> {
        let Some(bytes) = self.charges.get(key)? else {
            return Ok(None);
        };
        self.durable()?;
        Ok(Some(decode(&bytes)?))
    }

    /// Every stored charge, oldest first.
    pub fn list(&self) -> Result<Vec<Stored>, Error> {
        let mut all = Vec::new();
        for entry in self.charges.iter() {
            let (_, value) = entry?;
            all.push(decode(&value)?);
        }
        all.sort_by_key(|stored| stored.seq);
        Ok(all)
    }

    pub fn flush(&self) -> Result<(), Error> {
        self.db.flush()?;
        Ok(())
    }
}

fn compare(stored: Stored, fingerprint: &str) -> Outcome {
    if stored.fingerprint == fingerprint {
        Outcome::Replayed(stored)
    } else {
        Outcome::KeyReused
    }
}

fn decode(bytes: &[u8]) -> Result<Stored, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt(format!("stored charge: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_insert_wins_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let first = store
            .charge("k", "fp", |_| Ok((201, "{\"id\":\"a\"}".into())))
            .unwrap();
        assert!(matches!(first, Outcome::Created(_)));
        let again = store
            .charge("k", "fp", |_| panic!("must not make a second charge"))
            .unwrap();
        let Outcome::Replayed(stored) = again else {
            panic!("expected a replay, got {again:?}");
        };
        assert_eq!(stored.body, "{\"id\":\"a\"}");
        assert!(matches!(
            store
                .charge("k", "other", |_| Ok((201, String::new())))
                .unwrap(),
            Outcome::KeyReused
        ));
        drop(store);
        // sled releases its file lock a moment after the last handle is dropped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let reopened = loop {
            match Store::open(dir.path()) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() > deadline => panic!("reopen: {e}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        assert_eq!(reopened.list().unwrap(), vec![stored]);
    }

    #[test]
    fn racing_inserts_make_one_charge() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    store
                        .charge("k", "fp", |_| Ok((201, format!("{{\"n\":{i}}}"))))
                        .unwrap()
                })
            })
            .collect();
        let outcomes: Vec<Outcome> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Created(_)))
            .count();
        assert_eq!(created, 1);
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1);
        for outcome in outcomes {
            let (Outcome::Created(stored) | Outcome::Replayed(stored)) = outcome else {
                panic!("unexpected {outcome:?}");
            };
            assert_eq!(stored, listed[0]);
        }
    }
}
