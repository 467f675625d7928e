//! The Redis peer: `SET key NX` claims a key with a "processing" record; the
//! winner writes the order and replaces the record with its response
//! (`SET key XX`) in one MULTI/EXEC. A loser reads the record: another
//! fingerprint is 422, a stored response is replayed, and a record still
//! processing is polled for a while (as keyhold waits for an in-flight first
//! attempt) before answering 409.

use crate::orders::{self, Prepared, OPERATION};
use crate::Error;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a record lives, like keyhold's default `response_ttl` (48 h).
pub const RECORD_TTL_MS: u64 = 48 * 3600 * 1000;
/// A duplicate waits this long for the first attempt (keyhold's default
/// `inflight_wait`), then answers 409 request-in-progress.
pub const INFLIGHT_WAIT_MS: u64 = 2_000;
/// Between two reads of a record still processing.
pub const POLL_INTERVAL_MS: u64 = 2;
const HOME_REGION: &str = "peer-redis";

#[derive(Serialize, Deserialize)]
struct Record {
    fingerprint: String,
    /// None while processing.
    location: Option<String>,
    body: Option<String>,
}

#[derive(Clone)]
pub struct RedisPeer {
    connection: ConnectionManager,
}

impl RedisPeer {
    /// Connects to `url` (`redis://127.0.0.1:6379/`).
    pub async fn connect(url: &str) -> Result<RedisPeer, Error> {
        let client = redis::Client::open(url)?;
        let connection = ConnectionManager::new(client).await?;
        Ok(RedisPeer { connection })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/orders", post(create))
            .with_state(Arc::new(self))
    }
}

async fn create(State(peer): State<Arc<RedisPeer>>, headers: HeaderMap, body: Bytes) -> Response {
    let prepared = match orders::prepare(&headers, &body) {
        Ok(p) => p,
        Err(rejection) => return rejection.into_response(),
    };
    match decide(&peer, &prepared).await {
        Ok(answer) => answer,
        Err(e) => orders::unavailable(e),
    }
}

fn record_key(p: &Prepared) -> String {
    format!("idem:{}:{OPERATION}:{}", p.tenant, p.key)
}

async fn decide(peer: &RedisPeer, p: &Prepared) -> Result<Response, Error> {
    let mut con = peer.connection.clone();
    let key = record_key(p);
    let started = Instant::now();
    loop {
        let processing = serde_json::to_string(&Record {
            fingerprint: p.fingerprint.clone(),
            location: None,
            body: None,
        })
        .expect("record serializes");
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(processing)
            .arg("NX")
            .arg("PX")
            .arg(RECORD_TTL_MS)
            .query_async(&mut con)
            .await?;
        if claimed.is_some() {
            let order = orders::new_order(p, HOME_REGION);
            let done = serde_json::to_string(&Record {
                fingerprint: p.fingerprint.clone(),
                location: Some(order.location.clone()),
                body: Some(order.body.clone()),
            })
            .expect("record serializes");
            redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(format!("order:{}", order.order_id))
                .arg(&order.body)
                .ignore()
                .cmd("SET")
                .arg(&key)
                .arg(done)
                .arg("XX")
                .arg("PX")
                .arg(RECORD_TTL_MS)
                .ignore()
                .query_async::<()>(&mut con)
                .await?;
            return Ok(orders::created(
                &p.fingerprint,
                &order.location,
                order.body,
                false,
            ));
        }
        let stored: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut con).await?;
        // Gone between SET NX and GET (expired): claim again.
        let Some(stored) = stored else { continue };
        let record: Record = serde_json::from_str(&stored).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::TypeError, "record", e.to_string()))
        })?;
        if record.fingerprint != p.fingerprint {
            return Ok(orders::problem(
                422,
                "idempotency-key-reused",
                "Idempotency-Key reused with another request",
            ));
        }
        if let (Some(location), Some(body)) = (record.location, record.body) {
            return Ok(orders::created(&p.fingerprint, &location, body, true));
        }
        if started.elapsed() >= Duration::from_millis(INFLIGHT_WAIT_MS) {
            return Ok(orders::problem(
                409,
                "request-in-progress",
                "Request in progress",
            ));
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
}
