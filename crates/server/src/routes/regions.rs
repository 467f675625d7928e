//! The admin endpoints of a whole region: an unplanned failover
//! (`POST /admin/v1/regions/{region}/failover`). The failover itself is driven
//! by `crate::failover` on the leader of the target region; this only checks
//! the request and opens the operation, which fences the failed region.

use crate::node::{now, Node};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use keyhold_core::Problem;
use keyhold_registry::standbys::StandbyState;
use keyhold_registry::{Rejection, Request, Response as RegistryResponse};
use serde::Deserialize;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverRequest {
    /// The region to fail over to; the failed region's standby by default, the
    /// only region that holds a copy of it.
    #[serde(default)]
    to: Option<String>,
    /// Fail over even though a node of the region says it is ready, or its
    /// standby is recorded lost.
    #[serde(default)]
    force: bool,
}

/// `POST /admin/v1/regions/{region}/failover {"to"?, "force"?}` → 202 with the
/// operation to poll. 404 for an unknown region; 409 when `to` holds no copy
/// of the region, when the region is healthy (a node of it is ready) or its
/// standby is recorded lost unless `force`, or when a failover of either
/// region is already running.
pub async fn start_failover(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    Path(region): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let (bytes, _) = super::json_body(&node, &headers, body).await?;
    let req: FailoverRequest =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid("", e.to_string()))?;
    if !node.registry().read(|s| s.regions.contains_key(&region)) {
        return Err(ApiError::new(Problem::NotFound).detail(format!("no region {region}")));
    }
    let standby = node.config().standbys.get(&region).cloned();
    let to = match (req.to, standby) {
        (Some(to), Some(standby)) if to == standby => to,
        (Some(to), _) => {
            return Err(ApiError::new(Problem::Conflict)
                .detail(format!("region {to} holds no copy of region {region}")))
        }
        (None, Some(standby)) => standby,
        (None, None) => {
            return Err(ApiError::new(Problem::Conflict)
                .detail(format!("region {region} has no standby region")))
        }
    };
    let standby_state = node.registry().read(|s| s.standby_state(&region));
    if let (false, StandbyState::Lost { since_ms }) = (req.force, standby_state) {
        return Err(ApiError::new(Problem::Conflict).detail(format!(
            "region {to}, the standby of {region}, is recorded lost since {since_ms} ms after \
             the epoch: its copy may lack more than max_standby_lag of what {region} \
             acknowledged; send \"force\": true to fail over to it anyway"
        )));
    }
    if !req.force && crate::failover::region_is_ready(&node, &region).await {
        return Err(ApiError::new(Problem::Conflict).detail(format!(
            "region {region} is healthy (a node of it is ready); send \"force\": true to fail it over anyway"
        )));
    }
    let operation_id = format!("op_{}", uuid::Uuid::now_v7().simple());
    let request = Request::BeginFailover {
        operation_id: operation_id.clone(),
        region: region.clone(),
        to: to.clone(),
        now_ms: now().0,
    };
    let written =
        node.registry().write(request).await.map_err(|e| {
            ApiError::new(Problem::StoreUnavailable).detail(format!("registry: {e}"))
        })?;
    if let RegistryResponse::Rejected { reason } = written.response {
        return Err(match reason {
            Rejection::UnknownRegion { .. } | Rejection::Invalid { .. } => {
                ApiError::invalid("/to", reason.to_string())
            }
            _ => ApiError::new(Problem::Conflict).detail(reason.to_string()),
        });
    }
    metrics::counter!("keyhold_failovers_started_total").increment(1);
    tracing::warn!(%region, %to, operation = %operation_id, "failover begun: the region is fenced");
    Ok(super::moves::accepted(&node, written.log_index, &operation_id).await)
}
