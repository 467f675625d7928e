//! A node with `downstream = "off"` takes orders without delivering them: one
//! node alone, started in this process through `keyhold_server::run` with a
//! fake payment provider, creates an order whose `order.created` event gets
//! no reservation and no charge while the node runs far longer than its
//! relays take to deliver an event; the same node started again on the same
//! data dir with downstream on delivers that kept event (its reservations,
//! its charge, the order paid), which shows the wait was long enough for a
//! relay to have acted.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use keyhold_server::config::Downstream;
use keyhold_server::limits::{RELAY_IDLE_POLL_MS, RELAY_LINGER_MS};
use keyhold_server::Config;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const ADMIN_TOKEN: &str = "downstream-off-admin-token-0123456789";
/// Start-up and delivery on a loaded two-core machine.
const WAIT: Duration = Duration::from_secs(30);
/// How long the node with downstream off runs after the order: many relay
/// rounds' worth (a relay wakes on the order itself, or at the latest after
/// its idle poll).
const UNDELIVERED_FOR: Duration =
    Duration::from_millis(10 * (RELAY_IDLE_POLL_MS + RELAY_LINGER_MS));

struct TestNode {
    addr: SocketAddr,
    api: String,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), keyhold_server::Error>>,
}

impl TestNode {
    /// Starts the node on `addr` (port 0: any), where the registry it creates
    /// says its region answers, so it must be the same on a restart.
    async fn start(
        dir: &Path,
        addr: SocketAddr,
        psp_url: &str,
        downstream: Downstream,
    ) -> TestNode {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let api = format!("http://{addr}");
        let mut config = Config::new("a", dir.to_path_buf(), ADMIN_TOKEN.into());
        // Admin calls fan out to where the registry says region a answers.
        config.listen = addr.to_string();
        config.psp_url = Some(psp_url.to_owned());
        config.downstream = downstream;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(keyhold_server::run(config, listener, async move {
            let _ = stopped.await;
        }));
        let node = TestNode {
            addr,
            api,
            stop,
            task,
        };
        node.wait_ready().await;
        node
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = client().get(format!("{}/readyz", self.api)).send().await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return;
            }
            assert!(Instant::now() < deadline, "{} not ready", self.api);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("node task")
            .expect("node stopped cleanly");
    }

    async fn create_tenant(&self) -> String {
        let created = client()
            .post(format!("{}/admin/v1/tenants", self.api))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"tenant_id": "shop", "home_region": "a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let body: Value = created.json().await.unwrap();
        body["token"].as_str().unwrap().to_owned()
    }

    async fn reservations(&self, order_id: &str) -> Vec<Value> {
        let url = format!(
            "{}/admin/v1/inventory/reservations?order_id={order_id}",
            self.api
        );
        data(get_json(&url, Some(ADMIN_TOKEN)).await)
    }

    async fn order_status(&self, token: &str, order_id: &str) -> String {
        let url = format!("{}/v1/orders/{order_id}", self.api);
        let order = get_json(&url, Some(token)).await;
        order["status"].as_str().unwrap_or_default().to_owned()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `GET url`'s JSON answer, which must be a 200.
async fn get_json(url: &str, token: Option<&str>) -> Value {
    let mut request = client().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{url}: {body}");
    body
}

/// A listing's `data`.
fn data(listing: Value) -> Vec<Value> {
    listing["data"].as_array().cloned().unwrap_or_default()
}

async fn charges(psp_url: &str) -> Vec<Value> {
    data(get_json(&format!("{psp_url}/v1/charges"), None).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_downstream_off_an_order_s_event_waits_until_downstream_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let psp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let psp_url = format!("http://{}", psp_listener.local_addr().unwrap());
    let (psp_stop, psp_stopped) = oneshot::channel::<()>();
    let psp = tokio::spawn(keyhold_fakepsp::run(
        keyhold_fakepsp::PspConfig::new(dir.path().join("psp")),
        psp_listener,
        async {
            let _ = psp_stopped.await;
        },
    ));
    let node_dir = dir.path().join("node");

    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let node = TestNode::start(&node_dir, any_port, &psp_url, Downstream::Off).await;
    let addr = node.addr;
    let token = node.create_tenant().await;
    let created = client()
        .post(format!("{}/v1/orders", node.api))
        .bearer_auth(&token)
        .header("idempotency-key", "k-1")
        .json(&json!({
            "client_order_id": "co-1",
            "cart_id": "cart-1",
            "amount": 1200,
            "currency": "EUR",
            "items": [{"sku": "sku-1", "quantity": 1}, {"sku": "sku-2", "quantity": 3}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let order_id = created.json::<Value>().await.unwrap()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();

    tokio::time::sleep(UNDELIVERED_FOR).await;
    assert_eq!(node.reservations(&order_id).await, Vec::<Value>::new());
    assert_eq!(charges(&psp_url).await, Vec::<Value>::new());
    assert_eq!(node.order_status(&token, &order_id).await, "CONFIRMED");
    node.stop().await;

    // The kept event is delivered once the relays run.
    let node = TestNode::start(&node_dir, addr, &psp_url, Downstream::On).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let reserved = node.reservations(&order_id).await.len();
        let charged = charges(&psp_url).await.len();
        let status = node.order_status(&token, &order_id).await;
        if reserved == 2 && charged == 1 && status == "PAID" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered: {reserved} reservations, {charged} charges, status {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.stop().await;
    let _ = psp_stop.send(());
    psp.await.unwrap().unwrap();
}
