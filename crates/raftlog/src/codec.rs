//! The one byte encoding of keyhold's Raft groups: bincode 2 in its serde mode with
//! `config::standard()`, used for log entries, votes, sled values of the state
//! machines and Raft RPC bodies alike. The encoding is part of every group's on-disk
//! format, so it lives in one place.

use serde::de::DeserializeOwned;
use serde::Serialize;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `value`.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, config())
}

/// How many bytes `encode(value)` would give, without building them.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, bincode::error::EncodeError> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config())?;
    Ok(size.bytes_written)
}

/// Decodes a whole buffer; trailing bytes are an error because they mean the writer
/// and the reader disagree about the type.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, config())?;
    if read != bytes.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes after a {}-byte value",
            bytes.len() - read,
            read
        )));
    }
    Ok(value)
}
