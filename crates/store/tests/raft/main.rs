//! Tests of a region's Raft group: a single-voter group end to end, openraft's own
//! storage suite for the region log store and state machine, exactly-once apply
//! across a kill -9, one sled batch per entry with the same answers as one per
//! command, and snapshots that build from the region tree and install on
//! new, lagging and interrupted replicas, and the promotion of a standby copy.

#[path = "../common/mod.rs"]
mod common;

mod catch_up;
mod exactly_once;
mod group;
mod helpers;
mod one_batch;
mod promote;
mod snapshots;
mod suite;
