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

mod cluster;
pub mod config;
mod copies;
mod demo;
mod downstream;
mod erase;
mod failover;
mod http;
mod inflight;
mod lease;
pub mod limits;
mod metrics;
mod mover;
mod node;
mod operations;
mod peers;
mod problem;
mod reconcile;
mod routes;
mod standby;
mod survival;
mod sweeper;
pub mod tenants;

pub use config::{parse_duration, Config};
pub use node::Node;
pub use problem::ApiError;

use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// A background task's clock: ticks every `period` (late ticks are delayed, not
/// bunched) until `stop` flips.
pub(crate) struct Ticker {
    interval: tokio::time::Interval,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Ticker {
    pub(crate) fn new(
        period: std::time::Duration,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticker { interval, stop }
    }

    /// Waits for the next tick; false once the node stops.
    pub(crate) async fn tick(&mut self) -> bool {
        tokio::select! {
            _ = self.interval.tick() => !*self.stop.borrow(),
            _ = self.stop.changed() => false,
        }
    }
}

/// The loop of a background task driven by the registry (erasure,
/// reconciliation): runs `pass` at start, after every applied registry entry,
/// and every `retry` while `pass` says work is left (false), until `stop`.
pub(crate) async fn on_registry_change<F, Fut>(
    node: Arc<Node>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    retry: std::time::Duration,
    mut pass: F,
) where
    F: FnMut(Arc<Node>) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut applied = node.registry().subscribe();
    loop {
        let settled = pass(node.clone()).await;
        let again = async {
            if settled {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(retry).await;
        };
        tokio::select! {
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = again => {}
            _ = stop.changed() => return,
        }
    }
}

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
/// lets in-flight requests finish, stops background tasks and returns. The Raft
/// listener is bound from `config.raft_listen`. The node advertises the
/// addresses of its own entry in `config.members` when it has one (a proxy in
/// front of it, say), else those of its listeners.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let raft_listener = TcpListener::bind(&config.raft_listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", config.raft_listen)))?;
    run_listening(config, listener, raft_listener, shutdown).await
}

/// [`run`] on a Raft listener the caller bound already (`config.raft_listen`
/// is then not read): for a caller that holds its addresses itself, such as a
/// test that restarts a node where it was.
pub async fn run_listening(
    config: Config,
    listener: TcpListener,
    raft_listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let own = config.members.iter().find(|m| m.id == config.node_id);
    // A member advertises what its config says (checked by `validate`: an
    // IP or a DNS name); a node alone advertises where it listens.
    let (api_addr, raft_addr) = match own {
        Some(m) => (m.api_addr.clone(), m.raft_addr.clone()),
        None => (
            listener.local_addr()?.to_string(),
            raft_listener.local_addr()?.to_string(),
        ),
    };
    let node = Node::open(config, api_addr, raft_addr).await?;
    serve(Arc::new(node), listener, raft_listener, shutdown).await
}

/// Serves an opened node on its API and Raft listeners: bootstraps the registry
/// when this node is the first member, keeps the tenant directory in step with
/// the registry, and runs the sweeper and the outbox relays.
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    raft_listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let raft_addr = raft_listener.local_addr()?;
    // The registry's routes and the region group's, each under its group's name.
    let region_group = keyhold_store::raft::group_name(node.region());
    let mut raft_app = keyhold_registry::raft_router(node.registry().clone()).merge(
        keyhold_registry::group_router(
            &region_group,
            node.store().group().raft().clone(),
            node.credentials().clone(),
        ),
    );
    // The groups of the regions this node keeps a standby copy of: served by
    // whichever copy the node holds at the time (a reset replaces it).
    for copy in node.standby_copies() {
        let (holder, region) = (node.clone(), copy.region.clone());
        let source: keyhold_registry::RaftSource<keyhold_store::raft::RegionConfig> =
            Arc::new(move || {
                let copy = holder.standby_copy(&region)?;
                // What a failover may have lost is bounded from here (`failover::lost_bound`).
                copy.clock.heard(std::time::Instant::now());
                Some(copy.store.group().raft().clone())
            });
        raft_app = raft_app.merge(keyhold_registry::replaceable_group_router(
            &keyhold_store::raft::group_name(&copy.region),
            source,
            node.credentials().clone(),
        ));
    }
    let mut raft_stop = stop_rx.clone();
    let raft_server = tokio::spawn(async move {
        axum::serve(raft_listener, raft_app)
            .with_graceful_shutdown(async move {
                let _ = raft_stop.changed().await;
            })
            .await
    });
    let bootstrap = tokio::spawn(cluster::bootstrap(node.clone()));
    let directory = tokio::spawn(cluster::follow_registry(node.clone(), stop_rx.clone()));
    let upkeep = tokio::spawn(cluster::upkeep_on_leadership(node.clone(), stop_rx.clone()));
    let lease = tokio::spawn(lease::run(node.clone(), stop_rx.clone()));
    let standby = tokio::spawn(standby::run(node.clone(), stop_rx.clone()));
    let purge = tokio::spawn(standby::purge_behind_standby(node.clone(), stop_rx.clone()));
    let standby_watch = tokio::spawn(survival::standby_watch(node.clone(), stop_rx.clone()));
    let copies = tokio::spawn(copies::run(node.clone(), stop_rx.clone()));
    let move_watch = tokio::spawn(mover::resume_stalled(node.clone(), stop_rx.clone()));
    let failovers = tokio::spawn(failover::run(node.clone(), stop_rx.clone()));
    let failover_watch = tokio::spawn(failover::watch(node.clone(), stop_rx.clone()));
    let sweeper = tokio::spawn(sweeper::run(node.clone(), stop_rx.clone()));
    let eraser = tokio::spawn(erase::run(node.clone(), stop_rx.clone()));
    let reconciler = tokio::spawn(reconcile::run(node.clone(), stop_rx.clone()));
    if node.config().downstream == config::Downstream::Off {
        tracing::info!("downstream off: orders write their events, no relay delivers them");
    }
    let relays: Vec<_> = downstream::relayed(&node)
        .into_iter()
        .map(|c| tokio::spawn(downstream::run(node.clone(), c, stop_rx.clone())))
        .collect();
    let app = routes::router(node.clone());
    // The one start-up line per node: who it is and where it answers.
    tracing::info!(
        node_id = node.config().node_id,
        region = %node.config().region,
        api = %format!("http://{}", listener.local_addr()?),
        raft = %raft_addr,
        "keyhold node listening"
    );
    let limits = http::ConnectionLimits {
        connections_max: node.config().connections_max,
        connections_per_address_max: node.config().connections_per_address_max,
        new_connections_per_address_per_second: node
            .config()
            .new_connections_per_address_per_second,
        header_read_timeout: node.config().header_read_timeout,
    };
    http::serve(listener, app, limits, shutdown).await?;
    let _ = stop_tx.send(true);
    bootstrap.abort();
    // A stopped driver's move stays running in the registry; the watchdog of
    // the registry leader's node resumes it.
    node.drivers.stop_all();
    let _ = sweeper.await;
    let _ = eraser.await;
    let _ = reconciler.await;
    let _ = directory.await;
    let _ = upkeep.await;
    let _ = lease.await;
    let _ = standby.await;
    let _ = purge.await;
    let _ = standby_watch.await;
    let _ = copies.await;
    let _ = move_watch.await;
    let _ = failovers.await;
    let _ = failover_watch.await;
    for relay in relays {
        let _ = relay.await;
    }
    if let Err(e) = node.registry().shutdown().await {
        tracing::warn!(error = %e, "registry shutdown");
    }
    if let Err(e) = node.store().shutdown().await {
        tracing::warn!(error = %e, "region store shutdown");
    }
    for copy in node.standby_copies() {
        if let Err(e) = copy.store.shutdown().await {
            tracing::warn!(region = %copy.region, error = %e, "standby copy shutdown");
        }
    }
    let _ = raft_server.await;
    tracing::info!("keyhold node stopped");
    Ok(())
}
