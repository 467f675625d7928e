//! Storage format 1, read once to migrate a region directory to format 2: the
//! reader of the old write-ahead log (`commands.wal`, no writer) and the steps
//! that apply what it holds to the region tree in `db/` and retire it.
//!
//! In format 1 the region tree in `db/` (tree `region`, the tree format 2's state
//! machine keeps) was flushed in the background and `commands.wal` held every
//! acknowledged batch it might lack; `sbatch` in the tree named the last batch the
//! tree held whole. Migrating does what format 1's own open did, then retires the
//! log: apply the logged batches newer than `sbatch`, flush, remove the log, drop
//! the format-1 bookkeeping, flush. The caller writes the `FORMAT` marker last; a
//! crash before it repeats the migration, which applies nothing twice (`sbatch`
//! while the log exists, no log once it is gone).
//!
//! Log record: `len: u32 LE | crc32(payload): u32 LE | payload`, where payload is
//! `batch: u64 BE | count: u32 LE | (len: u32 LE | command bytes)*`. A torn or
//! corrupt record at the end was never acknowledged and is ignored; a bad record
//! with a whole record after it is damage among acknowledged batches and refuses
//! the migration before anything in the directory changes (defect 8's rule), as
//! do batch numbers that do not increase and a whole record that does not decode.

use std::fs::File;
use std::path::Path;

use crate::command::Command;
use crate::limits::FORMAT_1_RECORD_BYTES_MAX;
use crate::machine::Machine;
use crate::overlay::Changes;
use crate::{codec, keys, Error};

/// The old write-ahead log.
const LOG: &str = "commands.wal";
/// The region's sled `Db`, in both formats.
const DB: &str = "db";
/// Entries whose presence (without a `FORMAT` marker) means format 1.
pub(crate) const ENTRIES: [&str; 2] = [LOG, DB];
/// Format 1's record of the last batch the region tree held whole (u64, stamped).
const KEY_LAST_BATCH: &[u8] = b"sbatch";

/// One logged batch.
struct Logged {
    batch: u64,
    commands: Vec<Command>,
}

fn refuse(dir: &Path, reason: String) -> Error {
    Error::DataDir {
        dir: dir.to_path_buf(),
        reason,
    }
}

/// Migrates the format-1 region store in `dir` to format 2's layout, all but the
/// marker, which the caller writes once this returns. Blocking. Refuses (and
/// changes nothing) when `dir` holds anything format 1 did not, or a damaged log.
pub(crate) fn migrate(dir: &Path, others_allowed: &[&str]) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir).map_err(Error::Io)? {
        let name = entry.map_err(Error::Io)?.file_name();
        let known = ENTRIES.iter().chain(others_allowed).any(|n| name == *n);
        if !known {
            return Err(refuse(
                dir,
                format!(
                    "it holds storage format 1 (db/, commands.wal) and also {name:?}, which \
                     format 1 never wrote; not migrating it: remove what does not belong"
                ),
            ));
        }
    }
    let logged = read_log(dir)?;
    let (db, machine) = open_tree(dir)?;
    let applied = apply_log(&db, &machine, logged)?;
    remove_log(dir)?;
    forget_format_1(&db, &machine)?;
    drop((machine, db));
    tracing::info!(
        dir = %dir.display(),
        applied,
        "migrated the region store from storage format 1"
    );
    Ok(())
}

/// Every whole record of `dir`'s log (none when there is no log: a migration that
/// removed it was interrupted). Reads only.
fn read_log(dir: &Path) -> Result<Vec<Logged>, Error> {
    let bytes = match std::fs::read(dir.join(LOG)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Io(e)),
    };
    let mut logged: Vec<Logged> = Vec::new();
    let mut at = 0usize;
    while let Some((record, next)) = read_record(&bytes, at) {
        let record = record.map_err(|e| {
            refuse(
                dir,
                format!(
                    "its write-ahead log {LOG} holds a whole record at byte {at} that does \
                     not decode ({e}); it was written by another release: run that one"
                ),
            )
        })?;
        if let Some(previous) = logged.last() {
            if record.batch <= previous.batch {
                return Err(refuse(
                    dir,
                    format!(
                        "its write-ahead log {LOG} has batch {} at byte {at} after batch {}; \
                         nothing was changed",
                        record.batch, previous.batch
                    ),
                ));
            }
        }
        logged.push(record);
        at = next;
    }
    if let Some(whole) = whole_record_after(&bytes, at) {
        return Err(refuse(
            dir,
            format!(
                "its write-ahead log {LOG} is damaged at byte {at} with a whole record at \
                 byte {whole} after it: acknowledged batches would be lost, so it is not \
                 migrated and nothing was changed; restore the directory from a backup"
            ),
        ));
    }
    Ok(logged)
}

/// The offset of the first whole record (its checksum matches) after `bad`, if
/// any. A torn tail holds none (a crash cut the last append short).
fn whole_record_after(bytes: &[u8], bad: usize) -> Option<usize> {
    (bad + 1..bytes.len()).find(|&at| read_record(bytes, at).is_some())
}

/// The record at `at` and where the next one starts; `None` at the end of the log
/// or at a torn or corrupt record.
fn read_record(bytes: &[u8], at: usize) -> Option<(Result<Logged, Error>, usize)> {
    let header = bytes.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len > FORMAT_1_RECORD_BYTES_MAX {
        return None;
    }
    let next = at + 8 + len;
    let payload = bytes.get(at + 8..next)?;
    if payload.len() < 12 || crc32fast::hash(payload) != crc {
        return None;
    }
    let batch = u64::from_be_bytes(payload[..8].try_into().ok()?);
    let count = u32::from_le_bytes(payload[8..12].try_into().ok()?) as usize;
    let mut commands = Vec::new();
    let mut p = 12;
    for _ in 0..count {
        let len = u32::from_le_bytes(payload.get(p..p + 4)?.try_into().ok()?) as usize;
        let encoded = payload.get(p + 4..(p + 4).checked_add(len)?)?;
        match Command::decode(encoded) {
            Ok(command) => commands.push(command),
            Err(e) => return Some((Err(e), next)),
        }
        p += 4 + len;
    }
    Some((Ok(Logged { batch, commands }), next))
}

/// Opens `dir`'s region tree alone (no background flusher, so the `Db` is closed
/// when the last handle drops and the region group can open it next).
fn open_tree(dir: &Path) -> Result<(sled::Db, Machine), Error> {
    let db =
        keyhold_raftlog::open_db(&sled::Config::new().path(dir.join(DB)).flush_every_ms(None))?;
    let machine = Machine::new(db.open_tree(crate::raft::REGION_TREE)?);
    // Its log's commands are decided again on the tree: its fences must read
    // as the guards they stand for first.
    machine.migrate_legacy_fences()?;
    Ok((db, machine))
}

/// Applies the logged batches newer than the tree's last whole batch, as format
/// 1's open did (each command stamped with its batch number), and flushes.
/// Returns how many commands it applied.
fn apply_log(db: &sled::Db, machine: &Machine, logged: Vec<Logged>) -> Result<usize, Error> {
    // Batch numbers increase through the log (`read_log` checks), so the records
    // to apply are those after the last whole batch.
    let last_batch: u64 = machine.get(KEY_LAST_BATCH)?.unwrap_or(0);
    let mut applied = 0;
    for record in logged.into_iter().filter(|r| r.batch > last_batch) {
        let count = record.commands.len();
        for (position, command) in record.commands.iter().enumerate() {
            // Format 1 applied each command in its own sled batch: so does its replay.
            let (_, writes) = machine.stage(&Changes::default(), command, record.batch)?;
            let mut writes = writes.unwrap_or_default().into_batch();
            // The batch is whole with its last command's effect, in one sled batch.
            if position + 1 == count {
                writes.insert(KEY_LAST_BATCH, codec::encode(record.batch, &record.batch));
            }
            machine.tree().apply_batch(writes)?;
            applied += 1;
        }
        if count == 0 {
            machine
                .tree()
                .insert(KEY_LAST_BATCH, codec::encode(record.batch, &record.batch))?;
        }
    }
    db.flush()?;
    Ok(applied)
}

/// Removes the log once the tree holds all of it durably.
fn remove_log(dir: &Path) -> Result<(), Error> {
    match std::fs::remove_file(dir.join(LOG)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::Io(e)),
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::Io)
}

/// Drops what only format 1 read: `sbatch`, and the consumers' cursor generations.
/// A generation is an old batch number that a new log index could equal (the
/// relay compares generations for equality), so an outbox replay after the
/// migration could look like none; without one a cursor reads generation 0,
/// which no log entry's index is, and no relay round outlives the restart.
fn forget_format_1(db: &sled::Db, machine: &Machine) -> Result<(), Error> {
    let mut batch = sled::Batch::default();
    batch.remove(KEY_LAST_BATCH);
    for item in machine.tree().scan_prefix(keys::CURSOR_GENERATION_PREFIX) {
        batch.remove(item?.0);
    }
    machine.tree().apply_batch(batch)?;
    db.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Applied, OrderOutcome};
    use crate::Store;
    use std::path::PathBuf;

    use crate::test_common::{member, new_order as order};

    /// One record as format 1's writer appended it.
    fn record(batch: u64, commands: &[Command]) -> Vec<u8> {
        let mut payload = batch.to_be_bytes().to_vec();
        payload.extend_from_slice(&(commands.len() as u32).to_le_bytes());
        for command in commands {
            let encoded = command.encode();
            payload.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            payload.extend_from_slice(&encoded);
        }
        let mut out = (payload.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// A format-1 directory as the old release left it after a crash: batches 1
    /// and 2 (orders 1 to 3) in the tree with `sbatch` 2, a consumer's cursor
    /// generation, and a log holding batch 2 again, batches 3 and 4 (orders 4 to
    /// 6) that the tree lacks, and a torn last append. Returns the log's bytes.
    fn write_format_1(dir: &Path) -> Vec<u8> {
        {
            let db = sled::Config::new().path(dir.join(DB)).open().unwrap();
            let machine = Machine::new(db.open_tree(crate::raft::REGION_TREE).unwrap());
            for (batch, commands) in [(1, vec![order(1), order(2)]), (2, vec![order(3)])] {
                for command in &commands {
                    let (_, writes) = machine.stage(&Changes::default(), command, batch).unwrap();
                    machine
                        .tree()
                        .apply_batch(writes.unwrap().into_batch())
                        .unwrap();
                }
                let stamp = codec::encode(batch, &batch);
                machine.tree().insert(KEY_LAST_BATCH, stamp).unwrap();
            }
            let generation = codec::encode(2, &2u64);
            let key = keys::cursor_generation(crate::Consumer::Payments);
            machine.tree().insert(key, generation).unwrap();
            db.flush().unwrap();
        }
        let mut log = record(2, &[order(3)]);
        log.extend(record(3, &[order(4), order(5)]));
        log.extend(record(4, &[order(6)]));
        log.extend_from_slice(&[40, 0, 0, 0, 1, 2]);
        std::fs::write(dir.join(LOG), &log).unwrap();
        log
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| PathBuf::from(e.unwrap().file_name()))
            .collect();
        names.sort();
        names
    }

    /// Every order is there and a retry of it replays; outbox events keep their
    /// gapless sequence.
    async fn check_orders(store: &Store, last: u64) {
        for n in 1..=last {
            assert!(store.order(&format!("ord_{n}")).await.unwrap().is_some());
            match store.execute(order(n)).await.unwrap() {
                Applied::Order(OrderOutcome::Replayed { .. }) => {}
                other => panic!("order {n}: expected a replay, got {other:?}"),
            }
        }
        crate::test_common::assert_outbox_gapless(store, last).await;
    }

    #[tokio::test]
    async fn a_format_1_dir_opens_with_every_order_and_takes_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        write_format_1(dir.path());
        let store = Store::open(dir.path(), member()).await.unwrap();
        let marker = std::fs::read_to_string(dir.path().join("FORMAT")).unwrap();
        assert_eq!(marker.trim(), crate::STORAGE_FORMAT.to_string());
        assert!(!dir.path().join(LOG).exists());
        assert!(store
            .inner
            .machine
            .tree()
            .get(KEY_LAST_BATCH)
            .unwrap()
            .is_none());
        assert_eq!(
            store
                .cursor_at(crate::Consumer::Payments)
                .await
                .unwrap()
                .generation,
            0
        );
        check_orders(&store, 6).await;
        match store.execute(order(7)).await.unwrap() {
            Applied::Order(OrderOutcome::Created { .. }) => {}
            other => panic!("a new order: {other:?}"),
        }
        let state = store.state_for_tests();
        store.shutdown().await.unwrap();
        drop(store);

        let store = Store::open(dir.path(), member()).await.unwrap();
        check_orders(&store, 7).await;
        assert_eq!(store.state_for_tests(), state);
        store.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn an_interrupted_migration_completes_on_the_next_open() {
        let straight = tempfile::tempdir().unwrap();
        write_format_1(straight.path());
        let store = Store::open(straight.path(), member()).await.unwrap();
        let expected = store.state_for_tests();
        store.shutdown().await.unwrap();
        drop(store);

        // A crash after the log was applied, and one after it was removed too.
        for steps in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            write_format_1(dir.path());
            {
                let (db, machine) = open_tree(dir.path()).unwrap();
                apply_log(&db, &machine, read_log(dir.path()).unwrap()).unwrap();
            }
            if steps == 2 {
                remove_log(dir.path()).unwrap();
            }
            assert!(!dir.path().join("FORMAT").exists());
            let store = Store::open(dir.path(), member()).await.unwrap();
            assert_eq!(store.state_for_tests(), expected, "after step {steps}");
            check_orders(&store, 6).await;
            store.shutdown().await.unwrap();
        }
    }

    #[tokio::test]
    async fn damage_in_the_middle_of_the_log_refuses_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = write_format_1(dir.path());
        // One flipped bit inside the first record's payload: batches 3 and 4 follow.
        log[10] ^= 0x01;
        std::fs::write(dir.path().join(LOG), &log).unwrap();
        let before = entries(dir.path());
        match Store::open(dir.path(), member()).await {
            Err(Error::DataDir { dir: named, reason }) => {
                assert_eq!(named, dir.path());
                assert!(reason.contains("damaged at byte 0"), "{reason}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(entries(dir.path()), before);
        assert_eq!(std::fs::read(dir.path().join(LOG)).unwrap(), log);
    }

    #[test]
    fn batch_numbers_must_increase() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = record(5, &[order(1)]);
        log.extend(record(5, &[order(2)]));
        std::fs::write(dir.path().join(LOG), &log).unwrap();
        let Err(Error::DataDir { reason, .. }) = read_log(dir.path()) else {
            panic!("repeated batch numbers were read");
        };
        assert!(reason.contains("batch 5 at byte"), "{reason}");
    }

    #[test]
    fn an_entry_format_1_never_wrote_refuses() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOG), b"").unwrap();
        std::fs::create_dir(dir.path().join("log")).unwrap();
        let Err(Error::DataDir { reason, .. }) = migrate(dir.path(), &[]) else {
            panic!("migrated a directory with a foreign entry");
        };
        assert!(reason.contains("\"log\""), "{reason}");
        assert!(!dir.path().join(DB).exists());
    }
}
