//! A fake payment provider for tests and demos, Stripe-like in the one way that
//! matters to keyhold's payments consumer: it honours `Idempotency-Key`.
//!
//! The first `POST /v1/charges` with a key creates a charge (succeeded, or
//! declined with probability `decline_rate`) and stores it durably; a retry with
//! the same key and body gets the stored answer again, and the same key with
//! another body is refused. With probability `drop_response_rate` the answer is
//! lost after the charge is committed, so clients must retry with the same key.
//! With probability `refuse_replay_rate` a retry of a committed charge is refused
//! (400 `idempotency_key_expired`) instead of replayed, as a provider whose keys
//! expired would: a client that lost the first answer must then look the charge
//! up with `GET /v1/charges/by-key/{key}` before it decides anything.
//! `GET /v1/charges` lists every charge, oldest first. `run(config, listener,
//! shutdown)` is the whole provider; tests start it on port 0 through it.
//!
//! Code map: `charge` (request, fingerprint, charge object), `store` (sled,
//! exactly one charge per key), `connection` (losing an answer), `routes`
//! (HTTP), `limits`.

mod charge;
mod connection;
pub mod limits;
mod routes;
mod store;

pub use routes::REPLAYED_HEADER;

use connection::{LoseAnswer, LossyListener};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The one error type of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("store: {0}")]
    Store(#[from] sled::Error),
    #[error("store: corrupt data: {0}")]
    Corrupt(String),
    #[error("encoding: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("background task failed: {0}")]
    Task(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// How the provider runs.
#[derive(Debug, Clone)]
pub struct PspConfig {
    /// Where charges are kept (a sled database; created if missing).
    pub data_dir: PathBuf,
    /// Probability, in `0..=1`, that an answer to a committed charge is lost.
    pub drop_response_rate: f64,
    /// Probability, in `0..=1`, that a new charge is declined.
    pub decline_rate: f64,
    /// Probability, in `0..=1`, that a retry of a committed charge (same key,
    /// same body) is refused with 400 instead of answered with the stored charge.
    pub refuse_replay_rate: f64,
}

impl PspConfig {
    /// A provider in `data_dir` that declines nothing and loses no answer.
    pub fn new(data_dir: impl Into<PathBuf>) -> PspConfig {
        PspConfig {
            data_dir: data_dir.into(),
            drop_response_rate: 0.0,
            decline_rate: 0.0,
            refuse_replay_rate: 0.0,
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        for (name, rate) in [
            ("drop_response_rate", self.drop_response_rate),
            ("decline_rate", self.decline_rate),
            ("refuse_replay_rate", self.refuse_replay_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(Error::Config(format!(
                    "{name} must be a probability from 0 to 1, got {rate}"
                )));
            }
        }
        Ok(())
    }
}

/// Runs the provider until `shutdown` resolves, then stops accepting
/// connections, lets in-flight requests finish, flushes and returns.
pub async fn run(
    config: PspConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let store = store::Store::open(&config.data_dir)?;
    let app = Arc::new(routes::App {
        store: store.clone(),
        drop_response_rate: config.drop_response_rate,
        decline_rate: config.decline_rate,
        refuse_replay_rate: config.refuse_replay_rate,
    });
    tracing::info!(
        addr = %listener.local_addr()?,
        data_dir = %config.data_dir.display(),
        drop_response_rate = config.drop_response_rate,
        decline_rate = config.decline_rate,
        "fake psp listening"
    );
    let (stop_flusher, flusher_stop) = tokio::sync::watch::channel(false);
    let flusher = tokio::spawn(store.clone().run_flusher(flusher_stop));
    let service = routes::router(app).into_make_service_with_connect_info::<LoseAnswer>();
    let served = axum::serve(LossyListener::new(listener), service)
        .with_graceful_shutdown(shutdown)
        .await;
    // Every request has been answered (or abandoned): no ticket is left.
    let _ = stop_flusher.send(true);
    flusher
        .await
        .map_err(|join| Error::Task(format!("flusher: {join}")))?;
    served?;
    store.flush()?;
    tracing::info!("fake psp stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_must_be_probabilities() {
        let mut config = PspConfig::new("/nonexistent");
        assert!(config.validate().is_ok());
        config.decline_rate = 1.5;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("decline_rate"), "{error}");
        config.decline_rate = 1.0;
        config.drop_response_rate = f64::NAN;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("drop_response_rate"), "{error}");
    }
}
