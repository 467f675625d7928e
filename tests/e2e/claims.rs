//! End-to-end tests of the claims API (contract section 5): acquiring a claim,
//! in-progress refusal with `Retry-After`, completion and byte-exact replay of the
//! stored response body, key reuse, lease bounds, lease expiry with recovery and
//! fencing of the previous owner (`stale-owner-token` on its complete and
//! heartbeat), heartbeats, and the FAILED_RETRYABLE / FAILED_FINAL outcomes.

mod common;

use common::{unique, Api, Cluster, Resp};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const OP: &str = "POST:/v1/payments";

struct Claims {
    _cluster: Cluster,
    api: Api,
    token: String,
}

impl Claims {
    fn start() -> Claims {
        let cluster = Cluster::start("a", &[]);
        let api = cluster.api("a");
        let token = cluster.tenant("a").token;
        Claims {
            _cluster: cluster,
            api,
            token,
        }
    }

    fn claim(&self, op: &str, key: &str, fingerprint: &str, lease_ms: u64) -> Resp {
        let body =
            json!({"operation": op, "key": key, "fingerprint": fingerprint, "lease_ms": lease_ms});
        self.api
            .post_json("/v1/claims", Some(&self.token), &body.to_string())
    }

    fn complete_raw(&self, body: &str) -> Resp {
        self.api
            .post_json("/v1/claims/complete", Some(&self.token), body)
    }

    fn complete(&self, key: &str, owner: &str, outcome: &str, response: Option<Value>) -> Resp {
        let mut body =
            json!({"operation": OP, "key": key, "owner_token": owner, "outcome": outcome});
        if let Some(r) = response {
            body["response"] = r;
        }
        self.complete_raw(&body.to_string())
    }

    fn heartbeat(&self, key: &str, owner: &str, lease_ms: u64) -> Resp {
        let body = json!({"operation": OP, "key": key, "owner_token": owner, "lease_ms": lease_ms});
        self.api
            .post_json("/v1/claims/heartbeat", Some(&self.token), &body.to_string())
    }
}

fn fp(tag: &str) -> String {
    format!("sha256:{:0>64}", tag)
}

/// Checks a 201 acquisition and returns `(owner_token, lease_expires_at)`.
#[track_caller]
fn acquired(r: &Resp, recovery: bool) -> (String, String) {
    r.assert_status(201);
    let j = r.json();
    assert_eq!(j["state"], "PROCESSING", "{j}");
    assert_eq!(j["recovery"], recovery, "{j}");
    let owner = j["owner_token"].as_str().expect("owner_token").to_owned();
    assert!(!owner.is_empty());
    let lease = j["lease_expires_at"]
        .as_str()
        .expect("lease_expires_at")
        .to_owned();
    assert!(
        lease.contains('T') && lease.ends_with('Z'),
        "RFC 3339 UTC: {lease}"
    );
    (owner, lease)
}

/// Milliseconds since the Unix epoch of an RFC 3339 UTC timestamp
/// (`2026-01-02T03:04:05Z`, optionally with a fraction).
fn unix_ms(text: &str) -> i64 {
    let t = text
        .strip_suffix('Z')
        .unwrap_or_else(|| panic!("UTC timestamp: {text}"));
    let (date, time) = t.split_once('T').expect("date T time");
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let h: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    let ms: i64 = format!("{frac:0<3}")[..3].parse().unwrap();
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + h[0]) * 60 + h[1]) * 60_000 + h[2] * 1000 + ms
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The exact text of `response.body` in a replay.
fn raw_body(r: &Resp) -> String {
    let top: HashMap<String, Box<RawValue>> =
        serde_json::from_slice(&r.body).expect("replay is a JSON object");
    let response: HashMap<String, Box<RawValue>> =
        serde_json::from_str(top["response"].get()).expect("response is an object");
    response["body"].get().to_owned()
}

#[test]
fn claim_complete_replay() {
    let c = Claims::start();
    let key = unique("pay");
    let (owner, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);

    // Someone else holds it: 409 with Retry-After (checked for every 409
    // request-in-progress by `Api::send`).
    let busy = c.claim(OP, &key, &fp("1"), 30_000);
    busy.assert_problem(409, "request-in-progress");
    assert!(busy.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    // Key reuse is decided even while in progress.
    c.claim(OP, &key, &fp("2"), 30_000)
        .assert_problem(422, "idempotency-key-reused");

    // Complete with a body that must come back exactly: member order, 1.50,
    // exponents, nested objects and non-ASCII text.
    let body_text = r#"{"zeta":1.50,"alpha":{"nested":[1.50,1e2,-0,0.10,{"deep":"café ☕ 𝄞","q":"a\"b\nc"}],"empty":{},"list":[]},"n":null,"t":true,"amount":100}"#;
    let complete = format!(
        r#"{{"operation":"{OP}","key":"{key}","owner_token":"{owner}","outcome":"SUCCEEDED","response":{{"status":201,"headers":{{"location":"/v1/payments/pay_1","x-trace":"abc"}},"body":{body_text}}},"resource_id":"pay_1"}}"#
    );
    let done = c.complete_raw(&complete);
    done.assert_status(200);

    // Replay: 200 with the stored outcome.
    for _ in 0..2 {
        let replay = c.claim(OP, &key, &fp("1"), 30_000);
        replay.assert_status(200);
        let j = replay.json();
        assert_eq!(j["state"], "SUCCEEDED", "{j}");
        assert_eq!(j["resource_id"], "pay_1", "{j}");
        assert_eq!(j["response"]["status"], 201, "{j}");
        assert_eq!(
            j["response"]["headers"]["location"], "/v1/payments/pay_1",
            "{j}"
        );
        assert_eq!(j["response"]["headers"]["x-trace"], "abc", "{j}");
        assert_eq!(
            raw_body(&replay),
            body_text,
            "the body is replayed byte for byte"
        );
    }
    // A different request under the same key after completion: 422.
    c.claim(OP, &key, &fp("2"), 30_000)
        .assert_problem(422, "idempotency-key-reused");

    // The scope includes the operation and the tenant.
    acquired(&c.claim("POST:/v1/refunds", &key, &fp("2"), 30_000), false);
    let other = c._cluster.create_tenant("a", json!({}));
    let body = json!({"operation": OP, "key": key, "fingerprint": fp("3"), "lease_ms": 1000});
    let r = c
        .api
        .post_json("/v1/claims", Some(&other.token), &body.to_string());
    acquired(&r, false);
}

#[test]
fn lease_bounds() {
    let c = Claims::start();
    for lease in [0u64, 99, 3_600_001, 100_000_000] {
        let r = c.claim(OP, &unique("k"), &fp("1"), lease);
        r.assert_problem(400, "invalid-request");
        assert!(
            r.error_pointers().iter().any(|p| p == "/lease_ms"),
            "{}",
            r.text()
        );
    }
    let (owner, _) = acquired(&c.claim(OP, &unique("k"), &fp("1"), 100), false);
    assert!(!owner.is_empty());
    // Leases are honoured as given: expiry = now + lease_ms (same host clock).
    assert_eq!(unix_ms("1970-01-01T00:00:01.5Z"), 1500);
    assert_eq!(unix_ms("2000-03-01T00:00:00.000Z"), 951_868_800_000);
    let key = unique("k");
    let before = now_ms();
    let (owner, lease) = acquired(&c.claim(OP, &key, &fp("1"), 3_600_000), false);
    let after = now_ms();
    let at = unix_ms(&lease);
    assert!(
        (before + 3_600_000 - 1000..=after + 3_600_000 + 1000).contains(&at),
        "lease_expires_at {lease} is now + 1 h"
    );
    let before = now_ms();
    let hb = c.heartbeat(&key, &owner, 100);
    let after = now_ms();
    hb.assert_status(200);
    let at = unix_ms(hb.json()["lease_expires_at"].as_str().unwrap());
    assert!(
        (before + 100 - 1000..=after + 100 + 1000).contains(&at),
        "a heartbeat's lease is honoured as given too: {}",
        hb.text()
    );
    for lease in [99u64, 3_600_001] {
        let r = c.heartbeat(&key, &owner, lease);
        r.assert_problem(400, "invalid-request");
    }
    // Malformed claim bodies are invalid-request too.
    for body in [
        json!({"operation": OP, "key": "k", "fingerprint": fp("1")}),
        json!({"operation": OP, "key": "k", "fingerprint": fp("1"), "lease_ms": "100"}),
        json!({"operation": OP, "fingerprint": fp("1"), "lease_ms": 100}),
        json!({"operation": OP, "key": "k", "fingerprint": fp("1"), "lease_ms": 1.5}),
    ] {
        c.api
            .post_json("/v1/claims", Some(&c.token), &body.to_string())
            .assert_problem(400, "invalid-request");
    }
    let r = c.api.post_json("/v1/claims", Some(&c.token), r#"{"operation":"POST:/x","operation":"POST:/y","key":"k","fingerprint":"f","lease_ms":100}"#);
    r.assert_problem(400, "invalid-request");
}

#[test]
fn expired_lease_is_recovered_and_the_old_owner_is_fenced() {
    let c = Claims::start();
    let key = unique("pay");
    let (old_owner, old_lease) = acquired(&c.claim(OP, &key, &fp("1"), 200), false);
    std::thread::sleep(Duration::from_millis(400));

    let (new_owner, new_lease) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), true);
    assert_ne!(new_owner, old_owner, "a takeover gets a new owner token");
    assert!(new_lease > old_lease);

    // The previous owner's late writes are refused.
    let late = json!({"status": 200, "headers": {}, "body": {"from": "old"}});
    c.complete(&key, &old_owner, "SUCCEEDED", Some(late))
        .assert_problem(409, "stale-owner-token");
    c.heartbeat(&key, &old_owner, 30_000)
        .assert_problem(409, "stale-owner-token");
    // Garbage tokens are refused too (as stale or as invalid).
    let r = c.heartbeat(&key, "1.0000000000000000", 30_000);
    assert!(
        r.slug().as_deref() == Some("stale-owner-token")
            || r.slug().as_deref() == Some("invalid-request"),
        "{}",
        r.text()
    );

    // The current owner extends its lease.
    std::thread::sleep(Duration::from_millis(20));
    let hb = c.heartbeat(&key, &new_owner, 60_000);
    hb.assert_status(200);
    let extended = hb.json()["lease_expires_at"]
        .as_str()
        .expect("lease_expires_at")
        .to_owned();
    assert!(extended > new_lease, "{extended} later than {new_lease}");
    c.claim(OP, &key, &fp("1"), 30_000)
        .assert_problem(409, "request-in-progress");

    // It completes; the old owner still cannot overwrite the outcome.
    let good = json!({"status": 200, "headers": {}, "body": {"from": "new"}});
    c.complete(&key, &new_owner, "SUCCEEDED", Some(good))
        .assert_status(200);
    let late = json!({"status": 200, "headers": {}, "body": {"from": "old"}});
    c.complete(&key, &old_owner, "SUCCEEDED", Some(late))
        .assert_problem(409, "stale-owner-token");
    c.heartbeat(&key, &old_owner, 30_000)
        .assert_problem(409, "stale-owner-token");
    let replay = c.claim(OP, &key, &fp("1"), 30_000);
    replay.assert_status(200);
    assert_eq!(replay.json()["state"], "SUCCEEDED");
    assert_eq!(raw_body(&replay), r#"{"from":"new"}"#);
}

#[test]
fn failed_retryable_reopens_and_failed_final_replays() {
    let c = Claims::start();
    // FAILED_RETRYABLE: the next claim acquires again, without recovery.
    let key = unique("pay");
    let (owner1, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);
    let failed = json!({"status": 503, "headers": {}, "body": {"error": "upstream"}});
    c.complete(&key, &owner1, "FAILED_RETRYABLE", Some(failed))
        .assert_status(200);
    let (owner2, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);
    assert_ne!(owner1, owner2);
    // The first owner's token is dead after the re-acquisition.
    c.heartbeat(&key, &owner1, 30_000)
        .assert_problem(409, "stale-owner-token");
    c.complete(
        &key,
        &owner2,
        "SUCCEEDED",
        Some(json!({"status": 201, "headers": {}, "body": [1, 2]})),
    )
    .assert_status(200);
    let replay = c.claim(OP, &key, &fp("1"), 30_000);
    replay.assert_status(200);
    assert_eq!(replay.json()["state"], "SUCCEEDED");
    assert_eq!(raw_body(&replay), "[1,2]");

    // FAILED_RETRYABLE without a response is fine as well.
    let key = unique("pay");
    let (owner, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);
    c.complete(&key, &owner, "FAILED_RETRYABLE", None)
        .assert_status(200);
    acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);

    // FAILED_FINAL is replayed like success.
    let key = unique("pay");
    let (owner, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);
    let declined = r#"{"error":{"code":"card_declined","amount":12.50}}"#;
    let complete = format!(
        r#"{{"operation":"{OP}","key":"{key}","owner_token":"{owner}","outcome":"FAILED_FINAL","response":{{"status":402,"headers":{{}},"body":{declined}}},"resource_id":"ch_9"}}"#
    );
    c.complete_raw(&complete).assert_status(200);
    for _ in 0..2 {
        let replay = c.claim(OP, &key, &fp("1"), 30_000);
        replay.assert_status(200);
        let j = replay.json();
        assert_eq!(j["state"], "FAILED_FINAL", "{j}");
        assert_eq!(j["response"]["status"], 402, "{j}");
        assert_eq!(j["resource_id"], "ch_9", "{j}");
        assert_eq!(raw_body(&replay), declined);
    }
    c.claim(OP, &key, &fp("9"), 30_000)
        .assert_problem(422, "idempotency-key-reused");
    // Completed work cannot be heartbeaten back to life.
    let r = c.heartbeat(&key, &owner, 30_000);
    r.assert_problem(409, "stale-owner-token");

    // An outcome that is not one of the three is invalid.
    let key = unique("pay");
    let (owner, _) = acquired(&c.claim(OP, &key, &fp("1"), 30_000), false);
    c.complete(
        &key,
        &owner,
        "DONE",
        Some(json!({"status": 200, "headers": {}, "body": 1})),
    )
    .assert_problem(400, "invalid-request");
}

/// 32 concurrent claims of one scope: exactly one owner, the rest 409.
#[test]
fn concurrent_claims_have_one_owner() {
    let c = Claims::start();
    let key = unique("pay");
    let n = 32;
    let barrier = Arc::new(Barrier::new(n));
    let body = json!({"operation": OP, "key": key, "fingerprint": fp("1"), "lease_ms": 30_000})
        .to_string();
    let answers: Vec<Resp> = (0..n)
        .map(|_| {
            let (api, token, body, barrier) = (
                c.api.clone(),
                c.token.clone(),
                body.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let rb = api
                    .post("/v1/claims")
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(body);
                barrier.wait();
                api.send(rb)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let owners: Vec<_> = answers.iter().filter(|r| r.status == 201).collect();
    assert_eq!(owners.len(), 1, "exactly one owner");
    for r in &answers {
        if r.status != 201 {
            r.assert_problem(409, "request-in-progress");
        }
    }
    let (owner, _) = acquired(owners[0], false);
    c.complete(
        &key,
        &owner,
        "SUCCEEDED",
        Some(json!({"status": 200, "headers": {}, "body": "ok"})),
    )
    .assert_status(200);
    assert_eq!(
        c.claim(OP, &key, &fp("1"), 30_000)
            .assert_status(200)
            .json()["state"],
        "SUCCEEDED"
    );
}
