//! Inside a region: every node holds a replica of the region's store, and only the
//! region group's leader executes and reads it. A request that must touch the
//! store and reaches a follower is sent on, whole, to the leader (one hop,
//! marked `Keyhold-Hop: region` under the node credential), and the leader's
//! answer is relayed back.
//!
//! The hop is never repeated: a node that receives a hop while it does not lead
//! answers 503 `store-unavailable` with `Keyhold-Not-Leader`, and the follower
//! that sent it waits for the group to settle and tries the new leader, within
//! `REGION_LEADER_WAIT_MS`. Only a request that was not delivered (no connection,
//! or refused by a non-leader before executing) is sent again; one that may have
//! executed (a timeout, an answer cut off) is answered 503, and the client's
//! retry with its key replays it.

use super::read_body;
use crate::node::Node;
use crate::peers::{Call, CallKind};
use crate::problem::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keyhold_core::Problem;
use std::sync::Arc;

pub use crate::peers::{AtLeader, Patience, HOP_REGION, KEYHOLD_HOP, KEYHOLD_NOT_LEADER};

/// Response headers a relay does not copy back (hyper sets its own).
pub(super) const HOP_BY_HOP: [&str; 4] =
    ["connection", "transfer-encoding", "content-length", "date"];

/// How a request reached this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// From a client (or anything without the node credential).
    Client,
    /// Forwarded by a node of another region.
    OtherRegion,
    /// From a follower of this region: it must not travel on again.
    RegionHop,
}

impl Arrival {
    /// Marks are trusted only under the node credential: a client cannot make a
    /// node refuse to send its request on.
    pub fn of(node: &Node, headers: &HeaderMap) -> Arrival {
        if !node.credentials().check(headers) {
            return Arrival::Client;
        }
        let marked = headers
            .get(KEYHOLD_HOP)
            .is_some_and(|v| v.as_bytes() == HOP_REGION.as_bytes());
        if marked {
            Arrival::RegionHop
        } else {
            Arrival::OtherRegion
        }
    }
}

/// The answer of a node that received a hop but does not lead its region.
pub fn not_leader() -> Response {
    metrics::counter!("keyhold_region_hop_not_leader_total").increment(1);
    let mut response = ApiError::new(Problem::StoreUnavailable)
        .detail("this node does not lead its region's store; try again")
        .into_response();
    response
        .headers_mut()
        .insert(KEYHOLD_NOT_LEADER, HeaderValue::from_static("1"));
    response
}

/// Sends `call` on to the region group's leader (`Peers::hop_to_leader`,
/// the one hop of every route that acts on this region's store), by this
/// node's view of its region group; the node credential and the hop mark are
/// added.
pub async fn send_to_leader(node: &Node, call: &Call, patience: Patience) -> AtLeader {
    node.peers()
        .hop_to_leader(|| node.store().leadership(), call, patience)
        .await
}

/// The path and query of a request, to send it on as it came.
pub fn path_of(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

/// Copies an answer from another node back to the caller.
pub async fn relay(response: reqwest::Response, cut_off: Problem) -> Response {
    let status = response.status();
    let mut headers = HeaderMap::new();
    for (name, value) in response.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(cut_off)
                .detail("the executing node's answer was cut off")
                .into_response()
        }
    };
    let mut out = (status, body).into_response();
    out.headers_mut().extend(headers);
    out
}

/// Layer of the routes that act on this region's store for another node (move
/// copy): run here on the leader, else on the leader. `body_bytes_max` bounds
/// what a follower buffers.
pub async fn at_region_leader(
    State((node, body_bytes_max)): State<(Arc<Node>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    run_at_leader(&node, body_bytes_max, request, next).await
}

/// Layer of the admin routes: a call with `keyhold-scope: local` (one region's
/// part of a fanned-out admin call) acts on this region's store, so it runs on
/// the region's leader; any other runs here.
pub async fn admin_local_at_leader(
    State((node, body_bytes_max)): State<(Arc<Node>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    if !super::admin::is_local_scope(request.headers()) {
        return next.run(request).await;
    }
    run_at_leader(&node, body_bytes_max, request, next).await
}

async fn run_at_leader(
    node: &Node,
    body_bytes_max: usize,
    request: Request,
    next: Next,
) -> Response {
    if node.leads_region() {
        return next.run(request).await;
    }
    if Arrival::of(node, request.headers()) == Arrival::RegionHop {
        return not_leader();
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(&parts.headers, body, body_bytes_max).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    // The caller's node credential, if any, is replaced by this node's.
    let mut headers = parts.headers.clone();
    for name in ["host", "content-length", "connection", "transfer-encoding"] {
        headers.remove(name);
    }
    let call = Call::new(parts.method.clone(), CallKind::Forward, path_of(&parts.uri))
        .headers(headers)
        .body(bytes.clone());
    match send_to_leader(node, &call, Patience::Wait).await {
        AtLeader::Answered(response) => relay(response, Problem::StoreUnavailable).await,
        AtLeader::Here => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        AtLeader::NoLeader => not_leader(),
        AtLeader::Failed(e) => e.into_response(),
    }
}
