//! Changing who belongs to the cluster: `POST /admin/v1/nodes` adds a node to the
//! registry and to its region's store group, `POST /admin/v1/nodes/{id}/remove`
//! takes it out of both. This is how a dead node is replaced: remove it, wipe its
//! data dir, start it with `start = "join"`, add it back. A node must be removed
//! before it comes back empty: a voter that forgot its log and its vote could
//! let a leader be elected without an acknowledged command.
//!
//! Each change runs on its group's leader: the registry part on the registry's
//! leader, the region part on the leader of the node's region group, through
//! `/internal/v1/membership/{registry,region}` (node credential). An added node
//! is first a learner that catches up (from the log, or by a snapshot where the
//! leader purged it) and only then a voter. Both calls are idempotent: a call
//! that ran out of time while the node was still catching up answers 202, and
//! calling again finishes it.

use super::leader::not_leader;
use super::{json_response, read_body};
use crate::limits::{MEMBERSHIP_CALL_WAIT_MS, MEMBERSHIP_CATCH_UP_WAIT_MS, REGION_LEADER_POLL_MS};
use crate::node::Node;
use crate::peers::{Call, CallKind, Failure, To};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use keyhold_core::Problem;
use keyhold_registry::NodeInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One membership change, as sent to a group's leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Change {
    Add {
        node_id: u64,
        region: String,
        api_addr: String,
        raft_addr: String,
    },
    Remove {
        node_id: u64,
    },
}

/// Where a change got to in one group.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Standing {
    /// It votes.
    Voter,
    /// It was added and is still catching up; not a voter yet.
    CatchingUp,
    /// It is not a member.
    Removed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddRequest {
    node_id: u64,
    region: String,
    api_addr: String,
    raft_addr: String,
}

/// `POST /admin/v1/nodes`: adds a node (started with `start = "join"`) to the
/// registry and to its region's store group. 200 once it votes in both; 202
/// while it is still catching up (call again).
pub async fn add_node(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    super::require_json(&headers)?;
    let bytes = read_body(&headers, body, node.config().body_bytes_max).await?;
    let request: AddRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(Problem::InvalidRequest).detail(format!("the body is not a node: {e}"))
    })?;
    if !node
        .registry()
        .regions()
        .iter()
        .any(|r| r.name == request.region)
    {
        return Err(ApiError::new(Problem::InvalidRequest)
            .detail(format!("region {:?} is not registered", request.region)));
    }
    for addr in [&request.api_addr, &request.raft_addr] {
        crate::config::check_node_address(addr)
            .map_err(|e| ApiError::new(Problem::InvalidRequest).detail(e))?;
    }
    let change = Change::Add {
        node_id: request.node_id,
        region: request.region.clone(),
        api_addr: request.api_addr,
        raft_addr: request.raft_addr,
    };
    let registry = at_registry_leader(&node, &change).await?;
    let region = at_region_leader(&node, &request.region, &change).await?;
    answer(request.node_id, &request.region, registry, region)
}

/// `POST /admin/v1/nodes/{node_id}/remove`: takes a node out of its region's
/// store group and out of the registry. Remove a dead node this way before its
/// replacement starts on an empty data dir.
pub async fn remove_node(
    State(node): State<Arc<Node>>,
    Path(node_id): Path<u64>,
) -> Result<Response, ApiError> {
    // The registry knows the node's region while it is a member; once it is
    // out of the registry, the region group may still hold it.
    let region = match node.registry().nodes().get(&node_id) {
        Some(info) => info.region.clone(),
        // Out of the registry already: it may still be in this region's group.
        None => {
            let (_, members) = node.store().group().members();
            let info = members.get(&node_id).ok_or_else(|| {
                ApiError::new(Problem::NotFound).detail(format!("node {node_id} is not a member"))
            })?;
            info.region.clone()
        }
    };
    let change = Change::Remove { node_id };
    let region_standing = at_region_leader(&node, &region, &change).await?;
    let registry_standing = at_registry_leader(&node, &change).await?;
    answer(node_id, &region, registry_standing, region_standing)
}

fn answer(
    node_id: u64,
    region: &str,
    registry: Standing,
    region_group: Standing,
) -> Result<Response, ApiError> {
    let status = if registry == Standing::CatchingUp || region_group == Standing::CatchingUp {
        202
    } else {
        200
    };
    let body = serde_json::json!({
        "node_id": node_id,
        "region": region,
        "registry": registry,
        "region_group": region_group,
    });
    Ok(json_response(
        status,
        serde_json::to_vec(&body).expect("json"),
    ))
}

/// Runs `change` on the registry's leader: here when this node leads it, else
/// by its internal endpoint, retried while the leader is unknown or changing.
async fn at_registry_leader(node: &Node, change: &Change) -> Result<Standing, ApiError> {
    let deadline = Instant::now() + Duration::from_millis(MEMBERSHIP_CALL_WAIT_MS);
    loop {
        let registry = node.registry();
        let leader = registry.leader();
        if leader == Some(registry.id()) {
            match apply_to_registry(node, change).await {
                Err(Refusal::NotLeader) => {}
                Err(Refusal::Failed(e)) => return Err(e),
                Ok(standing) => return Ok(standing),
            }
        } else if let Some(info) = leader.and_then(|id| registry.nodes().get(&id).cloned()) {
            let to = To::Node(&info.api_addr);
            let path = "/internal/v1/membership/registry";
            if let Some(standing) = send(node, to, path, change, Problem::StoreUnavailable).await? {
                return Ok(standing);
            }
        }
        if Instant::now() >= deadline {
            return Err(ApiError::new(Problem::StoreUnavailable)
                .detail("the registry has no reachable leader"));
        }
        tokio::time::sleep(Duration::from_millis(REGION_LEADER_POLL_MS)).await;
    }
}

/// Runs `change` on the leader of `region`'s store group, through any node of the
/// region (a follower sends it on).
async fn at_region_leader(
    node: &Node,
    region: &str,
    change: &Change,
) -> Result<Standing, ApiError> {
    let deadline = Instant::now() + Duration::from_millis(MEMBERSHIP_CALL_WAIT_MS);
    loop {
        let path = "/internal/v1/membership/region";
        let sent = send(
            node,
            To::Region(region),
            path,
            change,
            Problem::OwnerUnreachable,
        );
        if let Some(standing) = sent.await? {
            return Ok(standing);
        }
        if Instant::now() >= deadline {
            return Err(ApiError::new(Problem::OwnerUnreachable)
                .detail(format!("region {region}'s store has no reachable leader")));
        }
        tokio::time::sleep(Duration::from_millis(REGION_LEADER_POLL_MS)).await;
    }
}

/// Sends a change to a group's leader through `to`'s internal endpoint.
/// `None`: nobody there leads, or nobody could be reached; try again. A
/// refusal of the leader (the last voter, a node of another region) is passed
/// on as it is (`PeerError::into_api`), since a 503 would have automation
/// retry a permanent refusal forever; `failure` is what any other failure is.
async fn send(
    node: &Node,
    to: To<'_>,
    path: &str,
    change: &Change,
    failure: Problem,
) -> Result<Option<Standing>, ApiError> {
    let call = Call::post(CallKind::Membership, path).json(change);
    match node.peers().call_json(to, &call).await {
        Ok(standing) => Ok(Some(standing)),
        Err(e) if e.delivered_nothing() && !matches!(e.failure, Failure::NoNode) => Ok(None),
        Err(e) => Err(e.into_api(failure)),
    }
}

/// Why a group's leader did not apply a change.
enum Refusal {
    NotLeader,
    Failed(ApiError),
}

fn refusal_answer(refusal: Refusal) -> Response {
    match refusal {
        Refusal::NotLeader => not_leader(),
        Refusal::Failed(e) => e.into_response(),
    }
}

fn standing_answer(standing: Standing) -> Response {
    json_response(200, serde_json::to_vec(&standing).expect("json"))
}

/// `POST /internal/v1/membership/registry` (node credential): applies a change
/// to the registry's membership on its leader.
pub async fn registry_change(
    State(node): State<Arc<Node>>,
    axum::Json(change): axum::Json<Change>,
) -> Response {
    match apply_to_registry(&node, &change).await {
        Ok(standing) => standing_answer(standing),
        Err(refusal) => refusal_answer(refusal),
    }
}

/// `POST /internal/v1/membership/region` (node credential; run on the region
/// group's leader by its route layer): applies a change to the region group.
pub async fn region_change(
    State(node): State<Arc<Node>>,
    axum::Json(change): axum::Json<Change>,
) -> Response {
    match apply_to_region(&node, &change).await {
        Ok(standing) => standing_answer(standing),
        Err(refusal) => refusal_answer(refusal),
    }
}

async fn apply_to_registry(node: &Node, change: &Change) -> Result<Standing, Refusal> {
    let registry = node.registry();
    if registry.leader() != Some(registry.id()) {
        return Err(Refusal::NotLeader);
    }
    let failed = |e: keyhold_registry::Error| {
        Refusal::Failed(ApiError::new(Problem::StoreUnavailable).detail(format!("registry: {e}")))
    };
    let mut voters: BTreeSet<u64> = registry
        .metrics()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    match change {
        Change::Add {
            node_id,
            region,
            api_addr,
            raft_addr,
        } => {
            if voters.contains(node_id) {
                return Ok(Standing::Voter);
            }
            let info = NodeInfo::new(region.clone(), api_addr.clone(), raft_addr.clone());
            let wait = Duration::from_millis(MEMBERSHIP_CATCH_UP_WAIT_MS);
            match tokio::time::timeout(wait, registry.add_learner(*node_id, info)).await {
                Err(_) => return Ok(Standing::CatchingUp),
                Ok(result) => result.map_err(failed)?,
            }
            voters.insert(*node_id);
            registry.change_membership(voters).await.map_err(failed)?;
            tracing::info!(node_id, "node added to the registry");
            Ok(Standing::Voter)
        }
        Change::Remove { node_id } => {
            let member = registry.nodes().contains_key(node_id);
            if !member {
                return Ok(Standing::Removed);
            }
            voters.remove(node_id);
            if voters.is_empty() {
                return Err(Refusal::Failed(
                    ApiError::new(Problem::Conflict).detail("the registry's last voter stays"),
                ));
            }
            registry.change_membership(voters).await.map_err(failed)?;
            tracing::info!(node_id, "node removed from the registry");
            Ok(Standing::Removed)
        }
    }
}

async fn apply_to_region(node: &Node, change: &Change) -> Result<Standing, Refusal> {
    let group = node.store().group();
    let failed = |e: keyhold_store::Error| match e {
        keyhold_store::Error::NotLeader { .. } => Refusal::NotLeader,
        e => Refusal::Failed(
            ApiError::new(Problem::StoreUnavailable).detail(format!("region group: {e}")),
        ),
    };
    let (voters, members) = group.members();
    match change {
        Change::Add {
            node_id,
            region,
            api_addr,
            raft_addr,
        } => {
            if region != node.region() {
                return Err(Refusal::Failed(
                    ApiError::new(Problem::InvalidRequest).detail(format!(
                        "node {node_id} is of region {region}, not {}",
                        node.region()
                    )),
                ));
            }
            if voters.contains(node_id) {
                return Ok(Standing::Voter);
            }
            let info = NodeInfo::new(region.clone(), api_addr.clone(), raft_addr.clone());
            let wait = Duration::from_millis(MEMBERSHIP_CATCH_UP_WAIT_MS);
            if !group
                .add_learner(*node_id, info, wait)
                .await
                .map_err(failed)?
            {
                return Ok(Standing::CatchingUp);
            }
            group.add_voter(*node_id).await.map_err(failed)?;
            tracing::info!(node_id, "node added to the region group");
            Ok(Standing::Voter)
        }
        Change::Remove { node_id } => {
            if !members.contains_key(node_id) {
                return Ok(Standing::Removed);
            }
            if voters.len() == 1 && voters.contains(node_id) {
                return Err(Refusal::Failed(
                    ApiError::new(Problem::Conflict).detail("the region group's last voter stays"),
                ));
            }
            group.remove_member(*node_id).await.map_err(failed)?;
            tracing::info!(node_id, "node removed from the region group");
            Ok(Standing::Removed)
        }
    }
}
