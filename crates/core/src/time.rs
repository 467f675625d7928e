//! Time as a plain value: milliseconds since the Unix epoch, passed in by callers.
//!
//! `core` never reads a clock; the server samples one `now` per request and hands it
//! down, which is also what makes commands replayable on another replica.

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    pub const ZERO: UnixMillis = UnixMillis(0);

    pub fn plus_ms(self, ms: u64) -> UnixMillis {
        UnixMillis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `self` until `later`, zero when `later` is not later.
    pub fn until(self, later: UnixMillis) -> u64 {
        later.0.saturating_sub(self.0)
    }

    /// RFC 3339 with millisecond precision in UTC, e.g. `2026-11-29T23:32:35.123Z`.
    pub fn to_rfc3339(self) -> String {
        let t = UNIX_EPOCH + Duration::from_millis(self.0);
        humantime::format_rfc3339_millis(t).to_string()
    }

    /// Parses an RFC 3339 timestamp; `None` when it is not one.
    pub fn parse_rfc3339(text: &str) -> Option<UnixMillis> {
        let t: SystemTime = humantime::parse_rfc3339_weak(text).ok()?;
        let d = t.duration_since(UNIX_EPOCH).ok()?;
        Some(UnixMillis(u64::try_from(d.as_millis()).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = UnixMillis(1_764_459_155_123);
        let s = t.to_rfc3339();
        assert_eq!(s, "2025-11-29T23:32:35.123Z");
        assert_eq!(UnixMillis::parse_rfc3339(&s), Some(t));
        assert_eq!(UnixMillis::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn until_saturates() {
        assert_eq!(UnixMillis(10).until(UnixMillis(25)), 15);
        assert_eq!(UnixMillis(25).until(UnixMillis(10)), 0);
    }
}
