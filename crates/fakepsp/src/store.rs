//! Durable charges: one sled tree keyed by idempotency key.
//!
//! Each entry holds the request fingerprint and the exact answer (HTTP status
//! and body bytes), so a replay returns the same bytes as the first answer.
//! Exactly one charge per key comes from sled's compare-and-swap: the first
//! request to insert into the empty slot wins, every other one reads the
//! winner's entry. No answer leaves before a `flush`, so whatever a client was
//! told survives a crash.
//!
//! Flushes are group commits run by one task ([`Store::run_flusher`]): a
//! request takes a ticket after its write and waits for a flush that began
//! after the ticket; one flush covers every ticket taken before it began. The
//! reads and the compare-and-swap run on the caller's task: the provider's
//! charges stay in sled's cache, and a blocking thread per charge (a hand-off
//! there and back, and a thread parked on a lock per waiting charge) cost more
//! than the work (docs/benchmarks.md, "The fake provider's group commit").
//!
//! **Architecture Invariant:** the store knows nothing of HTTP or randomness;
//! the caller decides the charge, the store only decides who was first.

use crate::Error;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, Notify};

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
    flushes: Arc<Flushes>,
}

/// Group commit for answers: a flush that begins after a write covers it, so
/// concurrent requests share flushes instead of each paying for one.
#[derive(Debug)]
struct Flushes {
    /// Tickets taken so far; ticket `n` is taken after its writer's write.
    taken: AtomicU64,
    /// Wakes the flusher when a ticket is taken.
    wake: Notify,
    /// What the flushes so far made durable.
    done: watch::Sender<Flushed>,
}

/// The flusher's progress: every ticket up to `covered` is durable; the
/// tickets up to `failed`'s first field waited for a flush that failed.
#[derive(Debug, Clone, Default)]
struct Flushed {
    covered: u64,
    failed: Option<(u64, String)>,
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
        let flushes = Flushes {
            taken: AtomicU64::new(0),
            wake: Notify::new(),
            done: watch::channel(Flushed::default()).0,
        };
        Ok(Store {
            db,
            charges,
            flushes: Arc::new(flushes),
        })
    }

    /// Flushes for the tickets taken, once per group, until `stop` turns true
    /// with no ticket waiting. Every [`durable`](Self::durable) call waits for
    /// this task: run exactly one per store while it serves.
    pub async fn run_flusher(self, mut stop: watch::Receiver<bool>) {
        let mut covered = 0;
        loop {
            let target = self.flushes.taken.load(Ordering::SeqCst);
            if target == covered {
                if *stop.borrow() {
                    return;
                }
                tokio::select! {
                    () = self.flushes.wake.notified() => {}
                    changed = stop.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
                continue;
            }
            // Every ticket up to `target` was taken after its write, so this
            // flush, begun after the load, covers them all.
            let db = self.db.clone();
            let error = match tokio::task::spawn_blocking(move || db.flush()).await {
                Ok(Ok(_)) => {
                    self.flushes.done.send_modify(|f| f.covered = target);
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(join) => Some(join.to_string()),
            };
            if let Some(error) = error {
                tracing::error!(%error, "fake psp flush failed");
                // Those waiting fail; a later ticket gets a new flush.
                self.flushes
                    .done
                    .send_modify(|f| f.failed = Some((target, error)));
            }
            covered = target;
        }
    }

    /// Creates the charge for `key` with `make(seq)` unless one exists, and
    /// returns what the client must be told. `make` runs only if no entry was
    /// found, but a racing request may still win the insert; its entry is then
    /// the answer. Returns only after the entry is durable.
    pub async fn charge(
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
        self.durable().await?;
        Ok(outcome)
    }

    /// Returns once every write made before the call is on disk.
    async fn durable(&self) -> Result<(), Error> {
        let ticket = self.flushes.taken.fetch_add(1, Ordering::SeqCst) + 1;
        self.flushes.wake.notify_one();
        let mut done = self.flushes.done.subscribe();
        let flushed = done
            .wait_for(|f| {
                f.covered >= ticket || f.failed.as_ref().is_some_and(|(upto, _)| *upto >= ticket)
            })
            .await
            .map_err(|_| Error::Task("the flusher stopped".into()))?;
        if flushed.covered >= ticket {
            return Ok(());
        }
        let error = flushed.failed.as_ref().map_or("", |(_, e)| e.as_str());
        Err(Error::Task(format!("flush failed: {error}")))
    }

    /// The charge stored under `key`, once it is durable (a lookup never
    /// reports a charge a crash could still take back).
    pub async fn by_key(&self, key: &str) -> Result<Option<Stored>, Error> {
        let Some(bytes) = self.charges.get(key)? else {
            return Ok(None);
        };
        self.durable().await?;
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

    /// `store` with its flusher running; the flusher stops when the sender
    /// drops, and the task ends then.
    fn flushing(store: &Store) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = watch::channel(false);
        (stop, tokio::spawn(store.clone().run_flusher(stopped)))
    }

    #[tokio::test]
    async fn first_insert_wins_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (stop, flusher) = flushing(&store);
        let first = store
            .charge("k", "fp", |_| Ok((201, "{\"id\":\"a\"}".into())))
            .await
            .unwrap();
        assert!(matches!(first, Outcome::Created(_)));
        let again = store
            .charge("k", "fp", |_| panic!("must not make a second charge"))
            .await
            .unwrap();
        let Outcome::Replayed(stored) = again else {
            panic!("expected a replay, got {again:?}");
        };
        assert_eq!(stored.body, "{\"id\":\"a\"}");
        assert!(matches!(
            store
                .charge("k", "other", |_| Ok((201, String::new())))
                .await
                .unwrap(),
            Outcome::KeyReused
        ));
        assert_eq!(store.by_key("k").await.unwrap(), Some(stored.clone()));
        assert_eq!(store.by_key("unknown").await.unwrap(), None);
        drop(stop);
        // The flusher holds the store too.
        flusher.await.unwrap();
        drop(store);
        // sled releases its file lock a moment after the last handle is dropped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let reopened = loop {
            match Store::open(dir.path()) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() > deadline => panic!("reopen: {e}"),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        assert_eq!(reopened.list().unwrap(), vec![stored]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_inserts_make_one_charge() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (_stop, _flusher) = flushing(&store);
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .charge("k", "fp", |_| Ok((201, format!("{{\"n\":{i}}}"))))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn each_answer_waits_for_a_flush_that_began_after_its_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // No flusher yet: a charge is written but not answered.
        let waiting = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .charge("k", "fp", |_| Ok((201, "{}".into())))
                    .await
                    .unwrap()
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "answered before any flush");
        assert_eq!(store.flushes.done.borrow().covered, 0);
        let (stop, flusher) = flushing(&store);
        assert!(matches!(waiting.await.unwrap(), Outcome::Created(_)));
        assert!(store.flushes.done.borrow().covered >= 1);
        // Many charges at once share flushes and are all answered.
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let key = format!("k-{i}");
                    store.charge(&key, "fp", |_| Ok((201, "{}".into()))).await
                })
            })
            .collect();
        for task in tasks {
            assert!(matches!(task.await.unwrap(), Ok(Outcome::Created(_))));
        }
        assert_eq!(store.list().unwrap().len(), 65);
        // Stopped with no ticket waiting, the flusher returns.
        stop.send(true).unwrap();
        flusher.await.unwrap();
    }
}
