//! When a member of a region group campaigns. openraft 0.9 checks its election
//! timer only on its own ticks, every one and a half heartbeat periods, and a
//! region group's heartbeat period is its RPC timeout (450 ms, `limits.rs`):
//! a follower noticed a dead leader up to 675 ms late, on top of a wait drawn
//! once per process (so two members that collided once collided again). The
//! group's ticker, every `REGION_HEARTBEAT_INTERVAL_MS`, asks `ElectionTimer`
//! instead, with openraft's own timer turned off.
//!
//! The rules are openraft's, with the wait drawn anew for every campaign:
//! - a member that knows a leader (its vote is committed) campaigns once no
//!   leader reached it for `REGION_CAMPAIGN_AFTER_LEADER_MS` plus a draw below
//!   `REGION_CAMPAIGN_JITTER_MS`: longer than the lease in which the others
//!   refuse any campaign, so a campaign is not spent while they still hear a
//!   leader;
//! - a member whose last campaign (or the one it voted for) produced no leader
//!   tries again after `REGION_ELECTION_TIMEOUT_MIN_MS` plus such a draw;
//! - a member that learned from a vote answer that another member's log is
//!   longer than its own waits `REGION_CAMPAIGN_BEHIND_MS` more from then, so
//!   the longer log campaigns first (a shorter one cannot win, and its
//!   campaign at the same term makes the longer one's fail);
//! - the only voter of a group campaigns at once (and again, as after any
//!   failed campaign, if that one did not make it leader).
//!
//! Pure: the caller reads openraft's state and the clock.

use crate::limits::{
    REGION_CAMPAIGN_AFTER_LEADER_MS, REGION_CAMPAIGN_BEHIND_MS, REGION_CAMPAIGN_JITTER_MS,
    REGION_ELECTION_TIMEOUT_MIN_MS,
};
use std::time::{Duration, Instant};

/// What the timer needs of a member's Raft state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub role: Role,
    /// The group's voters.
    pub voters: usize,
    /// The member's vote is committed: it knows a leader (or is one).
    pub vote_committed: bool,
    /// When the vote was last granted, changed or renewed by a leader's
    /// AppendEntries; `None` before any.
    pub vote_changed: Option<Instant>,
    /// When a vote answer last showed a longer log than this member's.
    pub longer_log: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Candidate,
    /// A voter that neither leads nor campaigns.
    Follower,
    /// Not a voter (a learner: a standby region's copy), or shut down.
    NoVoter,
}

/// The election timer of one member: its current draw and the source of the
/// next ones.
#[derive(Debug)]
pub struct ElectionTimer {
    rng: u64,
    jitter: Duration,
}

impl ElectionTimer {
    /// A timer whose draws come from `seed` (members of one group need
    /// different seeds: the node id mixed with the start time).
    pub fn new(seed: u64) -> Self {
        let mut timer = ElectionTimer {
            rng: seed,
            jitter: Duration::ZERO,
        };
        timer.draw();
        timer
    }

    /// Whether the member should campaign at `now`. After a `true` the caller
    /// campaigns, and the next wait is drawn anew.
    pub fn due(&mut self, seen: &Seen, now: Instant) -> bool {
        let due = self.is_due(seen, now);
        if due {
            self.draw();
        }
        due
    }

    fn is_due(&self, seen: &Seen, now: Instant) -> bool {
        match seen.role {
            Role::Leader | Role::NoVoter => return false,
            Role::Follower if seen.voters <= 1 => return true,
            Role::Candidate | Role::Follower => {}
        }
        let quiet = match seen.vote_changed {
            None => return true,
            Some(at) => now.saturating_duration_since(at),
        };
        let base = if seen.vote_committed {
            Duration::from_millis(REGION_CAMPAIGN_AFTER_LEADER_MS)
        } else {
            Duration::from_millis(REGION_ELECTION_TIMEOUT_MIN_MS)
        };
        if quiet < base + self.jitter {
            return false;
        }
        let behind = Duration::from_millis(REGION_CAMPAIGN_BEHIND_MS);
        seen.longer_log
            .is_none_or(|at| now.saturating_duration_since(at) >= behind)
    }

    /// splitmix64: a draw below `REGION_CAMPAIGN_JITTER_MS`.
    fn draw(&mut self) {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        self.jitter = Duration::from_millis(z % REGION_CAMPAIGN_JITTER_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn follower(t0: Instant) -> Seen {
        Seen {
            role: Role::Follower,
            voters: 3,
            vote_committed: true,
            vote_changed: Some(t0),
            longer_log: None,
        }
    }

    #[test]
    fn a_follower_campaigns_only_after_the_leader_is_quiet_past_the_lease_and_a_draw() {
        let t0 = Instant::now();
        for seed in 0..200 {
            let mut timer = ElectionTimer::new(seed);
            let seen = follower(t0);
            let first = (0..=REGION_CAMPAIGN_AFTER_LEADER_MS + REGION_CAMPAIGN_JITTER_MS)
                .step_by(10)
                .find(|&ms| timer.clone_draw().is_due(&seen, t0 + MS(ms)))
                .expect("due within the bound");
            assert!(
                first >= REGION_CAMPAIGN_AFTER_LEADER_MS,
                "seed {seed}: {first} ms"
            );
            assert!(first <= REGION_CAMPAIGN_AFTER_LEADER_MS + REGION_CAMPAIGN_JITTER_MS);
            // The leader's AppendEntries renew the vote: not due then.
            let renewed = Seen {
                vote_changed: Some(t0 + MS(first)),
                ..seen
            };
            assert!(!timer.due(&renewed, t0 + MS(first)));
        }
    }

    #[test]
    fn the_waits_are_drawn_anew_for_every_campaign() {
        let t0 = Instant::now();
        let mut timer = ElectionTimer::new(7);
        let mut draws = std::collections::BTreeSet::new();
        for _ in 0..50 {
            draws.insert(timer.jitter);
            let far = t0 + MS(10_000);
            assert!(timer.due(&follower(t0), far));
        }
        assert!(draws.len() > 10, "{draws:?}");
        assert!(draws.iter().all(|d| *d < MS(REGION_CAMPAIGN_JITTER_MS)));
    }

    #[test]
    fn a_failed_campaign_is_retried_sooner_than_a_lost_leader_is_noticed() {
        let t0 = Instant::now();
        let mut timer = ElectionTimer::new(3);
        let candidate = Seen {
            role: Role::Candidate,
            vote_committed: false,
            ..follower(t0)
        };
        let retry = REGION_ELECTION_TIMEOUT_MIN_MS + timer.jitter.as_millis() as u64;
        assert!(!timer.clone_draw().is_due(&candidate, t0 + MS(retry - 1)));
        assert!(timer.due(&candidate, t0 + MS(retry)));
    }

    #[test]
    fn a_member_that_saw_a_longer_log_holds_back() {
        let t0 = Instant::now();
        let mut timer = ElectionTimer::new(11);
        let seen_at = t0 + MS(200);
        let behind = Seen {
            role: Role::Candidate,
            vote_committed: false,
            longer_log: Some(seen_at),
            ..follower(t0)
        };
        let late = t0 + MS(REGION_ELECTION_TIMEOUT_MIN_MS + REGION_CAMPAIGN_JITTER_MS);
        assert!(!timer.due(&behind, late));
        assert!(!timer.due(&behind, seen_at + MS(REGION_CAMPAIGN_BEHIND_MS - 1)));
        assert!(timer.due(&behind, seen_at + MS(REGION_CAMPAIGN_BEHIND_MS)));
    }

    #[test]
    fn leaders_and_learners_never_campaign_and_the_only_voter_at_once() {
        let t0 = Instant::now();
        let far = t0 + MS(60_000);
        let mut timer = ElectionTimer::new(5);
        for role in [Role::Leader, Role::NoVoter] {
            assert!(
                !timer.due(
                    &Seen {
                        role,
                        ..follower(t0)
                    },
                    far
                ),
                "{role:?}"
            );
        }
        let alone = Seen {
            voters: 1,
            ..follower(t0)
        };
        assert!(timer.due(&alone, t0), "the only voter campaigns at once");
        let campaigning = Seen {
            role: Role::Candidate,
            vote_committed: false,
            ..alone
        };
        assert!(!timer.due(&campaigning, t0 + MS(1)));
        assert!(timer.due(&campaigning, far), "a stuck campaign is retried");
        let fresh = Seen {
            vote_changed: None,
            ..follower(t0)
        };
        assert!(timer.due(&fresh, t0));
    }

    impl ElectionTimer {
        /// The same timer, to ask without drawing anew.
        fn clone_draw(&self) -> ElectionTimer {
            ElectionTimer {
                rng: self.rng,
                jitter: self.jitter,
            }
        }
    }
}
