//! Storage tests of the sled-backed Raft log and state machine: openraft's own storage
//! suite, restart and snapshot round trips, and a kill -9 durability test.

#[path = "../common/mod.rs"]
mod common;

mod kill9;
mod restart;
mod suite;
