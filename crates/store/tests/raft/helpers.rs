//! Builders of region log entries shared by this binary's tests.

#![allow(dead_code)] // Each test module uses a different subset.

use std::collections::BTreeSet;

use keyhold_store::raft::{CommandBatch, Entry, EntryOutcome, LogId};
use keyhold_store::{Applied, Command, OrderOutcome};
use openraft::{CommittedLeaderId, EntryPayload, Membership};

pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// An entry at `index` carrying `commands`.
pub fn commands_entry(index: u64, commands: Vec<Command>) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(CommandBatch { commands }),
    }
}

pub fn membership_entry(index: u64) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1u64])], None)),
    }
}

pub use crate::common::new_order;

/// The region tree's key of the record of idempotency key `key` (orders).
pub fn record_key(key: &str) -> Vec<u8> {
    let scope = crate::common::scope(keyhold_core::scope::Namespace::Orders, key);
    [b"r".as_slice(), &scope.storage_key()].concat()
}

/// An entry at `index` carrying one new order, numbered `index`.
pub fn order_entry(index: u64) -> Entry {
    commands_entry(index, vec![new_order(index)])
}

pub fn is_created(applied: &Applied) -> bool {
    matches!(applied, Applied::Order(OrderOutcome::Created { .. }))
}

/// The answers of a command entry's outcome (none for Raft's own entries).
pub fn answers(outcome: &EntryOutcome) -> &[Applied] {
    match outcome {
        EntryOutcome::Commands(answers) => answers,
        EntryOutcome::Raft => &[],
    }
}
