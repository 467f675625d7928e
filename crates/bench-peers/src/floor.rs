//! The HTTP floor: the same server stack (axum, tokio, one route) reading the
//! request body and answering a fixed 200-byte JSON body, with no storage and
//! no checks. Whatever an idempotent service costs, it costs on top of this.

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;

/// Size of the fixed answer, about an order body's.
pub const FLOOR_BODY_BYTES: usize = 200;

/// `{"order_id":"ord_floor","padding":"xxx..."}`, exactly 200 bytes.
pub fn floor_body() -> Bytes {
    let head = r#"{"order_id":"ord_floor","padding":""#;
    let tail = r#""}"#;
    let padding = "x".repeat(FLOOR_BODY_BYTES - head.len() - tail.len());
    Bytes::from(format!("{head}{padding}{tail}"))
}

pub fn router() -> Router {
    let body = floor_body();
    Router::new().fallback(move |request: Bytes| {
        let body = body.clone();
        async move {
            // Read the request like the peers do, then drop it.
            drop(request);
            answer(body)
        }
    })
}

fn answer(body: Bytes) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_body_is_200_bytes_of_json() {
        let body = super::floor_body();
        assert_eq!(body.len(), super::FLOOR_BODY_BYTES);
        assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
    }
}
