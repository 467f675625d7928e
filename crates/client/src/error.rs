//! The SDK's one error type, and the single rule of what may be retried.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error (RFC 9457 problem+json; a body that is
    /// not one still yields the status, with an empty slug).
    #[error("{status} {slug}: {title}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Problem {
        status: u16,
        /// Last segment of the problem's `type` URI, e.g. `idempotency-key-reused`.
        slug: String,
        title: String,
        detail: Option<String>,
        /// From the `Retry-After` header (delta-seconds only).
        retry_after: Option<Duration>,
    },
    /// No answer: connection refused or reset, timeout, broken body.
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),
    /// Every attempt failed with a retryable error; `last` is the final one.
    #[error("gave up after {attempts} attempts; last: {last}")]
    GaveUp { attempts: u32, last: Box<Error> },
    /// A success status whose body is not what the contract promises.
    #[error("unexpected answer (status {status}): {detail}")]
    Unexpected { status: u16, detail: String },
    /// The intent journal could not be read or written.
    #[error("intent journal {}: {source}", path.display())]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A caller's argument or setting is out of range.
    #[error("invalid: {0}")]
    Invalid(String),
}

impl Error {
    /// Whether sending the same request again, under the same key, may succeed:
    /// connection errors and timeouts (the request may or may not have run: the
    /// key makes that safe), 409 `request-in-progress`, 429 and 503. Never 422
    /// or any other 4xx: the same request would get the same answer.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Problem { status, slug, .. } => {
                matches!(status, 429 | 503) || (*status == 409 && slug == "request-in-progress")
            }
            _ => false,
        }
    }

    /// The problem's slug, looking through `GaveUp`.
    pub fn slug(&self) -> Option<&str> {
        match self {
            Error::Problem { slug, .. } => Some(slug),
            Error::GaveUp { last, .. } => last.slug(),
            _ => None,
        }
    }

    /// The HTTP status, looking through `GaveUp`.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Problem { status, .. } | Error::Unexpected { status, .. } => Some(*status),
            Error::GaveUp { last, .. } => last.status(),
            _ => None,
        }
    }

    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Problem { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(status: u16, slug: &str) -> Error {
        Error::Problem {
            status,
            slug: slug.into(),
            title: String::new(),
            detail: None,
            retry_after: None,
        }
    }

    #[test]
    fn what_is_retried() {
        assert!(problem(503, "store-unavailable").is_retryable());
        assert!(problem(429, "rate-limited").is_retryable());
        assert!(problem(409, "request-in-progress").is_retryable());
        assert!(!problem(409, "client-order-id-conflict").is_retryable());
        assert!(!problem(409, "stale-owner-token").is_retryable());
        assert!(!problem(422, "idempotency-key-reused").is_retryable());
        assert!(!problem(400, "invalid-request").is_retryable());
        assert!(!problem(401, "unauthenticated").is_retryable());
        assert!(!problem(500, "").is_retryable());
        let gave_up = Error::GaveUp {
            attempts: 2,
            last: Box::new(problem(503, "store-unavailable")),
        };
        assert!(!gave_up.is_retryable());
        assert_eq!(gave_up.slug(), Some("store-unavailable"));
    }
}
