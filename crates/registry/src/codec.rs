//! The one byte encoding of the crate: bincode 2 in its serde mode with
//! `config::standard()`, used for sled values and for Raft RPC bodies alike. The
//! encoding is part of the on-disk format (see `limits::STORAGE_FORMAT_VERSION`), so it
//! lives in one place.

use serde::de::DeserializeOwned;
use serde::Serialize;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `value`.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, config())
}

/// Decodes a whole buffer; trailing bytes are an error because they mean the writer
/// and the reader disagree about the type.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
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
