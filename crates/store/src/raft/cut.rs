//! A consistent cut of the region tree, read while entries go on being applied.
//!
//! sled 0.34 offers no point-in-time view, so a snapshot used to hold the apply
//! lock for as long as the whole tree took to stream to disk: a region of 2M
//! orders stopped applying for longer than a writer waits (5 s), once every
//! snapshot interval (issue 13). A `Cut` lets entries go on instead. From the
//! moment it begins, every write first records, for each key it changes for
//! the first time since, the value that key held at the cut (`record`); the
//! cut's reader (`entries`) takes a key's recorded value over what the tree
//! holds now, skips keys recorded as absent, and puts the recorded keys the
//! tree no longer holds back in key order.
//!
//! Why the reader sees exactly the cut: a write records a key before it
//! reaches the tree, and the reader looks a key's record up after reading the
//! key from the tree. A key without a record when it is looked up had not been
//! written since the cut when it was read, so the tree's value is the cut's.
//! A key the tree's iterator passed over (absent when it passed) and that has
//! no record by the time the reader looks for records in that gap was absent
//! at the cut as well, for the same reason.
//!
//! The records are the memory the cut costs: old values of the keys changed
//! while the snapshot streams, ahead of the reader (a key the reader has
//! decided needs none). The state machine bounds them
//! (`SNAPSHOT_CUT_RECORDED_BYTES_MAX`) by holding the apply lock for the rest
//! of a build that reaches it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use sled::IVec;

/// The value each key changed since the cut held at the cut (`None`: absent).
#[derive(Default)]
struct Recorded {
    old: BTreeMap<IVec, Option<IVec>>,
    /// Bytes of the recorded keys and values.
    bytes: usize,
    /// The last key the reader decided (`Entries::passed`): a write at or
    /// before it needs no record, since the reader never looks back.
    passed: Option<IVec>,
}

/// Records kept while a cut is read; none otherwise.
#[derive(Default)]
pub(crate) struct Cut {
    recorded: Mutex<Option<Recorded>>,
}

impl Cut {
    fn lock(&self) -> MutexGuard<'_, Option<Recorded>> {
        self.recorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the cut at the tree's present state. The caller holds what keeps
    /// writes out meanwhile (the apply lock), so no write is half done. The
    /// cut lasts as long as the returned guard: dropping it, on every way out
    /// of a build, stops recording and frees the records.
    pub(crate) fn begin(&self) -> Reading<'_> {
        let mut recorded = self.lock();
        assert!(recorded.is_none(), "one cut at a time");
        *recorded = Some(Recorded::default());
        Reading(self)
    }

    /// To be called before `keys` are written to `tree`: while a cut is read,
    /// records the value each of them held at the cut, if this is its first
    /// write since and the reader has yet to reach it. Without a cut it costs
    /// a lock and nothing more.
    pub(crate) fn record<'k>(
        &self,
        tree: &sled::Tree,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<(), sled::Error> {
        let mut guard = self.lock();
        let Some(recorded) = guard.as_mut() else {
            return Ok(());
        };
        for key in keys {
            let behind = recorded
                .passed
                .as_ref()
                .is_some_and(|passed| key <= passed.as_ref());
            if behind || recorded.old.contains_key(key) {
                continue;
            }
            let old = tree.get(key)?;
            recorded.bytes += key.len() + old.as_ref().map_or(0, |value| value.len());
            recorded.old.insert(IVec::from(key), old);
        }
        Ok(())
    }

    /// Bytes of the records the reader has yet to reach (0 without a cut).
    pub(crate) fn recorded_bytes(&self) -> usize {
        self.lock().as_ref().map_or(0, |recorded| recorded.bytes)
    }

    /// The tree's entries as they were at the cut, in key order. Valid while
    /// `begin`'s guard lives.
    pub(crate) fn entries<'a>(&'a self, tree: &sled::Tree) -> Entries<'a> {
        Entries {
            cut: self,
            tree: tree.iter(),
            passed: None,
            ready: VecDeque::new(),
            finished: false,
        }
    }
}

/// A cut being read (`Cut::begin`).
pub(crate) struct Reading<'a>(&'a Cut);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        *self.0.lock() = None;
    }
}

/// The iterator `Cut::entries` returns.
pub(crate) struct Entries<'a> {
    cut: &'a Cut,
    tree: sled::Iter,
    /// The last key the tree's iterator answered: every key up to it is dealt
    /// with.
    passed: Option<IVec>,
    /// Entries decided and not yet handed out, in key order.
    ready: VecDeque<(IVec, IVec)>,
    finished: bool,
}

impl Entries<'_> {
    /// Reads the tree's next key and decides everything up to it: the recorded
    /// keys in the gap since the last one (changed since the cut, absent from
    /// the tree when its iterator passed), then the key itself.
    fn advance(&mut self) -> Result<(), sled::Error> {
        let next = loop {
            match self.tree.next().transpose()? {
                // sled's iterator only moves forward; a key at or before the
                // last one would already be dealt with.
                Some((key, _)) if self.passed.as_ref().is_some_and(|p| key <= *p) => continue,
                other => break other,
            }
        };
        let mut guard = self.cut.lock();
        let recorded = guard
            .as_mut()
            .expect("a cut's entries are read while it is taken");
        // Every record is of a key after the last one decided, so the first
        // ones, up to the tree's next key, are the keys in the gap before it
        // (absent from the tree when its iterator passed) and that key's own.
        // Each is taken out as it is decided: the reader never looks back.
        let mut next_at_cut = None;
        while let Some(first) = recorded.old.first_entry() {
            let key = first.key();
            let in_gap = match &next {
                Some((next_key, _)) if key > next_key => break,
                Some((next_key, _)) => key < next_key,
                None => true,
            };
            let (key, old) = first.remove_entry();
            recorded.bytes -= key.len() + old.as_ref().map_or(0, |value| value.len());
            match (in_gap, old) {
                (true, Some(value)) => self.ready.push_back((key, value)),
                (true, None) => {}
                (false, old) => next_at_cut = Some(old),
            }
        }
        match next {
            Some((key, now)) => {
                if let Some(value) = next_at_cut.unwrap_or(Some(now)) {
                    self.ready.push_back((key.clone(), value));
                }
                // Under the same lock as the records: from here on, writes
                // up to this key record nothing.
                recorded.passed = Some(key.clone());
                self.passed = Some(key);
            }
            None => self.finished = true,
        }
        Ok(())
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<(IVec, IVec), sled::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Some(Ok(entry));
            }
            if self.finished {
                return None;
            }
            if let Err(e) = self.advance() {
                self.finished = true;
                return Some(Err(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree("t").unwrap()
    }

    /// A write as the state machine makes one: recorded first, then applied.
    fn write(cut: &Cut, tree: &sled::Tree, key: &[u8], value: Option<&[u8]>) {
        cut.record(tree, [key]).unwrap();
        match value {
            Some(value) => tree.insert(key, value).unwrap(),
            None => tree.remove(key).unwrap(),
        };
    }

    fn contents(tree: &sled::Tree) -> BTreeMap<Vec<u8>, Vec<u8>> {
        tree.iter()
            .map(|item| {
                let (k, v) = item.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }

    #[test]
    fn without_writes_the_cut_is_the_tree() {
        let (cut, tree) = (Cut::default(), tree());
        for i in 0u8..50 {
            tree.insert([i], vec![i; 3]).unwrap();
        }
        let reading = cut.begin();
        let read: BTreeMap<_, _> = cut
            .entries(&tree)
            .map(|item| {
                let (k, v) = item.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect();
        drop(reading);
        assert_eq!(read, contents(&tree));
    }

    #[test]
    fn keys_changed_behind_and_ahead_of_the_reader_read_as_at_the_cut() {
        let (cut, tree) = (Cut::default(), tree());
        for i in (0u8..100).step_by(2) {
            tree.insert([i], vec![i]).unwrap();
        }
        let expected = contents(&tree);
        let reading = cut.begin();
        let mut entries = cut.entries(&tree);
        let mut read = Vec::new();
        for _ in 0..10 {
            read.push(entries.next().unwrap().unwrap());
        }
        // Behind the reader (keys 0..20) and ahead of it: updated, deleted,
        // inserted, and inserted then deleted.
        write(&cut, &tree, &[4], Some(b"new"));
        write(&cut, &tree, &[5], Some(b"new"));
        write(&cut, &tree, &[40], Some(b"new"));
        write(&cut, &tree, &[42], None);
        write(&cut, &tree, &[43], Some(b"new"));
        write(&cut, &tree, &[45], Some(b"new"));
        write(&cut, &tree, &[45], None);
        write(&cut, &tree, &[98], None);
        write(&cut, &tree, &[99], Some(b"last"));
        read.extend(entries.map(Result::unwrap));
        assert_eq!(cut.recorded_bytes(), 0, "the reader took every record");
        write(&cut, &tree, &[50], Some(b"behind"));
        assert_eq!(
            cut.recorded_bytes(),
            0,
            "a write behind the reader records nothing"
        );
        drop(reading);
        let read: BTreeMap<_, _> = read
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(read, expected);
        assert_eq!(cut.recorded_bytes(), 0, "ending the cut frees its records");
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Hand out this many more entries of the cut.
        Read(usize),
        Put(u8, u8),
        Delete(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1usize..8).prop_map(Step::Read),
            (any::<u8>(), any::<u8>()).prop_map(|(k, v)| Step::Put(k % 64, v)),
            any::<u8>().prop_map(|k| Step::Delete(k % 64)),
        ]
    }

    proptest! {
        /// Whatever is written in between, the cut's entries are the tree's
        /// contents at the cut, each once and in key order.
        #[test]
        fn the_cut_reads_the_tree_as_it_was_whatever_is_written_meanwhile(
            initial in proptest::collection::btree_map(0u8..64, any::<u8>(), 0..40),
            steps in proptest::collection::vec(step(), 0..60),
        ) {
            let (cut, tree) = (Cut::default(), tree());
            for (k, v) in &initial {
                tree.insert([*k], vec![*v]).unwrap();
            }
            let expected: Vec<(Vec<u8>, Vec<u8>)> = contents(&tree).into_iter().collect();
            let reading = cut.begin();
            let mut entries = cut.entries(&tree);
            let mut read = Vec::new();
            for step in steps {
                match step {
                    Step::Read(n) => {
                        for item in entries.by_ref().take(n) {
                            read.push(item.unwrap());
                        }
                    }
                    Step::Put(k, v) => write(&cut, &tree, &[k], Some(&[v])),
                    Step::Delete(k) => write(&cut, &tree, &[k], None),
                }
            }
            read.extend(entries.map(Result::unwrap));
            drop(reading);
            let read: Vec<(Vec<u8>, Vec<u8>)> =
                read.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
            prop_assert_eq!(read, expected);
        }
    }
}
