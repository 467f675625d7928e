//! The changes of a Raft entry's commands not yet in the region tree, and reads
//! of the tree through them.
//!
//! The state machine writes an entry's commands in one sled batch (sled 0.34 takes
//! its global write lock, pins and writes a batch manifest per batch, so one batch
//! per command made sled most of an entry's apply). Each command must still be
//! decided on the state the commands before it left, so it reads a `View`: the
//! tree with the entry's earlier changes over it, deletions included, every scan
//! a merge of both in key order. A `Changes` is an ordered map because
//! `sled::Batch` can be written but not read; it becomes one once, at the end.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;

use sled::IVec;

use crate::Error;

/// Writes and deletions by key, the later of two on a key winning (as in a
/// `sled::Batch`), with a running count of their bytes.
#[derive(Debug, Default)]
pub struct Changes {
    writes: BTreeMap<IVec, Option<IVec>>,
    /// Bytes of keys and values inserted so far (a key written twice counts
    /// twice): an upper bound of what the changes hold, for the entry's limit.
    bytes: usize,
}

impl Changes {
    pub fn insert(&mut self, key: impl Into<IVec>, value: impl Into<IVec>) {
        let (key, value) = (key.into(), value.into());
        self.bytes += key.len() + value.len();
        self.writes.insert(key, Some(value));
    }

    pub fn remove(&mut self, key: impl Into<IVec>) {
        let key = key.into();
        self.bytes += key.len();
        self.writes.insert(key, None);
    }

    /// Adds `later`'s changes over these.
    pub fn absorb(&mut self, later: Changes) {
        self.bytes += later.bytes;
        if self.writes.is_empty() {
            self.writes = later.writes;
        } else {
            self.writes.extend(later.writes);
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The keys written or deleted, in key order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.writes.keys().map(|key| key.as_ref())
    }

    /// The changes as one sled batch, applied atomically.
    pub fn into_batch(self) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (key, value) in self.writes {
            match value {
                Some(value) => batch.insert(key, value),
                None => batch.remove(key),
            }
        }
        batch
    }
}

/// The tree as it is after `over` is applied, read without applying it.
#[derive(Clone, Copy)]
pub struct View<'a> {
    tree: &'a sled::Tree,
    over: &'a Changes,
}

impl<'a> View<'a> {
    pub fn new(tree: &'a sled::Tree, over: &'a Changes) -> View<'a> {
        View { tree, over }
    }

    pub fn get_raw(&self, key: &[u8]) -> Result<Option<IVec>, Error> {
        match self.over.writes.get(key) {
            Some(changed) => Ok(changed.clone()),
            None => Ok(self.tree.get(key)?),
        }
    }

    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = key.as_ref();
        match self.over.writes.get(key) {
            Some(changed) => Ok(changed.is_some()),
            None => Ok(self.tree.contains_key(key)?),
        }
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn scan_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> impl Iterator<Item = Result<(IVec, IVec), Error>> + 'a {
        let prefix = prefix.as_ref().to_vec();
        let tree = self.tree.scan_prefix(&prefix);
        let over = self
            .over
            .writes
            .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(&prefix));
        Merged::new(tree, over)
    }

    /// Entries from `start` (included) to `end` (excluded), in key order.
    pub fn range(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> impl Iterator<Item = Result<(IVec, IVec), Error>> + 'a {
        // Both sled and `BTreeMap` refuse a range that ends before it starts.
        let end = end.max(start);
        let tree = self.tree.range(start..end);
        let over = self
            .over
            .writes
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        Merged::new(tree, over)
    }
}

/// The tree's entries of a range with the changes of the same range over them.
struct Merged<'a, T: Iterator, O: Iterator<Item = (&'a IVec, &'a Option<IVec>)>> {
    tree: Peekable<T>,
    over: Peekable<O>,
}

impl<'a, T, O> Merged<'a, T, O>
where
    T: Iterator<Item = sled::Result<(IVec, IVec)>>,
    O: Iterator<Item = (&'a IVec, &'a Option<IVec>)>,
{
    fn new(tree: T, over: O) -> Self {
        Merged {
            tree: tree.peekable(),
            over: over.peekable(),
        }
    }
}

impl<'a, T, O> Iterator for Merged<'a, T, O>
where
    T: Iterator<Item = sled::Result<(IVec, IVec)>>,
    O: Iterator<Item = (&'a IVec, &'a Option<IVec>)>,
{
    type Item = Result<(IVec, IVec), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::cmp::Ordering::{Equal, Greater, Less};
        loop {
            let next = match (self.tree.peek(), self.over.peek()) {
                (None, None) => return None,
                // An error of the tree is passed on where it happened.
                (Some(Err(_)), _) | (Some(Ok(_)), None) => Less,
                (None, Some(_)) => Greater,
                (Some(Ok((in_tree, _))), Some((changed, _))) => in_tree.cmp(changed),
            };
            if next == Less {
                return self.tree.next().map(|item| item.map_err(Error::from));
            }
            if next == Equal {
                // The change replaces (or deletes) the tree's entry.
                self.tree.next();
            }
            if let Some((key, Some(value))) = self.over.next() {
                return Some(Ok((key.clone(), value.clone())));
            }
            // A deletion: nothing to yield for this key.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (sled::Db, sled::Tree) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        for key in ["a1", "a3", "a5", "b1"] {
            tree.insert(key, key).unwrap();
        }
        (db, tree)
    }

    fn keys(items: impl Iterator<Item = Result<(IVec, IVec), Error>>) -> Vec<String> {
        items
            .map(|item| {
                let (key, value) = item.unwrap();
                format!(
                    "{}={}",
                    String::from_utf8_lossy(&key),
                    String::from_utf8_lossy(&value)
                )
            })
            .collect()
    }

    #[test]
    fn reads_see_changes_over_the_tree_deletions_included() {
        let (_db, tree) = tree();
        let mut over = Changes::default();
        over.insert("a2", "new");
        over.insert("a3", "changed");
        over.remove("a5");
        over.remove("a9");
        over.insert("a6", "new");
        let view = View::new(&tree, &over);
        assert_eq!(view.get_raw(b"a3").unwrap().unwrap(), b"changed");
        assert_eq!(view.get_raw(b"a5").unwrap(), None);
        assert_eq!(view.get_raw(b"a1").unwrap().unwrap(), b"a1");
        assert!(!view.contains_key(b"a5").unwrap());
        assert!(view.contains_key(b"a2").unwrap());
        assert!(view.contains_key(b"b1").unwrap());
        assert_eq!(
            keys(view.scan_prefix(b"a")),
            ["a1=a1", "a2=new", "a3=changed", "a6=new"]
        );
        assert_eq!(keys(view.range(b"a2", b"a6")), ["a2=new", "a3=changed"]);
        assert_eq!(keys(view.range(b"a6", b"c")), ["a6=new", "b1=b1"]);
        assert!(keys(view.range(b"b", b"a")).is_empty());
        // The tree itself is untouched.
        assert_eq!(tree.len(), 4);
    }

    #[test]
    fn later_changes_win_and_become_one_batch() {
        let (_db, tree) = tree();
        let mut first = Changes::default();
        first.insert("a1", "x");
        first.remove("a3");
        let mut second = Changes::default();
        second.remove("a1");
        second.insert("a3", "back");
        first.absorb(second);
        assert_eq!(first.bytes(), 2 + 1 + 2 + 2 + 2 + 4);
        tree.apply_batch(first.into_batch()).unwrap();
        assert_eq!(tree.get("a1").unwrap(), None);
        assert_eq!(tree.get("a3").unwrap().unwrap(), b"back");
    }
}
