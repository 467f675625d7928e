//! The crate's one error type. Raft and transport errors are carried as text or boxed
//! sources so that `Result<_, Error>` stays small; rejections by the state machine are
//! not errors (they come back as `Response::Rejected`).

use crate::types::NodeId;

/// Everything that can go wrong in the registry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is inconsistent (for example election timeouts not above the
    /// heartbeat).
    #[error("invalid registry config: {0}")]
    Config(String),
    /// The sled database failed or holds data this version cannot read.
    #[error("registry storage: {0}")]
    Storage(String),
    /// The local Raft instance stopped (shutdown, or a fatal storage error).
    #[error("registry raft stopped: {0}")]
    Fatal(String),
    /// `initialize` was refused for a reason other than "already initialized".
    #[error("registry initialize: {0}")]
    Initialize(String),
    /// A membership change (`add_learner`, `change_membership`) failed.
    #[error("registry membership change: {0}")]
    Membership(String),
    /// No leader could take the write within `WRITE_ATTEMPTS_MAX` attempts.
    #[error("no registry leader after {attempts} attempts (last: {last_error})")]
    NoLeader { attempts: u32, last_error: String },
    /// `Registry::write` ran out of `write_timeout_ms`. The write may still commit later.
    #[error("registry write did not complete within {waited_ms} ms")]
    WriteTimeout { waited_ms: u64 },
    /// Forwarding a write to the leader failed in a way retries cannot fix (for example
    /// the leader answered with something that is not a registry reply).
    #[error("registry write forwarded to node {leader} failed: {reason}")]
    Forward { leader: NodeId, reason: String },
    /// `wait_applied` ran out of time.
    #[error("registry replica did not apply index {index} within {waited_ms} ms (at {applied})")]
    Timeout {
        index: u64,
        applied: u64,
        waited_ms: u64,
    },
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::Storage(e.to_string())
    }
}
