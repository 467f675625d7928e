//! Layers that make every answer of the node one a client can rely on, whatever
//! the handler did: the request's framing and header size are checked before any
//! route runs, the whole request is bounded in time, every error answer is
//! problem+json, and the connection is either left clean for the next request or
//! closed with `Connection: close` — never closed silently.
//!
//! Why the last one needs a layer: a handler that answers before it read the
//! body (401, 415, a missing key, 503 `tenant-moving`) leaves unread bytes on the
//! connection. hyper then closes the connection after the answer, and whether
//! that answer says `Connection: close` depends on a race inside hyper. Here the
//! body is wrapped so the layer can tell whether it was read to its end; if not,
//! it reads and discards the rest (bounded by `DRAIN_BYTES_MAX` and `DRAIN_MS`),
//! and only when that fails does it add `Connection: close` itself.

use crate::http::RefusedHead;
use crate::limits::{DRAIN_BYTES_MAX, DRAIN_MS, HEADERS_MAX, HEADER_BYTES_MAX, REQUEST_TIMEOUT_MS};
use crate::problem::{ApiError, PROBLEM_JSON};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use keyhold_core::Problem;
use keyhold_httphead::Refusal;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// Paths of the node-to-node endpoints.
const INTERNAL_PREFIX: &str = "/internal/";

/// Refuses requests whose framing or headers the node will not interpret: a
/// head the connection's check refused (`crate::http`: ambiguous framing, bad
/// bytes, hyper's limits; the request is its stand-in, and the connection is
/// closed: what follows on it cannot be framed with certainty), more header
/// lines or bytes than the node accepts (431). These come before
/// authentication: they are about the message, not the caller.
pub async fn check_message(request: Request, next: Next) -> Response {
    if let Some(&RefusedHead(refusal)) = request.extensions().get::<RefusedHead>() {
        let problem = match refusal {
            Refusal::Invalid(_) => Problem::InvalidRequest,
            Refusal::HeadersTooLarge(_) => Problem::HeadersTooLarge,
            Refusal::UriTooLong => Problem::UriTooLong,
        };
        let mut response = ApiError::new(problem)
            .detail(refusal.detail())
            .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > HEADERS_MAX || bytes > HEADER_BYTES_MAX {
        return ApiError::new(Problem::HeadersTooLarge)
            .detail(format!(
                "at most {HEADERS_MAX} header lines and {HEADER_BYTES_MAX} bytes of headers"
            ))
            .into_response();
    }
    next.run(request).await
}

/// Bounds the whole request. A request still running after `REQUEST_TIMEOUT_MS`
/// waits on the store or on another region (a slow body is refused earlier by
/// `read_body`), so the answer is 503 `store-unavailable`: the outcome is
/// unknown and the client retries with its key. Node-to-node move endpoints
/// are not clients' requests: a fence waits for the relay (up to
/// `MOVE_DRAIN_WAIT_MS`) and an import writes a whole page; their callers set
/// their own timeouts.
pub async fn bound_time(request: Request, next: Next) -> Response {
    if request.uri().path().starts_with(INTERNAL_PREFIX) {
        return next.run(request).await;
    }
    let limit = Duration::from_millis(REQUEST_TIMEOUT_MS);
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            metrics::counter!("keyhold_http_request_timeouts_total").increment(1);
            ApiError::new(Problem::StoreUnavailable)
                .detail(format!(
                    "the request did not finish within {REQUEST_TIMEOUT_MS} ms"
                ))
                .into_response()
        }
    }
}

/// Every error answer is problem+json. The node's own answers already are; this
/// catches what the framework writes by itself (a query string or path that
/// does not deserialize, a body the demo's file server refuses) and keeps its
/// text as the `detail`.
pub async fn problems_only(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if status.as_u16() < 400 || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match body.collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let mut problem = ApiError::new(problem_for(status));
    if !text.trim().is_empty() {
        problem = problem.detail(text.trim().to_owned());
    }
    let mut out = problem.into_response();
    // Keep what the framework said about the connection and methods.
    for name in [header::CONNECTION, header::ALLOW] {
        if let Some(value) = parts.headers.get(&name) {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

/// The problem type for a status the framework chose.
fn problem_for(status: StatusCode) -> Problem {
    match status.as_u16() {
        401 => Problem::Unauthenticated,
        404 => Problem::NotFound,
        405 => Problem::MethodNotAllowed,
        408 => Problem::RequestTimeout,
        413 => Problem::PayloadTooLarge,
        415 => Problem::UnsupportedMediaType,
        414 => Problem::UriTooLong,
        431 => Problem::HeadersTooLarge,
        429 => Problem::RateLimited,
        s if s >= 500 => Problem::Internal,
        _ => Problem::InvalidRequest,
    }
}

/// Leaves the connection clean after every answer: see the module docs.
pub async fn settle_body(request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let shared = Arc::new(Shared {
        body: Mutex::new(Some(body)),
        ended: AtomicBool::new(false),
    });
    let request = Request::from_parts(parts, Body::new(Tracked(shared.clone())));
    let mut response = next.run(request).await;
    if shared.ended.load(Ordering::Acquire) {
        return response;
    }
    let rest = shared.body.lock().expect("body lock").take();
    let settled = match rest {
        Some(body) => drain(body).await,
        None => false,
    };
    if !settled {
        metrics::counter!("keyhold_http_unread_body_closes_total").increment(1);
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads and discards what is left of a body, bounded in bytes and time;
/// returns whether it reached the end.
async fn drain(mut body: Body) -> bool {
    let read = async {
        let mut drained = 0usize;
        loop {
            if body.is_end_stream() {
                return true;
            }
            match body.frame().await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    drained += frame.data_ref().map_or(0, Bytes::len);
                    if drained > DRAIN_BYTES_MAX {
                        return false;
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_millis(DRAIN_MS), read)
        .await
        .unwrap_or(false)
}

/// The request body, shared between the handler (which reads it through
/// [`Tracked`]) and [`settle_body`] (which drains what the handler left).
struct Shared {
    body: Mutex<Option<Body>>,
    /// The handler read the body to its end.
    ended: AtomicBool,
}

struct Tracked(Arc<Shared>);

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let shared = &self.0;
        let mut guard = shared.body.lock().expect("body lock");
        let Some(body) = guard.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            shared.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let guard = self.0.body.lock().expect("body lock");
        let ended = guard.as_ref().is_none_or(Body::is_end_stream);
        if ended {
            self.0.ended.store(true, Ordering::Release);
        }
        ended
    }

    fn size_hint(&self) -> SizeHint {
        let guard = self.0.body.lock().expect("body lock");
        guard
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::middleware;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    /// A handler that answers before reading the body, like a 401 or a 503
    /// `tenant-moving`.
    fn early_answer() -> Router {
        Router::new()
            .route("/", post(|| async { ApiError::new(Problem::TenantMoving) }))
            .layer(middleware::from_fn(settle_body))
    }

    /// A body that never ends.
    struct Endless;

    impl HttpBody for Endless {
        type Data = Bytes;
        type Error = axum::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
            Poll::Pending
        }
    }

    fn post_with(body: Body) -> Request {
        Request::builder()
            .method("POST")
            .uri("/")
            .body(body)
            .expect("request")
    }

    #[tokio::test]
    async fn an_unread_small_body_is_drained_and_the_connection_kept() {
        let response = early_answer()
            .oneshot(post_with(Body::from(vec![b'x'; 70 * 1024])))
            .await
            .expect("answer");
        assert_eq!(response.status(), 503);
        assert!(response.headers().get(header::CONNECTION).is_none());
    }

    #[tokio::test]
    async fn an_unread_endless_or_oversized_body_closes_the_connection_and_says_so() {
        let bodies = [
            Body::new(Endless),
            Body::from(vec![b'x'; DRAIN_BYTES_MAX + 64 * 1024]),
        ];
        for body in bodies {
            let response = early_answer()
                .oneshot(post_with(body))
                .await
                .expect("answer");
            assert_eq!(response.status(), 503);
            let connection = response.headers().get(header::CONNECTION);
            assert_eq!(connection.map(|v| v.as_bytes()), Some(&b"close"[..]));
        }
    }

    #[tokio::test]
    async fn framework_rejections_become_problems() {
        let app = Router::new()
            .route(
                "/",
                post(|| async { (StatusCode::BAD_REQUEST, "Failed to deserialize") }),
            )
            .layer(middleware::from_fn(problems_only));
        let response = app.oneshot(post_with(Body::empty())).await.expect("answer");
        assert_eq!(response.status(), 400);
        assert_eq!(
            response
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(PROBLEM_JSON.as_bytes())
        );
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let j: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(j["type"], Problem::InvalidRequest.type_uri());
        assert_eq!(j["detail"], "Failed to deserialize");
    }

    #[tokio::test]
    async fn too_many_headers_are_a_431_problem() {
        let app = Router::new()
            .route("/", post(|| async { "ok" }))
            .layer(middleware::from_fn(check_message));
        let mut request = post_with(Body::empty());
        for i in 0..=HEADERS_MAX {
            request.headers_mut().insert(
                axum::http::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).expect("name"),
                HeaderValue::from_static("v"),
            );
        }
        let response = app.oneshot(request).await.expect("answer");
        assert_eq!(response.status(), 431);
    }
}
