//! End-to-end tests of the common request rules (contract section 2) and of the
//! parts of section 9 that every node serves: authentication on every attempt,
//! `Idempotency-Key` syntax, body size / media type / strict JSON / field rules
//! with `errors` pointers, problem+json bodies, `Keyhold-Region` on every
//! response (errors and 404s included), per-tenant rate limits with
//! `Retry-After`, the `cluster.json` shape, and the unauthenticated endpoints
//! (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`, the idempotency policy and
//! the fingerprint specs).

mod common;

use common::{assert_order, order_body, unique, Api, Cluster, Resp, ServeNode};
use reqwest::blocking::Body;
use reqwest::header::HeaderValue;
use serde_json::{json, Value};

fn single() -> (Cluster, Api, String) {
    let cluster = Cluster::start("a", &[]);
    let api = cluster.api("a");
    let token = cluster.tenant("a").token;
    (cluster, api, token)
}

#[test]
fn authentication_comes_first_on_every_attempt() {
    let (_cluster, api, token) = single();
    let key = unique("k");
    let coid = unique("co");
    let body = order_body(&coid, 10);
    let first = api.create_order(&token, &key, &body);
    assert_order(&first, 201, &coid, 10);

    // A retry of a valid key is authenticated again.
    let no_token = api
        .post("/v1/orders")
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(body.clone());
    api.send(no_token).assert_problem(401, "unauthenticated");
    for auth in [
        "Bearer kh_not_a_real_token".to_owned(),
        format!("Basic {token}"),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        token.clone(),
        format!("Bearer {token}x"),
    ] {
        let rb = api
            .post("/v1/orders")
            .header("authorization", auth.as_str())
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body.clone());
        api.send(rb).assert_problem(401, "unauthenticated");
    }
    // Before anything else: no key, wrong media type, oversized or broken body.
    let rb = api
        .post("/v1/orders")
        .header("content-type", "text/plain")
        .body("x");
    api.send(rb).assert_problem(401, "unauthenticated");
    let rb = api
        .post("/v1/orders")
        .bearer_auth("kh_unknown")
        .header("content-type", "application/json")
        .body(vec![b' '; 70 * 1024]);
    api.send(rb).assert_problem(401, "unauthenticated");
    let rb = api
        .post("/v1/orders")
        .bearer_auth("kh_unknown")
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .header("idempotency-fingerprint", "sha256:00")
        .body("{");
    api.send(rb).assert_problem(401, "unauthenticated");
    // Claims are authenticated the same way.
    for path in ["/v1/claims", "/v1/claims/complete", "/v1/claims/heartbeat"] {
        api.post_json(path, None, "{}")
            .assert_problem(401, "unauthenticated");
        api.post_json(path, Some("kh_unknown"), "{}")
            .assert_problem(401, "unauthenticated");
    }
    // The refused attempts changed nothing: the valid retry replays.
    let replay = api.create_order(&token, &key, &body);
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
}

#[test]
fn idempotency_key_syntax() {
    let (_cluster, api, token) = single();
    let coid = unique("co");
    let body = order_body(&coid, 11);
    let base = || {
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    api.send(base())
        .assert_problem(400, "idempotency-key-missing");

    let invalid: Vec<(&str, HeaderValue)> = vec![
        ("empty", HeaderValue::from_static("")),
        (
            "256 characters",
            HeaderValue::from_str(&"k".repeat(256)).unwrap(),
        ),
        (
            "256 characters quoted",
            HeaderValue::from_str(&format!("\"{}\"", "k".repeat(256))).unwrap(),
        ),
        ("inner space", HeaderValue::from_static("ab cd")),
        ("tab", HeaderValue::from_static("ab\tcd")),
        (
            "non-ASCII",
            HeaderValue::from_bytes("caf\u{e9}".as_bytes()).unwrap(),
        ),
        (
            "non-ASCII quoted",
            HeaderValue::from_bytes("\"caf\u{e9}\"".as_bytes()).unwrap(),
        ),
        ("empty sf-string", HeaderValue::from_static("\"\"")),
        ("unterminated sf-string", HeaderValue::from_static("\"abc")),
        (
            "sf-string with trailing text",
            HeaderValue::from_static("\"abc\"def"),
        ),
        (
            "sf-string with a space",
            HeaderValue::from_static("\"ab cd\""),
        ),
    ];
    for (what, value) in invalid {
        let r = api.send(base().header("idempotency-key", value));
        assert_eq!(
            (r.status, r.slug().as_deref()),
            (400, Some("idempotency-key-invalid")),
            "{what}: {}",
            r.text()
        );
    }
    // The header given twice, with different or equal values.
    for (a, b) in [("k-one", "k-two"), ("k-same", "k-same")] {
        let rb = base()
            .header("idempotency-key", a)
            .header("idempotency-key", b);
        api.send(rb).assert_problem(400, "idempotency-key-invalid");
    }
    // Nothing was executed by any of these.
    api.find_order(&token, &coid)
        .assert_problem(404, "not-found");
    // The boundary: 255 visible ASCII characters, every one of 0x21..0x7E allowed.
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let key = format!("{visible}{visible}{visible}")
        .chars()
        .take(255)
        .collect::<String>();
    let r = api.send(base().header("idempotency-key", key.as_str()));
    assert_order(&r, 201, &coid, 11);
}

#[test]
fn body_size_and_media_type() {
    let (_cluster, api, token) = single();
    let limit = 64 * 1024;
    let order = |coid: &str| order_body(coid, 12);
    let padded = |coid: &str, len: usize| {
        let mut b = order(coid).into_bytes();
        b.resize(len, b' ');
        b
    };
    // Exactly 64 KiB is allowed (insignificant whitespace pads it).
    let coid = unique("co");
    let r = api.send(
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json")
            .body(padded(&coid, limit)),
    );
    assert_order(&r, 201, &coid, 12);
    // One byte more is 413, with a Content-Length...
    let coid = unique("co");
    let r = api.send(
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json")
            .body(padded(&coid, limit + 1)),
    );
    r.assert_problem(413, "payload-too-large");
    // A much larger body with a Content-Length gets its 413 as well.
    let r = api.send(
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json")
            .body(padded(&coid, 512 * 1024)),
    );
    r.assert_problem(413, "payload-too-large");
    // ...and streamed without one (chunked).
    let r = api.send(
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json")
            .body(Body::new(std::io::Cursor::new(padded(&coid, 100 * 1024)))),
    );
    r.assert_problem(413, "payload-too-large");
    api.find_order(&token, &coid)
        .assert_problem(404, "not-found");

    // Not JSON: 415.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/xml"),
        Some("text/json-ish"),
        None,
    ] {
        let mut rb = api
            .post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .body(order(&coid));
        if let Some(ct) = content_type {
            rb = rb.header("content-type", ct);
        }
        api.send(rb).assert_problem(415, "unsupported-media-type");
    }
    api.find_order(&token, &coid)
        .assert_problem(404, "not-found");
    // JSON with parameters is JSON.
    let r = api.send(
        api.post("/v1/orders")
            .bearer_auth(&token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json; charset=utf-8")
            .body(order(&coid)),
    );
    assert_order(&r, 201, &coid, 12);
}

fn post_raw(api: &Api, token: &str, body: impl Into<Vec<u8>>) -> Resp {
    api.send(
        api.post("/v1/orders")
            .bearer_auth(token)
            .header("idempotency-key", unique("k"))
            .header("content-type", "application/json")
            .body(body.into()),
    )
}

#[track_caller]
fn assert_invalid(r: &Resp, what: &str) {
    assert_eq!(
        (r.status, r.slug().as_deref()),
        (400, Some("invalid-request")),
        "{what}: {}",
        r.text()
    );
    let errors = r.json()["errors"].clone();
    assert!(
        errors.as_array().is_some_and(|e| !e.is_empty()),
        "{what}: invalid-request lists its errors: {}",
        r.text()
    );
}

#[test]
fn strict_json_is_enforced() {
    let (_cluster, api, token) = single();
    let coid = unique("co");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty body", b"".to_vec()),
        ("truncated", format!(r#"{{"client_order_id":"{coid}","#).into_bytes()),
        ("trailing garbage", format!("{} x", order_body(&coid, 13)).into_bytes()),
        ("two documents", format!("{}{}", order_body(&coid, 13), order_body(&coid, 13)).into_bytes()),
        ("single quotes", b"{'a':1}".to_vec()),
        ("trailing comma", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR",}}"#).into_bytes()),
        ("NaN", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":NaN,"currency":"EUR"}}"#).into_bytes()),
        ("number overflowing to infinity", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1e400,"currency":"EUR"}}"#).into_bytes()),
        ("invalid UTF-8", {
            let mut b = format!(r#"{{"client_order_id":"{coid}","cart_id":""#).into_bytes();
            b.extend_from_slice(&[0xff, 0xfe]);
            b.extend_from_slice(br#"","amount":1,"currency":"EUR"}"#);
            b
        }),
        ("duplicate member names", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"amount":2,"currency":"EUR"}}"#).into_bytes()),
        ("duplicate names with equal values", format!(r#"{{"client_order_id":"{coid}","client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR"}}"#).into_bytes()),
        ("duplicate names inside metadata", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR","metadata":{{"x":1,"x":1}}}}"#).into_bytes()),
        ("duplicate names spelled with escapes", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR","metadata":{{"ab":1,"a\u0062":2}}}}"#).into_bytes()),
        ("lone high surrogate", format!(r#"{{"client_order_id":"{coid}","cart_id":"\ud800","amount":1,"currency":"EUR"}}"#).into_bytes()),
        ("lone low surrogate in metadata", format!(r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR","metadata":{{"n":"\udc00"}}}}"#).into_bytes()),
        ("reversed surrogate pair", format!(r#"{{"client_order_id":"{coid}","cart_id":"\udc00\ud800","amount":1,"currency":"EUR"}}"#).into_bytes()),
        ("10k-deep array nesting", format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()),
        ("10k-deep nesting in metadata", format!(
            r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR","metadata":{{"x":{}1{}}}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        ).into_bytes()),
        ("10k-deep object nesting", format!("{}1{}", r#"{"a":"#.repeat(10_000), "}".repeat(10_000)).into_bytes()),
    ];
    for (what, body) in cases {
        let r = post_raw(&api, &token, body);
        assert_invalid(&r, what);
    }
    // None of it executed, and the node is still serving.
    api.find_order(&token, &coid)
        .assert_problem(404, "not-found");
    api.get("/healthz", None).assert_status(200);
    // A valid surrogate pair and escapes are fine.
    let body = format!(
        r#"{{"client_order_id":"{coid}","cart_id":"caf\u00e9 \ud83d\ude00","amount":13,"currency":"EUR"}}"#
    );
    let r = post_raw(&api, &token, body);
    let order = assert_order(&r, 201, &coid, 13);
    assert_eq!(order["cart_id"], "caf\u{e9} \u{1f600}");
}

#[test]
fn every_field_rule_names_its_pointer() {
    let (_cluster, api, token) = single();
    let valid = |coid: &str| -> Value {
        json!({
            "client_order_id": coid,
            "cart_id": "cart-1",
            "amount": 100,
            "currency": "EUR",
            "shipping_address_id": "addr",
            "items": [{"sku": "s", "quantity": 1}],
            "quote_id": "q",
            "metadata": {"a": 1},
        })
    };
    let items = |n: usize| -> Value {
        Value::Array(
            (0..n)
                .map(|i| json!({"sku": format!("s{i}"), "quantity": 1}))
                .collect(),
        )
    };
    let too_big_metadata = json!({"blob": "x".repeat(5000)});
    // (what, field, replacement or None to remove it, pointer that must be named)
    let cases: Vec<(&str, &str, Option<Value>, &str)> = vec![
        (
            "client_order_id missing",
            "client_order_id",
            None,
            "/client_order_id",
        ),
        (
            "client_order_id empty",
            "client_order_id",
            Some(json!("")),
            "/client_order_id",
        ),
        (
            "client_order_id 65",
            "client_order_id",
            Some(json!("c".repeat(65))),
            "/client_order_id",
        ),
        (
            "client_order_id space",
            "client_order_id",
            Some(json!("a b")),
            "/client_order_id",
        ),
        (
            "client_order_id slash",
            "client_order_id",
            Some(json!("a/b")),
            "/client_order_id",
        ),
        (
            "client_order_id non-ASCII",
            "client_order_id",
            Some(json!("caf\u{e9}")),
            "/client_order_id",
        ),
        (
            "client_order_id number",
            "client_order_id",
            Some(json!(12)),
            "/client_order_id",
        ),
        ("cart_id missing", "cart_id", None, "/cart_id"),
        ("cart_id empty", "cart_id", Some(json!("")), "/cart_id"),
        (
            "cart_id 65",
            "cart_id",
            Some(json!("c".repeat(65))),
            "/cart_id",
        ),
        ("cart_id number", "cart_id", Some(json!(5)), "/cart_id"),
        ("amount missing", "amount", None, "/amount"),
        ("amount zero", "amount", Some(json!(0)), "/amount"),
        ("amount negative", "amount", Some(json!(-1)), "/amount"),
        (
            "amount over 10^15",
            "amount",
            Some(json!(1_000_000_000_000_001u64)),
            "/amount",
        ),
        ("amount fraction", "amount", Some(json!(1.5)), "/amount"),
        ("amount string", "amount", Some(json!("100")), "/amount"),
        ("amount null", "amount", Some(Value::Null), "/amount"),
        ("currency missing", "currency", None, "/currency"),
        (
            "currency lower",
            "currency",
            Some(json!("eur")),
            "/currency",
        ),
        ("currency short", "currency", Some(json!("EU")), "/currency"),
        (
            "currency long",
            "currency",
            Some(json!("EURO")),
            "/currency",
        ),
        ("currency number", "currency", Some(json!(978)), "/currency"),
        (
            "shipping_address_id 65",
            "shipping_address_id",
            Some(json!("s".repeat(65))),
            "/shipping_address_id",
        ),
        (
            "shipping_address_id number",
            "shipping_address_id",
            Some(json!(1)),
            "/shipping_address_id",
        ),
        (
            "quote_id 65",
            "quote_id",
            Some(json!("q".repeat(65))),
            "/quote_id",
        ),
        ("quote_id object", "quote_id", Some(json!({})), "/quote_id"),
        (
            "items not an array",
            "items",
            Some(json!({"sku": "s"})),
            "/items",
        ),
        ("items 101", "items", Some(items(101)), "/items"),
        ("item not an object", "items", Some(json!([1])), "/items/0"),
        (
            "item sku missing",
            "items",
            Some(json!([{"sku": "s", "quantity": 1}, {"quantity": 1}])),
            "/items/1/sku",
        ),
        (
            "item sku 65",
            "items",
            Some(json!([{"sku": "s".repeat(65), "quantity": 1}])),
            "/items/0/sku",
        ),
        (
            "item sku number",
            "items",
            Some(json!([{"sku": 3, "quantity": 1}])),
            "/items/0/sku",
        ),
        (
            "item quantity missing",
            "items",
            Some(json!([{"sku": "s"}])),
            "/items/0/quantity",
        ),
        (
            "item quantity zero",
            "items",
            Some(json!([{"sku": "s", "quantity": 0}])),
            "/items/0/quantity",
        ),
        (
            "item quantity over 10^6",
            "items",
            Some(json!([{"sku": "s", "quantity": 1_000_001}])),
            "/items/0/quantity",
        ),
        (
            "item quantity fraction",
            "items",
            Some(json!([{"sku": "s", "quantity": 1.25}])),
            "/items/0/quantity",
        ),
        (
            "metadata not an object",
            "metadata",
            Some(json!(["a"])),
            "/metadata",
        ),
        ("metadata string", "metadata", Some(json!("a")), "/metadata"),
        (
            "metadata over 4 KiB",
            "metadata",
            Some(too_big_metadata),
            "/metadata",
        ),
    ];
    for (what, field, replacement, pointer) in cases {
        let coid = unique("co");
        let mut body = valid(&coid);
        match replacement {
            Some(v) => body[field] = v,
            None => {
                body.as_object_mut().unwrap().remove(field);
            }
        }
        let r = post_raw(&api, &token, body.to_string());
        assert_invalid(&r, what);
        let pointers = r.error_pointers();
        assert!(
            pointers.iter().any(|p| p == pointer),
            "{what}: errors must name {pointer}: {}",
            r.text()
        );
        if field != "client_order_id" {
            api.find_order(&token, &coid)
                .assert_problem(404, "not-found");
        }
    }
    // Several failures are listed together.
    let r = post_raw(
        &api,
        &token,
        json!({"amount": 0, "currency": "x"}).to_string(),
    );
    assert_invalid(&r, "several");
    let pointers = r.error_pointers();
    for p in ["/client_order_id", "/cart_id", "/amount", "/currency"] {
        assert!(pointers.iter().any(|x| x == p), "{p} in {pointers:?}");
    }
    // Not an object at all.
    for body in ["[]", "1", "\"order\"", "null"] {
        assert_invalid(&post_raw(&api, &token, body), body);
    }

    // The boundaries themselves are accepted.
    let coid64: String = "aZ09_.:-".repeat(8);
    assert_eq!(coid64.len(), 64);
    let boundary = [
        ("client_order_id", json!(coid64.clone())),
        ("cart_id", json!("c".repeat(64))),
        ("amount", json!(1_000_000_000_000_000u64)),
        ("shipping_address_id", json!("s".repeat(64))),
        ("quote_id", json!("q".repeat(64))),
        ("items", items(100)),
        ("metadata", json!({"blob": "x".repeat(3000)})),
    ];
    for (field, value) in boundary {
        let coid = if field == "client_order_id" {
            coid64.clone()
        } else {
            unique("co")
        };
        let mut body = valid(&coid);
        body[field] = value;
        let r = post_raw(&api, &token, body.to_string());
        assert_eq!(r.status, 201, "{field} at its bound: {}", r.text());
    }
    let coid = unique("co");
    let mut body = valid(&coid);
    body["amount"] = json!(1);
    body["items"] =
        json!([{"sku": "s".repeat(64), "quantity": 1_000_000}, {"sku": "t", "quantity": 1}]);
    body.as_object_mut().unwrap().remove("metadata");
    body.as_object_mut().unwrap().remove("quote_id");
    body.as_object_mut().unwrap().remove("shipping_address_id");
    let r = post_raw(&api, &token, body.to_string());
    assert_order(&r, 201, &coid, 1);
}

#[test]
fn problems_and_region_header_on_every_response() {
    let (_cluster, api, token) = single();
    // Unknown paths and methods are problems too, and carry the region header
    // (checked for every response by `Api::send`).
    api.get("/nope", None).assert_problem(404, "not-found");
    api.get("/v1/orders/ord_x/y", Some(&token))
        .assert_problem(404, "not-found");
    let r = api.send(api.client.delete(api.url("/v1/orders")).bearer_auth(&token));
    assert!(r.status == 405 || r.status == 404, "{}", r.text());
    let r = api.send(api.client.put(api.url("/healthz")));
    assert!(r.status == 405 || r.status == 404, "{}", r.text());
    // The slug of each problem is the last segment of a keyhold problem URI.
    let j = api
        .post_json("/v1/orders", None, "{}")
        .assert_problem(401, "unauthenticated");
    assert!(j["type"].as_str().unwrap().ends_with("/unauthenticated"));
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/idempotency-policy",
        "/v1/fingerprint-specs",
    ] {
        api.get(path, None).assert_status(200);
    }
}

#[test]
fn unauthenticated_meta_endpoints() {
    let (cluster, api, token) = single();
    // Traffic first, so request series exist, including for ids in paths.
    let coid = unique("co");
    let r = api.create_order(&token, &unique("k"), &order_body(&coid, 14));
    let order_id = assert_order(&r, 201, &coid, 14)["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    api.get_order(&token, &order_id).assert_status(200);
    api.find_order(&token, &coid).assert_status(200);
    api.get("/nope/ord_secret", None)
        .assert_problem(404, "not-found");

    assert_eq!(api.get("/healthz", None).status, 200);
    assert_eq!(api.get("/readyz", None).status, 200);

    let openapi = api.get("/openapi.json", None);
    openapi.assert_status(200);
    assert!(openapi.json().is_object(), "openapi.json is a JSON object");
    assert!(openapi.json()["openapi"]
        .as_str()
        .is_some_and(|v| v.starts_with('3')));

    let policy = api.get("/v1/idempotency-policy", None);
    policy.assert_status(200);
    let p = policy.json();
    assert_eq!(p["response_ttl_seconds"], 48 * 3600, "{p}");
    assert_eq!(p["marker_ttl_seconds"], 30 * 86_400, "{p}");
    assert_eq!(p["processed_ttl_seconds"], 35 * 86_400, "{p}");
    assert_eq!(p["inflight_wait_ms"], 2000, "{p}");
    assert_eq!(p["key_max_length"], 255, "{p}");
    // By default the bundled provider never forgets a key, so the stored
    // response is the first stage to end.
    assert_eq!(p["psp_key_retention_seconds"], Value::Null, "{p}");
    assert_eq!(p["dedupe_horizon"]["ends_first"], "response_cache", "{p}");
    assert_eq!(p["dedupe_horizon"]["window_seconds"], 48 * 3600, "{p}");
    assert_eq!(p["dedupe_horizon"]["stages"][3]["ttl_seconds"], Value::Null);
    // "and the status codes above": every slug of the contract with its status.
    let text = policy.text();
    for (slug, status) in [
        ("unauthenticated", 401),
        ("idempotency-key-missing", 400),
        ("idempotency-key-invalid", 400),
        ("payload-too-large", 413),
        ("unsupported-media-type", 415),
        ("invalid-request", 400),
        ("fingerprint-mismatch", 400),
        ("idempotency-key-reused", 422),
        ("request-in-progress", 409),
        ("client-order-id-conflict", 409),
        ("stale-owner-token", 409),
        ("rate-limited", 429),
        ("store-unavailable", 503),
        ("owner-unreachable", 503),
        ("tenant-moving", 503),
        ("not-found", 404),
    ] {
        assert!(text.contains(slug), "policy lists {slug}: {text}");
        assert_eq!(
            find_member(&p, slug).and_then(Value::as_u64),
            Some(status),
            "policy gives {slug} status {status}: {text}"
        );
    }

    let specs = api.get("/v1/fingerprint-specs", None);
    specs.assert_status(200);
    let specs = specs.json();
    let list = specs
        .as_array()
        .or_else(|| specs["data"].as_array())
        .expect("a list of specs (or {data: [...]})");
    let orders = list
        .iter()
        .find(|s| s["operation"] == "POST:/v1/orders")
        .expect("the orders spec is listed");
    assert_eq!(orders["version"], 1);
    let include: Vec<&str> = orders["include"]
        .as_array()
        .expect("orders spec uses include")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut sorted = include.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            "/amount",
            "/cart_id",
            "/client_order_id",
            "/currency",
            "/items",
            "/quote_id",
            "/shipping_address_id"
        ]
    );
    assert!(orders.get("exclude").is_none());

    let metrics = api.get("/metrics", None);
    metrics.assert_status(200);
    assert!(
        metrics.content_type().starts_with("text/plain"),
        "{}",
        metrics.content_type()
    );
    let text = metrics.text();
    let mut series = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        series += 1;
        assert!(
            line.starts_with("keyhold_"),
            "series not named keyhold_*: {line}"
        );
    }
    assert!(series > 0, "metrics has series after traffic: {text}");
    for tenant in &cluster.info.tenants {
        assert!(
            !text.contains(&tenant.tenant_id),
            "tenant id {} in metrics",
            tenant.tenant_id
        );
        assert!(!text.contains(&tenant.token), "a token in metrics");
    }
    assert!(!text.contains(&order_id), "order ids in metrics");
    assert!(!text.contains(&coid), "client_order_ids in metrics");
    assert!(!text.contains("ord_secret"), "raw paths in metrics");
}

/// Finds the first member named `name` anywhere in `v`.
fn find_member<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m
            .get(name)
            .or_else(|| m.values().find_map(|x| find_member(x, name))),
        Value::Array(a) => a.iter().find_map(|x| find_member(x, name)),
        _ => None,
    }
}

#[test]
fn rate_limits_are_per_tenant_and_carry_retry_after() {
    let cluster = Cluster::start("a", &[]);
    let api = cluster.api("a");
    let demo = cluster.tenant("a");
    // Limits are configurable per tenant; this one gets one request per second.
    let slow = cluster.create_tenant("a", json!({"requests_per_second": 1}));
    let answers: Vec<Resp> = (0..10)
        .map(|_| {
            api.get(
                &format!("/v1/orders?client_order_id={}", unique("co")),
                Some(&slow.token),
            )
        })
        .collect();
    let limited: Vec<_> = answers.iter().filter(|r| r.status == 429).collect();
    assert!(!limited.is_empty(), "10 requests at once exceed 1/s");
    for r in limited {
        r.assert_problem(429, "rate-limited");
        // Retry-After is checked by `Api::send`; it must be a positive delay.
        assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    }
    // Orders count against the request rate as well.
    let limited = (0..10).any(|_| {
        let r = api.create_order(&slow.token, &unique("k"), &order_body(&unique("co"), 1));
        r.status == 429 && r.slug().as_deref() == Some("rate-limited")
    });
    assert!(limited, "orders are rate limited too");
    // The other tenant is not affected.
    for _ in 0..20 {
        let r = api.find_order(&demo.token, &unique("co"));
        r.assert_problem(404, "not-found");
    }

    // The rate of *new* keys is limited separately; replays are not new keys.
    let keys = cluster.create_tenant("a", json!({"new_keys_per_second": 1}));
    let coid = unique("co");
    let key = unique("k");
    let first = api.create_order(&keys.token, &key, &order_body(&coid, 2));
    assert_order(&first, 201, &coid, 2);
    let limited = (0..10).any(|_| {
        let r = api.create_order(&keys.token, &unique("k"), &order_body(&unique("co"), 3));
        assert!(r.status == 201 || r.status == 429, "{}", r.text());
        r.status == 429 && r.slug().as_deref() == Some("rate-limited")
    });
    assert!(limited, "new keys beyond 1/s are refused");
    let replay = api.create_order(&keys.token, &key, &order_body(&coid, 2));
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
}

#[test]
fn cluster_json_and_every_region() {
    let cluster = Cluster::start("a,b,c", &[]);
    let raw = &cluster.info.raw;
    let base = cluster.base_port;
    for k in ["admin_token", "regions", "psp_url", "tenants"] {
        assert!(raw.get(k).is_some(), "cluster.json has {k}: {raw}");
    }
    // psp_url is null until the fake payment provider exists; then an origin.
    if let Some(psp) = raw["psp_url"].as_str() {
        let port: u16 = psp
            .strip_prefix("http://127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("psp_url is an origin http://127.0.0.1:PORT: {psp}"));
        assert!(
            (base..base + 50).contains(&port),
            "psp port {port} within base {base} + 49"
        );
    } else {
        assert!(raw["psp_url"].is_null(), "psp_url: {}", raw["psp_url"]);
    }
    let names: Vec<&str> = cluster
        .info
        .regions
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    let mut ports = Vec::new();
    for region in &cluster.info.regions {
        let port: u16 = region
            .api_url
            .strip_prefix("http://127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "api_url is an origin http://127.0.0.1:PORT: {}",
                    region.api_url
                )
            });
        assert!(
            (base..base + 50).contains(&port),
            "port {port} within base {base} + 49"
        );
        ports.push(port);
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 3, "one port per region");
    // Only 127.0.0.1 ports from P to P+49 are bound.
    #[cfg(target_os = "linux")]
    {
        // `up` and its node processes together.
        let sockets: Vec<_> = cluster
            .pids()
            .into_iter()
            .flat_map(common::listening_sockets)
            .collect();
        assert!(sockets.len() >= 3, "listens on each api port: {sockets:?}");
        for (addr, port) in &sockets {
            assert_eq!(addr, "0100007F", "binds 127.0.0.1 only: {sockets:?}");
            assert!(
                (base..base + 50).contains(port),
                "port {port} outside {base}..{}",
                base + 49
            );
        }
        for port in &ports {
            assert!(
                sockets.iter().any(|(_, p)| p == port),
                "api port {port} is listening"
            );
        }
    }
    assert_eq!(cluster.info.tenants.len(), 3, "one demo tenant per region");
    let mut tenant_ids: Vec<&str> = cluster
        .info
        .tenants
        .iter()
        .map(|t| t.tenant_id.as_str())
        .collect();
    tenant_ids.sort();
    tenant_ids.dedup();
    assert_eq!(tenant_ids.len(), 3);

    for name in ["a", "b", "c"] {
        let api = cluster.api(name);
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            api.get(path, None).assert_status(200);
        }
        api.get("/nope", None).assert_problem(404, "not-found");
        // The demo tenant homed here is served here, and the answer names the region.
        let tenant = cluster.tenant(name);
        let coid = unique("co");
        let key = unique("k");
        let r = api.create_order(&tenant.token, &key, &order_body(&coid, 15));
        let order = assert_order(&r, 201, &coid, 15);
        assert_eq!(order["home_region"], name);
        let replay = api.create_order(&tenant.token, &key, &order_body(&coid, 15));
        assert_eq!((replay.status, &replay.body), (201, &r.body));
        // Admin endpoints answer on every node.
        let c = api.get("/admin/v1/cluster", Some(&cluster.info.admin_token));
        c.assert_status(200);
        let t = api.get(
            &format!("/admin/v1/tenants/{}", tenant.tenant_id),
            Some(&cluster.info.admin_token),
        );
        t.assert_status(200);
        assert_eq!(t.json()["home_region"], name);
        // A tenant created through the admin API of its home node works there.
        let extra = cluster.create_tenant(name, json!({}));
        let r = api.create_order(&extra.token, &unique("k"), &order_body(&coid, 15));
        assert_order(&r, 201, &coid, 15);
    }
}

/// `keyhold serve --config FILE` runs one node; its limits are configurable.
#[test]
fn serve_runs_one_node_with_configured_limits() {
    let node = ServeNode::start(
        "eu",
        "body_bytes_max = 2048\ninflight_wait = \"500ms\"\nresponse_ttl = \"1h\"\n",
    );
    let api = &node.api;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        api.get(path, None).assert_status(200);
    }
    let policy = api.get("/v1/idempotency-policy", None).json();
    assert_eq!(policy["inflight_wait_ms"], 500, "{policy}");
    assert_eq!(policy["response_ttl_seconds"], 3600, "{policy}");
    // A tenant through the admin API, then the usual create and replay.
    let tenant_id = unique("t");
    let r = api.post_json(
        "/admin/v1/tenants",
        Some(&node.admin_token),
        &json!({"tenant_id": tenant_id, "home_region": "eu"}).to_string(),
    );
    r.assert_status(201);
    let token = r.json()["token"].as_str().expect("token").to_owned();
    let (key, coid) = (unique("k"), unique("co"));
    let first = api.create_order(&token, &key, &order_body(&coid, 5));
    assert_eq!(assert_order(&first, 201, &coid, 5)["home_region"], "eu");
    let replay = api.create_order(&token, &key, &order_body(&coid, 5));
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    // The body limit is the configured one.
    let mut big = order_body(&unique("co"), 6).into_bytes();
    big.resize(2049, b' ');
    post_raw(api, &token, big).assert_problem(413, "payload-too-large");
    let mut fits = order_body(&unique("co"), 6).into_bytes();
    fits.resize(2048, b' ');
    post_raw(api, &token, fits).assert_status(201);
}
