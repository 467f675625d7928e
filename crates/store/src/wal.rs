//! The write-ahead log: what makes a batch durable.
//!
//! A commit batch is acknowledged once its commands are appended to this log and
//! the log is `fdatasync`ed: one small sequential write and one sync per batch,
//! however many commands it holds. The sled tree is the state the commands
//! produce; sled persists it in the background, and on open every logged batch
//! newer than the last one sled holds is applied again. That is safe because
//! commands are deterministic and each command is a no-op on the state it itself
//! produced (see the store tests), so a batch sled holds in part replays cleanly.
//! When the log grows past `WAL_BYTES_MAX`, the apply thread flushes sled and
//! empties the log (a checkpoint).
//!
//! Record: `len: u32 LE | crc32(payload): u32 LE | payload`, where payload is
//! `batch: u64 BE | count: u32 LE | (len: u32 LE | command bytes)*`. A torn or
//! corrupt record at the end of the log was never synced, so never acknowledged:
//! it is cut. A bad record with a whole record after it is damage in the middle
//! of acknowledged batches: the log refuses to open rather than drop them.
//! Batch numbers increase from record to record; a log where they do not is
//! refused too. The file's directory entry is synced when the log is opened, so
//! a log created just before a crash does not vanish with it.

use crate::command::Command;
use crate::Error;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The log is checkpointed (sled flushed, log emptied) past this size.
pub const WAL_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// A record larger than this is corrupt (a batch is bounded by its command count).
const RECORD_BYTES_MAX: usize = 512 * 1024 * 1024;

pub struct Wal {
    file: File,
    bytes: u64,
    buffer: Vec<u8>,
}

/// One logged batch, read back at open.
pub struct Logged {
    pub batch: u64,
    pub commands: Vec<Command>,
}

impl Wal {
    /// Opens the log in `dir`, returning it (positioned at the end of its last
    /// whole record) and every whole record in it.
    pub fn open(dir: &Path) -> Result<(Wal, Vec<Logged>), Error> {
        let path = dir.join("commands.wal");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(Error::Io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(Error::Io)?;
        let mut logged: Vec<Logged> = Vec::new();
        let mut at = 0usize;
        while let Some((record, next)) = read_record(&bytes, at) {
            let record = record?;
            if let Some(previous) = logged.last() {
                if record.batch <= previous.batch {
                    return Err(Error::Corrupt(format!(
                        "write-ahead log: batch {} at byte {at} follows batch {}",
                        record.batch, previous.batch
                    )));
                }
            }
            logged.push(record);
            at = next;
        }
        if let Some(valid) = whole_record_after(&bytes, at) {
            return Err(Error::Corrupt(format!(
                "write-ahead log damaged at byte {at} with a whole record at byte {valid} \
                 after it; refusing to drop acknowledged batches"
            )));
        }
        // Cut a torn tail so new records follow the last whole one.
        file.set_len(at as u64).map_err(Error::Io)?;
        file.seek(SeekFrom::End(0)).map_err(Error::Io)?;
        file.sync_all().map_err(Error::Io)?;
        // The file's name must be durable too, or a crash can take the whole log.
        sync_dir(dir)?;
        Ok((
            Wal {
                file,
                bytes: at as u64,
                buffer: Vec::with_capacity(64 * 1024),
            },
            logged,
        ))
    }

    /// Appends one batch and syncs it: on return the batch is durable.
    pub fn append(&mut self, batch: u64, commands: &[&Command]) -> Result<(), Error> {
        self.buffer.clear();
        self.buffer.extend_from_slice(&[0u8; 8]);
        self.buffer.extend_from_slice(&batch.to_be_bytes());
        self.buffer
            .extend_from_slice(&(commands.len() as u32).to_le_bytes());
        for command in commands {
            let encoded = command.encode();
            self.buffer
                .extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            self.buffer.extend_from_slice(&encoded);
        }
        let payload_len = self.buffer.len() - 8;
        let crc = crc32fast::hash(&self.buffer[8..]);
        self.buffer[..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        self.buffer[4..8].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all(&self.buffer).map_err(Error::Io)?;
        self.file.sync_data().map_err(Error::Io)?;
        self.bytes += self.buffer.len() as u64;
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Empties the log. Call only once everything it holds is durable elsewhere.
    pub fn reset(&mut self) -> Result<(), Error> {
        self.file.set_len(0).map_err(Error::Io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(Error::Io)?;
        self.file.sync_all().map_err(Error::Io)?;
        self.bytes = 0;
        Ok(())
    }
}

/// Syncs a directory, making the names of the files it holds durable.
fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::Io)
}

/// The offset of the first whole record (its checksum matches) after `bad`,
/// if any. A torn tail holds none (the crash cut the last append short); damage
/// in the middle of the log does.
fn whole_record_after(bytes: &[u8], bad: usize) -> Option<usize> {
    (bad + 1..bytes.len()).find(|&at| read_record(bytes, at).is_some())
}

/// The record at `at`, and where the next one starts; `None` at the end of the
/// log or at a torn or corrupt record.
fn read_record(bytes: &[u8], at: usize) -> Option<(Result<Logged, Error>, usize)> {
    let header = bytes.get(at..at + 8)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len > RECORD_BYTES_MAX {
        return None;
    }
    let payload = bytes.get(at + 8..at + 8 + len)?;
    if crc32fast::hash(payload) != crc || payload.len() < 12 {
        return None;
    }
    let batch = u64::from_be_bytes(payload[..8].try_into().ok()?);
    let count = u32::from_le_bytes(payload[8..12].try_into().ok()?) as usize;
    let mut commands = Vec::with_capacity(count);
    let mut p = 12;
    for _ in 0..count {
        let len = u32::from_le_bytes(payload.get(p..p + 4)?.try_into().ok()?) as usize;
        let encoded = payload.get(p + 4..p + 4 + len)?;
        match Command::decode(encoded) {
            Ok(c) => commands.push(c),
            // A record whose checksum matches but does not decode was written by
            // another version: stop loudly rather than skip acknowledged work.
            Err(e) => return Some((Err(e), at + 8 + len)),
        }
        p += 4 + len;
    }
    Some((Ok(Logged { batch, commands }), at + 8 + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyhold_core::UnixMillis;

    fn sweep(n: u64) -> Command {
        Command::Sweep {
            now: UnixMillis(n),
            entries_max: 1,
            consumers: vec![],
        }
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut wal, logged) = Wal::open(dir.path()).unwrap();
            assert!(logged.is_empty());
            wal.append(1, &[&sweep(1), &sweep(2)]).unwrap();
            wal.append(2, &[&sweep(3)]).unwrap();
        }
        // Half a record at the end: a crash in the middle of an append.
        let path = dir.path().join("commands.wal");
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[40, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let (mut wal, logged) = Wal::open(dir.path()).unwrap();
        assert_eq!(logged.len(), 2);
        assert_eq!(logged[0].batch, 1);
        assert_eq!(logged[0].commands, vec![sweep(1), sweep(2)]);
        assert_eq!(logged[1].commands, vec![sweep(3)]);
        wal.append(3, &[&sweep(4)]).unwrap();
        drop(wal);
        let (mut wal, logged) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            logged.iter().map(|l| l.batch).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        wal.reset().unwrap();
        drop(wal);
        let (_, logged) = Wal::open(dir.path()).unwrap();
        assert!(logged.is_empty());
    }

    fn three_batches(dir: &Path) -> Vec<u8> {
        let (mut wal, _) = Wal::open(dir).unwrap();
        wal.append(1, &[&sweep(1)]).unwrap();
        wal.append(2, &[&sweep(2)]).unwrap();
        wal.append(3, &[&sweep(3)]).unwrap();
        drop(wal);
        std::fs::read(dir.join("commands.wal")).unwrap()
    }

    #[test]
    fn damage_with_whole_records_after_it_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = three_batches(dir.path());
        let record_bytes = bytes.len() / 3;
        // One flipped bit inside the first record's payload.
        bytes[10] ^= 0x01;
        std::fs::write(dir.path().join("commands.wal"), &bytes).unwrap();
        match Wal::open(dir.path()) {
            Err(Error::Corrupt(message)) => {
                assert!(message.contains("damaged at byte 0"), "{message}")
            }
            Ok((_, logged)) => panic!("opened with {} batches of 3", logged.len()),
            Err(other) => panic!("unexpected error {other}"),
        }
        // Nothing was cut: the file is as it was, for an operator to inspect.
        let kept = std::fs::read(dir.path().join("commands.wal")).unwrap();
        assert_eq!(kept.len(), 3 * record_bytes);
    }

    #[test]
    fn damage_in_the_last_record_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = three_batches(dir.path());
        let last = bytes.len() - 3;
        bytes[last] ^= 0x01;
        std::fs::write(dir.path().join("commands.wal"), &bytes).unwrap();
        let (_, logged) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            logged.iter().map(|l| l.batch).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn batch_numbers_must_increase() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut wal, _) = Wal::open(dir.path()).unwrap();
            wal.append(5, &[&sweep(1)]).unwrap();
            wal.append(5, &[&sweep(2)]).unwrap();
        }
        assert!(matches!(Wal::open(dir.path()), Err(Error::Corrupt(_))));
    }
}
