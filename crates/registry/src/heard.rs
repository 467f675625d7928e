//! When this replica last handled an AppendEntries of each leader term: a
//! leader proves its leadership (`ensure_linearizable`) only with the answers
//! of a quorum, each given after its member handled the leader's heartbeat,
//! so a proof of an earlier term is older than the newest such moment of the
//! quorum's members. The node's region lease builds on it (`lease.rs` of the
//! server): a new registry leader bounds what its predecessors handed out by
//! asking the other replicas instead of counting from its own election.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Terms remembered: a replica sees a few terms between failovers, and only
/// those before the current one matter.
const TERMS_KEPT_MAX: usize = 8;

/// Per leader term, the newest moment this replica finished handling an
/// AppendEntries of it (refused ones included: a later moment only makes a
/// bound later), and when the replica started: it handled nothing it
/// remembers before, but a process before it may have.
#[derive(Debug, Clone)]
pub struct Heard {
    started: Instant,
    terms: Arc<Mutex<BTreeMap<u64, Instant>>>,
}

impl Heard {
    /// Nothing handled yet, as of `started`.
    pub fn new(started: Instant) -> Heard {
        Heard {
            started,
            terms: Arc::default(),
        }
    }

    /// Notes that an AppendEntries of `term`'s leader was handled at `at`.
    pub fn note(&self, term: u64, at: Instant) {
        let mut terms = self.terms.lock().expect("not poisoned");
        let newest = terms.entry(term).or_insert(at);
        *newest = (*newest).max(at);
        while terms.len() > TERMS_KEPT_MAX {
            terms.pop_first();
        }
    }

    /// No AppendEntries of a term before `term` was handled here later than
    /// this: the newest such moment, or the replica's start.
    pub fn handled_before(&self, term: u64) -> Instant {
        let terms = self.terms.lock().expect("not poisoned");
        let newest = terms.range(..term).map(|(_, at)| *at).max();
        newest.map_or(self.started, |at| at.max(self.started))
    }
}

#[cfg(test)]
mod tests {
    use super::{Heard, TERMS_KEPT_MAX};
    use std::time::{Duration, Instant};

    #[test]
    fn the_newest_moment_of_earlier_terms_only_and_never_before_the_start() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let heard = Heard::new(at(10));
        assert_eq!(heard.handled_before(5), at(10));
        heard.note(3, at(100));
        heard.note(3, at(50));
        heard.note(4, at(300));
        heard.note(5, at(900));
        assert_eq!(heard.handled_before(5), at(300));
        assert_eq!(heard.handled_before(4), at(100));
        assert_eq!(heard.handled_before(6), at(900));
        assert_eq!(heard.handled_before(3), at(10));
    }

    #[test]
    fn old_terms_are_forgotten_newest_first_kept() {
        let t0 = Instant::now();
        let heard = Heard::new(t0);
        for term in 0..(TERMS_KEPT_MAX as u64 + 4) {
            heard.note(term, t0 + Duration::from_millis(term));
        }
        let last = TERMS_KEPT_MAX as u64 + 3;
        assert_eq!(
            heard.handled_before(last + 1),
            t0 + Duration::from_millis(last)
        );
        // Terms 0..=3 are forgotten: the start stands for them.
        assert_eq!(heard.handled_before(4), t0);
    }
}
