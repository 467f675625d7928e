//! The HTTP surface: `POST /v1/charges`, `GET /v1/charges`,
//! `GET /v1/charges/by-key/{key}`, `GET /healthz`.
//!
//! Handlers validate, decide the random parts (decline, lost answer), hand the
//! durable part to the store, and turn its outcome into the answer. An answer
//! is lost only after the store has made the charge durable, which is the
//! failure a payments client must survive.

use crate::charge::{self, Charge, Invalid, Status};
use crate::connection::LoseAnswer;
use crate::limits::BODY_BYTES_MAX;
use crate::store::{Outcome, Store, Stored};
use crate::Error;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rand::Rng;
use std::sync::Arc;

/// Header marking an answer that repeats a stored one.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    pub store: Store,
    pub drop_response_rate: f64,
    pub decline_rate: f64,
    pub refuse_replay_rate: f64,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/charges", get(list_charges).post(create_charge))
        .route("/v1/charges/by-key/{key}", get(charge_by_key))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(app)
}

async fn healthz() -> Response {
    json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned())
}

async fn create_charge(
    State(app): State<Arc<App>>,
    ConnectInfo(lose): ConnectInfo<LoseAnswer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let key = match charge::parse_idempotency_key(
        headers.get("idempotency-key").map(HeaderValue::as_bytes),
    ) {
        Ok(key) => key,
        Err(invalid) => return refuse(StatusCode::BAD_REQUEST, &invalid),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "body_too_large"
            } else {
                "invalid_request"
            };
            let invalid = Invalid {
                code,
                message: rejection.body_text(),
            };
            return refuse(rejection.status(), &invalid);
        }
    };
    let request = match charge::parse_request(&body) {
        Ok(request) => request,
        Err(invalid) => return refuse(StatusCode::BAD_REQUEST, &invalid),
    };
    let fingerprint = charge::fingerprint(&request);
    let decline_rate = app.decline_rate;
    let outcome = app
        .store
        .charge(&key, &fingerprint, |_seq| {
            let status = if rand::thread_rng().gen_bool(decline_rate) {
                Status::Failed
            } else {
                Status::Succeeded
            };
            let charge = Charge::new(request, key.clone(), status);
            Ok((status.http_status(), serde_json::to_string(&charge)?))
        })
        .await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => return internal(&error),
    };
    let (stored, replayed) = match outcome {
        Outcome::Created(stored) => (stored, false),
        Outcome::Replayed(_) if rand::thread_rng().gen_bool(app.refuse_replay_rate) => {
            tracing::info!(idempotency_key = %key, "replay refused (fault injection)");
            let invalid = Invalid {
                code: "idempotency_key_expired",
                message: "this Idempotency-Key is no longer known here".into(),
            };
            return refuse(StatusCode::BAD_REQUEST, &invalid);
        }
        Outcome::Replayed(stored) => (stored, true),
        Outcome::KeyReused => {
            let invalid = Invalid {
                code: "idempotency_key_reused",
                message: "this Idempotency-Key was used with a different request body".into(),
            };
            return refuse(StatusCode::UNPROCESSABLE_ENTITY, &invalid);
        }
    };
    if rand::thread_rng().gen_bool(app.drop_response_rate) {
        lose.lose();
        tracing::info!(idempotency_key = %key, replayed, "charge committed, answer dropped");
    } else {
        tracing::debug!(idempotency_key = %key, replayed, status = stored.status, "charge answered");
    }
    answer(stored, replayed)
}

async fn list_charges(State(app): State<Arc<App>>) -> Response {
    let store = app.store.clone();
    let all = match tokio::task::spawn_blocking(move || store.list()).await {
        Ok(Ok(all)) => all,
        Ok(Err(error)) => return internal(&error),
        Err(join) => return internal(&Error::Task(join.to_string())),
    };
    // The stored bodies are JSON objects the provider wrote itself.
    let bodies: Vec<&str> = all.iter().map(|stored| stored.body.as_str()).collect();
    json(
        StatusCode::OK,
        format!("{{\"data\":[{}]}}", bodies.join(",")),
    )
}

/// The charge created under one idempotency key: how a client that lost an
/// answer learns what happened without sending the charge again.
async fn charge_by_key(State(app): State<Arc<App>>, Path(key): Path<String>) -> Response {
    let found = match app.store.by_key(&key).await {
        Ok(found) => found,
        Err(error) => return internal(&error),
    };
    match found {
        Some(stored) => json(StatusCode::OK, stored.body),
        None => {
            let invalid = Invalid {
                code: "not_found",
                message: "no charge was made with this Idempotency-Key".into(),
            };
            refuse(StatusCode::NOT_FOUND, &invalid)
        }
    }
}

fn answer(stored: Stored, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json(status, stored.body);
    if replayed {
        response
            .headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    response
}

fn refuse(status: StatusCode, invalid: &Invalid) -> Response {
    let body = serde_json::json!({ "error": invalid.code, "message": invalid.message });
    json(status, body.to_string())
}

fn internal(error: &Error) -> Response {
    tracing::error!(%error, "fake psp failed");
    let invalid = Invalid {
        code: "internal",
        message: error.to_string(),
    };
    refuse(StatusCode::INTERNAL_SERVER_ERROR, &invalid)
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
