//! End-to-end tests of contract section 7: every order is charged exactly once
//! and its items reserved exactly once, although events are delivered at least
//! once, clients retry, the payment provider loses answers and the node is
//! killed with SIGKILL in the middle; an outbox replay changes nothing; and a
//! consumer killed between its effect and its acknowledgement does not repeat
//! the effect.

mod common;

use common::{unique, Cluster};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ORDERS: usize = 500;
const CLIENTS: usize = 8;

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// One intent: a key, a body, and its item lines.
struct Intent {
    key: String,
    body: String,
    client_order_id: String,
    lines: usize,
}

fn intent(run: &str, i: usize) -> Intent {
    let client_order_id = format!("{run}-{i}");
    let lines = 1 + i % 3;
    let items: Vec<Value> = (0..lines)
        .map(|l| json!({"sku": format!("sku-{l}"), "quantity": 1 + (i + l) % 4}))
        .collect();
    let body = json!({
        "client_order_id": client_order_id,
        "cart_id": "cart-d",
        "amount": 1000 + i,
        "currency": "EUR",
        "items": items,
    })
    .to_string();
    Intent {
        key: format!("k-{client_order_id}"),
        body,
        client_order_id,
        lines,
    }
}

/// Sends an intent until an answer with an order arrives (retrying through
/// restarts with the same key), then sends it 1-2 more times as clients that
/// did not trust the first answer do. Returns the order id.
fn place(
    http: &reqwest::blocking::Client,
    base: &Mutex<String>,
    token: &str,
    it: &Intent,
    extra: usize,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut order_id: Option<String> = None;
    let mut sends = 0;
    while order_id.is_none() || sends < 1 + extra {
        assert!(
            Instant::now() < deadline,
            "order {} never acknowledged",
            it.client_order_id
        );
        let url = format!("{}/v1/orders", base.lock().unwrap());
        let sent = http
            .post(url)
            .bearer_auth(token)
            .header("idempotency-key", &it.key)
            .header("content-type", "application/json")
            .body(it.body.clone())
            .send();
        let Ok(resp) = sent else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let status = resp.status().as_u16();
        let Ok(j) = resp.json::<Value>() else {
            continue;
        };
        match status {
            201 | 200 => {
                let id = j["order_id"].as_str().expect("order id").to_owned();
                if let Some(first) = &order_id {
                    assert_eq!(
                        first, &id,
                        "a retry of {} named another order",
                        it.client_order_id
                    );
                }
                order_id = Some(id);
                sends += 1;
            }
            409 | 429 | 503 => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("unexpected {other} for {}: {j}", it.client_order_id),
        }
    }
    order_id.expect("acknowledged")
}

fn charges(http: &reqwest::blocking::Client, psp_url: &str) -> Vec<Value> {
    let j: Value = http
        .get(format!("{psp_url}/v1/charges"))
        .send()
        .expect("psp answers")
        .json()
        .expect("json");
    j["data"].as_array().expect("data").clone()
}

fn reservations(
    http: &reqwest::blocking::Client,
    api: &str,
    admin: &str,
    order_id: &str,
) -> Vec<Value> {
    let j: Value = http
        .get(format!(
            "{api}/admin/v1/inventory/reservations?order_id={order_id}"
        ))
        .bearer_auth(admin)
        .send()
        .expect("node answers")
        .json()
        .expect("json");
    j["data"].as_array().expect("data").clone()
}

fn psp_url(cluster: &Cluster) -> String {
    cluster.info.raw["psp_url"]
        .as_str()
        .expect("cluster.json names psp_url")
        .to_owned()
}

/// Waits until every order is PAID or PAYMENT_FAILED and has all its
/// reservations; returns the status per order.
fn settle(
    http: &reqwest::blocking::Client,
    cluster: &Cluster,
    token: &str,
    orders: &BTreeMap<String, (String, usize)>,
) -> BTreeMap<String, String> {
    let api = cluster.region("a").api_url.clone();
    let admin = cluster.info.admin_token.clone();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut statuses = BTreeMap::new();
    for (order_id, (_, lines)) in orders {
        loop {
            let j: Value = http
                .get(format!("{api}/v1/orders/{order_id}"))
                .bearer_auth(token)
                .send()
                .expect("node answers")
                .json()
                .expect("json");
            let status = j["status"].as_str().unwrap_or("").to_owned();
            let reserved = reservations(http, &api, &admin, order_id).len();
            if status != "CONFIRMED" && reserved >= *lines {
                statuses.insert(order_id.clone(), status);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "order {order_id} did not settle: status {status}, {reserved}/{lines} reservations\n{}",
                cluster.stderr_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    statuses
}

/// Checks exactly one charge per order (and none for anything else) and exactly
/// one reservation per item line; returns (charges, reservations) counts.
fn assert_exactly_once(
    http: &reqwest::blocking::Client,
    cluster: &Cluster,
    orders: &BTreeMap<String, (String, usize)>,
    statuses: &BTreeMap<String, String>,
) -> (usize, usize) {
    let list = charges(http, &psp_url(cluster));
    let mut per_order: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for c in &list {
        per_order
            .entry(c["order_id"].as_str().expect("order_id").to_owned())
            .or_default()
            .push(c);
    }
    for (order_id, status) in statuses {
        let cs = per_order.get(order_id).map_or(&[][..], |v| v.as_slice());
        assert_eq!(cs.len(), 1, "order {order_id} has {} charges", cs.len());
        let expected = if cs[0]["status"] == "succeeded" {
            "PAID"
        } else {
            "PAYMENT_FAILED"
        };
        assert_eq!(
            status, expected,
            "order {order_id} status vs its charge {}",
            cs[0]
        );
    }
    assert_eq!(list.len(), orders.len(), "charges for unknown orders exist");
    let api = cluster.region("a").api_url.clone();
    let mut total = 0;
    for (order_id, (_, lines)) in orders {
        let rs = reservations(http, &api, &cluster.info.admin_token, order_id);
        let distinct: BTreeSet<u64> = rs
            .iter()
            .map(|r| r["line"].as_u64().expect("line"))
            .collect();
        assert_eq!(rs.len(), *lines, "order {order_id}: {rs:?}");
        assert_eq!(
            distinct.len(),
            *lines,
            "order {order_id} has a line reserved twice"
        );
        for r in &rs {
            assert_eq!(r["order_id"], order_id.as_str());
            assert!(r["event_id"].as_str().is_some_and(|e| !e.is_empty()));
        }
        total += rs.len();
    }
    (list.len(), total)
}

fn metric(http: &reqwest::blocking::Client, api: &str, name: &str) -> f64 {
    let text = http
        .get(format!("{api}/metrics"))
        .send()
        .expect("metrics")
        .text()
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn every_order_is_charged_and_reserved_exactly_once_through_crash_retries_and_replay() {
    let mut cluster = Cluster::start(
        "a",
        &[
            "--psp-drop-response-rate",
            "0.2",
            "--psp-decline-rate",
            "0.1",
        ],
    );
    let tenant = cluster.tenant("a");
    let base = Arc::new(Mutex::new(cluster.region("a").api_url.clone()));
    let run = unique("d");
    let intents: Arc<Vec<Intent>> = Arc::new((0..ORDERS).map(|i| intent(&run, i)).collect());
    let placed = Arc::new(Mutex::new(BTreeMap::new()));
    let next = Arc::new(Mutex::new(0usize));

    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (base, intents, placed, next, token) = (
                base.clone(),
                intents.clone(),
                placed.clone(),
                next.clone(),
                tenant.token.clone(),
            );
            std::thread::spawn(move || {
                let http = client();
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        if *n >= intents.len() {
                            return;
                        }
                        *n += 1;
                        *n - 1
                    };
                    let it = &intents[i];
                    let order_id = place(&http, &base, &token, it, 1 + i % 2);
                    let previous = placed
                        .lock()
                        .unwrap()
                        .insert(order_id.clone(), (it.client_order_id.clone(), it.lines));
                    assert!(previous.is_none(), "two intents got order {order_id}");
                }
            })
        })
        .collect();

    // Kill -9 in the middle of the load, then bring the same data dir back.
    let wait_start = Instant::now();
    while *next.lock().unwrap() < ORDERS / 2 && wait_start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.kill9();
    cluster.restart();
    *base.lock().unwrap() = cluster.region("a").api_url.clone();
    for w in workers {
        w.join().expect("client thread");
    }
    let orders = placed.lock().unwrap().clone();
    assert_eq!(orders.len(), ORDERS, "every intent made exactly one order");
    let coids: BTreeSet<_> = orders.values().map(|(c, _)| c.clone()).collect();
    assert_eq!(coids.len(), ORDERS);

    let http = client();
    let statuses = settle(&http, &cluster, &tenant.token, &orders);
    let (charged, reserved) = assert_exactly_once(&http, &cluster, &orders, &statuses);
    // The provider really lost answers, and declined some charges: the paths
    // under test ran.
    let api = cluster.region("a").api_url.clone();
    assert!(
        metric(&http, &api, "keyhold_psp_retries_total") > 0.0,
        "no lost answer was retried"
    );
    assert!(
        statuses.values().any(|s| s == "PAYMENT_FAILED"),
        "no charge was declined"
    );
    assert!(statuses.values().any(|s| s == "PAID"));

    // Replay every kept event: nothing downstream may move.
    let skipped_before = metric(&http, &api, "keyhold_consumer_duplicates_skipped_total");
    let r = http
        .post(format!("{api}/admin/v1/outbox/replay"))
        .bearer_auth(&cluster.info.admin_token)
        .send()
        .expect("replay");
    assert_eq!(r.status().as_u16(), 202);
    let replayed = r.json::<Value>().expect("json")["replayed"]
        .as_u64()
        .expect("count");
    assert!(replayed >= ORDERS as u64, "replayed {replayed}");
    // Both consumers skip every replayed event.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&http, &api, "keyhold_consumer_duplicates_skipped_total")
        < skipped_before + 2.0 * replayed as f64
    {
        assert!(Instant::now() < deadline, "replay was not consumed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let statuses_after = settle(&http, &cluster, &tenant.token, &orders);
    assert_eq!(statuses_after, statuses);
    assert_eq!(
        assert_exactly_once(&http, &cluster, &orders, &statuses_after),
        (charged, reserved)
    );
    // The replay with a `since` in the future republishes nothing.
    let r = http
        .post(format!("{api}/admin/v1/outbox/replay"))
        .bearer_auth(&cluster.info.admin_token)
        .header("content-type", "application/json")
        .body(json!({"since": "2999-01-01T00:00:00Z"}).to_string())
        .send()
        .expect("replay since");
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(r.json::<Value>().expect("json")["replayed"], 0);
}

#[test]
fn a_consumer_killed_between_effect_and_ack_does_not_repeat_the_effect() {
    let mut cluster = Cluster::start("a", &[]);
    let tenant = cluster.tenant("a");
    let token = tenant.token.clone();
    let http = client();
    // The next start aborts right after the inventory consumer's first effect.
    cluster.terminate();
    cluster.env = vec![(
        "KEYHOLD_FAULT_ABORT_AFTER_EFFECT".into(),
        "inventory".into(),
    )];
    cluster.restart();
    let it = intent(&unique("f"), 2);
    let api = cluster.region("a").api_url.clone();
    let resp = http
        .post(format!("{api}/v1/orders"))
        .bearer_auth(&token)
        .header("idempotency-key", &it.key)
        .header("content-type", "application/json")
        .body(it.body.clone())
        .send()
        .expect("order");
    assert_eq!(resp.status().as_u16(), 201);
    let order_id = resp.json::<Value>().expect("json")["order_id"]
        .as_str()
        .expect("id")
        .to_owned();
    // The node aborts; `up` logs it and leaves it down.
    cluster.wait_node_down("a", Duration::from_secs(20));
    assert!(
        cluster.stderr_log().contains("node exited unexpectedly"),
        "up reports the abort: {}",
        cluster.stderr_tail()
    );

    cluster.env.clear();
    cluster.kill9();
    cluster.restart();
    let api = cluster.region("a").api_url.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The event comes round again; the consumer must recognise it.
    while metric(
        &http,
        &api,
        "keyhold_consumer_duplicates_skipped_total{consumer=\"inventory\"}",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "the event was not redelivered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rs = reservations(&http, &api, &cluster.info.admin_token, &order_id);
    assert_eq!(rs.len(), it.lines, "{rs:?}");
    assert_eq!(
        metric(
            &http,
            &api,
            "keyhold_consumer_effects_total{consumer=\"inventory\"}"
        ),
        0.0
    );
}

/// The outbox and the stock ledger are per region; the admin endpoints answer for
/// the whole cluster from any node.
#[test]
fn replay_and_reservations_answer_for_every_region_from_any_node() {
    let cluster = Cluster::start("a,b,c", &[]);
    let http = client();
    let admin = cluster.info.admin_token.clone();
    let tenant = cluster.tenant("b");
    let it = intent(&unique("x"), 4);
    let b = cluster.region("b").api_url.clone();
    let resp = http
        .post(format!("{b}/v1/orders"))
        .bearer_auth(&tenant.token)
        .header("idempotency-key", &it.key)
        .header("content-type", "application/json")
        .body(it.body.clone())
        .send()
        .expect("order");
    assert_eq!(resp.status().as_u16(), 201);
    let order_id = resp.json::<Value>().expect("json")["order_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let a = cluster.region("a").api_url.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rs = reservations(&http, &a, &admin, &order_id);
        if rs.len() == it.lines {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reservations of a b-order never visible from a: {rs:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = cluster.region("c").api_url.clone();
    let r = http
        .post(format!("{c}/admin/v1/outbox/replay"))
        .bearer_auth(&admin)
        .send()
        .expect("replay");
    assert_eq!(r.status().as_u16(), 202);
    assert!(
        r.json::<Value>().expect("json")["replayed"]
            .as_u64()
            .expect("count")
            >= 1
    );
    // Redelivered, recognised, and still one reservation per line.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(reservations(&http, &a, &admin, &order_id).len(), it.lines);
}
