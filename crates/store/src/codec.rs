//! The on-disk value format: a format version byte, the number of the batch that
//! wrote the value (in a region group, the index of the log entry whose command
//! wrote it), then the bincode-2 (serde, standard config) payload.
//!
//! The stamp once told readers whether a value was durable yet; since the region
//! is a Raft state machine, every applied value is committed and nobody waits on
//! it, but it stays in the format: it says which entry last wrote a value (a
//! value migrated from storage format 1 keeps its old batch number, which may be
//! above the region log's indexes: nothing compares stamps for order). The
//! version byte lets a later release read values written by this one.

use crate::Error;
use serde::{de::DeserializeOwned, Serialize};

pub const FORMAT_VERSION: u8 = 1;
const HEADER_BYTES: usize = 9;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

pub fn encode<T: Serialize>(batch: u64, value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&batch.to_be_bytes());
    // Encoding our own plain data types into a Vec cannot fail.
    let payload = bincode::serde::encode_to_vec(value, config()).expect("value encodes");
    out.extend_from_slice(&payload);
    out
}

/// A value whose payload is already encoded (an imported entry), under a new stamp.
pub fn encode_raw(batch: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&batch.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a stored value, without its header.
pub fn payload(bytes: &[u8]) -> Result<&[u8], Error> {
    if bytes.len() < HEADER_BYTES || bytes[0] != FORMAT_VERSION {
        return Err(Error::Corrupt("value without a valid header".into()));
    }
    Ok(&bytes[HEADER_BYTES..])
}

/// Returns the value and the batch that wrote it.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, u64), Error> {
    if bytes.len() < HEADER_BYTES || bytes[0] != FORMAT_VERSION {
        return Err(Error::Corrupt(format!(
            "value of {} bytes with format byte {:?}",
            bytes.len(),
            bytes.first()
        )));
    }
    let batch = u64::from_be_bytes(bytes[1..HEADER_BYTES].try_into().expect("8 bytes"));
    let (value, _) = bincode::serde::decode_from_slice(&bytes[HEADER_BYTES..], config())
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    Ok((value, batch))
}

/// Commands travel (and will be logged by Raft) in the same encoding.
pub fn encode_plain<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, config()).expect("value encodes")
}

/// Decodes a command or an imported payload. The limit makes a length prefix
/// that claims more than `COMMAND_BYTES_MAX` an error before anything is
/// allocated for it (found by fuzzing: 11 bytes asked for 2.2 GB).
pub fn decode_plain<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let config = config().with_limit::<{ crate::limits::COMMAND_BYTES_MAX }>();
    bincode::serde::decode_from_slice(bytes, config)
        .map(|(v, _)| v)
        .map_err(|e| Error::Corrupt(e.to_string()))
}
