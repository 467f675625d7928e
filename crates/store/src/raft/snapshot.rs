//! The file format of a region group's snapshot: a self-describing stream of the
//! region tree's entries, written and read one entry at a time so that neither
//! building nor installing a snapshot holds more than one entry and an I/O buffer in
//! memory, whatever the size of the region.
//!
//! Layout: `MAGIC`, the encoded `SnapshotMeta` (u32 big-endian length, bytes), then per
//! entry a u32 key length, the key, a u32 value length and the value, in key order,
//! and finally `END_OF_ENTRIES` in place of a key length followed by the entry count
//! (u64). A file cut short anywhere fails to read instead of installing part of a
//! region.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::SnapshotMeta;
use crate::limits::{SNAPSHOT_ENTRY_BYTES_MAX, SNAPSHOT_IO_BUFFER_BYTES};
use crate::Error;

const MAGIC: &[u8; 8] = b"KHSNAP01";
/// Stands where the next key's length would: no more entries.
const END_OF_ENTRIES: u32 = u32::MAX;
/// A snapshot's meta is a log id, a membership and an id: small.
const META_BYTES_MAX: usize = 1024 * 1024;

const _: () = assert!(SNAPSHOT_ENTRY_BYTES_MAX < END_OF_ENTRIES as usize);

fn io(context: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Snapshot(format!("{context}: {e}"))
}

/// Writes a complete snapshot of `entries` to `path` and syncs it. Returns the number
/// of entries written.
pub(crate) fn write(
    path: &Path,
    meta: &SnapshotMeta,
    entries: impl Iterator<Item = Result<(sled::IVec, sled::IVec), sled::Error>>,
) -> Result<u64, Error> {
    let file = File::create(path).map_err(io("create snapshot file"))?;
    let mut out = BufWriter::with_capacity(SNAPSHOT_IO_BUFFER_BYTES, file);
    let meta = keyhold_raftlog::codec::encode(meta)
        .map_err(|e| Error::Snapshot(format!("encode snapshot meta: {e}")))?;
    let write_error = io("write snapshot file");
    out.write_all(MAGIC).map_err(&write_error)?;
    write_chunk(&mut out, &meta).map_err(&write_error)?;
    let mut count = 0u64;
    for entry in entries {
        let (key, value) = entry?;
        write_chunk(&mut out, &key).map_err(&write_error)?;
        write_chunk(&mut out, &value).map_err(&write_error)?;
        count += 1;
    }
    out.write_all(&END_OF_ENTRIES.to_be_bytes())
        .map_err(&write_error)?;
    out.write_all(&count.to_be_bytes()).map_err(&write_error)?;
    let file = out
        .into_inner()
        .map_err(|e| Error::Snapshot(format!("write snapshot file: {}", e.error())))?;
    file.sync_all().map_err(io("sync snapshot file"))?;
    Ok(count)
}

fn write_chunk(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    // Keys and values are bounded far below 4 GiB (`SNAPSHOT_ENTRY_BYTES_MAX`).
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(bytes)
}

/// One key and value of the region tree.
pub(crate) type TreeEntry = (Vec<u8>, Vec<u8>);

/// Reads a snapshot file entry by entry.
pub(crate) struct Reader {
    input: BufReader<File>,
    meta: SnapshotMeta,
    read: u64,
}

impl Reader {
    /// Opens a snapshot and reads its meta.
    pub(crate) fn open(file: File) -> Result<Reader, Error> {
        let mut input = BufReader::with_capacity(SNAPSHOT_IO_BUFFER_BYTES, file);
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(io("read snapshot header"))?;
        if &magic != MAGIC {
            return Err(Error::Snapshot(format!(
                "not a region snapshot (header {magic:?})"
            )));
        }
        let len = read_u32(&mut input)?;
        let meta = read_bytes(&mut input, len, META_BYTES_MAX)?;
        let meta = keyhold_raftlog::codec::decode(&meta)
            .map_err(|e| Error::Snapshot(format!("decode snapshot meta: {e}")))?;
        Ok(Reader {
            input,
            meta,
            read: 0,
        })
    }

    pub(crate) fn meta(&self) -> &SnapshotMeta {
        &self.meta
    }

    /// The next entry, or `None` after the last one (checked against the count the
    /// writer recorded).
    pub(crate) fn next_entry(&mut self) -> Result<Option<TreeEntry>, Error> {
        let len = read_u32(&mut self.input)?;
        if len == END_OF_ENTRIES {
            let mut count = [0u8; 8];
            self.input
                .read_exact(&mut count)
                .map_err(io("read snapshot entry count"))?;
            let count = u64::from_be_bytes(count);
            if count != self.read {
                return Err(Error::Snapshot(format!(
                    "snapshot holds {} entries but says {count}",
                    self.read
                )));
            }
            return Ok(None);
        }
        let key = read_bytes(&mut self.input, len, SNAPSHOT_ENTRY_BYTES_MAX)?;
        let len = read_u32(&mut self.input)?;
        let value = read_bytes(&mut self.input, len, SNAPSHOT_ENTRY_BYTES_MAX)?;
        self.read += 1;
        Ok(Some((key, value)))
    }
}

/// Reads a whole snapshot file; returns its meta when every entry and the closing
/// count are there.
pub(crate) fn verify(file: File) -> Result<SnapshotMeta, Error> {
    let mut reader = Reader::open(file)?;
    while reader.next_entry()?.is_some() {}
    Ok(reader.meta)
}

fn read_u32(input: &mut impl Read) -> Result<u32, Error> {
    let mut bytes = [0u8; 4];
    input
        .read_exact(&mut bytes)
        .map_err(io("read snapshot (cut short?)"))?;
    Ok(u32::from_be_bytes(bytes))
}

/// Reads `len` bytes, refusing a length above `max` before allocating for it.
fn read_bytes(input: &mut impl Read, len: u32, max: usize) -> Result<Vec<u8>, Error> {
    let len = len as usize;
    if len > max {
        return Err(Error::Snapshot(format!(
            "snapshot chunk of {len} bytes exceeds {max}"
        )));
    }
    let mut bytes = vec![0u8; len];
    input
        .read_exact(&mut bytes)
        .map_err(io("read snapshot (cut short?)"))?;
    Ok(bytes)
}
