//! The retry policy: how many attempts, and how long to wait between them
//! (exponential backoff with full jitter, never less than the server's
//! `Retry-After`).

use crate::limits;
use crate::Error;
use std::time::Duration;

/// Named limits of one call's retries, units last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per call, the first included (1 = never retry).
    pub attempts_max: u32,
    /// Ceiling of the wait before the first retry; it doubles per retry.
    pub backoff_ms_base: u64,
    /// The ceiling never grows past this.
    pub backoff_ms_max: u64,
    /// `Retry-After` is honoured up to this.
    pub retry_after_ms_max: u64,
    /// Per attempt, connect to last body byte.
    pub request_timeout_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts_max: limits::ATTEMPTS_MAX_DEFAULT,
            backoff_ms_base: limits::BACKOFF_MS_BASE_DEFAULT,
            backoff_ms_max: limits::BACKOFF_MS_MAX_DEFAULT,
            retry_after_ms_max: limits::RETRY_AFTER_MS_MAX_DEFAULT,
            request_timeout_ms: limits::REQUEST_TIMEOUT_MS_DEFAULT,
        }
    }
}

impl RetryPolicy {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.attempts_max == 0 {
            return Err(Error::Invalid("attempts_max must be at least 1".into()));
        }
        if self.backoff_ms_base > self.backoff_ms_max {
            return Err(Error::Invalid(
                "backoff_ms_base must not exceed backoff_ms_max".into(),
            ));
        }
        if self.request_timeout_ms == 0 {
            return Err(Error::Invalid("request_timeout_ms must be positive".into()));
        }
        Ok(())
    }

    /// Ceiling of the jittered wait before retry number `retry` (0 = the first).
    pub fn backoff_ms_ceiling(&self, retry: u32) -> u64 {
        let factor = 1u64.checked_shl(retry.min(63)).unwrap_or(u64::MAX);
        self.backoff_ms_base
            .saturating_mul(factor)
            .min(self.backoff_ms_max)
    }

    /// Full jitter (uniform in `0..=ceiling`) spreads a crowd of clients that
    /// failed together; a server's `Retry-After` is a floor under it.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.backoff_ms_ceiling(retry);
        let jittered = Duration::from_millis(rand::random::<u64>() % (ceiling + 1));
        match retry_after {
            Some(ra) => jittered.max(ra.min(Duration::from_millis(self.retry_after_ms_max))),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let p = RetryPolicy {
            backoff_ms_base: 10,
            backoff_ms_max: 100,
            ..RetryPolicy::default()
        };
        let ceilings: Vec<u64> = (0..6).map(|r| p.backoff_ms_ceiling(r)).collect();
        assert_eq!(ceilings, vec![10, 20, 40, 80, 100, 100]);
        assert_eq!(p.backoff_ms_ceiling(200), 100);
        for retry in 0..10 {
            assert!(p.delay(retry, None) <= Duration::from_millis(100));
        }
    }

    #[test]
    fn retry_after_is_a_floor_and_is_capped() {
        let p = RetryPolicy {
            backoff_ms_base: 1,
            backoff_ms_max: 2,
            retry_after_ms_max: 5_000,
            ..RetryPolicy::default()
        };
        assert!(p.delay(0, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(3600))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn invalid_policies_are_refused() {
        let zero = RetryPolicy {
            attempts_max: 0,
            ..RetryPolicy::default()
        };
        assert!(zero.validate().is_err());
        let inverted = RetryPolicy {
            backoff_ms_base: 10,
            backoff_ms_max: 1,
            ..RetryPolicy::default()
        };
        assert!(inverted.validate().is_err());
        assert!(RetryPolicy::default().validate().is_ok());
    }
}
