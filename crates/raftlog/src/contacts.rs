//! When each member last answered this member's AppendEntries, kept where the
//! group's leader can read it. openraft 0.9 reports what each member matched,
//! but not when a learner last answered: a standby learner that matched the
//! whole log and then fell silent looks the same as one that answers every
//! heartbeat. A region's leader needs the difference to bound what a failover
//! can lose (contract section 11, "Bounded loss"): it acknowledges a write only
//! while its standby's copies answered an AppendEntries it sent within
//! `max_standby_lag`, so a region cut off from its standby stops acknowledging
//! within that bound even when it was idle at the cut.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::NodeId;

/// For each member, when the latest AppendEntries it answered (conflict or
/// success) was sent. A cheap handle: clones share one record.
#[derive(Debug, Clone, Default)]
pub struct Contacts(Arc<Mutex<HashMap<NodeId, Instant>>>);

impl Contacts {
    /// `member` answered an AppendEntries sent at `sent`. Answers arrive out of
    /// order (a detached heartbeat, an append): the latest send is kept.
    pub fn answered(&self, member: NodeId, sent: Instant) {
        let mut latest = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = latest.entry(member).or_insert(sent);
        *entry = (*entry).max(sent);
    }

    /// When the latest AppendEntries `member` answered was sent, if any was.
    pub fn last_answered(&self, member: NodeId) -> Option<Instant> {
        let latest = self.0.lock().unwrap_or_else(|e| e.into_inner());
        latest.get(&member).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_latest_send_is_kept_per_member() {
        let contacts = Contacts::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        assert_eq!(contacts.last_answered(7), None);
        contacts.clone().answered(7, t1);
        contacts.answered(7, t0);
        contacts.answered(8, t0);
        assert_eq!(contacts.last_answered(7), Some(t1));
        assert_eq!(contacts.last_answered(8), Some(t0));
    }
}
