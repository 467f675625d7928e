//! Builders of region log entries shared by this binary's tests.

#![allow(dead_code)] // Each test module uses a different subset.

use std::collections::BTreeSet;

use keyhold_core::UnixMillis;
use keyhold_store::raft::{Entry, EntryOutcome, LogId};
use keyhold_store::{Applied, Command, OrderOutcome};
use openraft::{CommittedLeaderId, EntryPayload, Membership};

use crate::common::create;

pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

pub fn command_entry(index: u64, command: Command) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(command),
    }
}

pub fn membership_entry(index: u64) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1u64])], None)),
    }
}

/// A new order of its own key at `index` (distinct keys, ids and instants).
pub fn order_entry(index: u64) -> Entry {
    command_entry(
        index,
        create(
            &format!("key-{index}"),
            &format!("client-{index}"),
            "fp",
            &format!("ord_{index}"),
            UnixMillis(crate::common::T0.0 + index),
        ),
    )
}

pub fn is_created(outcome: &EntryOutcome) -> bool {
    matches!(
        outcome,
        EntryOutcome::Command(Applied::Order(OrderOutcome::Created { .. }))
    )
}
