//! The claims API (contract section 5): generic key ownership with leases, owner
//! tokens and fencing, for work the tenant's own services do.
//!
//! Bodies are checked as strict I-JSON first (the same rules as orders), then read
//! into typed requests. A completion's `response.body` is kept as the exact JSON
//! text the owner sent and replayed byte for byte. A `"survival": "region"`
//! tenant's answers wait for the standby to hold their entry (`survival.rs`).

use super::{json_body, json_response};
use crate::limits::CLAIM_RESPONSE_HEADERS_MAX;
use crate::node::{now, Node};
use crate::problem::ApiError;
use crate::survival;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use keyhold_core::limits::{
    FINGERPRINT_LENGTH_MAX, LEASE_MS_MAX, LEASE_MS_MIN, RESOURCE_ID_LENGTH_MAX,
};
use keyhold_core::scope::Namespace;
use keyhold_core::{
    IdempotencyKey, Operation, Outcome, OwnerToken, Problem, Record, Scope, StoredResponse,
};
use keyhold_store::{ClaimOutcome, CompleteOutcome, HeartbeatOutcome, Logged};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimRequest {
    operation: String,
    key: String,
    fingerprint: String,
    lease_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteRequest {
    operation: String,
    key: String,
    owner_token: String,
    outcome: String,
    #[serde(default)]
    response: Option<ResponseIn>,
    #[serde(default)]
    resource_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseIn {
    status: u16,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Box<RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatRequest {
    operation: String,
    key: String,
    owner_token: String,
    lease_ms: u64,
}

/// Strict checks, then the typed request; serde's message names the field.
async fn typed<T: DeserializeOwned>(
    node: &Node,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Arc<crate::tenants::Tenant>, T), ApiError> {
    let tenant = node.tenants.authenticate(headers)?;
    tenant.check_request_rate()?;
    let (bytes, _) = json_body(node, headers, body).await?;
    let request =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    Ok((tenant, request))
}

fn scope(tenant: &crate::tenants::Tenant, operation: &str, key: &str) -> Result<Scope, ApiError> {
    let operation =
        Operation::parse(operation).map_err(|e| ApiError::invalid("/operation", e.to_string()))?;
    let key = IdempotencyKey::parse(key).map_err(|e| ApiError::invalid("/key", e.to_string()))?;
    Ok(Scope {
        namespace: Namespace::Claims,
        tenant: tenant.id().clone(),
        operation,
        key,
    })
}

fn lease(lease_ms: u64) -> Result<u64, ApiError> {
    if (LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
        Ok(lease_ms)
    } else {
        Err(ApiError::invalid(
            "/lease_ms",
            format!("lease_ms must be from {LEASE_MS_MIN} to {LEASE_MS_MAX}"),
        ))
    }
}

fn owner_token(text: &str) -> Result<OwnerToken, ApiError> {
    OwnerToken::parse(text).map_err(|e| ApiError::invalid("/owner_token", e.to_string()))
}

fn json(status: u16, value: serde_json::Value) -> Response {
    json_response(status, serde_json::to_vec(&value).expect("json serializes"))
}

pub async fn claim(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (tenant, req): (_, ClaimRequest) = typed(&node, &headers, body).await?;
    let scope = scope(&tenant, &req.operation, &req.key)?;
    let lease_ms = lease(req.lease_ms)?;
    let fingerprint_ok = (1..=FINGERPRINT_LENGTH_MAX).contains(&req.fingerprint.len())
        && req.fingerprint.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !fingerprint_ok {
        return Err(ApiError::invalid(
            "/fingerprint",
            format!("fingerprint must be 1 to {FINGERPRINT_LENGTH_MAX} visible ASCII characters"),
        ));
    }
    let existing = node.store().record(&scope).await?;
    if existing.as_ref().is_none_or(|r| !r.is_live(now())) {
        tenant.check_new_key_rate()?;
    }
    let nonce = rand::random();
    let Logged {
        value: outcome,
        index,
    } = node
        .store()
        .claim(
            scope,
            req.fingerprint,
            lease_ms,
            nonce,
            now(),
            node.policy(),
        )
        .await?;
    if matches!(
        outcome,
        ClaimOutcome::Acquired { .. } | ClaimOutcome::Replay { .. }
    ) {
        survival::hold(&node, &tenant, index).await?;
    }
    match outcome {
        ClaimOutcome::Acquired {
            token,
            lease_expires_at,
            recovery,
        } => Ok(json(
            201,
            serde_json::json!({
                "state": "PROCESSING",
                "owner_token": token.to_string(),
                "fencing_token": token.generation,
                "lease_expires_at": lease_expires_at.to_rfc3339(),
                "recovery": recovery,
            }),
        )),
        ClaimOutcome::Replay { record } => Ok(replay(&record)),
        ClaimOutcome::InProgress { retry_after_ms } => {
            Err(ApiError::new(Problem::RequestInProgress).retry_after_ms(retry_after_ms))
        }
        ClaimOutcome::KeyReused => Err(ApiError::new(Problem::IdempotencyKeyReused)),
        ClaimOutcome::Fenced => Err(ApiError::new(Problem::TenantMoving)),
    }
}

/// `{"state", "response": {"status", "headers", "body"}, "resource_id"}` with the
/// body's exact stored text.
fn replay(record: &Record) -> Response {
    let response = record.response.as_ref();
    let body_text = response
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_else(|| "null".to_owned());
    let headers: BTreeMap<&str, &str> = response
        .map(|r| {
            r.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let mut out = String::with_capacity(body_text.len() + 128);
    out.push_str("{\"state\":");
    out.push_str(&serde_json::to_string(record.state.as_str()).expect("string"));
    out.push_str(",\"response\":{\"status\":");
    out.push_str(&response.map_or(0, |r| r.status).to_string());
    out.push_str(",\"headers\":");
    out.push_str(&serde_json::to_string(&headers).expect("map"));
    out.push_str(",\"body\":");
    out.push_str(&body_text);
    out.push_str("},\"resource_id\":");
    out.push_str(&serde_json::to_string(&record.resource_id).expect("option"));
    out.push('}');
    json_response(200, out.into_bytes())
}

pub async fn complete(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (tenant, req): (_, CompleteRequest) = typed(&node, &headers, body).await?;
    let scope = scope(&tenant, &req.operation, &req.key)?;
    let token = owner_token(&req.owner_token)?;
    let outcome = Outcome::parse(&req.outcome).ok_or_else(|| {
        ApiError::invalid(
            "/outcome",
            "outcome must be SUCCEEDED, FAILED_RETRYABLE or FAILED_FINAL",
        )
    })?;
    let response = match req.response {
        None if outcome != Outcome::FailedRetryable => {
            return Err(ApiError::invalid(
                "/response",
                "a response is required for SUCCEEDED and FAILED_FINAL",
            ))
        }
        None => None,
        Some(r) => {
            if !(100..=599).contains(&r.status) {
                return Err(ApiError::invalid(
                    "/response/status",
                    "status must be from 100 to 599",
                ));
            }
            if r.headers.len() > CLAIM_RESPONSE_HEADERS_MAX {
                return Err(ApiError::invalid(
                    "/response/headers",
                    format!("at most {CLAIM_RESPONSE_HEADERS_MAX} headers"),
                ));
            }
            Some(StoredResponse {
                status: r.status,
                headers: r.headers.into_iter().collect(),
                body: r.body.get().as_bytes().to_vec(),
            })
        }
    };
    if req
        .resource_id
        .as_ref()
        .is_some_and(|id| id.len() > RESOURCE_ID_LENGTH_MAX)
    {
        return Err(ApiError::invalid(
            "/resource_id",
            format!("resource_id must be at most {RESOURCE_ID_LENGTH_MAX} bytes"),
        ));
    }
    let completion = keyhold_store::Completion {
        outcome,
        response,
        resource_id: req.resource_id,
    };
    let completed = node
        .store()
        .complete(scope, token, completion, now(), node.policy());
    let Logged { value, index } = completed.await?;
    match value {
        CompleteOutcome::Completed { state } | CompleteOutcome::AlreadyCompleted { state } => {
            survival::hold(&node, &tenant, index).await?;
            Ok(json(200, serde_json::json!({ "state": state.as_str() })))
        }
        CompleteOutcome::Stale => Err(ApiError::new(Problem::StaleOwnerToken)),
        CompleteOutcome::Fenced => Err(ApiError::new(Problem::TenantMoving)),
    }
}

pub async fn heartbeat(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (tenant, req): (_, HeartbeatRequest) = typed(&node, &headers, body).await?;
    let scope = scope(&tenant, &req.operation, &req.key)?;
    let token = owner_token(&req.owner_token)?;
    let lease_ms = lease(req.lease_ms)?;
    let Logged { value, index } = node
        .store()
        .heartbeat(scope, token, lease_ms, now())
        .await?;
    match value {
        HeartbeatOutcome::Extended { lease_expires_at } => {
            survival::hold(&node, &tenant, index).await?;
            Ok(json(
                200,
                serde_json::json!({
                    "state": "PROCESSING",
                    "owner_token": token.to_string(),
                    "lease_expires_at": lease_expires_at.to_rfc3339(),
                }),
            ))
        }
        HeartbeatOutcome::Stale => Err(ApiError::new(Problem::StaleOwnerToken)),
        HeartbeatOutcome::Fenced => Err(ApiError::new(Problem::TenantMoving)),
    }
}
