//! What both storage peers share: the subset of keyhold's order contract they
//! implement (bearer token taken as the tenant as-is, `Idempotency-Key`, loose
//! field checks, the fingerprint of `Spec::orders()`), the order body, and the
//! answers.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use keyhold_fingerprint::Spec;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// The contract's bounds of an `Idempotency-Key`.
pub const KEY_LENGTH_MAX: usize = 255;
/// Loose field bounds (keyhold checks more; the peers check what a typical
/// handler would).
pub const FIELD_LENGTH_MAX: usize = 64;
/// Item lines an order may have (keyhold's own bound).
pub const ITEMS_MAX: usize = 100;
/// The operation both peers store keys under.
pub const OPERATION: &str = "POST:/v1/orders";
/// Sent with every 409 in progress and 503, like keyhold.
pub const RETRY_AFTER_SECONDS: u64 = 1;

pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
pub const IDEMPOTENCY_FINGERPRINT: HeaderName = HeaderName::from_static("idempotency-fingerprint");

fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(Spec::orders)
}

/// A request that passed the checks.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The bearer token, taken as the tenant id.
    pub tenant: String,
    pub key: String,
    /// `sha256:<hex>` of the canonical body.
    pub fingerprint: String,
    pub client_order_id: String,
    pub cart_id: String,
    pub amount: i64,
    pub currency: String,
}

/// An error answer in problem+json, like keyhold's.
pub fn problem(status: u16, slug: &str, title: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("https://keyhold.dev/problems/{slug}"),
        "title": title,
        "status": status,
    });
    let mut response = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response();
    if matches!(status, 409 | 429 | 503) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    }
    response
}

pub fn unavailable(error: impl std::fmt::Display) -> Response {
    eprintln!("store error: {error}");
    problem(503, "store-unavailable", "Store unavailable")
}

/// A request refused before any storage was touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub slug: &'static str,
    pub title: &'static str,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        problem(self.status, self.slug, self.title)
    }
}

const fn reject(status: u16, slug: &'static str, title: &'static str) -> Rejection {
    Rejection {
        status,
        slug,
        title,
    }
}

/// One item line of an order, as the full PostgreSQL peer's event carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub sku: String,
    pub quantity: i64,
}

/// Authentication, key, body: the checks a typical handler makes.
pub fn prepare(headers: &HeaderMap, body: &[u8]) -> Result<Prepared, Rejection> {
    prepare_parsed(headers, body).map(|(prepared, _)| prepared)
}

/// `prepare`, and the order's item lines (none when `items` is absent; each
/// with a `sku` and a `quantity` of at least 1), for a peer whose
/// downstream needs them. The minimal peers do not look at them.
pub fn prepare_with_items(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Prepared, Vec<Item>), Rejection> {
    let (prepared, value) = prepare_parsed(headers, body)?;
    let items = match value.get("items") {
        None => Vec::new(),
        Some(items) => serde_json::from_value::<Vec<Item>>(items.clone())
            .ok()
            .filter(|items| {
                items.len() <= ITEMS_MAX
                    && items
                        .iter()
                        .all(|i| (1..=FIELD_LENGTH_MAX).contains(&i.sku.len()) && i.quantity >= 1)
            })
            .ok_or_else(|| reject(400, "invalid-request", "Invalid request"))?,
    };
    Ok((prepared, items))
}

/// The checks of `prepare`, with the body's parsed JSON.
fn prepare_parsed(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Prepared, serde_json::Value), Rejection> {
    let tenant = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| reject(401, "unauthenticated", "Unauthenticated"))?
        .to_owned();
    let key = headers
        .get("idempotency-key")
        .ok_or_else(|| reject(400, "idempotency-key-missing", "Idempotency-Key missing"))?
        .to_str()
        .ok()
        .map(|k| k.trim().trim_matches('"'))
        .filter(|k| {
            (1..=KEY_LENGTH_MAX).contains(&k.len()) && k.bytes().all(|b| (0x21..=0x7e).contains(&b))
        })
        .ok_or_else(|| reject(400, "idempotency-key-invalid", "Idempotency-Key invalid"))?
        .to_owned();
    let invalid = || reject(400, "invalid-request", "Invalid request");
    let strict = keyhold_fingerprint::parse(body).map_err(|_| invalid())?;
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| invalid())?;
    let text = |name: &str| {
        value
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|s| (1..=FIELD_LENGTH_MAX).contains(&s.len()))
            .map(str::to_owned)
    };
    let (Some(client_order_id), Some(cart_id), Some(currency)) =
        (text("client_order_id"), text("cart_id"), text("currency"))
    else {
        return Err(invalid());
    };
    let amount = value
        .get("amount")
        .and_then(|v| v.as_i64())
        .filter(|a| *a >= 1)
        .ok_or_else(invalid)?;
    let prepared = Prepared {
        tenant,
        key,
        fingerprint: spec().fingerprint(&strict).as_str().to_owned(),
        client_order_id,
        cart_id,
        amount,
        currency,
    };
    Ok((prepared, value))
}

/// A new order: its id, `Location` and body, shaped like keyhold's.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub order_id: String,
    pub location: String,
    pub body: String,
}

pub fn new_order(p: &Prepared, home_region: &str) -> NewOrder {
    let order_id = format!("ord_{}", uuid::Uuid::now_v7().simple());
    let body = serde_json::json!({
        "order_id": order_id,
        "client_order_id": p.client_order_id,
        "cart_id": p.cart_id,
        "amount": p.amount,
        "currency": p.currency,
        "status": "CONFIRMED",
        "home_region": home_region,
        "created_at": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
    })
    .to_string();
    NewOrder {
        location: format!("/v1/orders/{order_id}"),
        order_id,
        body,
    }
}

/// The 201 of a creation, or its replay with `Idempotent-Replayed: true`.
pub fn created(fingerprint: &str, location: &str, body: String, replayed: bool) -> Response {
    let mut response = (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(fingerprint) {
        headers.insert(IDEMPOTENCY_FINGERPRINT, v);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: Option<&str>, key: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert(
                header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        if let Some(k) = key {
            h.insert("idempotency-key", k.parse().unwrap());
        }
        h
    }

    const BODY: &[u8] = br#"{"client_order_id":"c-1","cart_id":"k","amount":5,"currency":"EUR","metadata":{"a":1}}"#;

    #[test]
    fn checks_and_fingerprint() {
        let p = prepare(&headers(Some("t1"), Some("\"k-1\"")), BODY).unwrap();
        assert_eq!((p.tenant.as_str(), p.key.as_str()), ("t1", "k-1"));
        // The same digest keyhold computes for the same body.
        let strict = keyhold_fingerprint::parse(BODY).unwrap();
        assert_eq!(p.fingerprint, Spec::orders().fingerprint(&strict).as_str());
        let status = |r: Result<Prepared, Rejection>| r.unwrap_err().status;
        assert_eq!(status(prepare(&headers(None, Some("k")), BODY)), 401);
        assert_eq!(status(prepare(&headers(Some("t"), None), BODY)), 400);
        assert_eq!(
            status(prepare(&headers(Some("t"), Some("k")), b"{\"amount\":0}")),
            400
        );
        assert_eq!(
            status(prepare(&headers(Some("t"), Some("k")), b"nope")),
            400
        );
    }

    #[test]
    fn item_lines_for_the_peer_that_needs_them() {
        let h = headers(Some("t1"), Some("k"));
        let body = br#"{"client_order_id":"c","cart_id":"k","amount":5,"currency":"EUR","items":[{"sku":"a","quantity":2}]}"#;
        let (p, items) = prepare_with_items(&h, body).unwrap();
        assert_eq!(p.amount, 5);
        assert_eq!(
            items,
            vec![Item {
                sku: "a".into(),
                quantity: 2
            }]
        );
        assert!(prepare_with_items(&h, BODY).unwrap().1.is_empty());
        let bad = br#"{"client_order_id":"c","cart_id":"k","amount":5,"currency":"EUR","items":[{"sku":"a","quantity":0}]}"#;
        assert_eq!(prepare_with_items(&h, bad).unwrap_err().status, 400);
        // The minimal peers do not look at the lines.
        assert!(prepare(&h, bad).is_ok());
    }

    #[test]
    fn order_bodies_look_like_keyhold_s() {
        let p = prepare(&headers(Some("t1"), Some("k")), BODY).unwrap();
        let order = new_order(&p, "peer");
        let body: serde_json::Value = serde_json::from_str(&order.body).unwrap();
        for field in [
            "order_id",
            "client_order_id",
            "cart_id",
            "amount",
            "currency",
            "status",
            "home_region",
            "created_at",
        ] {
            assert!(body.get(field).is_some(), "{field}");
        }
        assert_eq!(order.location, format!("/v1/orders/{}", order.order_id));
    }
}
