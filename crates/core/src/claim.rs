//! Claims: leases, owner tokens and fencing for work done outside keyhold.
//!
//! A claim acquires a scope in PROCESSING for a lease. Each acquisition bumps the
//! record's generation, and the owner token carries it, so once a lease has been
//! taken over the previous owner's token no longer matches and its late
//! `complete` or `heartbeat` is refused instead of overwriting the new owner's work.

use crate::record::{Record, RecordState};
use crate::time::UnixMillis;
use crate::Error;
use serde::{Deserialize, Serialize};
use std::fmt;

/// `"{generation}.{nonce as 16 hex digits}"`: the generation makes takeovers
/// visible (it only grows), the nonce makes the token unguessable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerToken {
    pub generation: u64,
    pub nonce: u64,
}

impl OwnerToken {
    pub fn parse(text: &str) -> Result<OwnerToken, Error> {
        let (generation, nonce) = text.split_once('.').ok_or(Error::OwnerToken)?;
        if nonce.len() != 16 || generation.is_empty() || generation.len() > 20 {
            return Err(Error::OwnerToken);
        }
        // Only the form the server writes (decimal digits, lowercase hex): a
        // token is compared as issued, so `+3` or upper-case hex is malformed
        // (400), not some other owner's token (409).
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if !generation.bytes().all(|b| b.is_ascii_digit()) || !nonce.bytes().all(lower_hex) {
            return Err(Error::OwnerToken);
        }
        let generation = generation.parse().map_err(|_| Error::OwnerToken)?;
        let nonce = u64::from_str_radix(nonce, 16).map_err(|_| Error::OwnerToken)?;
        Ok(OwnerToken { generation, nonce })
    }

    pub fn of(record: &Record) -> OwnerToken {
        OwnerToken {
            generation: record.generation,
            nonce: record.nonce,
        }
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:016x}", self.generation, self.nonce)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDecision {
    /// The caller owns the work under this generation. `recovery` is true when a
    /// previous owner's lease ran out: its effect may already exist.
    Acquire { generation: u64, recovery: bool },
    /// A terminal outcome is stored: replay it.
    Replay,
    /// Another owner holds a live lease.
    InProgress { retry_after_ms: u64 },
    /// Same scope, different request.
    KeyReused,
}

/// Decides a claim from the record currently stored for the scope (if any).
/// An expired record reads as absent, but its generation still counts, so tokens
/// keep growing across expiry.
pub fn decide_claim(
    existing: Option<&Record>,
    fingerprint: &str,
    now: UnixMillis,
) -> ClaimDecision {
    let Some(record) = existing else {
        // A scope with no record starts at the clock, not at 1: the sweeper may
        // have deleted an older record of this scope, and fencing tokens must keep
        // growing across that (every earlier generation began at or below its own
        // acquisition time plus its takeovers).
        return ClaimDecision::Acquire {
            generation: now.0.max(1),
            recovery: false,
        };
    };
    let next = record.generation + 1;
    if !record.is_live(now) {
        // An expired record reads as absent, except that an attempt abandoned in
        // PROCESSING still makes the next owner a recovering one.
        return ClaimDecision::Acquire {
            generation: next,
            recovery: record.state == RecordState::Processing,
        };
    }
    if record.fingerprint != fingerprint {
        return ClaimDecision::KeyReused;
    }
    match record.state {
        RecordState::Succeeded | RecordState::FailedFinal => ClaimDecision::Replay,
        RecordState::FailedRetryable => ClaimDecision::Acquire {
            generation: next,
            recovery: false,
        },
        RecordState::Processing if now < record.lease_expires_at => ClaimDecision::InProgress {
            retry_after_ms: now.until(record.lease_expires_at),
        },
        RecordState::Processing => ClaimDecision::Acquire {
            generation: next,
            recovery: true,
        },
    }
}

/// How a claim ended, as reported by its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Succeeded,
    FailedRetryable,
    FailedFinal,
}

impl Outcome {
    pub fn parse(text: &str) -> Option<Outcome> {
        match text {
            "SUCCEEDED" => Some(Outcome::Succeeded),
            "FAILED_RETRYABLE" => Some(Outcome::FailedRetryable),
            "FAILED_FINAL" => Some(Outcome::FailedFinal),
            _ => None,
        }
    }

    pub fn state(self) -> RecordState {
        match self {
            Outcome::Succeeded => RecordState::Succeeded,
            Outcome::FailedRetryable => RecordState::FailedRetryable,
            Outcome::FailedFinal => RecordState::FailedFinal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerCheck {
    /// The token owns the PROCESSING record: the write may proceed.
    Owner,
    /// The token's own work already completed (a retried `complete` whose first
    /// answer was lost): answer with the current state and write nothing.
    AlreadyCompleted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the owner token no longer owns this scope")]
pub struct StaleOwner;

/// Fencing: only the current generation's token may complete or heartbeat. A lease
/// that ran out but was not taken over still belongs to its owner, since nobody
/// else can have started the work again.
pub fn check_owner(
    existing: Option<&Record>,
    token: OwnerToken,
    now: UnixMillis,
) -> Result<OwnerCheck, StaleOwner> {
    let Some(record) = existing.filter(|r| r.is_live(now)) else {
        return Err(StaleOwner);
    };
    if OwnerToken::of(record) != token {
        return Err(StaleOwner);
    }
    if record.state == RecordState::Processing {
        Ok(OwnerCheck::Owner)
    } else {
        Ok(OwnerCheck::AlreadyCompleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_text_round_trip() {
        let t = OwnerToken {
            generation: 7,
            nonce: 0xdead_beef,
        };
        assert_eq!(t.to_string(), "7.00000000deadbeef");
        assert_eq!(OwnerToken::parse(&t.to_string()), Ok(t));
        for bad in [
            "",
            "7",
            "7.",
            ".00000000deadbeef",
            "x.00000000deadbeef",
            "7.deadbeef",
            "7.00000000DEADBEEF",
            "+7.00000000deadbeef",
            "7.+0000000deadbeef",
        ] {
            assert_eq!(OwnerToken::parse(bad), Err(Error::OwnerToken), "{bad}");
        }
    }
}
