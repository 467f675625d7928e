//! What a member learned from the answers to its vote requests, kept where the
//! group's election timer can read it. openraft 0.9 holds a candidate back for
//! a while once an answer showed a log longer than its own, but only on its
//! own election timer, which runs at one and a half heartbeat periods; a group
//! that times its elections itself (region groups) learns the same fact here,
//! from its network, which sees every answer.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// When a vote answer last showed a log longer than the candidate's (this
/// member's). A cheap handle: clones share one record.
#[derive(Debug, Clone, Default)]
pub struct LongerLogs(Arc<Mutex<Option<Instant>>>);

impl LongerLogs {
    /// The last time an answer showed a longer log, if one did.
    pub fn last_seen(&self) -> Option<Instant> {
        *self.0.lock().expect("not poisoned")
    }

    /// An answer showed a longer log at `at`.
    pub fn seen(&self, at: Instant) {
        let mut last = self.0.lock().expect("not poisoned");
        *last = Some(last.map_or(at, |l| l.max(at)));
    }
}

/// A group's network, as far as its election timer and its leader care: where
/// it notes the vote answers with longer logs (`None`: it notes nothing, and
/// elections never hold back for a longer log), and the members' answers to
/// AppendEntries (`None`: it notes nothing; see `Contacts`).
pub trait NotesVotes {
    fn longer_logs(&self) -> Option<LongerLogs> {
        None
    }
    fn contacts(&self) -> Option<crate::Contacts> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_latest_answer_is_kept() {
        let notes = LongerLogs::default();
        assert_eq!(notes.last_seen(), None);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        notes.clone().seen(t1);
        notes.seen(t0);
        assert_eq!(notes.last_seen(), Some(t1));
    }
}
