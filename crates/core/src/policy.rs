//! The TTL policy and the rules that tie its parts together: the **dedupe
//! horizon**.
//!
//! Duplicate protection is a set of stages, listed in the order a duplicate
//! meets them: the stored response (a retry under the same `Idempotency-Key`),
//! the business marker (a retry under a new key with the same
//! `client_order_id`), the consumers' processed messages (a redelivered or
//! replayed outbox event, kept as long as they are) and the payment provider's
//! key retention (a charge retried after its answer was lost, which can happen
//! as long as the event is kept). Some stages back others: the marker and the
//! processed messages must outlive the response cache (contract section 6), and
//! the provider must keep keys as long as events can be redelivered. A stage
//! that forgets before the one it backs reopens the very window that stage
//! exists to close, so such a policy is refused at start-up, naming the broken
//! link, rather than served. The marker and the processed messages guard
//! different paths (a new request vs. a redelivered event), so neither bounds
//! the other: a marker may outlive the consumers' memory. The earliest stage to
//! end bounds the whole window; it is published with every stage by
//! `GET /v1/idempotency-policy`.

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
    /// A later stage of the chain forgets before an earlier one.
    #[error("{later} ({later_ttl}) must be at least {earlier} ({earlier_ttl}): {why}")]
    ChainBroken {
        later: &'static str,
        later_ttl: String,
        earlier: &'static str,
        earlier_ttl: String,
        why: &'static str,
    },
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
}

/// One stage of duplicate protection, in the order a duplicate meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    ResponseCache,
    Marker,
    ProcessedMessages,
    ProviderKey,
}

impl Stage {
    /// The setting that sizes the stage, as written in config and flags.
    pub fn setting(self) -> &'static str {
        match self {
            Stage::ResponseCache => "response_ttl",
            Stage::Marker => "marker_ttl",
            Stage::ProcessedMessages => "processed_ttl",
            Stage::ProviderKey => "psp_key_retention",
        }
    }

    /// The stable name published in the policy document.
    pub fn name(self) -> &'static str {
        match self {
            Stage::ResponseCache => "response_cache",
            Stage::Marker => "marker",
            Stage::ProcessedMessages => "processed_messages",
            Stage::ProviderKey => "provider_key",
        }
    }

    /// What the stage stops while it remembers.
    pub fn guards(self) -> &'static str {
        match self {
            Stage::ResponseCache => "a retry under the same Idempotency-Key is replayed",
            Stage::Marker => {
                "a retry under a new key with the same client_order_id creates nothing"
            }
            Stage::ProcessedMessages => "a redelivered or replayed event has no second effect",
            Stage::ProviderKey => "a retried charge is not charged twice by the provider",
        }
    }

    /// Why this stage must remember at least as long as the one before it.
    fn backs(self) -> &'static str {
        match self {
            Stage::ResponseCache => "",
            Stage::Marker => "a retry whose record expired is caught only by the marker",
            Stage::ProcessedMessages => {
                "an order's event may be redelivered while its response is still replayed"
            }
            Stage::ProviderKey => {
                "a charge whose answer was lost is retried as long as its event is kept"
            }
        }
    }
}

/// How long a stage remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Retention {
    Ms(u64),
    /// It never forgets (the bundled fake provider keeps every key).
    Unbounded,
}

impl Retention {
    pub fn ms(self) -> Option<u64> {
        match self {
            Retention::Ms(ms) => Some(ms),
            Retention::Unbounded => None,
        }
    }
}

/// Every stage of the chain with its retention, in chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizon {
    pub stages: [(Stage, Retention); 4],
}

impl Horizon {
    /// The stage that forgets first (the earliest in the chain on a tie): the
    /// real limit of duplicate protection.
    pub fn ends_first(&self) -> (Stage, Retention) {
        let mut first = self.stages[0];
        for stage in &self.stages[1..] {
            if stage.1 < first.1 {
                first = *stage;
            }
        }
        first
    }

    /// How long `stage` remembers.
    fn retention(&self, stage: Stage) -> Retention {
        self.stages
            .iter()
            .find(|(s, _)| *s == stage)
            .map(|(_, r)| *r)
            .expect("a horizon holds every stage")
    }

    /// Refuses a policy in which a stage forgets before the one it backs.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (stage, retention) in &self.stages {
            if *retention == Retention::Ms(0) {
                return Err(PolicyError::Zero(stage.setting()));
            }
        }
        for (earlier, later) in LINKS {
            let (earlier_ttl, later_ttl) = (self.retention(earlier), self.retention(later));
            if later_ttl < earlier_ttl {
                return Err(PolicyError::ChainBroken {
                    later: later.setting(),
                    later_ttl: human(later_ttl),
                    earlier: earlier.setting(),
                    earlier_ttl: human(earlier_ttl),
                    why: later.backs(),
                });
            }
        }
        Ok(())
    }
}

/// `(earlier, later)`: `later` must remember at least as long as `earlier`.
const LINKS: [(Stage, Stage); 3] = [
    (Stage::ResponseCache, Stage::Marker),
    (Stage::ResponseCache, Stage::ProcessedMessages),
    (Stage::ProcessedMessages, Stage::ProviderKey),
];

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

fn human(retention: Retention) -> String {
    match retention {
        // Whole days as days: humantime would write 35 days as "1month 4days
        // 13h 26m 24s" (its month is 30.44 days), not what anyone configured.
        Retention::Ms(ms) if ms >= DAY_MS && ms % DAY_MS == 0 => match ms / DAY_MS {
            1 => "1day".to_owned(),
            days => format!("{days}days"),
        },
        Retention::Ms(ms) => {
            humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
        }
        Retention::Unbounded => "unbounded".to_owned(),
    }
}

impl Policy {
    /// The whole chain, with the provider's key retention from config.
    pub fn horizon(&self, provider_key: Retention) -> Horizon {
        Horizon {
            stages: [
                (Stage::ResponseCache, Retention::Ms(self.response_ttl_ms)),
                (Stage::Marker, Retention::Ms(self.marker_ttl_ms)),
                (
                    Stage::ProcessedMessages,
                    Retention::Ms(self.processed_ttl_ms),
                ),
                (Stage::ProviderKey, provider_key),
            ],
        }
    }

    /// The chain without a provider (or with one that never forgets).
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.horizon(Retention::Unbounded).validate()
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

    #[test]
    fn every_link_of_the_chain_is_checked() {
        // A marker may outlive the consumers' memory: they guard different
        // paths, and the contract only ties both to the response cache.
        let p = Policy {
            marker_ttl_ms: 40 * DAY_MS,
            ..Policy::default()
        };
        assert_eq!(p.validate(), Ok(()));
        let p = Policy {
            processed_ttl_ms: DAY_MS,
            ..Policy::default()
        };
        let e = p.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("processed_ttl (1day) must be at least response_ttl (2days)"),
            "{e}"
        );
        // A provider that forgets keys before events stop being retried.
        let e = Policy::default()
            .horizon(Retention::Ms(DAY_MS))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("psp_key_retention (1day) must be at least processed_ttl (35days)"),
            "{e}"
        );
        assert_eq!(
            Policy::default().horizon(Retention::Ms(0)).validate(),
            Err(PolicyError::Zero("psp_key_retention"))
        );
        let ok = Policy::default().horizon(Retention::Ms(35 * DAY_MS));
        assert_eq!(ok.validate(), Ok(()));
    }

    #[test]
    fn the_earliest_stage_to_end_bounds_the_window() {
        let h = Policy::default().horizon(Retention::Unbounded);
        assert_eq!(
            h.ends_first(),
            (Stage::ResponseCache, Retention::Ms(48 * HOUR_MS))
        );
        // Ties go to the earlier stage; an invalid chain still names its
        // shortest stage (the policy document describes what is configured).
        let p = Policy {
            response_ttl_ms: DAY_MS,
            marker_ttl_ms: DAY_MS,
            processed_ttl_ms: HOUR_MS,
            inflight_wait_ms: 1,
        };
        assert_eq!(
            p.horizon(Retention::Unbounded).ends_first(),
            (Stage::ProcessedMessages, Retention::Ms(HOUR_MS))
        );
        assert_eq!(
            p.horizon(Retention::Ms(DAY_MS)).ends_first().0,
            Stage::ProcessedMessages
        );
    }
}
