//! The full PostgreSQL peer: keyhold's whole order contract the way a team
//! would build it on PostgreSQL, downstream included, so that `scripts/bench`
//! can put keyhold with its downstream running next to it.
//!
//! **Ingest.** A new order is the minimal peer's transaction (`pg::decide`:
//! the key claimed with `INSERT ... ON CONFLICT DO NOTHING`, the order row, the
//! stored response) plus one `outbox` row, an `order.created` event with its
//! event id, order id, amount, currency and item lines, in the same
//! transaction: order, key and event commit together or not at all. Replays
//! and refusals are the minimal peer's.
//!
//! **Relay.** `RELAY_WORKERS` tasks in the same process each repeatedly take
//! a batch of undelivered rows (`SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, so
//! two workers never take the same row), charge the fake payment provider for
//! each (`POST {psp}/v1/charges` with `Idempotency-Key: pg-pay-{event_id}`, as
//! keyhold's payments consumer calls it, at most `PSP_CONCURRENCY_MAX` at
//! once), and then, **in the same transaction that locked the rows**, record
//! the effects and mark the rows delivered: for each event an inventory
//! reservation row per item line and the order's payment status, each behind
//! its `processed_messages` row `(consumer, event_id)`. The same transaction,
//! rather than a follow-up one, because the row lock is then the lease: a
//! worker that dies mid-batch rolls back, its locks go, and another worker
//! takes the rows again, with no "in flight" state to expire; the price is a
//! transaction (and a connection) held open across the batch's charges, tens
//! of milliseconds. Delivery is therefore at least once: a batch that rolls
//! back after its charges charges again, and the provider deduplicates by
//! the key (same key, same charge). The effects are written once: they commit
//! only with the delivered mark, and the processed-messages guard also keeps
//! an event made undelivered again (an operator's replay) from reserving or
//! settling twice. An event whose charge is not confirmed after
//! `PSP_ATTEMPTS_MAX` tries stays undelivered and is taken again in a later
//! round; a charge the provider refuses as a request (a 4xx that is not a
//! retryable one) is settled as failed without looking the key up (keyhold
//! looks it up; with the fake provider as the bench runs it, a refusal never
//! hides a charge).
//!
//! The relay's sizes follow keyhold's own relay (its batch of 256 events, 32
//! charges in flight, its idle poll and linger) so that both downstreams do
//! the same work with the same parallelism.

use crate::orders::{self, Item, NewOrder, Prepared};
use crate::pg::{self, AlsoInTransaction};
use crate::Error;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use deadpool_postgres::{Pool, Transaction};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

/// Relay tasks taking batches side by side (keyhold runs one relay per
/// consumer, two); `SKIP LOCKED` splits the backlog between them.
pub const RELAY_WORKERS: usize = 2;
/// Outbox rows one relay round locks and delivers.
pub const RELAY_BATCH_ROWS_MAX: usize = 256;
/// Charge requests one round has in flight at once: with `RELAY_WORKERS`
/// rounds side by side, keyhold's payments relay's 32 in all.
pub const PSP_CONCURRENCY_MAX: usize = 16;
/// How often an idle relay looks at the outbox without being woken by a new
/// order.
pub const RELAY_IDLE_POLL_MS: u64 = 200;
/// After a round that was not full, a relay waits this long so that the
/// orders right behind it join the next round instead of one round each.
pub const RELAY_LINGER_MS: u64 = 5;
/// Ceiling of a relay's backoff after a failed round.
pub const RELAY_BACKOFF_MS_MAX: u64 = 5_000;
/// One charge request, and how often one delivery tries it before the event
/// is left for a later round.
pub const PSP_REQUEST_TIMEOUT_MS: u64 = 3_000;
pub const PSP_ATTEMPTS_MAX: u32 = 8;
pub const PSP_BACKOFF_MS_BASE: u64 = 20;
pub const PSP_BACKOFF_MS_MAX: u64 = 1_000;
/// What the orders' bodies name as their home.
const HOME_REGION: &str = "peer-postgres-outbox";

const _: () = assert!(PSP_CONCURRENCY_MAX <= RELAY_BATCH_ROWS_MAX);
const _: () = assert!(RELAY_WORKERS >= 1);
const _: () = assert!(RELAY_LINGER_MS < RELAY_IDLE_POLL_MS);
const _: () = assert!(PSP_BACKOFF_MS_BASE < PSP_BACKOFF_MS_MAX);
const _: () = assert!(PSP_BACKOFF_MS_MAX <= RELAY_BACKOFF_MS_MAX);

/// The tables of this peer besides the minimal peer's `pg::SCHEMA`, created
/// if missing. `scripts/bench` reads `outbox` for the backlog at the end of a
/// run.
pub const OUTBOX_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    id           bigserial   PRIMARY KEY,
    event_id     text        NOT NULL UNIQUE,
    event_type   text        NOT NULL,
    order_id     text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_undelivered ON outbox (id) WHERE delivered_at IS NULL;
CREATE TABLE IF NOT EXISTS processed_messages (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE IF NOT EXISTS inventory_reservations (
    order_id    text        NOT NULL,
    line        int         NOT NULL,
    sku         text        NOT NULL,
    quantity    bigint      NOT NULL,
    event_id    text        NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, line)
);";

const INSERT_EVENT: &str = "INSERT INTO outbox (event_id, event_type, order_id, payload) \
     VALUES ($1, 'order.created', $2, $3::text::jsonb)";
const TAKE_BATCH: &str = "SELECT id, payload::text FROM outbox \
     WHERE delivered_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";
/// Each event not processed by the inventory consumer yet gets its processed
/// row and a reservation per item line.
const RESERVE: &str = "WITH fresh AS ( \
       INSERT INTO processed_messages (consumer, event_id) \
       SELECT 'inventory', e FROM unnest($1::text[]) AS e \
       ON CONFLICT DO NOTHING RETURNING event_id) \
     INSERT INTO inventory_reservations (order_id, line, sku, quantity, event_id) \
     SELECT l.order_id, l.line, l.sku, l.quantity, l.event_id \
     FROM unnest($2::text[], $3::int[], $4::text[], $5::bigint[], $6::text[]) \
       AS l(order_id, line, sku, quantity, event_id) \
     JOIN fresh ON fresh.event_id = l.event_id";
/// Each event not processed by the payments consumer yet gets its processed
/// row and its order's payment status.
const SETTLE: &str = "WITH fresh AS ( \
       INSERT INTO processed_messages (consumer, event_id) \
       SELECT 'payments', e FROM unnest($1::text[]) AS e \
       ON CONFLICT DO NOTHING RETURNING event_id) \
     UPDATE orders SET status = p.status \
     FROM unnest($1::text[], $2::text[], $3::text[]) AS p(event_id, order_id, status) \
     JOIN fresh ON fresh.event_id = p.event_id \
     WHERE orders.order_id = p.order_id";
const MARK_DELIVERED: &str = "UPDATE outbox SET delivered_at = now() WHERE id = ANY($1::bigint[])";

/// The `order.created` event, shaped like keyhold's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub order: EventOrder,
    pub items: Vec<Item>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventOrder {
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
}

#[derive(Clone)]
pub struct PgOutboxPeer {
    pool: Pool,
    relay: Arc<Relay>,
}

/// What the relay workers share.
struct Relay {
    /// Their own connections, so that a busy API never starves them.
    pool: Pool,
    http: reqwest::Client,
    psp_url: String,
    /// A committed new order wakes one idle worker.
    new_order: Notify,
}

impl PgOutboxPeer {
    /// Connects to `url` (`connections` for the API, `RELAY_WORKERS` more for
    /// the relay), creates the schema, and charges the provider at `psp_url`.
    pub async fn connect(
        url: &str,
        connections: usize,
        psp_url: &str,
    ) -> Result<PgOutboxPeer, Error> {
        let schema = [pg::SCHEMA, OUTBOX_SCHEMA].concat();
        let pool = pg::connect_pool(url, connections, &schema).await?;
        let relay_pool = pg::connect_pool(url, RELAY_WORKERS, "").await?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| Error::Provider(e.to_string()))?;
        let relay = Arc::new(Relay {
            pool: relay_pool,
            http,
            psp_url: psp_url.trim_end_matches('/').to_owned(),
            new_order: Notify::new(),
        });
        Ok(PgOutboxPeer { pool, relay })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/orders", post(create))
            .with_state(Arc::new(self))
    }

    /// Starts the relay workers; they run until aborted (a batch in flight
    /// then rolls back and is delivered again).
    pub fn spawn_relay(&self) -> Vec<JoinHandle<()>> {
        (0..RELAY_WORKERS)
            .map(|_| tokio::spawn(relay_loop(self.relay.clone())))
            .collect()
    }
}

/// The outbox row a new order writes in its transaction.
struct OutboxRow<'a> {
    prepared: &'a Prepared,
    items: &'a [Item],
}

impl AlsoInTransaction for OutboxRow<'_> {
    async fn write(&self, tx: &Transaction<'_>, order: &NewOrder) -> Result<(), Error> {
        let event = Event {
            event_id: format!("evt_{}", uuid::Uuid::now_v7().simple()),
            kind: "order.created".to_owned(),
            order: EventOrder {
                order_id: order.order_id.clone(),
                amount: self.prepared.amount,
                currency: self.prepared.currency.clone(),
            },
            items: self.items.to_vec(),
        };
        let payload = serde_json::to_string(&event).expect("event serializes");
        let insert = tx.prepare_cached(INSERT_EVENT).await?;
        tx.execute(&insert, &[&event.event_id, &order.order_id, &payload])
            .await?;
        Ok(())
    }
}

async fn create(
    State(peer): State<Arc<PgOutboxPeer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (prepared, items) = match orders::prepare_with_items(&headers, &body) {
        Ok(p) => p,
        Err(rejection) => return rejection.into_response(),
    };
    let row = OutboxRow {
        prepared: &prepared,
        items: &items,
    };
    match pg::decide(&peer.pool, &prepared, HOME_REGION, &row).await {
        Ok(answer) => {
            let replayed = answer.headers().contains_key(orders::IDEMPOTENT_REPLAYED);
            if answer.status() == StatusCode::CREATED && !replayed {
                peer.relay.new_order.notify_one();
            }
            answer
        }
        Err(e) => orders::unavailable(e),
    }
}

/// One worker: rounds back to back while they are full, a short linger after
/// a partial one, a wait for a new order (or the idle poll) after an empty
/// one, a growing pause after a failed one.
async fn relay_loop(relay: Arc<Relay>) {
    let mut failures: u32 = 0;
    loop {
        let started = tokio::time::Instant::now();
        let pause = match relay.round().await {
            Ok(0) => {
                failures = 0;
                tokio::select! {
                    _ = relay.new_order.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(RELAY_IDLE_POLL_MS)) => {}
                }
                Duration::from_millis(RELAY_LINGER_MS)
            }
            Ok(n) if n >= RELAY_BATCH_ROWS_MAX => {
                failures = 0;
                continue;
            }
            Ok(_) => {
                failures = 0;
                (started + Duration::from_millis(RELAY_LINGER_MS))
                    .saturating_duration_since(tokio::time::Instant::now())
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                eprintln!("relay round failed; backing off: {e}");
                backoff(failures, RELAY_BACKOFF_MS_MAX)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// `PSP_BACKOFF_MS_BASE * 2^attempt`, at most `max_ms`.
fn backoff(attempt: u32, max_ms: u64) -> Duration {
    Duration::from_millis(
        PSP_BACKOFF_MS_BASE
            .saturating_mul(1u64 << attempt.min(20))
            .min(max_ms),
    )
}

/// A taken event and what its charge came to.
struct Delivery {
    id: i64,
    event: Event,
    paid: bool,
}

impl Relay {
    /// Takes one batch, charges for it and records it; returns how many rows
    /// it took. An event whose charge failed stays undelivered; the round
    /// then fails after recording the others, so the worker backs off.
    async fn round(self: &Arc<Self>) -> Result<usize, Error> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| Error::Pool(e.to_string()))?;
        let tx = client.transaction().await?;
        let take = tx.prepare_cached(TAKE_BATCH).await?;
        let rows = tx.query(&take, &[&(RELAY_BATCH_ROWS_MAX as i64)]).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let limit = Arc::new(Semaphore::new(PSP_CONCURRENCY_MAX));
        let mut charges = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        for row in &rows {
            let (id, payload): (i64, String) = (row.get(0), row.get(1));
            let event: Event = match serde_json::from_str(&payload) {
                Ok(event) => event,
                Err(e) => {
                    // Rows are written by this program; an unreadable one is
                    // a bug that no retry fixes. Marked delivered loudly
                    // rather than stalling the outbox behind it.
                    eprintln!("outbox row {id} unreadable, skipped: {e}");
                    unreadable.push(id);
                    continue;
                }
            };
            let permit = limit
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore is never closed");
            let relay = self.clone();
            charges.push(tokio::spawn(async move {
                let paid = charge(&relay.http, &relay.psp_url, &event).await;
                drop(permit);
                paid.map(|paid| Delivery { id, event, paid })
            }));
        }
        let mut delivered = Vec::with_capacity(charges.len());
        let mut first_error = None;
        for task in charges {
            match task.await {
                Ok(Ok(d)) => delivered.push(d),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(format!("charge task failed: {e}"));
                }
            }
        }
        record(&tx, &delivered, &unreadable).await?;
        tx.commit().await?;
        match first_error {
            Some(e) => Err(Error::Provider(e)),
            None => Ok(rows.len()),
        }
    }
}

/// The effects of a batch's delivered events and the delivered mark of those
/// and of the `skipped` rows, in the transaction that locked them.
async fn record(
    tx: &Transaction<'_>,
    delivered: &[Delivery],
    skipped: &[i64],
) -> Result<(), Error> {
    if delivered.is_empty() && skipped.is_empty() {
        return Ok(());
    }
    let event_ids: Vec<&str> = delivered
        .iter()
        .map(|d| d.event.event_id.as_str())
        .collect();
    let order_ids: Vec<&str> = delivered
        .iter()
        .map(|d| d.event.order.order_id.as_str())
        .collect();
    let (mut l_order, mut l_line, mut l_sku, mut l_quantity, mut l_event) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for d in delivered {
        for (line, item) in d.event.items.iter().enumerate() {
            l_order.push(d.event.order.order_id.as_str());
            l_line.push(line as i32);
            l_sku.push(item.sku.as_str());
            l_quantity.push(item.quantity);
            l_event.push(d.event.event_id.as_str());
        }
    }
    let statuses: Vec<&str> = delivered
        .iter()
        .map(|d| if d.paid { "PAID" } else { "PAYMENT_FAILED" })
        .collect();
    let ids: Vec<i64> = delivered
        .iter()
        .map(|d| d.id)
        .chain(skipped.iter().copied())
        .collect();
    let reserve = tx.prepare_cached(RESERVE).await?;
    tx.execute(
        &reserve,
        &[&event_ids, &l_order, &l_line, &l_sku, &l_quantity, &l_event],
    )
    .await?;
    let settle = tx.prepare_cached(SETTLE).await?;
    tx.execute(&settle, &[&event_ids, &order_ids, &statuses])
        .await?;
    let mark = tx.prepare_cached(MARK_DELIVERED).await?;
    tx.execute(&mark, &[&ids]).await?;
    Ok(())
}

#[derive(Deserialize)]
struct Charge {
    status: String,
}

/// The provider's key for `event`'s charge: the same on every delivery.
pub fn charge_key(event: &Event) -> String {
    format!("pg-pay-{}", event.event_id)
}

/// Charges the provider at `base` for `event`'s order, retrying lost answers
/// with the same key; whether the charge succeeded (a decline is `false`).
async fn charge(http: &reqwest::Client, base: &str, event: &Event) -> Result<bool, String> {
    let url = format!("{base}/v1/charges");
    let key = charge_key(event);
    let body = serde_json::json!({
        "order_id": event.order.order_id,
        "amount": event.order.amount,
        "currency": event.order.currency,
    });
    let mut last_error = String::new();
    for attempt in 0..PSP_ATTEMPTS_MAX {
        if attempt > 0 {
            tokio::time::sleep(backoff(attempt, PSP_BACKOFF_MS_MAX)).await;
        }
        let sent = http
            .post(&url)
            .header("Idempotency-Key", &key)
            .timeout(Duration::from_millis(PSP_REQUEST_TIMEOUT_MS))
            .json(&body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                last_error = format!("request failed: {e}");
                continue;
            }
        };
        let status = response.status().as_u16();
        // A lost answer fails here, after the provider committed: the retry
        // with the same key gets the same charge.
        let parsed = match response.bytes().await {
            Ok(bytes) => serde_json::from_slice::<Charge>(&bytes).ok(),
            Err(e) => {
                last_error = format!("answer lost: {e}");
                continue;
            }
        };
        match (status, parsed) {
            (200..=299 | 402, Some(c)) => return Ok(c.status == "succeeded"),
            (400..=499, _) if !matches!(status, 408 | 409 | 425 | 429) => {
                eprintln!(
                    "payment provider refused the charge for {} ({status}); settled as failed",
                    event.order.order_id
                );
                return Ok(false);
            }
            (s, _) => last_error = format!("provider answered {s}"),
        }
    }
    Err(format!(
        "charge for {} not confirmed after {PSP_ATTEMPTS_MAX} attempts: {last_error}",
        event.order.order_id
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyhold_fakepsp::PspConfig;

    fn event(event_id: &str, currency: &str) -> Event {
        Event {
            event_id: event_id.into(),
            kind: "order.created".into(),
            order: EventOrder {
                order_id: format!("ord_{event_id}"),
                amount: 1_000,
                currency: currency.into(),
            },
            items: vec![Item {
                sku: "sku-1".into(),
                quantity: 2,
            }],
        }
    }

    async fn provider(config: PspConfig) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(keyhold_fakepsp::run(config, listener, async {
            let _ = stopped.await;
        }));
        (base, stop)
    }

    #[test]
    fn events_read_back_as_written_and_look_like_keyhold_s() {
        let e = event("evt_1", "EUR");
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), e);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["type"], "order.created");
        assert_eq!(value["order"]["order_id"], "ord_evt_1");
        assert_eq!(value["items"][0]["quantity"], 2);
    }

    /// An event delivered twice (its first batch rolled back after the charge)
    /// is charged once: the second request carries the same key.
    #[tokio::test]
    async fn a_redelivered_charge_is_the_same_charge() {
        let dir = tempfile::tempdir().unwrap();
        let (base, _stop) = provider(PspConfig::new(dir.path())).await;
        let http = reqwest::Client::new();
        let e = event("evt_2", "EUR");
        // Two deliveries of one event, as after a batch rolled back.
        assert!(charge(&http, &base, &e).await.unwrap());
        assert!(charge(&http, &base, &e).await.unwrap());
        let listed: serde_json::Value = http
            .get(format!("{base}/v1/charges"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = listed["data"].as_array().unwrap();
        assert_eq!(data.len(), 1, "{listed}");
        assert_eq!(data[0]["idempotency_key"], charge_key(&e).as_str());
        // A request the provider refuses settles as failed, not forever retried.
        let refused = event("evt_3", "euro");
        assert!(!charge(&http, &base, &refused).await.unwrap());
    }
}
