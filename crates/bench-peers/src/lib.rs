//! Bench-only peers of keyhold: `POST /v1/orders` with idempotency built the way
//! most teams build it, so that `scripts/bench` can put keyhold's figures next
//! to something familiar on the same machine:
//!
//! - [`pg`]: axum + tokio-postgres over an idempotency table with a unique
//!   constraint (`INSERT ... ON CONFLICT DO NOTHING` claims; the order row and
//!   the stored response are written in the same transaction);
//! - [`pg_outbox`]: the same, with the whole contract's downstream as a team
//!   would build it: an outbox row in the order's transaction, and a relay in
//!   the process that charges the fake payment provider and reserves
//!   inventory for each event;
//! - [`redis_peer`]: axum + redis (`SET NX` claims, `SET XX` stores the response);
//! - [`floor`]: a bare handler with a fixed 200-byte body, the HTTP floor.
//!
//! [`orders`] holds what the storage peers share: the loose request checks, the
//! fingerprint (keyhold's own `Spec::orders()`), the order body and the
//! problem+json answers; [`chart`] what the chart binaries share. Nothing here
//! is used by keyhold itself.

pub mod chart;
pub mod floor;
pub mod orders;
pub mod pg;
pub mod pg_outbox;
pub mod redis_peer;

use std::future::Future;
use tokio::net::TcpListener;

/// The one error type of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("postgres pool: {0}")]
    Pool(String),
    #[error("payment provider: {0}")]
    Provider(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    router: axum::Router,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM (what `scripts/bench` sends at exit).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
