//! The idempotency decision, as pure functions over records with time passed in.
//!
//! This crate answers "what should happen to this request?" given what the store
//! already holds: create, replay, refuse a changed request, wait for an in-flight
//! first attempt, or hand back an existing order through a business marker. It also
//! owns the vocabulary every other crate shares: scopes, records, leases and owner
//! tokens, orders, problem types and the TTL policy.
//!
//! **Architecture Invariant:** `core` does no I/O and reads no clock. Every function
//! that depends on time takes `now: UnixMillis`, so tests drive time by hand.

pub mod claim;
pub mod limits;
pub mod order;
pub mod policy;
pub mod problem;
pub mod record;
pub mod scope;
pub mod time;

pub use claim::{
    check_owner, decide_claim, ClaimDecision, Outcome, OwnerCheck, OwnerToken, StaleOwner,
};
pub use order::{
    decide_order, FieldError, Item, Marker, Order, OrderDecision, OrderRequest, OrderStatus,
};
pub use policy::{Horizon, Policy, PolicyError, Retention, Stage};
pub use problem::Problem;
pub use record::{Record, RecordState, StoredResponse};
pub use scope::{IdempotencyKey, Operation, Scope, ScopeError, TenantId};
pub use time::UnixMillis;

/// The one error type of this crate: input that breaks a rule of the contract.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(transparent)]
    Scope(#[from] ScopeError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("invalid owner token")]
    OwnerToken,
}
