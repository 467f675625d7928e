//! Turning `keyhold_core::Problem` into RFC 9457 `application/problem+json`
//! responses, with `Retry-After` on every 409-in-progress, 429 and 503.

use crate::limits::RETRY_AFTER_SECONDS;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use keyhold_core::{FieldError, Problem};
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug, Clone)]
pub struct ApiError {
    pub problem: Problem,
    pub detail: Option<String>,
    pub errors: Vec<FieldError>,
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    pub fn new(problem: Problem) -> ApiError {
        let retry_after_seconds = problem.is_retryable().then_some(RETRY_AFTER_SECONDS);
        ApiError {
            problem,
            detail: None,
            errors: Vec::new(),
            retry_after_seconds,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> ApiError {
        self.detail = Some(detail.into());
        self
    }

    pub fn errors(mut self, errors: Vec<FieldError>) -> ApiError {
        self.errors = errors;
        self
    }

    /// Retry-After from a wait in milliseconds, rounded up to whole seconds.
    pub fn retry_after_ms(mut self, ms: u64) -> ApiError {
        self.retry_after_seconds = Some(ms.div_ceil(1000).max(1));
        self
    }

    /// An `invalid-request` naming one offending field.
    pub fn invalid(pointer: &str, detail: impl Into<String>) -> ApiError {
        let detail = detail.into();
        ApiError::new(Problem::InvalidRequest)
            .detail(detail.clone())
            .errors(vec![FieldError::new(pointer, detail)])
    }
}

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> ApiError {
        ApiError::new(problem)
    }
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'static str,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "<[FieldError]>::is_empty")]
    errors: &'a [FieldError],
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.problem.status();
        let body = Body {
            type_uri: self.problem.type_uri(),
            title: self.problem.title(),
            status,
            detail: self.detail.as_deref(),
            errors: &self.errors,
        };
        let bytes = serde_json::to_vec(&body).expect("problem serializes");
        let mut response = (
            StatusCode::from_u16(status).expect("problem statuses are valid"),
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            bytes,
        )
            .into_response();
        // Read by the access-log and metrics middleware (the slug of an error
        // answer, without parsing the body).
        response.extensions_mut().insert(self.problem);
        if let Some(seconds) = self.retry_after_seconds {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<keyhold_store::Error> for ApiError {
    fn from(e: keyhold_store::Error) -> ApiError {
        if let keyhold_store::Error::CommandTooLarge { .. } = e {
            // Refused before the log, and refused again on a retry: not a
            // store that is down.
            tracing::warn!(error = %e, "a command larger than a region log entry refused");
            return ApiError::new(Problem::PayloadTooLarge).detail(e.to_string());
        }
        tracing::warn!(error = %e, "store could not confirm");
        ApiError::new(Problem::StoreUnavailable).detail(e.to_string())
    }
}
