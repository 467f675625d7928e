//! End-to-end tests of `POST /v1/orders` and the order reads (contract section 4,
//! with the fingerprint header of section 3): every row of the outcome table
//! (create, byte-identical replay, key reuse, marker hit without a stored record,
//! client-order-id conflict), an independently computed fingerprint, the
//! `Idempotency-Fingerprint` request check, tenant isolation, and the two
//! concurrency races (one key, and one client_order_id under many keys).

mod common;

use common::Resp;
use common::{
    assert_order, assert_same_order, is_sha256_fingerprint, order_body, unique, Api, Cluster,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn single() -> (Cluster, Api, String) {
    let cluster = Cluster::start("a", &[]);
    let api = cluster.api("a");
    let token = cluster.tenant("a").token;
    (cluster, api, token)
}

#[test]
fn create_then_replay_is_byte_identical_and_key_reuse_is_422() {
    let (_cluster, api, token) = single();
    let key = unique("k");
    let coid = unique("co");
    let body = json!({
        "client_order_id": coid,
        "cart_id": "cart-42",
        "amount": 1999,
        "currency": "EUR",
        "shipping_address_id": "addr-1",
        "items": [{"sku": "sku-1", "quantity": 2}],
        "quote_id": "q-1",
        "metadata": {"note": "first"},
    });

    // Row 1: first request for the scope.
    let first = api.create_order(&token, &key, &body.to_string());
    let order = assert_order(&first, 201, &coid, 1999);
    assert_eq!(order["cart_id"], "cart-42");
    assert_eq!(order["currency"], "EUR");
    assert_eq!(order["status"], "CONFIRMED");
    assert_eq!(order["home_region"], "a");
    let created_at = order["created_at"].as_str().expect("created_at string");
    assert!(
        created_at.contains('T') && created_at.ends_with('Z'),
        "created_at is RFC 3339 UTC: {created_at}"
    );
    assert_ne!(
        first.header("idempotent-replayed").as_deref(),
        Some("true"),
        "a first answer is not a replay"
    );
    let fingerprint = first
        .header("idempotency-fingerprint")
        .expect("POST responses carry Idempotency-Fingerprint");
    assert!(is_sha256_fingerprint(&fingerprint), "{fingerprint}");
    let location = first.header("location").unwrap();

    // Row 2: same scope, same fingerprint: the stored response.
    let replay = api.create_order(&token, &key, &body.to_string());
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body, "replay body is byte-identical");
    assert_eq!(replay.header("location"), Some(location.clone()));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(
        replay.header("idempotency-fingerprint"),
        Some(fingerprint.clone())
    );

    // The same JSON with other member order and whitespace is the same request.
    let reordered = format!(
        r#"{{ "currency" : "EUR", "amount": 1999, "metadata": {{"note":"first"}},
             "items": [ {{"quantity": 2, "sku": "sku-1"}} ], "quote_id": "q-1",
             "shipping_address_id": "addr-1", "cart_id": "cart-42", "client_order_id": "{coid}" }}"#
    );
    let replay = api.create_order(&token, &key, &reordered);
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );

    // metadata is not fingerprinted: changing it under the same key is a replay.
    let mut changed_meta = body.clone();
    changed_meta["metadata"] = json!({"note": "second", "extra": [1, 2, 3]});
    let replay = api.create_order(&token, &key, &changed_meta.to_string());
    assert_eq!(replay.status, 201, "{}", replay.text());
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(
        replay.header("idempotency-fingerprint"),
        Some(fingerprint.clone())
    );
    let mut no_meta = body.clone();
    no_meta.as_object_mut().unwrap().remove("metadata");
    let replay = api.create_order(&token, &key, &no_meta.to_string());
    assert_eq!((replay.status, &replay.body), (201, &first.body));

    // Row 3: same scope, different fingerprint (each fingerprinted field).
    let changes: [(&str, Value); 7] = [
        ("amount", json!(2000)),
        ("cart_id", json!("cart-43")),
        ("currency", json!("USD")),
        ("shipping_address_id", json!("addr-2")),
        ("items", json!([{"sku": "sku-1", "quantity": 3}])),
        ("quote_id", json!("q-2")),
        ("client_order_id", json!(unique("co"))),
    ];
    for (field, value) in changes {
        let mut changed = body.clone();
        changed[field] = value;
        let r = api.create_order(&token, &key, &changed.to_string());
        r.assert_problem(422, "idempotency-key-reused");
        let sent = r
            .header("idempotency-fingerprint")
            .expect("fingerprint on 422");
        assert!(is_sha256_fingerprint(&sent));
        assert_ne!(
            sent, fingerprint,
            "changing {field} changes the fingerprint"
        );
    }
    // Dropping an optional fingerprinted field changes the request too.
    let mut dropped = body.clone();
    dropped.as_object_mut().unwrap().remove("quote_id");
    api.create_order(&token, &key, &dropped.to_string())
        .assert_problem(422, "idempotency-key-reused");

    // The original is untouched by the refused attempts.
    let replay = api.create_order(&token, &key, &body.to_string());
    assert_eq!((replay.status, &replay.body), (201, &first.body));

    // The order reads back at its Location and by client_order_id.
    let got = api.get(&location, Some(&token));
    got.assert_status(200);
    assert_same_order(&got.json(), &order);
    assert_eq!(got.header("location"), Some(location.clone()));
    let found = api.find_order(&token, &coid);
    found.assert_status(200);
    assert_same_order(&found.json(), &order);
}

#[test]
fn key_header_forms_share_one_scope() {
    let (_cluster, api, token) = single();
    // `"abc"` (sf-string) and `abc` (bare) are the same key.
    let key = unique("k");
    let coid = unique("co");
    let body = order_body(&coid, 500);
    let first = api.create_order(&token, &format!("\"{key}\""), &body);
    assert_order(&first, 201, &coid, 500);
    let bare = api.create_order(&token, &key, &body);
    assert_eq!((bare.status, &bare.body), (201, &first.body));
    assert_eq!(bare.header("idempotent-replayed").as_deref(), Some("true"));
    // And the other way round, with an escaped quote inside the sf-string.
    let key = format!("{}\"x", unique("k"));
    let coid = unique("co");
    let body = order_body(&coid, 501);
    let first = api.create_order(&token, &key, &body);
    assert_order(&first, 201, &coid, 501);
    let quoted = format!("\"{}\"", key.replace('"', "\\\""));
    let again = api.create_order(&token, &quoted, &body);
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    // 255 characters is the longest valid key.
    let long = format!("{}{}", unique("k"), "x".repeat(255))
        .chars()
        .take(255)
        .collect::<String>();
    let coid = unique("co");
    let first = api.create_order(&token, &long, &order_body(&coid, 7));
    assert_order(&first, 201, &coid, 7);
    let again = api.create_order(&token, &format!("\"{long}\""), &order_body(&coid, 7));
    assert_eq!((again.status, &again.body), (201, &first.body));
}

/// Section 3 by hand: projection, JCS preimage, SHA-256, compared with the header.
#[test]
fn fingerprint_header_matches_an_independent_computation() {
    let (_cluster, api, token) = single();
    let coid = unique("fp");
    let body = format!(
        r#"{{"metadata":{{"note":"not fingerprinted"}},"items":[{{"sku":"sku-1","quantity":2}}],"currency":"EUR","amount":1000,"cart_id":"cart-9","client_order_id":"{coid}"}}"#
    );
    // Pointers as member names, sorted; members of nested objects sorted too.
    let preimage = format!(
        r#"{{"fields":{{"/amount":1000,"/cart_id":"cart-9","/client_order_id":"{coid}","/currency":"EUR","/items":[{{"quantity":2,"sku":"sku-1"}}]}},"op":"POST:/v1/orders","v":1}}"#
    );
    let expected = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(preimage.as_bytes()))
    );

    // A wrong client-sent fingerprint is refused and nothing is executed.
    let key = unique("k");
    let wrong = format!("sha256:{}", "0".repeat(64));
    let r = api.send(
        api.order_rb(&token, &key, &body)
            .header("idempotency-fingerprint", &wrong),
    );
    r.assert_problem(400, "fingerprint-mismatch");
    api.find_order(&token, &coid)
        .assert_problem(404, "not-found");

    // The same key then runs afresh (no record was stored by the refusal), and the
    // client may send the right fingerprint.
    let r = api.send(
        api.order_rb(&token, &key, &body)
            .header("idempotency-fingerprint", &expected),
    );
    assert_order(&r, 201, &coid, 1000);
    assert_ne!(r.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(r.header("idempotency-fingerprint"), Some(expected.clone()));

    // The fingerprint of a body without optional fields, by hand as well.
    let coid2 = unique("fp");
    let body2 = order_body(&coid2, 42);
    let preimage2 = format!(
        r#"{{"fields":{{"/amount":42,"/cart_id":"cart-1","/client_order_id":"{coid2}","/currency":"EUR"}},"op":"POST:/v1/orders","v":1}}"#
    );
    let expected2 = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(preimage2.as_bytes()))
    );
    let r = api.create_order(&token, &unique("k"), &body2);
    assert_order(&r, 201, &coid2, 42);
    assert_eq!(r.header("idempotency-fingerprint"), Some(expected2));
    // `null` is kept in the projection: an explicit null is a different request.
    let mut with_null: Value = serde_json::from_str(&body2).unwrap();
    with_null["quote_id"] = Value::Null;
    let r = api.create_order(&token, &unique("k"), &with_null.to_string());
    let preimage3 = format!(
        r#"{{"fields":{{"/amount":42,"/cart_id":"cart-1","/client_order_id":"{coid2}","/currency":"EUR","/quote_id":null}},"op":"POST:/v1/orders","v":1}}"#
    );
    let expected3 = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(preimage3.as_bytes()))
    );
    if r.status == 400 {
        // A null optional string may be refused as a field rule; then the
        // fingerprint is not reached. Either is within the contract.
        r.assert_problem(400, "invalid-request");
    } else {
        // Otherwise it is a marker conflict (same client_order_id, other request).
        r.assert_problem(409, "client-order-id-conflict");
        assert_eq!(r.header("idempotency-fingerprint"), Some(expected3));
    }
}

#[test]
fn marker_hit_stores_no_record_and_conflict_is_409() {
    let (_cluster, api, token) = single();
    let coid = unique("co");
    let body = order_body(&coid, 1234);
    let first = api.create_order(&token, &unique("k"), &body);
    let order = assert_order(&first, 201, &coid, 1234);
    let order_id = order["order_id"].as_str().unwrap();

    // New key, same request: 200 with the existing order; nothing new created.
    let key2 = unique("k");
    let hit = api.create_order(&token, &key2, &body);
    let hit_order = assert_order(&hit, 200, &coid, 1234);
    assert_eq!(hit_order["order_id"], order_id);
    assert_same_order(&hit_order, &order);
    let fp = hit
        .header("idempotency-fingerprint")
        .expect("fingerprint on a marker hit");
    assert_eq!(Some(fp), first.header("idempotency-fingerprint"));
    // Again under the same new key: still a marker hit (decided afresh).
    let again = api.create_order(&token, &key2, &body);
    assert_eq!(assert_order(&again, 200, &coid, 1234)["order_id"], order_id);

    // No record was stored for key2: another request under it is decided afresh
    // and creates a new order (not 422 idempotency-key-reused).
    let coid_b = unique("co");
    let fresh = api.create_order(&token, &key2, &order_body(&coid_b, 99));
    let fresh_order = assert_order(&fresh, 201, &coid_b, 99);
    assert_ne!(fresh_order["order_id"], order_id);
    // ...and key2 now belongs to that order.
    let replay = api.create_order(&token, &key2, &order_body(&coid_b, 99));
    assert_eq!((replay.status, &replay.body), (201, &fresh.body));
    api.create_order(&token, &key2, &body)
        .assert_problem(422, "idempotency-key-reused");

    // New key, same client_order_id, different request: 409, nothing created.
    let key3 = unique("k");
    let conflict = api.create_order(&token, &key3, &order_body(&coid, 1235));
    conflict.assert_problem(409, "client-order-id-conflict");
    let found = api.find_order(&token, &coid);
    assert_eq!(found.json()["order_id"], order_id);
    assert_eq!(found.json()["amount"], 1234);
    // metadata alone does not make a conflict: it is not fingerprinted.
    let mut with_meta: Value = serde_json::from_str(&body).unwrap();
    with_meta["metadata"] = json!({"k": "v"});
    let hit = api.create_order(&token, &unique("k"), &with_meta.to_string());
    assert_eq!(assert_order(&hit, 200, &coid, 1234)["order_id"], order_id);
}

#[test]
fn tenants_are_isolated() {
    let cluster = Cluster::start("a", &[]);
    let api = cluster.api("a");
    let t1 = cluster.tenant("a");
    let t2 = cluster.create_tenant("a", json!({}));
    assert_ne!(t1.token, t2.token);
    // The token is shown once: the tenant's read view does not carry it.
    let view = api.get(
        &format!("/admin/v1/tenants/{}", t2.tenant_id),
        Some(&cluster.info.admin_token),
    );
    view.assert_status(200);
    assert_eq!(view.json()["tenant_id"], t2.tenant_id.as_str());
    assert_eq!(view.json()["home_region"], "a");
    assert!(
        !view.text().contains(&t2.token),
        "token is never shown again"
    );
    // Admin endpoints need the admin token.
    api.get(
        &format!("/admin/v1/tenants/{}", t2.tenant_id),
        Some(&t1.token),
    )
    .assert_problem(401, "unauthenticated");
    api.post_json(
        "/admin/v1/tenants",
        None,
        &json!({"tenant_id": unique("t"), "home_region": "a"}).to_string(),
    )
    .assert_problem(401, "unauthenticated");

    // Same key, same body, two tenants: two scopes, two orders.
    let key = unique("k");
    let coid = unique("co");
    let body = order_body(&coid, 300);
    let r1 = api.create_order(&t1.token, &key, &body);
    let o1 = assert_order(&r1, 201, &coid, 300);
    let r2 = api.create_order(&t2.token, &key, &body);
    let o2 = assert_order(&r2, 201, &coid, 300);
    assert_ne!(r2.header("idempotent-replayed").as_deref(), Some("true"));
    assert_ne!(o1["order_id"], o2["order_id"]);
    let id1 = o1["order_id"].as_str().unwrap();
    let id2 = o2["order_id"].as_str().unwrap();

    // Each tenant sees its own order only; another tenant's is 404 like a missing one.
    api.get_order(&t1.token, id1).assert_status(200);
    api.get_order(&t2.token, id2).assert_status(200);
    api.get_order(&t2.token, id1)
        .assert_problem(404, "not-found");
    api.get_order(&t1.token, id2)
        .assert_problem(404, "not-found");
    api.get_order(&t1.token, "ord_does_not_exist")
        .assert_problem(404, "not-found");
    assert_eq!(api.find_order(&t1.token, &coid).json()["order_id"], id1);
    assert_eq!(api.find_order(&t2.token, &coid).json()["order_id"], id2);
    api.find_order(&t1.token, &unique("nope"))
        .assert_problem(404, "not-found");
    // Reads need a valid token too.
    api.get(&format!("/v1/orders/{id1}"), None)
        .assert_problem(401, "unauthenticated");
    api.get(
        &format!("/v1/orders?client_order_id={coid}"),
        Some("kh_unknown"),
    )
    .assert_problem(401, "unauthenticated");

    // Replays stay per tenant.
    let again = api.create_order(&t2.token, &key, &body);
    assert_eq!((again.status, &again.body), (201, &r2.body));
}

/// 32 concurrent requests with one key: one execution, the rest replays.
#[test]
fn concurrent_duplicates_of_one_key_create_one_order() {
    let (_cluster, api, token) = single();
    let key = unique("k");
    let coid = unique("co");
    let body = order_body(&coid, 777);
    let n = 32;
    let barrier = Arc::new(Barrier::new(n));
    let answers: Vec<(Resp, Duration)> = (0..n)
        .map(|_| {
            let (api, token, key, body, barrier) = (
                api.clone(),
                token.clone(),
                key.clone(),
                body.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let rb = api.order_rb(&token, &key, &body);
                barrier.wait();
                let started = Instant::now();
                let r = api.send(rb);
                (r, started.elapsed())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let mut first = None;
    let mut replays = 0;
    let mut in_progress = 0;
    for (r, took) in &answers {
        match (
            r.status,
            r.header("idempotent-replayed").as_deref() == Some("true"),
        ) {
            (201, false) => {
                assert!(first.is_none(), "more than one non-replayed 201");
                first = Some(r.clone());
            }
            (201, true) => replays += 1,
            // Allowed only after waiting inflight_wait (2 s) for the first attempt.
            (409, _) if *took >= Duration::from_millis(1900) => {
                r.assert_problem(409, "request-in-progress");
                in_progress += 1;
            }
            _ => panic!(
                "unexpected answer after {took:?}: {} {}",
                r.status,
                r.text()
            ),
        }
    }
    let answers: Vec<Resp> = answers
        .into_iter()
        .map(|(r, _)| r)
        .filter(|r| r.status == 201)
        .collect();
    let first = first.expect("exactly one non-replayed 201");
    assert_eq!(replays + in_progress, n - 1);
    for r in &answers {
        assert_eq!(
            r.body, first.body,
            "every answer is the same order, byte for byte"
        );
    }
    let order_id = first.json()["order_id"].as_str().unwrap().to_owned();
    assert_eq!(
        api.find_order(&token, &coid).json()["order_id"],
        order_id.as_str()
    );
}

/// 32 concurrent requests, 32 keys, one client_order_id: one order.
#[test]
fn concurrent_keys_for_one_client_order_id_create_one_order() {
    let (_cluster, api, token) = single();
    let coid = unique("co");
    let body = order_body(&coid, 888);
    let n = 32;
    let barrier = Arc::new(Barrier::new(n));
    let answers: Vec<_> = (0..n)
        .map(|_| {
            let (api, token, body, barrier) =
                (api.clone(), token.clone(), body.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rb = api.order_rb(&token, &unique("k"), &body);
                barrier.wait();
                api.send(rb)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let created: Vec<_> = answers.iter().filter(|r| r.status == 201).collect();
    assert_eq!(created.len(), 1, "exactly one 201");
    let order_id = created[0].json()["order_id"].as_str().unwrap().to_owned();
    for r in &answers {
        if r.status == 200 {
            assert_ne!(r.header("idempotent-replayed").as_deref(), Some("true"));
        } else {
            assert_eq!(r.status, 201, "{}", r.text());
        }
        assert_eq!(
            assert_order(r, r.status, &coid, 888)["order_id"],
            order_id.as_str()
        );
    }
    assert_eq!(
        api.find_order(&token, &coid).json()["order_id"],
        order_id.as_str()
    );
}
