//! End-to-end crash test: `keyhold up` is killed with SIGKILL while 8 client
//! threads create orders, then restarted on the same data dir, and every request
//! (answered or not) is retried with its same key and body. Nothing answered may
//! be lost (same order id, byte-identical replay), and no client_order_id may end
//! up with more than one order.

mod common;

use common::{order_body, unique, Cluster, Resp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Attempt {
    key: String,
    client_order_id: String,
    body: String,
    /// The answer, if one arrived before the crash.
    answer: Option<Resp>,
}

fn order_id(r: &Resp) -> String {
    r.json()["order_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no order_id in {}", r.text()))
        .to_owned()
}

#[test]
fn kill_9_under_load_loses_nothing_acknowledged_and_duplicates_nothing() {
    let mut cluster = Cluster::start("a", &[]);
    let api = cluster.api("a");
    let token = cluster.tenant("a").token;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));

    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (api, token, stop, acked) =
                (api.clone(), token.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let mut attempts = Vec::new();
                let started = Instant::now();
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > Duration::from_secs(20) {
                        break;
                    }
                    let key = unique(&format!("crash{t}"));
                    let client_order_id = unique(&format!("co{t}-{i}"));
                    let body = order_body(&client_order_id, 1 + i as u64);
                    let sent = api.try_send(api.order_rb(&token, &key, &body));
                    let failed = sent.is_err();
                    let answer = sent.ok().filter(|r| {
                        assert!(
                            r.status == 201,
                            "before the crash every new order is created: {} {}",
                            r.status,
                            r.text()
                        );
                        true
                    });
                    if answer.is_some() {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    attempts.push(Attempt {
                        key,
                        client_order_id,
                        body,
                        answer,
                    });
                    if failed {
                        // The server is gone; this attempt stays unanswered.
                        break;
                    }
                }
                attempts
            })
        })
        .collect();

    // Let real traffic build up, then pull the plug mid-flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    std::thread::sleep(Duration::from_millis(300));
    while acked.load(Ordering::Relaxed) < 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.kill9();
    stop.store(true, Ordering::Relaxed);
    let attempts: Vec<Attempt> = threads
        .into_iter()
        .flat_map(|h| h.join().expect("client thread"))
        .collect();
    let answered = attempts.iter().filter(|a| a.answer.is_some()).count();
    assert!(
        answered >= 20,
        "only {answered} orders were acknowledged before the crash"
    );

    cluster.restart();
    let api = cluster.api("a");
    let mut orders_by_coid: HashMap<String, String> = HashMap::new();
    let mut unanswered_committed = 0;
    for a in &attempts {
        let retry = api.create_order(&token, &a.key, &a.body);
        assert_eq!(retry.status, 201, "retry of {}: {}", a.key, retry.text());
        let id = order_id(&retry);
        match &a.answer {
            Some(first) => {
                assert_eq!(order_id(first), id, "acknowledged order {} survived", a.key);
                assert_eq!(
                    retry.body, first.body,
                    "byte-identical replay after the crash"
                );
                assert_eq!(retry.header("location"), first.header("location"));
                assert_eq!(retry.header("idempotent-replayed").as_deref(), Some("true"));
            }
            None => {
                if retry.header("idempotent-replayed").as_deref() == Some("true") {
                    unanswered_committed += 1;
                }
            }
        }
        // Again: now every attempt is decided and replays.
        let again = api.create_order(&token, &a.key, &a.body);
        assert_eq!((again.status, &again.body), (201, &retry.body));
        assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
        assert!(
            orders_by_coid
                .insert(a.client_order_id.clone(), id)
                .is_none(),
            "client_order_ids are unique per attempt"
        );
    }
    // One order per client_order_id, the one every answer named.
    for (coid, id) in &orders_by_coid {
        let found = api.find_order(&token, coid);
        found.assert_status(200);
        assert_eq!(
            found.json()["order_id"].as_str(),
            Some(id.as_str()),
            "{coid}"
        );
        api.get_order(&token, id).assert_status(200);
    }
    eprintln!(
        "crash test: {} attempts, {answered} acknowledged, {unanswered_committed} committed but unanswered",
        attempts.len()
    );
}
