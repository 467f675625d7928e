//! The idempotency record: what the store remembers about one scope.

use crate::time::UnixMillis;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    Processing,
    Succeeded,
    FailedRetryable,
    FailedFinal,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Processing => "PROCESSING",
            RecordState::Succeeded => "SUCCEEDED",
            RecordState::FailedRetryable => "FAILED_RETRYABLE",
            RecordState::FailedFinal => "FAILED_FINAL",
        }
    }

    /// Terminal states are replayed to every later attempt.
    pub fn is_replayable(self) -> bool {
        matches!(self, RecordState::Succeeded | RecordState::FailedFinal)
    }
}

/// A response kept byte for byte so a replay is indistinguishable from the first
/// answer (bar the `Idempotent-Replayed` header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Stored form of the fingerprint (`sha256:` or `hmac-sha256:`).
    pub fingerprint: String,
    pub state: RecordState,
    /// Increases on every acquisition of the scope; the fencing token.
    pub generation: u64,
    /// Random part of the owner token, so a token cannot be guessed from the
    /// generation alone.
    pub nonce: u64,
    pub lease_expires_at: UnixMillis,
    pub response: Option<StoredResponse>,
    pub resource_id: Option<String>,
    pub created_at: UnixMillis,
    /// Logical expiry: at or after this instant the record reads as absent.
    pub expires_at: UnixMillis,
}

impl Record {
    pub fn is_live(&self, now: UnixMillis) -> bool {
        now < self.expires_at
    }
}
