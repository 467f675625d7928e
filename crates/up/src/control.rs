//! The control API of a local cluster (contract section 10, "Processes"), on
//! `control_url`: kill, start, isolate and heal nodes, isolate and heal
//! regions (section 11 adds the nodes' isolation). For drills
//! and tests only; every call needs the admin token as a bearer token, and
//! answers 200 once done (killed: reaped; started: listening; isolated or
//! healed: proxies switched and connections across the cut closed). Killing a
//! node that is down, starting one that runs, isolating an isolated region or
//! node and healing a healed one are no-ops that answer 200 too, so a drill can repeat
//! a step. Every error is problem+json.

use crate::layout::write_json;
use crate::limits::REROUTE_SETTLE_MS;
use crate::links::Links;
use crate::nodes::{Nodes, Running};
use crate::Error;
use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use keyhold_clusterfile::ClusterFile;
use keyhold_core::Problem;
use keyhold_server::ApiError;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The running cluster as the control API and the supervisor see it.
pub struct Cluster {
    pub nodes: Nodes,
    pub links: Links,
    /// cluster.json as written when ready; pids are filled in on each publish.
    pub file: ClusterFile,
    pub file_path: PathBuf,
    regions: Vec<String>,
    /// Serialises writes of cluster.json.
    publishing: std::sync::Mutex<()>,
}

impl Cluster {
    pub fn new(
        nodes: Nodes,
        links: Links,
        file: ClusterFile,
        file_path: PathBuf,
        regions: Vec<String>,
    ) -> Cluster {
        Cluster {
            nodes,
            links,
            file,
            file_path,
            regions,
            publishing: std::sync::Mutex::new(()),
        }
    }

    /// Writes cluster.json with every node's current pid.
    pub fn publish(&self) -> Result<(), Error> {
        let _one_at_a_time = self.publishing.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = self.file.clone();
        for (entry, pid) in file.nodes.iter_mut().zip(self.nodes.pids()) {
            entry.pid = pid;
        }
        write_json(&self.file_path, &file)
    }

    fn node(&self, node_id: &str) -> Result<usize, ApiError> {
        node_id
            .parse()
            .ok()
            .and_then(|id| self.nodes.index_of(id))
            .ok_or_else(|| {
                ApiError::new(Problem::NotFound)
                    .detail(format!("no node {node_id:?} in this cluster"))
            })
    }

    fn region(&self, name: &str) -> Result<usize, ApiError> {
        self.regions.iter().position(|r| r == name).ok_or_else(|| {
            ApiError::new(Problem::NotFound).detail(format!("no region {name:?} in this cluster"))
        })
    }
}

pub fn router(cluster: Arc<Cluster>) -> Router {
    Router::new()
        .route("/v1/nodes/{node_id}/kill", post(kill))
        .route("/v1/nodes/{node_id}/start", post(start))
        .route("/v1/nodes/{node_id}/isolate", post(isolate_node))
        .route("/v1/nodes/{node_id}/heal", post(heal_node))
        .route("/v1/regions/{region}/isolate", post(isolate))
        .route("/v1/regions/{region}/heal", post(heal))
        .fallback(|| async {
            ApiError::new(Problem::NotFound).detail("the control API has no such route")
        })
        .layer(axum::middleware::from_fn_with_state(
            cluster.clone(),
            require_admin,
        ))
        .with_state(cluster)
}

/// 401 `unauthenticated` unless the caller presents the admin token.
async fn require_admin(
    State(cluster): State<Arc<Cluster>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let expected = cluster.file.admin_token.as_bytes();
    let ok = presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(expected)))
        && request
            .headers()
            .get_all(header::AUTHORIZATION)
            .iter()
            .count()
            == 1;
    if !ok {
        return ApiError::new(Problem::Unauthenticated)
            .detail("the control API needs the cluster's admin token")
            .into_response();
    }
    next.run(request).await
}

fn node_answer(cluster: &Cluster, i: usize, running: Running) -> Result<Json<Value>, ApiError> {
    if let Err(e) = cluster.publish() {
        tracing::warn!(error = %e, "cannot rewrite cluster.json");
    }
    let plan = &cluster.nodes.plans()[i];
    let (state, pid) = match running {
        Running::Yes { pid } => ("running", Some(pid)),
        Running::No => ("stopped", None),
    };
    Ok(Json(json!({
        "node_id": plan.id,
        "region": plan.region,
        "api_url": plan.api_url(),
        "state": state,
        "pid": pid,
    })))
}

fn failed(e: Error) -> ApiError {
    ApiError::new(Problem::Internal).detail(e.to_string())
}

async fn kill(
    State(cluster): State<Arc<Cluster>>,
    Path(node_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let i = cluster.node(&node_id)?;
    let running = cluster.nodes.kill(i).await.map_err(failed)?;
    node_answer(&cluster, i, running)
}

async fn start(
    State(cluster): State<Arc<Cluster>>,
    Path(node_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let i = cluster.node(&node_id)?;
    let running = cluster.nodes.start(i).await.map_err(failed)?;
    node_answer(&cluster, i, running)
}

async fn isolate(
    State(cluster): State<Arc<Cluster>>,
    Path(region): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_isolated(cluster, region, true).await
}

async fn heal(
    State(cluster): State<Arc<Cluster>>,
    Path(region): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_isolated(cluster, region, false).await
}

async fn set_isolated(
    cluster: Arc<Cluster>,
    region: String,
    isolated: bool,
) -> Result<Json<Value>, ApiError> {
    let r = cluster.region(&region)?;
    cluster.links.set_region_isolated(r, isolated);
    tokio::time::sleep(Duration::from_millis(REROUTE_SETTLE_MS)).await;
    tracing::info!(region, isolated, "region links switched");
    Ok(Json(json!({
        "region": region,
        "isolated": cluster.links.is_region_isolated(r),
    })))
}

async fn isolate_node(
    State(cluster): State<Arc<Cluster>>,
    Path(node_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_node_isolated(cluster, node_id, true).await
}

async fn heal_node(
    State(cluster): State<Arc<Cluster>>,
    Path(node_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_node_isolated(cluster, node_id, false).await
}

async fn set_node_isolated(
    cluster: Arc<Cluster>,
    node_id: String,
    isolated: bool,
) -> Result<Json<Value>, ApiError> {
    let k = cluster.node(&node_id)?;
    cluster.links.set_node_isolated(k, isolated);
    tokio::time::sleep(Duration::from_millis(REROUTE_SETTLE_MS)).await;
    let plan = &cluster.nodes.plans()[k];
    tracing::info!(node_id = plan.id, isolated, "node links switched");
    Ok(Json(json!({
        "node_id": plan.id,
        "region": plan.region,
        "isolated": cluster.links.is_node_isolated(k),
    })))
}
