//! The TTL policy and the rules that tie its parts together.
//!
//! A marker or processed-message entry that expired before the response record
//! would reopen the very window it exists to close, so such a policy is refused at
//! start-up rather than served.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub response_ttl_ms: u64,
    pub marker_ttl_ms: u64,
    pub processed_ttl_ms: u64,
    pub inflight_wait_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("marker_ttl ({marker}) must be at least response_ttl ({response})")]
    MarkerShorterThanResponse { marker: String, response: String },
    #[error("processed_ttl ({processed}) must be at least response_ttl ({response})")]
    ProcessedShorterThanResponse { processed: String, response: String },
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
}

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            response_ttl_ms: 48 * HOUR_MS,
            marker_ttl_ms: 30 * DAY_MS,
            processed_ttl_ms: 35 * DAY_MS,
            inflight_wait_ms: 2_000,
        }
    }
}

fn human(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

impl Policy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.response_ttl_ms == 0 {
            return Err(PolicyError::Zero("response_ttl"));
        }
        if self.marker_ttl_ms < self.response_ttl_ms {
            return Err(PolicyError::MarkerShorterThanResponse {
                marker: human(self.marker_ttl_ms),
                response: human(self.response_ttl_ms),
            });
        }
        if self.processed_ttl_ms < self.response_ttl_ms {
            return Err(PolicyError::ProcessedShorterThanResponse {
                processed: human(self.processed_ttl_ms),
                response: human(self.response_ttl_ms),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert_eq!(Policy::default().validate(), Ok(()));
    }

    #[test]
    fn names_the_violated_rule() {
        let p = Policy {
            marker_ttl_ms: HOUR_MS,
            ..Policy::default()
        };
        let e = p.validate().unwrap_err().to_string();
        assert!(
            e.contains("marker_ttl (1h) must be at least response_ttl (2days)"),
            "{e}"
        );
        let p = Policy {
            processed_ttl_ms: HOUR_MS,
            ..Policy::default()
        };
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("processed_ttl"));
    }
}
