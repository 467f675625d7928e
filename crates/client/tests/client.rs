//! The SDK against a real node started in-process on 127.0.0.1:0, with a small
//! axum stub in front of it that answers 503/429/409/422, stalls or loses
//! answers on a script, then forwards. The stub logs every Idempotency-Key it
//! sees, so the tests can say that every attempt carried the intent's key.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use keyhold_client::{
    Claim, ClaimRequest, Client, Completion, Error, Intent, IntentJournal, Outcome, RetryPolicy,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "admin-token-for-client-tests";

/// A node on 127.0.0.1:0 with one tenant; stopped on drop.
struct Node {
    url: String,
    token: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config =
            keyhold_server::Config::new("t", dir.path().join("data"), ADMIN_TOKEN.to_owned());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            keyhold_server::run(config, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let answer = create_tenant(&url).await;
        Node {
            url,
            token: answer["token"].as_str().unwrap().to_owned(),
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

/// Creates the test tenant; a node that just started may not be ready to
/// create tenants yet, so a few refusals are waited out.
async fn create_tenant(url: &str) -> serde_json::Value {
    let mut last = String::new();
    for _ in 0..50 {
        let answer = reqwest::Client::new()
            .post(format!("{url}/admin/v1/tenants"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"tenant_id": "acme", "home_region": "t"}))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body = answer.text().await.unwrap();
        if status.as_u16() == 201 {
            return serde_json::from_str(&body).unwrap();
        }
        last = format!("{status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot create the test tenant: {last}");
}

/// What the stub does with the next request.
#[derive(Clone, Debug)]
enum Act {
    /// Answer with this problem (status, slug, Retry-After seconds).
    Problem(u16, &'static str, Option<u64>),
    /// Wait this long, then forward (the client times out first).
    Stall(Duration),
    /// Forward, then lose the node's answer and say 503 instead.
    ForwardThenLose,
}

#[derive(Default)]
struct StubState {
    script: Mutex<VecDeque<Act>>,
    /// (Idempotency-Key, when it arrived) of every request.
    seen: Mutex<Vec<(String, Instant)>>,
    target: String,
}

struct Stub {
    url: String,
    state: Arc<StubState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Stub {
    async fn start(target: &str, script: Vec<Act>) -> Stub {
        let state = Arc::new(StubState {
            script: Mutex::new(script.into()),
            seen: Mutex::new(Vec::new()),
            target: target.to_owned(),
        });
        let app = axum::Router::new().fallback(stub).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Stub {
            url,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn keys(&self) -> Vec<String> {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn arrivals(&self) -> Vec<Instant> {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| *t)
            .collect()
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            // A stalled handler may still hold a connection; do not wait forever.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

fn problem(status: u16, slug: &str, retry_after: Option<u64>) -> Response {
    let body = serde_json::json!({
        "type": format!("https://keyhold.dev/problems/{slug}"),
        "title": slug,
        "status": status,
    });
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert("retry-after", seconds.to_string().parse().unwrap());
    }
    response
}

async fn forward(
    state: &StubState,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let mut request = reqwest::Client::new().request(
        method,
        format!(
            "{}{}",
            state.target,
            uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
        ),
    );
    for name in ["authorization", "idempotency-key", "content-type"] {
        if let Some(v) = headers.get(name) {
            request = request.header(name, v.as_bytes());
        }
    }
    let answer = request.body(body).send().await.unwrap();
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    response
        .body(axum::body::Body::from(answer.bytes().await.unwrap()))
        .unwrap()
}

async fn stub(
    State(state): State<Arc<StubState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    state.seen.lock().unwrap().push((key, Instant::now()));
    let act = state.script.lock().unwrap().pop_front();
    match act {
        None => forward(&state, method, &uri, &headers, body).await,
        Some(Act::Problem(status, slug, retry_after)) => problem(status, slug, retry_after),
        Some(Act::Stall(d)) => {
            tokio::time::sleep(d).await;
            forward(&state, method, &uri, &headers, body).await
        }
        Some(Act::ForwardThenLose) => {
            let _ = forward(&state, method, &uri, &headers, body).await;
            problem(503, "store-unavailable", Some(0))
        }
    }
}

fn order_body(client_order_id: &str) -> serde_json::Value {
    serde_json::json!({
        "client_order_id": client_order_id,
        "cart_id": "cart-1",
        "amount": 1999,
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 2}],
    })
}

/// Fast retries, so the tests measure the rules and not the default waits.
fn quick(attempts_max: u32) -> RetryPolicy {
    RetryPolicy {
        attempts_max,
        backoff_ms_base: 1,
        backoff_ms_max: 5,
        retry_after_ms_max: 5_000,
        request_timeout_ms: 2_000,
    }
}

#[tokio::test]
async fn retries_503_429_and_409_under_one_key_then_replays() {
    let node = Node::start().await;
    let stub = Stub::start(
        &node.url,
        vec![
            Act::Problem(503, "store-unavailable", Some(0)),
            Act::Problem(429, "rate-limited", Some(0)),
            Act::Problem(409, "request-in-progress", Some(0)),
        ],
    )
    .await;
    let client = Client::new(&stub.url, &node.token)
        .unwrap()
        .with_policy(quick(6))
        .unwrap();
    let intent = client.intent(order_body("c-retry"));
    let first = client.create_order_receipt(&intent).await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false));
    assert_eq!(stub.keys(), vec![intent.key().to_owned(); 4]);

    let again = client.create_order_receipt(&intent).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.order, first.order);
    assert_eq!(
        client.get_order(&first.order.order_id).await.unwrap(),
        first.order
    );
    stub.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let node = Node::start().await;
    let stub = Stub::start(
        &node.url,
        vec![Act::Problem(503, "store-unavailable", Some(1))],
    )
    .await;
    let client = Client::new(&stub.url, &node.token)
        .unwrap()
        .with_policy(quick(3))
        .unwrap();
    let intent = client.intent(order_body("c-retry-after"));
    client.create_order(&intent).await.unwrap();
    let arrivals = stub.arrivals();
    assert_eq!(arrivals.len(), 2);
    // The backoff alone would wait at most 5 ms; the server asked for 1 s.
    assert!(arrivals[1] - arrivals[0] >= Duration::from_secs(1));
    stub.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn a_422_and_other_4xx_are_never_retried() {
    let node = Node::start().await;
    let stub = Stub::start(
        &node.url,
        vec![Act::Problem(422, "idempotency-key-reused", None)],
    )
    .await;
    let client = Client::new(&stub.url, &node.token)
        .unwrap()
        .with_policy(quick(5))
        .unwrap();
    let err = client
        .create_order(&client.intent(order_body("c-422")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Problem { status: 422, slug, .. } if slug == "idempotency-key-reused")
    );
    assert_eq!(stub.keys().len(), 1);

    // The real node: the same key with a changed body is 422, once.
    let direct = Client::new(&node.url, &node.token)
        .unwrap()
        .with_policy(quick(5))
        .unwrap();
    let intent = direct.intent(order_body("c-reused"));
    direct.create_order(&intent).await.unwrap();
    let mut changed = intent.body().clone();
    changed["amount"] = 1.into();
    let err = direct
        .create_order(&Intent::with_key(intent.key(), changed))
        .await
        .unwrap_err();
    assert_eq!(err.slug(), Some("idempotency-key-reused"));
    assert_eq!(err.status(), Some(422));

    // A field rule failure (400) through the stub: one attempt, typed.
    let before = stub.keys().len();
    let err = client
        .create_order(&client.intent(serde_json::json!({"client_order_id": "c-bad"})))
        .await
        .unwrap_err();
    assert_eq!(err.slug(), Some("invalid-request"));
    assert_eq!(stub.keys().len(), before + 1);
    stub.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn gives_up_with_the_last_error_and_retries_timeouts() {
    let node = Node::start().await;
    let stub = Stub::start(
        &node.url,
        vec![
            Act::Problem(503, "store-unavailable", Some(0)),
            Act::Problem(503, "store-unavailable", Some(0)),
            Act::Problem(503, "owner-unreachable", Some(0)),
            Act::Stall(Duration::from_millis(1_500)),
        ],
    )
    .await;
    let client = Client::new(&stub.url, &node.token)
        .unwrap()
        .with_policy(quick(3))
        .unwrap();
    let err = client
        .create_order(&client.intent(order_body("c-give-up")))
        .await
        .unwrap_err();
    match err {
        Error::GaveUp { attempts, last } => {
            assert_eq!(attempts, 3);
            assert!(
                matches!(*last, Error::Problem { status: 503, ref slug, .. } if slug == "owner-unreachable")
            );
        }
        other => panic!("{other:?}"),
    }

    // The next attempt stalls past the client's timeout; the retry succeeds
    // under the same key, and the stalled one (forwarded late) replays it.
    let patient = Client::new(&stub.url, &node.token)
        .unwrap()
        .with_policy(RetryPolicy {
            request_timeout_ms: 300,
            ..quick(4)
        })
        .unwrap();
    let intent = patient.intent(order_body("c-timeout"));
    let order = patient.create_order(&intent).await.unwrap();
    let keys = stub.keys();
    assert_eq!(
        &keys[keys.len() - 2..],
        &[intent.key().to_owned(), intent.key().to_owned()]
    );
    // Give the stalled forward time to land, then check there is one order.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let found = patient
        .find_by_client_order_id("c-timeout")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.order_id, order.order_id);
    stub.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn a_journal_resumes_after_a_restart_with_exactly_one_order() {
    let node = Node::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pending-intents.json");
    // Every answer is lost after the node committed: the first process gives up
    // not knowing whether the order exists.
    let stub = Stub::start(&node.url, vec![Act::ForwardThenLose; 3]).await;
    let intent = {
        let journal = Arc::new(IntentJournal::open(&path).unwrap());
        let client = Client::new(&stub.url, &node.token)
            .unwrap()
            .with_policy(quick(3))
            .unwrap()
            .with_journal(journal.clone())
            .unwrap();
        let intent = client.intent(order_body("c-journal"));
        let err = client.create_order(&intent).await.unwrap_err();
        assert!(matches!(err, Error::GaveUp { attempts: 3, .. }));
        assert_eq!(journal.pending(), vec![intent.clone()]);
        intent
        // The process "dies" here: client and journal are dropped.
    };
    assert_eq!(stub.keys(), vec![intent.key().to_owned(); 3]);

    // The restarted process reads the journal from disk and resumes.
    let journal = Arc::new(IntentJournal::open(&path).unwrap());
    assert_eq!(journal.pending(), vec![intent.clone()]);
    let client = Client::new(&node.url, &node.token)
        .unwrap()
        .with_policy(quick(3))
        .unwrap()
        .with_journal(journal.clone())
        .unwrap();
    let resumed = client.resume().await;
    assert_eq!(resumed.len(), 1);
    let receipt = resumed[0].1.as_ref().unwrap();
    assert!(receipt.replayed, "the order was created before the restart");
    assert!(journal.pending().is_empty());
    assert!(IntentJournal::open(&path).unwrap().pending().is_empty());

    let found = client
        .find_by_client_order_id("c-journal")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.order_id, receipt.order.order_id);
    assert!(client
        .find_by_client_order_id("c-never")
        .await
        .unwrap()
        .is_none());
    stub.stop().await;
    node.stop().await;
}

#[tokio::test]
async fn a_claim_guard_heartbeats_until_complete_and_stops_on_drop() {
    let node = Node::start().await;
    let client = Client::new(&node.url, &node.token)
        .unwrap()
        .with_policy(quick(3))
        .unwrap();
    let once = client.clone().with_policy(quick(1)).unwrap();
    let request = ClaimRequest {
        operation: "POST:/v1/payouts".into(),
        key: "payout-1".into(),
        fingerprint: "sha256:abc".into(),
        lease_ms: 300,
    };
    let Claim::Acquired(guard) = client.claim(&request).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    assert!(!guard.recovery());
    // Work for three leases: the guard's heartbeats keep the claim ours.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let err = once.claim(&request).await.unwrap_err();
    assert_eq!(err.slug(), Some("request-in-progress"));
    assert!(!guard.is_lost());
    let response = keyhold_client::Response {
        status: 201,
        headers: Default::default(),
        body: serde_json::json!({"payout_id": "po_1"}),
    };
    let state = guard
        .complete(&Completion {
            outcome: Outcome::Succeeded,
            response: Some(response.clone()),
            resource_id: Some("po_1".into()),
        })
        .await
        .unwrap();
    assert_eq!(state, "SUCCEEDED");
    match client.claim(&request).await.unwrap() {
        Claim::Completed(done) => {
            assert_eq!(done.response, response);
            assert_eq!(done.resource_id.as_deref(), Some("po_1"));
        }
        Claim::Acquired(_) => panic!("a completed key replays"),
    }

    // A dropped guard stops heartbeating: the lease runs out and the next
    // claim recovers the work.
    let other = ClaimRequest {
        key: "payout-2".into(),
        ..request.clone()
    };
    let Claim::Acquired(guard) = client.claim(&other).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    drop(guard);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let Claim::Acquired(again) = client.claim(&other).await.unwrap() else {
        panic!("an expired lease is acquired again");
    };
    assert!(again.recovery());
    // An explicit heartbeat with a stale token is refused.
    let err = client
        .heartbeat(&other.operation, &other.key, "not-a-token", 300)
        .await
        .unwrap_err();
    assert!(matches!(err.status(), Some(400 | 409)));
    drop(again);
    node.stop().await;
}
