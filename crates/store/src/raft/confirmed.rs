//! When a majority of a region group's voters last confirmed this member as their
//! leader, and whether that is recent enough for it to read its own state as the
//! region's current state.
//!
//! openraft 0.9 never steps a leader down when it loses its quorum: cut off from
//! its peers, it goes on calling itself leader while the others elect a successor
//! that commits (and the region acknowledges) new writes. Its tree is then stale,
//! and a read served from it could answer an acknowledged order with 404 or copy a
//! stale page into a move (review d44e5cf, N2). What bounds this is openraft's
//! leader lease: a voter that heard from its leader refuses every campaign for
//! `REGION_ELECTION_TIMEOUT_MAX_MS` after that. So once a majority acknowledged a
//! message this leader sent at `t`, no successor can be elected before
//! `t + REGION_ELECTION_TIMEOUT_MAX_MS`, and until then nothing can be committed
//! that this member has not applied (a leader that applied an entry of its own
//! term holds every committed entry). The leader reads as current only until
//! `t + REGION_READ_LEASE_MS`, shorter by a margin for clock rate drift and for
//! the delay between openraft's measurement and this record of it.
//!
//! openraft reports the age of the latest quorum acknowledgement
//! (`millis_since_quorum_ack`) each time its core loop turns; [`Confirmations`]
//! turns each report into an instant, so that a core that stops reporting (stalled,
//! or shut down) stops renewing the lease as well. Time is an input: the caller
//! passes `now`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::limits::REGION_READ_LEASE_MS;

/// The latest quorum acknowledgement of this member as leader, by term.
#[derive(Debug, Default)]
pub(crate) struct Confirmations {
    latest: Mutex<Option<Confirmed>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Confirmed {
    term: u64,
    /// When the message a majority acknowledged was sent (this node's clock).
    sent: Instant,
}

impl Confirmations {
    /// Records openraft's report, seen at `now`: in `term`, this member leads and a
    /// majority acknowledged a message it sent `since_ack` before `now` (`None`:
    /// it does not lead, or no acknowledgement yet in this term).
    pub(crate) fn note(&self, term: u64, now: Instant, since_ack: Option<Duration>) {
        let Some(since_ack) = since_ack else {
            return;
        };
        let Some(sent) = now.checked_sub(since_ack) else {
            return;
        };
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        let newer = match *latest {
            Some(c) if c.term == term => sent > c.sent,
            Some(c) => term > c.term,
            None => true,
        };
        if newer {
            *latest = Some(Confirmed { term, sent });
        }
    }

    /// True when a majority confirmed this member as leader of `term` within
    /// `REGION_READ_LEASE_MS` before `now`.
    pub(crate) fn is_current(&self, term: u64, now: Instant) -> bool {
        let latest = *self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.is_some_and(|c| {
            c.term == term
                && now.saturating_duration_since(c.sent)
                    <= Duration::from_millis(REGION_READ_LEASE_MS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Confirmations;
    use crate::limits::REGION_READ_LEASE_MS;
    use std::time::{Duration, Instant};

    const LEASE: Duration = Duration::from_millis(REGION_READ_LEASE_MS);

    #[test]
    fn a_confirmation_holds_for_the_read_lease_from_when_its_message_was_sent() {
        let start = Instant::now();
        let c = Confirmations::default();
        assert!(!c.is_current(3, start), "nothing confirmed yet");
        // Seen 100 ms after the acknowledged message was sent.
        c.note(
            3,
            start + Duration::from_millis(100),
            Some(Duration::from_millis(100)),
        );
        assert!(c.is_current(3, start + LEASE));
        assert!(!c.is_current(3, start + LEASE + Duration::from_millis(1)));
    }

    #[test]
    fn reports_that_stop_let_the_lease_lapse_and_old_terms_do_not_count() {
        let start = Instant::now();
        let c = Confirmations::default();
        c.note(3, start, Some(Duration::ZERO));
        // openraft reports nothing newer (a cut-off leader's acks age; a stalled
        // core reports nothing at all): an older acknowledgement changes nothing.
        c.note(3, start + LEASE, Some(LEASE + Duration::from_millis(50)));
        assert!(!c.is_current(3, start + LEASE + Duration::from_millis(1)));
        // Leading no more, or in another term: not current.
        c.note(3, start + Duration::from_millis(10), None);
        assert!(!c.is_current(4, start + Duration::from_millis(20)));
        // A confirmation of a later term replaces it; an earlier term's later
        // report does not come back.
        c.note(4, start + Duration::from_millis(30), Some(Duration::ZERO));
        c.note(3, start + Duration::from_millis(40), Some(Duration::ZERO));
        assert!(c.is_current(4, start + Duration::from_millis(40)));
        assert!(!c.is_current(3, start + Duration::from_millis(40)));
    }
}
