//! Where two copies of one group's log part: the leaders that wrote a copy's
//! entries beyond the last one its holder knew committed (`LogTail`), and the
//! last index at which another copy holds the same entries (`agreement`).
//!
//! A log index alone does not name an entry. A learner cut off from its group
//! may hold entries a deposed leader wrote and never got committed, while a
//! new leader wrote other entries at the same indexes and committed them. Two
//! copies hold the same entry at an index only when the same leader wrote it
//! there, and then (Raft's log matching property) they hold the same entries
//! up to it. A leader is named by its `CommittedLeaderId` (term and, in
//! openraft's default mode, node), which every entry's log id carries.

use openraft::{CommittedLeaderId, LogId};
use serde::{Deserialize, Serialize};

use crate::NodeId;

/// The leader that wrote an entry.
pub type Leader = CommittedLeaderId<NodeId>;

/// The entries of a log from `from_index` up to the next run's start (or the
/// end of what the list covers) that one leader wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRun {
    pub from_index: u64,
    pub leader: Leader,
}

/// The end of one copy of a group's log that its holder could not know was
/// committed: entries `committed + 1 ..= last`, by the leaders that wrote them.
/// Every copy of the log holds the same entries up to `committed` (a
/// committed entry is in every later leader's log); beyond it, only where the
/// same leaders wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTail {
    /// The last index its holder knew committed.
    pub committed: u64,
    /// The last index it holds; at least `committed`.
    pub last: u64,
    /// The leaders of entries `committed + 1 ..= last`, ascending by
    /// `from_index`, the first starting at `committed + 1`; empty when
    /// `last == committed`.
    pub runs: Vec<LeaderRun>,
}

impl LogTail {
    /// A copy whose every entry up to `last` is known committed.
    pub fn confirmed(last: u64) -> LogTail {
        LogTail {
            committed: last,
            last,
            runs: Vec::new(),
        }
    }

    /// The tail of a copy that knew `committed` committed and holds `beyond`,
    /// the log ids of its entries after it, ascending and without a gap.
    pub fn of(committed: u64, beyond: impl IntoIterator<Item = LogId<NodeId>>) -> LogTail {
        let mut tail = LogTail::confirmed(committed);
        for log_id in beyond {
            assert_eq!(log_id.index, tail.last + 1, "a tail has no gaps");
            tail.last = log_id.index;
            if tail.runs.last().map(|run| run.leader) != Some(log_id.leader_id) {
                tail.runs.push(LeaderRun {
                    from_index: log_id.index,
                    leader: log_id.leader_id,
                });
            }
        }
        tail
    }

    /// The last index up to which another copy of the same group's log holds
    /// the same entries as this one, at most `last`. `other` lists the leaders
    /// of the other copy's entries (ascending; a run reaches up to the next),
    /// as far as `other_last`: where the other copy names no leader (before
    /// its first run, or beyond `other_last`, where it holds nothing yet) the
    /// entry counts as the same, since nothing the other copy wrote there can
    /// be lost. The copies part at the first index where their leaders
    /// differ; by log matching they agree everywhere before it.
    pub fn agreement(&self, other: &[LeaderRun], other_last: u64) -> u64 {
        debug_assert!(other.windows(2).all(|w| w[0].from_index < w[1].from_index));
        let start = self.committed + 1;
        let mut points: Vec<u64> = std::iter::once(start)
            .chain(self.runs.iter().map(|run| run.from_index))
            .chain(other.iter().map(|run| run.from_index))
            .filter(|&index| (start..=self.last.min(other_last)).contains(&index))
            .collect();
        points.sort_unstable();
        points.dedup();
        for index in points {
            let ours = leader_at(&self.runs, index);
            let theirs = leader_at(other, index);
            if let (Some(ours), Some(theirs)) = (ours, theirs) {
                if ours != theirs {
                    return index - 1;
                }
            }
        }
        self.last
    }
}

/// The leader of the run covering `index`, if any run starts at or before it.
fn leader_at(runs: &[LeaderRun], index: u64) -> Option<Leader> {
    let after = runs.partition_point(|run| run.from_index <= index);
    after.checked_sub(1).map(|i| runs[i].leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, node: NodeId, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn run(from_index: u64, term: u64, node: NodeId) -> LeaderRun {
        LeaderRun {
            from_index,
            leader: CommittedLeaderId::new(term, node),
        }
    }

    #[test]
    fn a_tail_lists_one_run_per_leader() {
        let tail = LogTail::of(3, [id(1, 1, 4), id(1, 1, 5), id(2, 2, 6)]);
        assert_eq!(tail.committed, 3);
        assert_eq!(tail.last, 6);
        assert_eq!(tail.runs, vec![run(4, 1, 1), run(6, 2, 2)]);
        assert_eq!(LogTail::of(3, []), LogTail::confirmed(3));
    }

    #[test]
    fn copies_agree_up_to_the_first_entry_another_leader_wrote() {
        // The copy got 4..=6 from the leader of term 1, which was deposed; the
        // region's leader of term 2 wrote 5 onwards.
        let tail = LogTail::of(3, [id(1, 1, 4), id(1, 1, 5), id(1, 1, 6)]);
        let region = [run(1, 1, 1), run(5, 2, 2)];
        assert_eq!(tail.agreement(&region, 9), 4);
        // Same leader throughout: the whole tail is held alike.
        assert_eq!(tail.agreement(&[run(1, 1, 1)], 9), 6);
        // A new leader from the very first unconfirmed entry.
        assert_eq!(tail.agreement(&[run(1, 1, 1), run(4, 2, 3)], 9), 3);
        // The other copy's change of leader after the tail's end is no part.
        assert_eq!(tail.agreement(&[run(1, 1, 1), run(7, 2, 2)], 9), 6);
    }

    #[test]
    fn the_same_term_by_another_node_is_another_leader() {
        let tail = LogTail::of(0, [id(2, 1, 1), id(2, 1, 2)]);
        assert_eq!(tail.agreement(&[run(1, 2, 2)], 2), 0);
    }

    #[test]
    fn where_the_other_copy_names_no_leader_the_entries_count_as_the_same() {
        let tail = LogTail::of(3, [id(1, 1, 4), id(2, 2, 5), id(2, 2, 6)]);
        // Recorded no leaders (written before leaders were recorded).
        assert_eq!(tail.agreement(&[], 9), 6);
        // Names leaders from 6 only.
        assert_eq!(tail.agreement(&[run(6, 2, 2)], 9), 6);
        assert_eq!(tail.agreement(&[run(6, 3, 1)], 9), 5);
        // Holds up to 4: what it may hold beyond is not compared.
        assert_eq!(tail.agreement(&[run(1, 1, 1)], 4), 6);
        assert_eq!(tail.agreement(&[run(1, 1, 1)], 5), 4);
        // A copy whose tail is all confirmed agrees everywhere it holds.
        assert_eq!(LogTail::confirmed(7).agreement(&[run(1, 9, 9)], 9), 7);
    }
}
