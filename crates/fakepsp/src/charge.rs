//! What a charge is: the validated request, its fingerprint, and the charge
//! object the provider answers with and lists.
//!
//! Validation is plain functions over bytes and strings, so the HTTP layer only
//! maps their `Invalid` errors to 400s. The fingerprint is a SHA-256 over a
//! canonical rendering of the parsed request (object keys sorted at every
//! depth), so a retry that serializes the same request with other key order or
//! whitespace is still "the same body".

use crate::limits::{AMOUNT_CENTS_MAX, IDEMPOTENCY_KEY_BYTES_MAX, ORDER_ID_BYTES_MAX};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::time::SystemTime;

/// Why a request was refused, with a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

impl Invalid {
    fn new(code: &'static str, message: impl Into<String>) -> Invalid {
        Invalid {
            code,
            message: message.into(),
        }
    }
}

/// A charge request as the client sends it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// Checks an `Idempotency-Key` header value: 1 to `IDEMPOTENCY_KEY_BYTES_MAX`
/// visible ASCII characters (no spaces, no controls).
pub fn parse_idempotency_key(value: Option<&[u8]>) -> Result<String, Invalid> {
    let code = "idempotency_key_invalid";
    let Some(bytes) = value else {
        return Err(Invalid::new(code, "the Idempotency-Key header is required"));
    };
    if bytes.is_empty() || bytes.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(Invalid::new(
            code,
            format!("the Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} characters"),
        ));
    }
    if !bytes.iter().all(|b| b.is_ascii_graphic()) {
        return Err(Invalid::new(
            code,
            "the Idempotency-Key must be visible ASCII characters only",
        ));
    }
    // Visible ASCII is valid UTF-8.
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// Parses and validates a charge request body.
pub fn parse_request(body: &[u8]) -> Result<ChargeRequest, Invalid> {
    let code = "invalid_request";
    let request: ChargeRequest = serde_json::from_slice(body)
        .map_err(|e| Invalid::new(code, format!("the body is not a valid charge request: {e}")))?;
    if request.order_id.is_empty() || request.order_id.len() > ORDER_ID_BYTES_MAX {
        return Err(Invalid::new(
            code,
            format!("order_id must be 1 to {ORDER_ID_BYTES_MAX} bytes"),
        ));
    }
    if request.amount == 0 || request.amount > AMOUNT_CENTS_MAX {
        return Err(Invalid::new(
            code,
            format!("amount must be an integer from 1 to {AMOUNT_CENTS_MAX} (minor units)"),
        ));
    }
    let iso =
        request.currency.len() == 3 && request.currency.bytes().all(|b| b.is_ascii_uppercase());
    if !iso {
        return Err(Invalid::new(
            code,
            "currency must be three upper-case letters (ISO 4217)".to_owned(),
        ));
    }
    Ok(request)
}

/// SHA-256 (hex) of the request's canonical rendering.
pub fn fingerprint(request: &ChargeRequest) -> String {
    let mut object = Map::new();
    object.insert("order_id".into(), Value::from(request.order_id.clone()));
    object.insert("amount".into(), Value::from(request.amount));
    object.insert("currency".into(), Value::from(request.currency.clone()));
    if let Some(metadata) = &request.metadata {
        object.insert("metadata".into(), Value::Object(metadata.clone()));
    }
    let mut text = String::new();
    write_canonical(&Value::Object(object), &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Writes `value` as JSON with object keys sorted at every depth, whatever
/// order the map type keeps them in.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Whether the provider accepted the payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Succeeded,
    Failed,
}

impl Status {
    /// The HTTP status of the answer that creates (or replays) such a charge.
    pub fn http_status(self) -> u16 {
        match self {
            Status::Succeeded => 201,
            Status::Failed => 402,
        }
    }
}

/// The charge object: the answer body of `POST /v1/charges` and an entry of
/// `GET /v1/charges`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    pub status: Status,
    pub idempotency_key: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl Charge {
    /// A new charge with a fresh id, created now.
    pub fn new(request: ChargeRequest, idempotency_key: String, status: Status) -> Charge {
        Charge {
            id: format!("ch_{}", uuid::Uuid::new_v4().simple()),
            order_id: request.order_id,
            amount: request.amount,
            currency: request.currency,
            status,
            idempotency_key,
            created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            metadata: request.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_bounds() {
        assert!(parse_idempotency_key(None).is_err());
        assert!(parse_idempotency_key(Some(b"")).is_err());
        assert!(parse_idempotency_key(Some(b"has space")).is_err());
        assert!(parse_idempotency_key(Some("é".as_bytes())).is_err());
        let longest = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX);
        assert_eq!(
            parse_idempotency_key(Some(longest.as_bytes())).as_deref(),
            Ok(longest.as_str())
        );
        let too_long = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1);
        assert!(parse_idempotency_key(Some(too_long.as_bytes())).is_err());
    }

    #[test]
    fn request_validation() {
        let ok = br#"{"order_id":"o1","amount":100,"currency":"EUR"}"#;
        assert!(parse_request(ok).is_ok());
        // Any ISO currency, and amounts up to keyhold's own limit.
        let usd = br#"{"order_id":"o1","amount":1000000000000000,"currency":"USD"}"#;
        assert!(parse_request(usd).is_ok());
        for bad in [
            &br#"{"order_id":"o1","amount":0,"currency":"EUR"}"#[..],
            br#"{"order_id":"o1","amount":-5,"currency":"EUR"}"#,
            br#"{"order_id":"o1","amount":1.5,"currency":"EUR"}"#,
            br#"{"order_id":"o1","amount":100,"currency":"EURO"}"#,
            br#"{"order_id":"","amount":100,"currency":"EUR"}"#,
            br#"{"order_id":"o1","amount":100,"currency":"EUR","extra":1}"#,
            br#"{"order_id":"o1","amount":100,"currency":"EUR","metadata":[]}"#,
            br#"not json"#,
        ] {
            let err = parse_request(bad).unwrap_err();
            assert_eq!(err.code, "invalid_request");
        }
    }

    #[test]
    fn fingerprint_ignores_key_order_and_whitespace() {
        let a = parse_request(
            br#"{"order_id":"o1","amount":100,"currency":"EUR","metadata":{"a":1,"b":{"y":2,"x":3}}}"#,
        )
        .unwrap();
        let b = parse_request(
            br#"{ "metadata": {"b": {"x": 3, "y": 2}, "a": 1}, "currency": "EUR", "amount": 100, "order_id": "o1" }"#,
        )
        .unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = parse_request(br#"{"order_id":"o1","amount":101,"currency":"EUR"}"#).unwrap();
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }
}
