//! The crate's byte encoding, for sled values and Raft RPC bodies: the one encoding of
//! every keyhold Raft group, defined in `keyhold-raftlog` (part of the on-disk format,
//! see `limits::STORAGE_FORMAT_VERSION`).

pub(crate) use keyhold_raftlog::codec::{decode, encode, encoded_len};
