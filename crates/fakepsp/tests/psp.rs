//! End-to-end tests of the fake payment provider: each starts the real server
//! on 127.0.0.1:0 through `run` and talks HTTP to it with reqwest, restarting
//! it on the same data directory where durability is the point.

use keyhold_fakepsp::{run, Error, PspConfig};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Psp {
    base: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), Error>>,
}

impl Psp {
    async fn start(data_dir: &Path, drop_response_rate: f64, decline_rate: f64) -> Psp {
        Psp::start_with(PspConfig {
            drop_response_rate,
            decline_rate,
            ..PspConfig::new(data_dir)
        })
        .await
    }

    async fn start_with(config: PspConfig) -> Psp {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(config, listener, async {
            let _ = stopped.await;
        }));
        Psp {
            base: format!("http://{addr}"),
            stop,
            task,
        }
    }

    /// Stops the server and waits until it has released the data directory.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn charge(&self, key: &str, body: &str) -> (u16, Option<String>, Vec<u8>) {
        // A fresh client per request: a lost answer closes its connection.
        let response = reqwest::Client::new()
            .post(self.url("/v1/charges"))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = response.bytes().await.unwrap().to_vec();
        (status, replayed, bytes)
    }

    async fn charges(&self) -> Vec<Value> {
        let response = reqwest::get(self.url("/v1/charges")).await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let body: Value = response.json().await.unwrap();
        body["data"].as_array().unwrap().clone()
    }
}

fn order(order_id: &str, amount: u64) -> String {
    format!(r#"{{"order_id":"{order_id}","amount":{amount},"currency":"EUR"}}"#)
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test]
async fn same_key_same_body_is_one_charge_and_an_identical_replay() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 0.0, 0.0).await;

    let (status, replayed, first) = psp.charge("evt-1", &order("o1", 1250)).await;
    assert_eq!(status, 201);
    assert_eq!(replayed, None);
    let charge = json(&first);
    assert!(charge["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(charge["order_id"], "o1");
    assert_eq!(charge["amount"], 1250);
    assert_eq!(charge["currency"], "EUR");
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(charge["idempotency_key"], "evt-1");
    assert!(charge["created_at"].as_str().unwrap().ends_with('Z'));

    let (status, replayed, again) = psp.charge("evt-1", &order("o1", 1250)).await;
    assert_eq!(status, 201);
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again, first, "a replay answers the same bytes");

    // The same request serialized differently is still the same body.
    let reordered = r#"{ "currency": "EUR", "amount": 1250, "order_id": "o1" }"#;
    let (status, replayed, third) = psp.charge("evt-1", reordered).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(third, first);

    assert_eq!(psp.charges().await, vec![charge]);
    psp.stop().await;
}

/// A client that lost an answer and then had its retry refused learns what
/// happened from the lookup by key, which sends nothing new.
#[tokio::test]
async fn a_refused_replay_leaves_the_charge_to_be_found_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start_with(PspConfig {
        refuse_replay_rate: 1.0,
        ..PspConfig::new(dir.path())
    })
    .await;
    let (status, _, first) = psp.charge("evt/3", &order("o3", 700)).await;
    assert_eq!(status, 201);
    let (status, replayed, refused) = psp.charge("evt/3", &order("o3", 700)).await;
    assert_eq!((status, replayed), (400, None));
    assert_eq!(json(&refused)["error"], "idempotency_key_expired");

    let found = reqwest::get(psp.url("/v1/charges/by-key/evt%2F3"))
        .await
        .unwrap();
    assert_eq!(found.status().as_u16(), 200);
    assert_eq!(found.bytes().await.unwrap().to_vec(), first);
    let missing = reqwest::get(psp.url("/v1/charges/by-key/evt-none"))
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"], "not_found");
    assert_eq!(psp.charges().await.len(), 1);
    psp.stop().await;
}

#[tokio::test]
async fn same_key_other_body_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 0.0, 0.0).await;

    let (status, _, first) = psp.charge("evt-2", &order("o2", 500)).await;
    assert_eq!(status, 201);
    let (status, replayed, refused) = psp.charge("evt-2", &order("o2", 501)).await;
    assert_eq!(status, 422);
    assert_eq!(replayed, None);
    assert_eq!(json(&refused)["error"], "idempotency_key_reused");

    assert_eq!(psp.charges().await, vec![json(&first)]);
    psp.stop().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_key_make_exactly_one_charge() {
    let dir = tempfile::tempdir().unwrap();
    let psp = std::sync::Arc::new(Psp::start(dir.path(), 0.0, 0.0).await);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let psp = psp.clone();
        tasks.spawn(async move { psp.charge("evt-race", &order("o3", 999)).await });
    }
    let mut answers = Vec::new();
    while let Some(answer) = tasks.join_next().await {
        answers.push(answer.unwrap());
    }
    assert_eq!(answers.len(), 32);
    let first = answers.iter().filter(|(_, replayed, _)| replayed.is_none());
    assert_eq!(first.count(), 1, "exactly one answer created the charge");
    for (status, _, body) in &answers {
        assert_eq!(*status, 201);
        assert_eq!(body, &answers[0].2);
    }
    let charges = psp.charges().await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0], json(&answers[0].2));

    let psp = std::sync::Arc::into_inner(psp).unwrap();
    psp.stop().await;
}

#[tokio::test]
async fn declined_charges_are_402_and_listed_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 0.0, 1.0).await;

    let (status, _, body) = psp.charge("evt-4", &order("o4", 700)).await;
    assert_eq!(status, 402);
    let charge = json(&body);
    assert_eq!(charge["status"], "failed");
    assert_eq!(charge["order_id"], "o4");

    let (status, replayed, again) = psp.charge("evt-4", &order("o4", 700)).await;
    assert_eq!((status, replayed.as_deref()), (402, Some("true")));
    assert_eq!(again, body);

    assert_eq!(psp.charges().await, vec![charge]);
    psp.stop().await;
}

#[tokio::test]
async fn a_lost_answer_still_commits_and_a_retry_gets_the_same_charge() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 1.0, 0.0).await;
    let body = order("o5", 4200);

    let lost = async {
        reqwest::Client::new()
            .post(psp.url("/v1/charges"))
            .header("Idempotency-Key", "evt-5")
            .body(body.clone())
            .send()
            .await?
            .bytes()
            .await
    }
    .await;
    let error = lost.expect_err("the answer must be lost");
    assert!(error.is_request() || error.is_body(), "{error:?}");

    let charges = psp.charges().await;
    assert_eq!(charges.len(), 1, "the charge was committed before the loss");
    assert_eq!(charges[0]["order_id"], "o5");
    assert_eq!(charges[0]["status"], "succeeded");

    // A retry is lost again at this rate, and still makes no second charge.
    let retry = reqwest::Client::new()
        .post(psp.url("/v1/charges"))
        .header("Idempotency-Key", "evt-5")
        .body(body.clone())
        .send()
        .await;
    assert!(retry.is_err());
    assert_eq!(psp.charges().await.len(), 1);
    psp.stop().await;

    let psp = Psp::start(dir.path(), 0.0, 0.0).await;
    let (status, replayed, answer) = psp.charge("evt-5", &body).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(json(&answer)["id"], charges[0]["id"]);
    assert_eq!(psp.charges().await, charges);
    psp.stop().await;
}

#[tokio::test]
async fn charges_survive_a_restart_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 0.0, 0.5).await;
    let mut answered = Vec::new();
    for i in 0..5 {
        let (status, _, body) = psp
            .charge(&format!("evt-6-{i}"), &order(&format!("o6-{i}"), 100 + i))
            .await;
        assert!(status == 201 || status == 402, "{status}");
        answered.push(json(&body));
    }
    assert_eq!(psp.charges().await, answered);
    psp.stop().await;

    let psp = Psp::start(dir.path(), 0.0, 0.0).await;
    assert_eq!(psp.charges().await, answered);
    psp.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_400_json() {
    let dir = tempfile::tempdir().unwrap();
    let psp = Psp::start(dir.path(), 0.0, 0.0).await;
    let client = reqwest::Client::new();

    let missing_key = client
        .post(psp.url("/v1/charges"))
        .body(order("o7", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(missing_key.status().as_u16(), 400);
    let error: Value = missing_key.json().await.unwrap();
    assert_eq!(error["error"], "idempotency_key_invalid");

    for bad in [
        order("o7", 0),
        r#"{"order_id":"o7","amount":5,"currency":"usd"}"#.to_owned(),
        "not json".to_owned(),
    ] {
        let (status, _, body) = psp.charge("evt-7", &bad).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(json(&body)["error"], "invalid_request");
    }
    let too_big = format!(
        r#"{{"order_id":"o7","amount":5,"currency":"EUR","metadata":{{"pad":"{}"}}}}"#,
        "x".repeat(keyhold_fakepsp::limits::BODY_BYTES_MAX)
    );
    let (status, _, _) = psp.charge("evt-7", &too_big).await;
    assert_eq!(status, 413);

    let health = client.get(psp.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    assert!(psp.charges().await.is_empty());
    psp.stop().await;
}

#[tokio::test]
async fn rates_outside_zero_to_one_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = PspConfig {
        decline_rate: -0.1,
        ..PspConfig::new(dir.path())
    };
    let error = run(config, listener, async {}).await.unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error}");
    assert!(error.to_string().contains("decline_rate"), "{error}");
}
