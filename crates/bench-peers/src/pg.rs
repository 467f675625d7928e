//! The PostgreSQL peer: the idempotency table most teams write. A unique
//! constraint decides which attempt wins (`INSERT ... ON CONFLICT DO NOTHING`);
//! the winner creates the order row and stores its response with an `UPDATE`
//! in the same transaction, so order and record commit together or not at all.
//! A loser reads the record in a fresh statement (under READ COMMITTED the
//! `INSERT` waited for the winner's commit, and a new statement's snapshot sees
//! it): same fingerprint replays, another one is 422. The full peer
//! (`pg_outbox`) answers through the same `decide`, adding its outbox row to
//! the transaction (`AlsoInTransaction`); this one adds nothing, so its
//! statements are those of earlier runs.

use crate::orders::{self, NewOrder, Prepared, OPERATION};
use crate::Error;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Transaction};
use std::sync::Arc;

/// Connections in the pool: as many as the benchmark's largest client count, so
/// no request queues for a connection.
pub const POOL_CONNECTIONS_DEFAULT: usize = 64;
/// A request never holds a connection longer than this in one statement (a
/// waiter on a stuck winner gives up instead of pinning the pool).
pub const STATEMENT_TIMEOUT_MS: u64 = 5_000;
const HOME_REGION: &str = "peer-postgres";

/// The schema, created if missing. The same statements are in `scripts/bench`'s
/// pgbench script.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant          text        NOT NULL,
    operation       text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    status_code     int,
    location        text,
    response_body   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, operation, idempotency_key)
);
CREATE TABLE IF NOT EXISTS orders (
    order_id        text        PRIMARY KEY,
    tenant          text        NOT NULL,
    client_order_id text        NOT NULL,
    cart_id         text        NOT NULL,
    amount          bigint      NOT NULL,
    currency        text        NOT NULL,
    status          text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, client_order_id)
);";

const CLAIM: &str =
    "INSERT INTO idempotency_keys (tenant, operation, idempotency_key, fingerprint) \
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
const CREATE_ORDER: &str = "INSERT INTO orders \
     (order_id, tenant, client_order_id, cart_id, amount, currency, status) \
     VALUES ($1, $2, $3, $4, $5, $6, 'CONFIRMED')";
const STORE_RESPONSE: &str = "UPDATE idempotency_keys \
     SET status_code = 201, location = $4, response_body = $5 \
     WHERE tenant = $1 AND operation = $2 AND idempotency_key = $3";
const READ_RECORD: &str = "SELECT fingerprint, status_code, location, response_body \
     FROM idempotency_keys WHERE tenant = $1 AND operation = $2 AND idempotency_key = $3";

#[derive(Clone)]
pub struct PgPeer {
    pool: Pool,
}

impl PgPeer {
    /// Connects a pool to `url` (`host=... port=... user=... dbname=...` or a
    /// `postgresql://` URL) and creates the schema.
    pub async fn connect(url: &str, connections: usize) -> Result<PgPeer, Error> {
        let pool = connect_pool(url, connections, SCHEMA).await?;
        Ok(PgPeer { pool })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/orders", post(create))
            .with_state(Arc::new(self))
    }
}

/// A pool of `connections` to `url` whose statements time out after
/// `STATEMENT_TIMEOUT_MS`, with `schema` created.
pub(crate) async fn connect_pool(
    url: &str,
    connections: usize,
    schema: &str,
) -> Result<Pool, Error> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config.options(format!("-c statement_timeout={STATEMENT_TIMEOUT_MS}"));
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(connections)
        .build()
        .map_err(|e| Error::Pool(e.to_string()))?;
    let client = pool.get().await.map_err(|e| Error::Pool(e.to_string()))?;
    client.batch_execute(schema).await?;
    Ok(pool)
}

async fn create(State(peer): State<Arc<PgPeer>>, headers: HeaderMap, body: Bytes) -> Response {
    let prepared = match orders::prepare(&headers, &body) {
        Ok(p) => p,
        Err(rejection) => return rejection.into_response(),
    };
    match decide(&peer.pool, &prepared, HOME_REGION, &Nothing).await {
        Ok(answer) => answer,
        Err(e) => orders::unavailable(e),
    }
}

/// What a new order's transaction writes besides its key, its order row and
/// its stored response, before the commit.
pub(crate) trait AlsoInTransaction {
    async fn write(&self, tx: &Transaction<'_>, order: &NewOrder) -> Result<(), Error>;
}

/// The minimal peer writes nothing more.
struct Nothing;

impl AlsoInTransaction for Nothing {
    async fn write(&self, _: &Transaction<'_>, _: &NewOrder) -> Result<(), Error> {
        Ok(())
    }
}

/// The answer to `p`: claim its key, or replay or refuse by the record that
/// holds it. A claim writes the order and `also` in the same transaction.
pub(crate) async fn decide(
    pool: &Pool,
    p: &Prepared,
    home_region: &str,
    also: &impl AlsoInTransaction,
) -> Result<Response, Error> {
    let mut client = pool.get().await.map_err(|e| Error::Pool(e.to_string()))?;
    let scope: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&p.tenant, &OPERATION, &p.key];
    {
        let tx = client.transaction().await?;
        let claim = tx.prepare_cached(CLAIM).await?;
        let claimed = tx
            .execute(&claim, &[&p.tenant, &OPERATION, &p.key, &p.fingerprint])
            .await?;
        if claimed == 1 {
            let order = orders::new_order(p, home_region);
            let insert = tx.prepare_cached(CREATE_ORDER).await?;
            let inserted = tx
                .execute(
                    &insert,
                    &[
                        &order.order_id,
                        &p.tenant,
                        &p.client_order_id,
                        &p.cart_id,
                        &p.amount,
                        &p.currency,
                    ],
                )
                .await;
            if let Err(e) = inserted {
                // The business key is taken under another idempotency key: the
                // transaction rolls back (dropping it does), releasing the claim.
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    return Ok(orders::problem(
                        409,
                        "client-order-id-conflict",
                        "client_order_id already used",
                    ));
                }
                return Err(e.into());
            }
            also.write(&tx, &order).await?;
            let store = tx.prepare_cached(STORE_RESPONSE).await?;
            tx.execute(
                &store,
                &[&p.tenant, &OPERATION, &p.key, &order.location, &order.body],
            )
            .await?;
            tx.commit().await?;
            return Ok(orders::created(
                &p.fingerprint,
                &order.location,
                order.body,
                false,
            ));
        }
        tx.rollback().await?;
    }
    let read = client.prepare_cached(READ_RECORD).await?;
    let Some(row) = client.query_opt(&read, &scope).await? else {
        // The winner rolled back between our INSERT and this read; the client
        // retries and will claim it.
        return Ok(orders::problem(
            409,
            "request-in-progress",
            "Request in progress",
        ));
    };
    let fingerprint: String = row.get(0);
    if fingerprint != p.fingerprint {
        return Ok(orders::problem(
            422,
            "idempotency-key-reused",
            "Idempotency-Key reused with another request",
        ));
    }
    let status: Option<i32> = row.get(1);
    let location: Option<String> = row.get(2);
    let body: Option<String> = row.get(3);
    match (status, location, body) {
        (Some(201), Some(location), Some(body)) => {
            Ok(orders::created(&p.fingerprint, &location, body, true))
        }
        _ => Ok(orders::problem(
            409,
            "request-in-progress",
            "Request in progress",
        )),
    }
}
