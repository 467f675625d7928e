//! The Rust SDK for keyhold. It owns the client's half of idempotency: one
//! `Idempotency-Key` fixed per *intent* (not per attempt), retries that are safe
//! because they reuse that key, typed errors read from problem+json, an optional
//! durable journal of intents still waiting for a final answer, and the claims
//! API with a guard that keeps a lease alive while the caller works.
//!
//! ```no_run
//! # async fn demo() -> Result<(), keyhold_client::Error> {
//! use keyhold_client::Client;
//! let client = Client::new("http://127.0.0.1:7400", "tenant-token")?;
//! // Fix the key when the customer decides to order, never inside the retry loop.
//! let intent = client.intent(serde_json::json!({
//!     "client_order_id": "c-1", "cart_id": "k-1", "amount": 1999, "currency": "EUR"
//! }));
//! let order = client.create_order(&intent).await?;
//! println!("{}", order.order_id);
//! # Ok(()) }
//! ```
//!
//! What is retried (connection errors, timeouts, 409 `request-in-progress`, 429,
//! 503) and what is not (422 and every other 4xx) is decided in one place,
//! [`Error::is_retryable`]; how long to wait is [`RetryPolicy`]'s job.

mod claims;
mod client;
mod error;
mod journal;
pub mod limits;
mod retry;

pub use claims::{
    Claim, ClaimGuard, ClaimRequest, Completed, Completion, Lease, Outcome, Response,
};
pub use client::{Client, Intent, Order, OrderReceipt};
pub use error::Error;
pub use journal::IntentJournal;
pub use retry::RetryPolicy;
