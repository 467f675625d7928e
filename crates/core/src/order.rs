//! Orders, the reference operation: request validation, business markers and the
//! create / replay / refuse decision of contract section 4.

use crate::limits::{
    AMOUNT_MAX, CLIENT_ORDER_ID_LENGTH_MAX, ITEMS_MAX, METADATA_BYTES_MAX, ORDER_STRING_LENGTH_MAX,
    QUANTITY_MAX,
};
use crate::record::{Record, RecordState, StoredResponse};
use crate::scope::TenantId;
use crate::time::UnixMillis;
use keyhold_fingerprint::Value;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderStatus {
    Confirmed,
    Paid,
    PaymentFailed,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Confirmed => "CONFIRMED",
            OrderStatus::Paid => "PAID",
            OrderStatus::PaymentFailed => "PAYMENT_FAILED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub sku: String,
    pub quantity: u64,
}

/// A validated `POST /v1/orders` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRequest {
    pub client_order_id: String,
    pub cart_id: String,
    pub amount: u64,
    pub currency: String,
    pub shipping_address_id: Option<String>,
    pub items: Vec<Item>,
    pub quote_id: Option<String>,
    /// Canonical JSON of `metadata`, if given. Kept as text: it is not
    /// fingerprinted and keyhold never looks inside it.
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub tenant: TenantId,
    pub request: OrderRequest,
    pub status: OrderStatus,
    pub home_region: String,
    pub created_at: UnixMillis,
}

/// The body of every order answer, with the contract's fields in a fixed order so
/// the same order always serializes to the same bytes.
#[derive(Serialize)]
struct OrderBody<'a> {
    order_id: &'a str,
    client_order_id: &'a str,
    cart_id: &'a str,
    amount: u64,
    currency: &'a str,
    status: &'a str,
    home_region: &'a str,
    created_at: String,
}

impl Order {
    fn body(&self) -> OrderBody<'_> {
        OrderBody {
            order_id: &self.order_id,
            client_order_id: &self.request.client_order_id,
            cart_id: &self.request.cart_id,
            amount: self.request.amount,
            currency: &self.request.currency,
            status: self.status.as_str(),
            home_region: &self.home_region,
            created_at: self.created_at.to_rfc3339(),
        }
    }

    pub fn body_json(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_vec(&self.body()).expect("order body serializes")
    }

    /// The `order.created` event payload: the order body plus what downstream
    /// consumers need (the item lines), so an event is self-contained.
    pub fn event_json(&self, event_id: &str) -> Vec<u8> {
        #[derive(Serialize)]
        struct Event<'a> {
            event_id: &'a str,
            #[serde(rename = "type")]
            kind: &'static str,
            order: OrderBody<'a>,
            items: &'a [Item],
        }
        let event = Event {
            event_id,
            kind: "order.created",
            order: self.body(),
            items: &self.request.items,
        };
        serde_json::to_vec(&event).expect("event serializes")
    }

    pub fn location(&self) -> String {
        format!("/v1/orders/{}", self.order_id)
    }

    /// The answer to the request that created the order (201, its location
    /// and body), kept in its record and replayed byte for byte to retries.
    pub fn created_response(&self) -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("location".to_owned(), self.location())],
            body: self.body_json(),
        }
    }
}

/// A long-lived business marker: `(tenant, client_order_id) -> order`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub order_id: String,
    pub fingerprint: String,
    pub expires_at: UnixMillis,
}

impl Marker {
    pub fn is_live(&self, now: UnixMillis) -> bool {
        now < self.expires_at
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderDecision {
    /// First request: write order, record, marker and outbox event together.
    Create,
    /// Same scope and fingerprint, completed: replay the stored response.
    Replay,
    /// Same scope, different fingerprint.
    KeyReused,
    /// Same scope, first attempt still running.
    InProgress { retry_after_ms: u64 },
    /// New scope, live marker with the same fingerprint: answer with that order.
    MarkerHit { order_id: String },
    /// New scope, live marker with another fingerprint.
    MarkerConflict,
}

/// Contract section 4, in the order the rows are decided: the record of the scope
/// first, then the business marker.
pub fn decide_order(
    record: Option<&Record>,
    marker: Option<&Marker>,
    fingerprint: &str,
    now: UnixMillis,
) -> OrderDecision {
    if let Some(record) = record.filter(|r| r.is_live(now)) {
        if record.fingerprint != fingerprint {
            return OrderDecision::KeyReused;
        }
        match record.state {
            RecordState::Succeeded | RecordState::FailedFinal => return OrderDecision::Replay,
            RecordState::Processing if now < record.lease_expires_at => {
                return OrderDecision::InProgress {
                    retry_after_ms: now.until(record.lease_expires_at),
                }
            }
            // A retryable failure or an abandoned attempt: decide afresh below.
            RecordState::Processing | RecordState::FailedRetryable => {}
        }
    }
    match marker.filter(|m| m.is_live(now)) {
        Some(m) if m.fingerprint == fingerprint => OrderDecision::MarkerHit {
            order_id: m.order_id.clone(),
        },
        Some(_) => OrderDecision::MarkerConflict,
        None => OrderDecision::Create,
    }
}

/// One failed field rule, reported in the problem's `errors` member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// RFC 6901 pointer to the offending field (`""` for the whole body).
    pub pointer: String,
    pub detail: String,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            pointer: pointer.into(),
            detail: detail.into(),
        }
    }
}

const ORDER_FIELDS: [&str; 8] = [
    "client_order_id",
    "cart_id",
    "amount",
    "currency",
    "shipping_address_id",
    "items",
    "quote_id",
    "metadata",
];

impl OrderRequest {
    /// Applies every field rule of contract section 4 and reports all failures at
    /// once, so a client fixes its request in one round trip.
    pub fn from_value(body: &Value) -> Result<OrderRequest, Vec<FieldError>> {
        let mut errors = Vec::new();
        let Some(members) = body.as_object() else {
            return Err(vec![FieldError::new("", "the body must be a JSON object")]);
        };
        for (name, _) in members {
            if !ORDER_FIELDS.contains(&name.as_str()) {
                errors.push(FieldError::new(
                    format!("/{}", escape_pointer(name)),
                    "unknown field",
                ));
            }
        }
        let client_order_id = required_string(body, "client_order_id", &mut errors, |s| {
            (1..=CLIENT_ORDER_ID_LENGTH_MAX).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
        });
        let cart_id = required_string(body, "cart_id", &mut errors, |s| {
            (1..=ORDER_STRING_LENGTH_MAX).contains(&s.chars().count())
        });
        let amount = match body.get("amount") {
            None => {
                errors.push(FieldError::new("/amount", "required"));
                None
            }
            Some(v) => match integer(v).filter(|a| (1..=AMOUNT_MAX).contains(a)) {
                Some(a) => Some(a),
                None => {
                    errors.push(FieldError::new(
                        "/amount",
                        format!("must be an integer from 1 to {AMOUNT_MAX}"),
                    ));
                    None
                }
            },
        };
        let currency = required_string(body, "currency", &mut errors, |s| {
            s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase())
        });
        let shipping_address_id = optional_string(body, "shipping_address_id", &mut errors);
        let quote_id = optional_string(body, "quote_id", &mut errors);
        let items = items(body, &mut errors);
        let metadata = match body.get("metadata") {
            None => None,
            Some(v @ Value::Object(_)) => {
                let text = keyhold_fingerprint::canonicalize(v);
                if text.len() > METADATA_BYTES_MAX {
                    errors.push(FieldError::new(
                        "/metadata",
                        format!("must be at most {METADATA_BYTES_MAX} bytes"),
                    ));
                }
                Some(text)
            }
            Some(_) => {
                errors.push(FieldError::new("/metadata", "must be an object"));
                None
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        // Every required field was present and valid, or `errors` would not be empty.
        Ok(OrderRequest {
            client_order_id: client_order_id.expect("validated"),
            cart_id: cart_id.expect("validated"),
            amount: amount.expect("validated"),
            currency: currency.expect("validated"),
            shipping_address_id,
            items,
            quote_id,
            metadata,
        })
    }
}

fn integer(v: &Value) -> Option<u64> {
    let x = v.as_f64()?;
    // Exact for every integer below 2^53, which covers AMOUNT_MAX and QUANTITY_MAX.
    (x.fract() == 0.0 && (0.0..9.0e15).contains(&x)).then_some(x as u64)
}

fn required_string(
    body: &Value,
    name: &str,
    errors: &mut Vec<FieldError>,
    rule: impl Fn(&str) -> bool,
) -> Option<String> {
    let pointer = format!("/{name}");
    match body.get(name) {
        None => {
            errors.push(FieldError::new(pointer, "required"));
            None
        }
        Some(v) => match v.as_str() {
            Some(s) if rule(s) => Some(s.to_owned()),
            _ => {
                errors.push(FieldError::new(pointer, field_rule(name)));
                None
            }
        },
    }
}

fn optional_string(body: &Value, name: &str, errors: &mut Vec<FieldError>) -> Option<String> {
    let v = body.get(name)?;
    match v.as_str() {
        Some(s) if s.chars().count() <= ORDER_STRING_LENGTH_MAX => Some(s.to_owned()),
        _ => {
            errors.push(FieldError::new(format!("/{name}"), field_rule(name)));
            None
        }
    }
}

fn field_rule(name: &str) -> String {
    match name {
        "client_order_id" => {
            format!("must be 1 to {CLIENT_ORDER_ID_LENGTH_MAX} characters of [A-Za-z0-9_.:-]")
        }
        "currency" => "must be three upper-case letters (ISO 4217)".to_owned(),
        "cart_id" => format!("must be a string of 1 to {ORDER_STRING_LENGTH_MAX} characters"),
        _ => format!("must be a string of at most {ORDER_STRING_LENGTH_MAX} characters"),
    }
}

fn items(body: &Value, errors: &mut Vec<FieldError>) -> Vec<Item> {
    let Some(v) = body.get("items") else {
        return Vec::new();
    };
    let Some(list) = v.as_array() else {
        errors.push(FieldError::new("/items", "must be an array"));
        return Vec::new();
    };
    if list.len() > ITEMS_MAX {
        errors.push(FieldError::new(
            "/items",
            format!("at most {ITEMS_MAX} items"),
        ));
        return Vec::new();
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let Some(members) = item.as_object() else {
            errors.push(FieldError::new(format!("/items/{i}"), "must be an object"));
            continue;
        };
        if let Some((name, _)) = members.iter().find(|(n, _)| n != "sku" && n != "quantity") {
            errors.push(FieldError::new(
                format!("/items/{i}/{}", escape_pointer(name)),
                "unknown field",
            ));
        }
        let sku = item
            .get("sku")
            .and_then(Value::as_str)
            .filter(|s| (1..=ORDER_STRING_LENGTH_MAX).contains(&s.chars().count()));
        let quantity = item
            .get("quantity")
            .and_then(integer)
            .filter(|q| (1..=QUANTITY_MAX).contains(q));
        match (sku, quantity) {
            (Some(sku), Some(quantity)) => out.push(Item {
                sku: sku.to_owned(),
                quantity,
            }),
            (sku, quantity) => {
                if sku.is_none() {
                    errors.push(FieldError::new(
                        format!("/items/{i}/sku"),
                        format!("required string of 1 to {ORDER_STRING_LENGTH_MAX} characters"),
                    ));
                }
                if quantity.is_none() {
                    errors.push(FieldError::new(
                        format!("/items/{i}/quantity"),
                        format!("required integer from 1 to {QUANTITY_MAX}"),
                    ));
                }
            }
        }
    }
    out
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a create answers, and every retry replays: the store keeps it in
    /// the order's record, so its form must not drift between releases.
    #[test]
    fn the_created_response_is_201_with_the_location_and_the_body() {
        let order = Order {
            order_id: "ord_1".into(),
            tenant: TenantId::parse("t1").unwrap(),
            request: OrderRequest {
                client_order_id: "c1".into(),
                cart_id: "cart".into(),
                amount: 100,
                currency: "EUR".into(),
                shipping_address_id: None,
                items: vec![],
                quote_id: None,
                metadata: None,
            },
            status: OrderStatus::Confirmed,
            home_region: "eu".into(),
            created_at: UnixMillis(0),
        };
        let response = order.created_response();
        assert_eq!(response.status, 201);
        assert_eq!(
            response.headers,
            vec![("location".to_owned(), "/v1/orders/ord_1".to_owned())]
        );
        assert_eq!(
            String::from_utf8(response.body).unwrap(),
            "{\"order_id\":\"ord_1\",\"client_order_id\":\"c1\",\"cart_id\":\"cart\",\
             \"amount\":100,\"currency\":\"EUR\",\"status\":\"CONFIRMED\",\
             \"home_region\":\"eu\",\"created_at\":\"1970-01-01T00:00:00.000Z\"}"
        );
    }
}
