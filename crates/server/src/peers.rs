//! `Peers`: the node's one client for calls to other nodes' API listeners.
//! It owns what every such call shares: the node credential header (sent on
//! every call, exactly once, whatever the caller's headers hold), the timeout
//! of each kind of call (`CallKind`, one named constant each in `limits.rs`),
//! the two ways to address a call (one node by its API address, or a node of a
//! region: the one that answered this node last first, the next only when one
//! could not be connected to, so that nothing is sent twice), the hop of a
//! request to this region's store leader (`hop_to_leader`, for tenant
//! requests, the internal move routes, local-scope admin calls and a
//! failover's import alike), and the reading of failures: whether a call was
//! delivered at all, and what it means as this node's own answer
//! (`PeerError::into_api`).
//!
//! The Raft groups' own transport (`keyhold_registry::HttpNetwork`, on the
//! Raft listener) and the payment provider's client (`downstream.rs`) are not
//! calls between API listeners and do not go through here.

use crate::limits::{
    ADMIN_CALL_TIMEOUT_MS, FAILOVER_CALL_TIMEOUT_MS, FAILOVER_COPY_TIMEOUT_MS,
    FAILOVER_HEALTH_PROBE_MS, FAILOVER_IMPORT_TIMEOUT_MS, FORWARD_TIMEOUT_MS,
    LEASE_END_CALL_TIMEOUT_MS, MEMBERSHIP_CALL_TIMEOUT_MS, MOVE_CALL_TIMEOUT_MS,
    MOVE_FENCE_CALL_TIMEOUT_MS, MOVE_PULL_CALL_TIMEOUT_MS, RECONCILE_MARKERS_CALL_TIMEOUT_MS,
    REGION_LEADER_POLL_MS, REGION_LEADER_WAIT_MS, REGION_UNCONFIRMED_WAIT_MS,
    REGISTRY_CONTACT_TIMEOUT_MS, STANDBY_LAG_CALL_TIMEOUT_MS,
};
use crate::problem::ApiError;
use axum::body::Bytes;
use axum::http::header::IntoHeaderName;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use keyhold_core::Problem;
use keyhold_registry::{NodeCredentials, NodeId, NodeInfo, NODE_CREDENTIAL_HEADER};
use keyhold_store::raft::Leadership;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Marks a request sent on by a follower of the home region to its leader.
pub const KEYHOLD_HOP: HeaderName = HeaderName::from_static("keyhold-hop");
pub const HOP_REGION: &str = "region";
/// On a 503 from a node that received a hop but does not lead: nothing executed.
pub const KEYHOLD_NOT_LEADER: HeaderName = HeaderName::from_static("keyhold-not-leader");

/// What a call is for, which decides how long it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// A tenant request forwarded to its home region, or any request sent on
    /// to this region's store leader (`hop_to_leader`).
    Forward,
    /// A region's part of a fanned-out admin call, or another region's
    /// reconciliation view (under the admin token).
    Admin,
    /// The registry leader's age of its last quorum contact (the lease).
    QuorumAge,
    /// The registry leader's bound on how much longer a fenced region's
    /// lease may hold (a failover's wait), and the voters' answers the
    /// leader builds it from (`heard`).
    LeaseEnd,
    /// A region leader's report of its standby's lag.
    StandbyLag,
    /// A membership change on a group's leader.
    Membership,
    /// One step of a move at the old home (track) or one page it exports.
    MoveStep,
    /// The move's fence, which waits for the old home's relay to drain.
    MoveFence,
    /// One `pull` call at the new home (a budget of pages).
    MovePull,
    /// Where a node's standby copy stands (a failover picks the best).
    CopyPosition,
    /// A failover's promotion of a copy, or a page out of it.
    CopyPage,
    /// A failover's promotion and import, on the target region's leader.
    FailoverImport,
    /// Whether a node of a region answers `/readyz`.
    ReadyProbe,
    /// The orders another region holds under a reconciling region's orphans.
    ReconcileMarkers,
}

impl CallKind {
    /// How long one call of this kind may take, connection included.
    pub fn timeout(self) -> Duration {
        Duration::from_millis(match self {
            CallKind::Forward => FORWARD_TIMEOUT_MS,
            CallKind::Admin => ADMIN_CALL_TIMEOUT_MS,
            CallKind::QuorumAge => REGISTRY_CONTACT_TIMEOUT_MS,
            CallKind::LeaseEnd => LEASE_END_CALL_TIMEOUT_MS,
            CallKind::StandbyLag => STANDBY_LAG_CALL_TIMEOUT_MS,
            CallKind::Membership => MEMBERSHIP_CALL_TIMEOUT_MS,
            CallKind::MoveStep => MOVE_CALL_TIMEOUT_MS,
            CallKind::MoveFence => MOVE_FENCE_CALL_TIMEOUT_MS,
            CallKind::MovePull => MOVE_PULL_CALL_TIMEOUT_MS,
            CallKind::CopyPosition => FAILOVER_COPY_TIMEOUT_MS,
            CallKind::CopyPage => FAILOVER_CALL_TIMEOUT_MS,
            CallKind::FailoverImport => FAILOVER_IMPORT_TIMEOUT_MS,
            CallKind::ReadyProbe => FAILOVER_HEALTH_PROBE_MS,
            CallKind::ReconcileMarkers => RECONCILE_MARKERS_CALL_TIMEOUT_MS,
        })
    }
}

/// Where a call goes.
#[derive(Debug, Clone, Copy)]
pub enum To<'a> {
    /// One node, by its API address (`host:port`).
    Node(&'a str),
    /// A node of this region (by the registry's membership): the one that
    /// answered this node's last call there first, the next only when one
    /// cannot be connected to (it received nothing).
    Region(&'a str),
}

impl std::fmt::Display for To<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            To::Node(addr) => write!(f, "node {addr}"),
            To::Region(region) => write!(f, "region {region}"),
        }
    }
}

/// Who a call acts as.
#[derive(Debug, Clone)]
enum Auth {
    /// The cluster's node credential (internal routes, hops, forwards).
    Node,
    /// The operator's admin token (an admin call's part at another region).
    Admin(String),
}

/// One call: method, path (with query), kind, and what it carries.
#[derive(Debug, Clone)]
pub struct Call {
    method: Method,
    path: String,
    kind: CallKind,
    headers: HeaderMap,
    body: Bytes,
    auth: Auth,
}

impl Call {
    pub fn new(method: Method, kind: CallKind, path: impl Into<String>) -> Call {
        let path = path.into();
        assert!(path.starts_with('/'), "a call's path is absolute: {path}");
        Call {
            method,
            path,
            kind,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            auth: Auth::Node,
        }
    }

    pub fn get(kind: CallKind, path: impl Into<String>) -> Call {
        Call::new(Method::GET, kind, path)
    }

    pub fn post(kind: CallKind, path: impl Into<String>) -> Call {
        Call::new(Method::POST, kind, path)
    }

    /// A JSON body (and its content type).
    pub fn json(self, value: &impl serde::Serialize) -> Call {
        let body = serde_json::to_vec(value).expect("a call's body serializes");
        self.header(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )
        .body(body.into())
    }

    pub fn body(mut self, body: Bytes) -> Call {
        self.body = body;
        self
    }

    /// Adds headers (a forwarded request's allow-listed ones, say). A node
    /// credential among them is dropped: `Peers` sends its own, once.
    pub fn headers(mut self, headers: HeaderMap) -> Call {
        self.headers.extend(headers);
        self
    }

    pub fn header(mut self, name: impl IntoHeaderName, value: HeaderValue) -> Call {
        self.headers.append(name, value);
        self
    }

    /// Sends the admin token instead of the node credential: the call is an
    /// operator's, executed at another region on their behalf.
    pub fn with_admin_token(mut self, token: &str) -> Call {
        self.auth = Auth::Admin(token.to_owned());
        self
    }
}

/// How a call failed, and to whom.
#[derive(Debug)]
pub struct PeerError {
    /// The node or region called (`To`'s display).
    pub to: String,
    pub failure: Failure,
}

#[derive(Debug)]
pub enum Failure {
    /// The registry knows no node of the region: nothing was sent.
    NoNode,
    /// No connection could be made: nothing was delivered.
    Unreachable(String),
    /// No answer within the call's timeout: it may have executed.
    TimedOut(Duration),
    /// The connection or the answer broke off: it may have executed.
    CutOff(String),
    /// An answer other than 2xx. `problem` is the peer's own problem (its
    /// `type` slug) when the body is one; `not_leader` marks a hop refused by a
    /// node that does not lead its region (nothing executed).
    Answered {
        status: StatusCode,
        not_leader: bool,
        problem: Option<Problem>,
        detail: Option<String>,
        body: String,
    },
    /// A 2xx answer whose body is not what the call expects.
    Undecodable(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = &self.to;
        match &self.failure {
            Failure::NoNode => write!(f, "{to}: no node of it is known"),
            Failure::Unreachable(e) => write!(f, "{to}: cannot connect: {e}"),
            Failure::TimedOut(t) => write!(f, "{to}: no answer within {} ms", t.as_millis()),
            Failure::CutOff(e) => write!(f, "{to}: {e}"),
            Failure::Answered { status, body, .. } => write!(f, "{to} answered {status}: {body}"),
            Failure::Undecodable(e) => write!(f, "{to}: undecodable answer: {e}"),
        }
    }
}

impl std::error::Error for PeerError {}

impl PeerError {
    /// True when the call certainly executed nothing there: no node, no
    /// connection, or a hop refused by a node that does not lead. Only such a
    /// call may be sent again elsewhere without the caller's retry key.
    pub fn delivered_nothing(&self) -> bool {
        matches!(
            self.failure,
            Failure::NoNode
                | Failure::Unreachable(_)
                | Failure::Answered {
                    not_leader: true,
                    ..
                }
        )
    }

    /// The status of a non-2xx answer.
    pub fn status(&self) -> Option<StatusCode> {
        match self.failure {
            Failure::Answered { status, .. } => Some(status),
            _ => None,
        }
    }

    /// The failure as this node's answer. A peer's problem answer passes on
    /// as that problem with its detail (a leader's refusal of a membership
    /// change, a conflict of a move's scope), because the caller can act on
    /// it; a 4xx without a problem body is a `conflict`. Everything else is
    /// `failure`, the problem that names what this node could not do (503
    /// `owner-unreachable` for another region's part, `store-unavailable` for
    /// this region's leader), with the peer and the cause as detail. A 401 is
    /// never passed on: it says the peer refused this node's credential, not
    /// the caller's.
    pub fn into_api(self, failure: Problem) -> ApiError {
        if let Failure::Answered {
            status,
            problem,
            detail,
            ..
        } = &self.failure
        {
            if *status != StatusCode::UNAUTHORIZED {
                if let Some(problem) = problem {
                    let error = ApiError::new(*problem);
                    return match detail {
                        Some(d) => error.detail(d.clone()),
                        None => error,
                    };
                }
                if status.is_client_error() {
                    return ApiError::new(Problem::Conflict).detail(self.to_string());
                }
            }
        }
        ApiError::new(failure).detail(self.to_string())
    }
}

/// How long `hop_to_leader` looks for a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Wait, within `REGION_LEADER_WAIT_MS`, for a leader to be known and to
    /// take the request (a leader that cannot confirm itself is waited for
    /// `REGION_UNCONFIRMED_WAIT_MS`): a request whose client is waiting.
    Wait,
    /// Try the leader known now, once: a driver that calls again itself.
    Once,
}

/// Where a request for this region's store went.
#[derive(Debug)]
pub enum AtLeader {
    /// The leader answered (relay this, whatever its status).
    Answered(reqwest::Response),
    /// This node leads (or came to lead meanwhile): execute here.
    Here,
    /// No leader took it (`Patience::Once` only): nothing executed.
    NoLeader,
    /// Nobody executed it, or nobody can say: answer this.
    Failed(ApiError),
}

/// The region nodes a `To::Region` call may go to.
type Directory = Box<dyn Fn(&str) -> Vec<(NodeId, NodeInfo)> + Send + Sync>;

/// The node's one inter-node client (see the module doc).
pub struct Peers {
    http: reqwest::Client,
    credentials: NodeCredentials,
    directory: Directory,
    /// Per region, the node that answered this node's last call there.
    answered: Mutex<HashMap<String, NodeId>>,
    /// Tests shorten a kind's timeout; nothing else does.
    #[cfg(test)]
    timeouts: Mutex<HashMap<CallKind, Duration>>,
}

impl Peers {
    /// `directory` lists a region's nodes (the registry's membership).
    pub fn new(
        http: reqwest::Client,
        credentials: NodeCredentials,
        directory: impl Fn(&str) -> Vec<(NodeId, NodeInfo)> + Send + Sync + 'static,
    ) -> Peers {
        Peers {
            http,
            credentials,
            directory: Box::new(directory),
            answered: Mutex::new(HashMap::new()),
            #[cfg(test)]
            timeouts: Mutex::new(HashMap::new()),
        }
    }

    fn timeout(&self, kind: CallKind) -> Duration {
        #[cfg(test)]
        if let Some(t) = self.timeouts.lock().expect("not poisoned").get(&kind) {
            return *t;
        }
        kind.timeout()
    }

    #[cfg(test)]
    fn set_timeout(&self, kind: CallKind, timeout: Duration) {
        self.timeouts
            .lock()
            .expect("not poisoned")
            .insert(kind, timeout);
    }

    /// The nodes of `region`, the one that answered this node last first: a
    /// `To::Region` call tries them in this order.
    pub fn region_nodes(&self, region: &str) -> Vec<(NodeId, NodeInfo)> {
        let mut nodes = (self.directory)(region);
        let preferred = self
            .answered
            .lock()
            .expect("not poisoned")
            .get(region)
            .copied();
        if let Some(id) = preferred {
            nodes.sort_by_key(|(n, _)| *n != id);
        }
        nodes
    }

    /// Sends `call`; any answer, whatever its status, is `Ok` (for a relay).
    pub async fn send(&self, to: To<'_>, call: &Call) -> Result<reqwest::Response, PeerError> {
        match to {
            To::Node(addr) => self.send_to(addr, call).await,
            To::Region(region) => {
                let mut last = None;
                for (id, info) in self.region_nodes(region) {
                    match self.send_to(&info.api_addr, call).await {
                        Ok(response) => {
                            self.answered
                                .lock()
                                .expect("not poisoned")
                                .insert(region.to_owned(), id);
                            return Ok(response);
                        }
                        // It received nothing: the next node may.
                        Err(e) if e.delivered_nothing() => last = Some(e.failure),
                        Err(e) => return Err(e),
                    }
                }
                Err(PeerError {
                    to: to.to_string(),
                    failure: last.unwrap_or(Failure::NoNode),
                })
            }
        }
    }

    /// Sends `call`; an answer other than 2xx is a `Failure::Answered`.
    pub async fn call(&self, to: To<'_>, call: &Call) -> Result<reqwest::Response, PeerError> {
        let response = self.send(to, call).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(to.to_string(), response).await)
    }

    /// `call`, with its JSON answer.
    pub async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        to: To<'_>,
        call: &Call,
    ) -> Result<T, PeerError> {
        let response = self.call(to, call).await?;
        response.json().await.map_err(|e| PeerError {
            to: to.to_string(),
            failure: if e.is_decode() {
                Failure::Undecodable(e.to_string())
            } else {
                Failure::CutOff(e.to_string())
            },
        })
    }

    /// Reads a 2xx answer's body; a body cut off is the callee's failure.
    pub async fn bytes(&self, to: To<'_>, response: reqwest::Response) -> Result<Bytes, PeerError> {
        response.bytes().await.map_err(|e| PeerError {
            to: to.to_string(),
            failure: Failure::CutOff(format!("the answer was cut off: {e}")),
        })
    }

    /// Sends a request on to this region's store leader, once (marked
    /// `Keyhold-Hop: region`, so the leader never sends it on again), and
    /// hands back where it went. `leadership` is this node's view of its
    /// region group, read again on every look. A request that reached no one
    /// (no leader known, no connection, refused by a node that does not lead)
    /// is tried again as `patience` allows; one that may have executed (a
    /// timeout, an answer cut off) is `Failed`: the client's retry with its
    /// key replays it.
    pub async fn hop_to_leader(
        &self,
        leadership: impl Fn() -> Leadership,
        call: &Call,
        patience: Patience,
    ) -> AtLeader {
        let deadline = Instant::now() + Duration::from_millis(REGION_LEADER_WAIT_MS);
        let hop = call
            .clone()
            .header(KEYHOLD_HOP, HeaderValue::from_static(HOP_REGION));
        let mut unconfirmed_since = None;
        loop {
            let leader = match leadership() {
                Leadership::Ready => return AtLeader::Here,
                Leadership::Follower(Some((_, info))) => Some(info),
                Leadership::Unconfirmed if patience == Patience::Wait => {
                    let since = *unconfirmed_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= Duration::from_millis(REGION_UNCONFIRMED_WAIT_MS) {
                        metrics::counter!("keyhold_region_unconfirmed_refusals_total").increment(1);
                        return AtLeader::Failed(ApiError::new(Problem::StoreUnavailable).detail(
                            "this node leads its region's store by its own account but \
                             cannot confirm it with its peers, so its data may not be \
                             current; try again or through another node",
                        ));
                    }
                    None
                }
                Leadership::Unconfirmed | Leadership::Follower(None) | Leadership::Elected => None,
            };
            if let Some(info) = leader {
                let started = Instant::now();
                let sent = self.send(To::Node(&info.api_addr), &hop).await;
                metrics::histogram!("keyhold_region_hop_duration_seconds")
                    .record(started.elapsed().as_secs_f64());
                match sent {
                    Ok(r)
                        if r.status() == StatusCode::SERVICE_UNAVAILABLE
                            && r.headers().contains_key(KEYHOLD_NOT_LEADER) => {}
                    Ok(r) => {
                        metrics::counter!("keyhold_region_hops_total").increment(1);
                        return AtLeader::Answered(r);
                    }
                    // Not delivered: the leader is gone; wait for the next one.
                    Err(e) if e.delivered_nothing() => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "the region's leader did not answer");
                        return AtLeader::Failed(e.into_api(Problem::StoreUnavailable));
                    }
                }
            }
            if patience == Patience::Once {
                return AtLeader::NoLeader;
            }
            if Instant::now() >= deadline {
                return AtLeader::Failed(
                    ApiError::new(Problem::StoreUnavailable)
                        .detail("the region's store has no reachable leader"),
                );
            }
            tokio::time::sleep(Duration::from_millis(REGION_LEADER_POLL_MS)).await;
        }
    }

    /// One node, one try: the only place a request to a peer is built.
    async fn send_to(&self, addr: &str, call: &Call) -> Result<reqwest::Response, PeerError> {
        let timeout = self.timeout(call.kind);
        let mut headers = call.headers.clone();
        // Exactly one credential travels: a second value would be refused.
        headers.remove(NODE_CREDENTIAL_HEADER);
        let mut request = self
            .http
            .request(call.method.clone(), format!("http://{addr}{}", call.path))
            .timeout(timeout)
            .headers(headers);
        request = match &call.auth {
            Auth::Node => request.header(NODE_CREDENTIAL_HEADER, self.credentials.current()),
            Auth::Admin(token) => request.bearer_auth(token),
        };
        if !call.body.is_empty() {
            request = request.body(call.body.clone());
        }
        request.send().await.map_err(|e| PeerError {
            to: To::Node(addr).to_string(),
            failure: transport_failure(&e, timeout),
        })
    }
}

fn transport_failure(e: &reqwest::Error, timeout: Duration) -> Failure {
    if e.is_connect() {
        Failure::Unreachable(e.to_string())
    } else if e.is_timeout() {
        Failure::TimedOut(timeout)
    } else {
        Failure::CutOff(e.to_string())
    }
}

/// A non-2xx answer as a failure, with the peer's problem when it sent one.
async fn refusal(to: String, response: reqwest::Response) -> PeerError {
    let status = response.status();
    let not_leader = status == StatusCode::SERVICE_UNAVAILABLE
        && response.headers().contains_key(KEYHOLD_NOT_LEADER);
    // A body that breaks off leaves the status to speak.
    let body = response.text().await.unwrap_or_default();
    let parsed: Option<serde_json::Value> = serde_json::from_str(&body).ok();
    let problem = parsed.as_ref().and_then(|v| {
        let slug = v["type"].as_str()?.rsplit('/').next()?;
        Problem::ALL.iter().find(|p| p.slug() == slug).copied()
    });
    let detail = parsed
        .as_ref()
        .and_then(|v| v["detail"].as_str())
        .map(str::to_owned);
    PeerError {
        to,
        failure: Failure::Answered {
            status,
            not_leader,
            problem,
            detail,
            body,
        },
    }
}

/// True when a request carries a node credential header at all (valid or not).
pub fn carries_credential(headers: &HeaderMap) -> bool {
    headers.contains_key(NODE_CREDENTIAL_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::State;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use axum::Router;
    use std::sync::Arc;

    const SECRET: &str = "peers-test-credential-0123456789abcdef";

    fn credentials() -> NodeCredentials {
        NodeCredentials::parse(SECRET).expect("a valid credential")
    }

    /// What the test server saw of the last call.
    #[derive(Default)]
    struct Seen {
        credentials: Mutex<Vec<Vec<String>>>,
        hops: Mutex<Vec<Option<String>>>,
    }

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    }

    /// An address nothing listens on: bound, then closed.
    async fn closed_addr() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        listener.local_addr().expect("addr").to_string()
    }

    fn test_router(seen: Arc<Seen>) -> Router {
        async fn record(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> &'static str {
            let values = headers
                .get_all(NODE_CREDENTIAL_HEADER)
                .iter()
                .map(|v| v.to_str().unwrap_or("?").to_owned())
                .collect();
            seen.credentials.lock().expect("lock").push(values);
            let hop = headers
                .get(KEYHOLD_HOP)
                .map(|v| v.to_str().unwrap_or("?").to_owned());
            seen.hops.lock().expect("lock").push(hop);
            "{\"ok\":true}"
        }
        Router::new()
            .route("/ok", get(record).post(record))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    "{\"ok\":true}"
                }),
            )
            .route(
                "/conflict",
                post(|| async {
                    ApiError::new(Problem::Conflict)
                        .detail("the move is not running here")
                        .into_response()
                }),
            )
            .route(
                "/plain-404",
                get(|| async { (StatusCode::NOT_FOUND, "nothing here") }),
            )
            .route(
                "/down",
                get(|| async {
                    ApiError::new(Problem::StoreUnavailable)
                        .detail("the store is down")
                        .into_response()
                }),
            )
            .route(
                "/bare-500",
                get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
            )
            .route(
                "/unauthenticated",
                get(|| async { ApiError::new(Problem::Unauthenticated).into_response() }),
            )
            .route(
                "/not-leader",
                post(|| async {
                    let mut response = ApiError::new(Problem::StoreUnavailable).into_response();
                    response
                        .headers_mut()
                        .insert(KEYHOLD_NOT_LEADER, HeaderValue::from_static("1"));
                    response
                }),
            )
            .with_state(seen)
    }

    fn peers(nodes: Vec<(NodeId, String)>) -> Peers {
        Peers::new(reqwest::Client::new(), credentials(), move |region| {
            nodes
                .iter()
                .map(|(id, addr)| {
                    (
                        *id,
                        NodeInfo::new(region.to_owned(), addr.clone(), addr.clone()),
                    )
                })
                .collect()
        })
    }

    #[tokio::test]
    async fn every_call_carries_the_node_credential_once() {
        let seen = Arc::new(Seen::default());
        let addr = serve(test_router(seen.clone())).await;
        let peers = peers(vec![]);
        let mut forged = HeaderMap::new();
        forged.insert(NODE_CREDENTIAL_HEADER, HeaderValue::from_static("forged"));
        let call = Call::post(CallKind::Forward, "/ok").headers(forged);
        let answer: serde_json::Value = peers
            .call_json(To::Node(&addr), &call)
            .await
            .expect("answered");
        assert_eq!(answer["ok"], true);
        assert_eq!(
            *seen.credentials.lock().expect("lock"),
            vec![vec![SECRET.to_owned()]]
        );
    }

    #[tokio::test]
    async fn an_admin_call_carries_the_admin_token_and_no_node_credential() {
        async fn record(headers: HeaderMap) -> String {
            format!(
                "{{\"auth\":{:?},\"node\":{}}}",
                headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(""),
                headers.contains_key(NODE_CREDENTIAL_HEADER)
            )
        }
        let addr = serve(Router::new().route("/admin", get(record))).await;
        let call = Call::get(CallKind::Admin, "/admin").with_admin_token("admin-token");
        let answer: serde_json::Value = peers(vec![])
            .call_json(To::Node(&addr), &call)
            .await
            .expect("answered");
        assert_eq!(answer["auth"], "Bearer admin-token");
        assert_eq!(answer["node"], false);
    }

    #[tokio::test]
    async fn each_kind_has_its_own_timeout() {
        let addr = serve(test_router(Arc::new(Seen::default()))).await;
        let peers = peers(vec![]);
        // `/slow` answers after 400 ms: within one kind's time, past the other's.
        peers.set_timeout(CallKind::ReadyProbe, Duration::from_millis(100));
        peers.set_timeout(CallKind::CopyPosition, Duration::from_secs(5));
        let started = Instant::now();
        let short = peers
            .call(To::Node(&addr), &Call::get(CallKind::ReadyProbe, "/slow"))
            .await
            .expect_err("past its timeout");
        assert!(
            matches!(short.failure, Failure::TimedOut(t) if t == Duration::from_millis(100)),
            "{short:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(400));
        assert!(
            !short.delivered_nothing(),
            "a timed-out call may have executed"
        );
        peers
            .call(To::Node(&addr), &Call::get(CallKind::CopyPosition, "/slow"))
            .await
            .expect("within its timeout");
    }

    #[test]
    fn the_kinds_take_their_limits() {
        assert_eq!(
            CallKind::FailoverImport.timeout(),
            Duration::from_millis(FAILOVER_IMPORT_TIMEOUT_MS)
        );
        assert_eq!(
            CallKind::MoveFence.timeout(),
            Duration::from_millis(crate::limits::MOVE_DRAIN_WAIT_MS + MOVE_CALL_TIMEOUT_MS)
        );
        assert_eq!(
            CallKind::Membership.timeout(),
            Duration::from_millis(
                crate::limits::MEMBERSHIP_CATCH_UP_WAIT_MS + crate::limits::MEMBERSHIP_CALL_WAIT_MS
            )
        );
        assert_eq!(
            CallKind::Forward.timeout(),
            Duration::from_millis(FORWARD_TIMEOUT_MS)
        );
    }

    #[tokio::test]
    async fn a_refused_connection_delivered_nothing() {
        let addr = closed_addr().await;
        let e = peers(vec![])
            .call(To::Node(&addr), &Call::get(CallKind::Forward, "/ok"))
            .await
            .expect_err("nothing listens");
        assert!(matches!(e.failure, Failure::Unreachable(_)), "{e:?}");
        assert!(e.delivered_nothing());
        let api = e.into_api(Problem::OwnerUnreachable);
        assert_eq!(api.problem, Problem::OwnerUnreachable);
        assert!(api.detail.is_some_and(|d| d.contains(&addr)));
    }

    #[tokio::test]
    async fn a_peer_problem_passes_on_and_a_bare_4xx_is_a_conflict() {
        let addr = serve(test_router(Arc::new(Seen::default()))).await;
        let peers = peers(vec![]);
        let e = peers
            .call(
                To::Node(&addr),
                &Call::post(CallKind::MoveStep, "/conflict"),
            )
            .await
            .expect_err("409");
        assert_eq!(e.status(), Some(StatusCode::CONFLICT));
        assert!(!e.delivered_nothing());
        let api = e.into_api(Problem::OwnerUnreachable);
        assert_eq!(api.problem, Problem::Conflict);
        assert_eq!(api.detail.as_deref(), Some("the move is not running here"));

        let e = peers
            .call(
                To::Node(&addr),
                &Call::get(CallKind::MoveStep, "/plain-404"),
            )
            .await
            .expect_err("404");
        let api = e.into_api(Problem::OwnerUnreachable);
        assert_eq!(api.problem, Problem::Conflict);
        assert!(api.detail.is_some_and(|d| d.contains("nothing here")));

        // A peer refusing this node's credential is this node's failure.
        let e = peers
            .call(
                To::Node(&addr),
                &Call::get(CallKind::MoveStep, "/unauthenticated"),
            )
            .await
            .expect_err("401");
        assert_eq!(
            e.into_api(Problem::OwnerUnreachable).problem,
            Problem::OwnerUnreachable
        );
    }

    #[tokio::test]
    async fn a_5xx_passes_its_problem_on_or_is_the_callers_failure() {
        let addr = serve(test_router(Arc::new(Seen::default()))).await;
        let peers = peers(vec![]);
        let e = peers
            .call(To::Node(&addr), &Call::get(CallKind::MoveStep, "/down"))
            .await
            .expect_err("503");
        assert!(!e.delivered_nothing());
        let api = e.into_api(Problem::OwnerUnreachable);
        assert_eq!(api.problem, Problem::StoreUnavailable);
        assert_eq!(api.detail.as_deref(), Some("the store is down"));

        let e = peers
            .call(To::Node(&addr), &Call::get(CallKind::MoveStep, "/bare-500"))
            .await
            .expect_err("500");
        assert_eq!(e.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
        let api = e.into_api(Problem::OwnerUnreachable);
        assert_eq!(api.problem, Problem::OwnerUnreachable);
        assert!(api.detail.is_some_and(|d| d.contains("boom")));
    }

    #[tokio::test]
    async fn a_region_call_moves_on_only_past_nodes_it_cannot_reach_and_prefers_the_last_answer() {
        let seen = Arc::new(Seen::default());
        let up = serve(test_router(seen.clone())).await;
        let down = closed_addr().await;
        let peers = peers(vec![(1, down.clone()), (2, up.clone())]);
        let call = Call::post(CallKind::Forward, "/ok");
        peers
            .call(To::Region("a"), &call)
            .await
            .expect("the second node answers");
        assert_eq!(
            peers.region_nodes("a")[0].0,
            2,
            "the node that answered first"
        );
        // A node that answered with a failure is not passed over: the call
        // may have executed there.
        let slow_peers = self::peers(vec![(1, up.clone()), (2, up)]);
        slow_peers.set_timeout(CallKind::ReadyProbe, Duration::from_millis(100));
        let e = slow_peers
            .call(To::Region("a"), &Call::get(CallKind::ReadyProbe, "/slow"))
            .await
            .expect_err("timed out");
        assert!(matches!(e.failure, Failure::TimedOut(_)), "{e:?}");

        let none = self::peers(vec![]);
        let e = none
            .call(To::Region("a"), &call)
            .await
            .expect_err("no node");
        assert!(matches!(e.failure, Failure::NoNode));
        let all_down = self::peers(vec![(1, down)]);
        let e = all_down
            .call(To::Region("a"), &call)
            .await
            .expect_err("unreachable");
        assert!(matches!(e.failure, Failure::Unreachable(_)), "{e:?}");
        assert!(e.to_string().starts_with("region a"), "{e}");
    }

    fn follower_of(addr: &str) -> Leadership {
        let info = NodeInfo::new("a".to_owned(), addr.to_owned(), addr.to_owned());
        Leadership::Follower(Some((7, info)))
    }

    #[tokio::test]
    async fn a_hop_is_marked_and_carries_the_credential() {
        let seen = Arc::new(Seen::default());
        let addr = serve(test_router(seen.clone())).await;
        let peers = peers(vec![]);
        let call = Call::post(CallKind::Forward, "/ok");
        let at = peers
            .hop_to_leader(|| follower_of(&addr), &call, Patience::Wait)
            .await;
        assert!(matches!(at, AtLeader::Answered(ref r) if r.status() == StatusCode::OK));
        assert_eq!(
            *seen.hops.lock().expect("lock"),
            vec![Some(HOP_REGION.to_owned())]
        );
        assert_eq!(
            *seen.credentials.lock().expect("lock"),
            vec![vec![SECRET.to_owned()]]
        );
        let here = peers
            .hop_to_leader(|| Leadership::Ready, &call, Patience::Wait)
            .await;
        assert!(matches!(here, AtLeader::Here));
    }

    #[tokio::test]
    async fn a_hop_once_gives_up_at_once_when_no_leader_takes_it() {
        let addr = serve(test_router(Arc::new(Seen::default()))).await;
        let peers = peers(vec![]);
        let refused = Call::post(CallKind::FailoverImport, "/not-leader");
        let started = Instant::now();
        let at = peers
            .hop_to_leader(|| follower_of(&addr), &refused, Patience::Once)
            .await;
        assert!(matches!(at, AtLeader::NoLeader), "{at:?}");
        let down = closed_addr().await;
        let at = peers
            .hop_to_leader(
                || follower_of(&down),
                &Call::post(CallKind::FailoverImport, "/ok"),
                Patience::Once,
            )
            .await;
        assert!(matches!(at, AtLeader::NoLeader), "{at:?}");
        let at = peers
            .hop_to_leader(|| Leadership::Elected, &refused, Patience::Once)
            .await;
        assert!(matches!(at, AtLeader::NoLeader), "{at:?}");
        assert!(started.elapsed() < Duration::from_millis(REGION_LEADER_POLL_MS * 4));
    }

    #[tokio::test]
    async fn a_hop_that_may_have_executed_is_not_sent_again() {
        let addr = serve(test_router(Arc::new(Seen::default()))).await;
        let peers = peers(vec![]);
        peers.set_timeout(CallKind::Forward, Duration::from_millis(100));
        let at = peers
            .hop_to_leader(
                || follower_of(&addr),
                &Call::get(CallKind::Forward, "/slow"),
                Patience::Wait,
            )
            .await;
        match at {
            AtLeader::Failed(e) => assert_eq!(e.problem, Problem::StoreUnavailable),
            other => panic!("a timeout is a failure, not a retry: {other:?}"),
        }
    }
}
