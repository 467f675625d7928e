//! The routes of a failed-over region's reconciliation (`crate::reconcile`).
//!
//! `GET /admin/v1/regions/{region}/reconciliation` answers on any node: the
//! report lives in the region's own store, so a node of another region asks a
//! node of that region (`keyhold-scope: local`), as the fanned-out admin calls
//! do. While the region cannot be reached its reconciliation is `pending`: it
//! happens when the region is back.
//!
//! `POST /internal/v1/reconcile/{tenant_id}/markers` (node credential, on the
//! region's leader): the reconciling region asks the tenant's new home which
//! orders it holds under some client order ids, answered from its business
//! markers, to fill the orphans' `duplicate_of`.

use super::admin::{is_local_scope, KEYHOLD_SCOPE};
use super::{json_response, read_body};
use crate::limits::{RECONCILE_MARKER_BODY_BYTES_MAX, RECONCILE_MARKER_IDS_MAX};
use crate::node::Node;
use crate::operations::failovers_done_from;
use crate::peers::{Call, CallKind, To};
use crate::problem::ApiError;
use crate::reconcile::{view, MarkerAnswer, MarkerQuery};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use keyhold_core::{Problem, TenantId};
use std::collections::BTreeMap;
use std::sync::Arc;

fn ok_json(value: &serde_json::Value) -> Response {
    json_response(200, serde_json::to_vec(value).expect("json"))
}

/// `GET /admin/v1/regions/{region}/reconciliation`: the reconciliation of the
/// newest failover away from `region`; 404 when it never failed over.
pub async fn get_reconciliation(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(region): Path<String>,
) -> Result<Response, ApiError> {
    if !node.registry().regions().iter().any(|r| r.name == region) {
        return Err(ApiError::new(Problem::NotFound).detail(format!("no region {region:?}")));
    }
    let Some(newest) = failovers_done_from(node.registry(), &region).pop() else {
        return Err(
            ApiError::new(Problem::NotFound).detail(format!("region {region} never failed over"))
        );
    };
    if region == node.region() || is_local_scope(&headers) {
        let report = node.store().reconciliation(&newest.operation_id)?;
        return Ok(ok_json(&view(report.as_ref(), &newest.operation_id)));
    }
    let call = Call::get(
        CallKind::Admin,
        format!("/admin/v1/regions/{region}/reconciliation"),
    )
    .with_admin_token(&node.config().admin_token)
    .header(KEYHOLD_SCOPE, HeaderValue::from_static("local"));
    let answered = match node.peers().call_json(To::Region(&region), &call).await {
        Ok(view) => Some(view),
        Err(e) => {
            if let Some(status) = e.status() {
                tracing::warn!(region, %status, "reconciliation view not given");
            }
            None
        }
    };
    // Unreachable: the region has not come back, so it has not reconciled.
    Ok(ok_json(
        &answered.unwrap_or_else(|| view(None, &newest.operation_id)),
    ))
}

/// `POST /internal/v1/reconcile/{tenant_id}/markers`: per client order id, the
/// order this store holds for it (by marker, else order index), or null.
pub async fn markers(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(tenant_id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = TenantId::parse(&tenant_id).map_err(|_| ApiError::new(Problem::NotFound))?;
    let bytes = read_body(&headers, body, RECONCILE_MARKER_BODY_BYTES_MAX).await?;
    let query: MarkerQuery =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    if query.client_order_ids.len() > RECONCILE_MARKER_IDS_MAX {
        return Err(ApiError::invalid(
            "/client_order_ids",
            format!("at most {RECONCILE_MARKER_IDS_MAX} ids per call"),
        ));
    }
    let mut orders = BTreeMap::new();
    for client_order_id in query.client_order_ids {
        let order_id = node
            .store()
            .order_id_by_marker(&tenant, &client_order_id)
            .await?;
        orders.insert(client_order_id, order_id);
    }
    let answer = serde_json::to_value(MarkerAnswer { orders }).expect("json");
    Ok(ok_json(&answer))
}
