//! The keyhold node: an axum HTTP server over one region store.
//!
//! `run(config, listener, shutdown)` is the whole node; the binary only parses its
//! command line and calls it, and tests start real nodes on port 0 through the
//! same function. The node authenticates, validates keys and bodies, computes
//! fingerprints, coalesces in-flight duplicates, and turns store outcomes into the
//! contract's answers. Background tasks (the expiry sweeper) stop with the server.
//!
//! **Architecture Invariant:** the server knows nothing of the storage layout; it
//! sends `keyhold_store::Command`s and reads through the store's typed getters.

pub mod config;
mod downstream;
mod inflight;
pub mod limits;
mod metrics;
mod node;
mod problem;
mod routes;
mod sweeper;
pub mod tenants;
pub mod up;

pub use config::{parse_duration, Config};
pub use node::Node;

use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The one error type of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("store: {0}")]
    Store(#[from] keyhold_store::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs one node until `shutdown` resolves, then stops accepting connections,
/// lets in-flight requests finish, stops background tasks and returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let node = Arc::new(Node::open(config)?);
    serve(node, listener, shutdown).await
}

/// Serves an already opened node (used by `keyhold up`, which creates demo
/// tenants before serving).
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sweeper = tokio::spawn(sweeper::run(node.clone(), stop_rx.clone()));
    let relays: Vec<_> = downstream::consumers(&node)
        .into_iter()
        .map(|c| tokio::spawn(downstream::run(node.clone(), c, stop_rx.clone())))
        .collect();
    let app = routes::router(node.clone());
    tracing::info!(
        region = %node.config().region,
        addr = %listener.local_addr()?,
        "keyhold node listening"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    let _ = stop_tx.send(true);
    let _ = sweeper.await;
    for relay in relays {
        let _ = relay.await;
    }
    tracing::info!("keyhold node stopped");
    Ok(())
}
