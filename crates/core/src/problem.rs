//! The problem types of the contract: one variant per slug, with its HTTP status
//! and title. The server turns these into RFC 9457 `application/problem+json`.

/// Base of every problem `type` URI; the slug is its last segment.
pub const PROBLEM_BASE: &str = "https://keyhold.dev/problems/";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Problem {
    Unauthenticated,
    IdempotencyKeyMissing,
    IdempotencyKeyInvalid,
    PayloadTooLarge,
    UnsupportedMediaType,
    InvalidRequest,
    FingerprintMismatch,
    IdempotencyKeyReused,
    RequestInProgress,
    ClientOrderIdConflict,
    StaleOwnerToken,
    NotFound,
    MethodNotAllowed,
    Conflict,
    RateLimited,
    StoreUnavailable,
    OwnerUnreachable,
    TenantMoving,
    /// A bug: a handler panicked. Kept apart from 503 because retrying will not help.
    Internal,
    /// Between nodes only: the receiver is not the tenant's owner at the epoch the
    /// sender believes. The sender refreshes its registry and places the request
    /// again; clients never see it.
    Misdirected,
    /// The client did not deliver the request body within the node's body read
    /// limit: a slow or unfinished body.
    RequestTimeout,
    /// More header lines, or more header bytes, than the node accepts.
    HeadersTooLarge,
    /// The home region's standby does not confirm its writes: a zone tenant's
    /// write past `max_standby_lag`, or any write of a region-survival tenant,
    /// while the standby is cut off or recorded lost.
    StandbyUnreachable,
    /// The request line alone is longer than a whole request head may be.
    UriTooLong,
}

impl Problem {
    pub const ALL: [Problem; 24] = [
        Problem::Unauthenticated,
        Problem::IdempotencyKeyMissing,
        Problem::IdempotencyKeyInvalid,
        Problem::PayloadTooLarge,
        Problem::UnsupportedMediaType,
        Problem::InvalidRequest,
        Problem::FingerprintMismatch,
        Problem::IdempotencyKeyReused,
        Problem::RequestInProgress,
        Problem::ClientOrderIdConflict,
        Problem::StaleOwnerToken,
        Problem::NotFound,
        Problem::MethodNotAllowed,
        Problem::Conflict,
        Problem::RateLimited,
        Problem::StoreUnavailable,
        Problem::OwnerUnreachable,
        Problem::TenantMoving,
        Problem::Internal,
        Problem::Misdirected,
        Problem::RequestTimeout,
        Problem::HeadersTooLarge,
        Problem::StandbyUnreachable,
        Problem::UriTooLong,
    ];

    pub fn status(self) -> u16 {
        match self {
            Problem::Unauthenticated => 401,
            Problem::IdempotencyKeyMissing
            | Problem::IdempotencyKeyInvalid
            | Problem::InvalidRequest
            | Problem::FingerprintMismatch => 400,
            Problem::NotFound => 404,
            Problem::MethodNotAllowed => 405,
            Problem::RequestInProgress
            | Problem::ClientOrderIdConflict
            | Problem::StaleOwnerToken
            | Problem::Conflict => 409,
            Problem::PayloadTooLarge => 413,
            Problem::UnsupportedMediaType => 415,
            Problem::IdempotencyKeyReused => 422,
            Problem::RateLimited => 429,
            Problem::StoreUnavailable
            | Problem::OwnerUnreachable
            | Problem::TenantMoving
            | Problem::StandbyUnreachable => 503,
            Problem::Internal => 500,
            Problem::Misdirected => 421,
            Problem::RequestTimeout => 408,
            Problem::HeadersTooLarge => 431,
            Problem::UriTooLong => 414,
        }
    }

    pub fn slug(self) -> &'static str {
        match self {
            Problem::Unauthenticated => "unauthenticated",
            Problem::IdempotencyKeyMissing => "idempotency-key-missing",
            Problem::IdempotencyKeyInvalid => "idempotency-key-invalid",
            Problem::PayloadTooLarge => "payload-too-large",
            Problem::UnsupportedMediaType => "unsupported-media-type",
            Problem::InvalidRequest => "invalid-request",
            Problem::FingerprintMismatch => "fingerprint-mismatch",
            Problem::IdempotencyKeyReused => "idempotency-key-reused",
            Problem::RequestInProgress => "request-in-progress",
            Problem::ClientOrderIdConflict => "client-order-id-conflict",
            Problem::StaleOwnerToken => "stale-owner-token",
            Problem::NotFound => "not-found",
            Problem::MethodNotAllowed => "method-not-allowed",
            Problem::Conflict => "conflict",
            Problem::RateLimited => "rate-limited",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::OwnerUnreachable => "owner-unreachable",
            Problem::TenantMoving => "tenant-moving",
            Problem::Internal => "internal-error",
            Problem::Misdirected => "misdirected-request",
            Problem::RequestTimeout => "request-timeout",
            Problem::HeadersTooLarge => "headers-too-large",
            Problem::StandbyUnreachable => "standby-unreachable",
            Problem::UriTooLong => "uri-too-long",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Problem::Unauthenticated => "Missing or unknown bearer token",
            Problem::IdempotencyKeyMissing => "The Idempotency-Key header is required",
            Problem::IdempotencyKeyInvalid => "The Idempotency-Key header is invalid",
            Problem::PayloadTooLarge => "The request body is too large",
            Problem::UnsupportedMediaType => "The request body must be application/json",
            Problem::InvalidRequest => "The request is invalid",
            Problem::FingerprintMismatch => {
                "The Idempotency-Fingerprint header does not match the request"
            }
            Problem::IdempotencyKeyReused => {
                "The idempotency key was already used with a different request"
            }
            Problem::RequestInProgress => "A request with this idempotency key is in progress",
            Problem::ClientOrderIdConflict => {
                "The client_order_id already belongs to a different order"
            }
            Problem::StaleOwnerToken => "The owner token no longer owns this key",
            Problem::NotFound => "Not found",
            Problem::MethodNotAllowed => "Method not allowed",
            Problem::Conflict => "The resource already exists",
            Problem::RateLimited => "Too many requests",
            Problem::StoreUnavailable => "The store could not confirm the request",
            Problem::OwnerUnreachable => "The tenant's home region cannot be reached",
            Problem::TenantMoving => "The tenant is moving to another region",
            Problem::Internal => "Internal error",
            Problem::Misdirected => "This node is not the tenant's owner at that epoch",
            Problem::RequestTimeout => "The request body did not arrive in time",
            Problem::HeadersTooLarge => "The request headers are too large",
            Problem::StandbyUnreachable => "The home region's standby does not confirm its writes",
            Problem::UriTooLong => "The request line is too long",
        }
    }

    /// Whether a client may send the same request again later and expect success.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Problem::RequestInProgress
                | Problem::RateLimited
                | Problem::StoreUnavailable
                | Problem::OwnerUnreachable
                | Problem::TenantMoving
                | Problem::StandbyUnreachable
        )
    }

    pub fn type_uri(self) -> String {
        format!("{PROBLEM_BASE}{}", self.slug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn slugs_are_unique_and_retryables_are_409_429_503() {
        let slugs: HashSet<_> = Problem::ALL.iter().map(|p| p.slug()).collect();
        assert_eq!(slugs.len(), Problem::ALL.len());
        for p in Problem::ALL {
            if p.is_retryable() {
                assert!(matches!(p.status(), 409 | 429 | 503), "{p:?}");
            }
        }
    }
}
