//! Fingerprint specs: reading and writing their JSON form, projection with
//! include and exclude, pointer escapes, and the built-in orders spec against
//! digests computed independently (Python's json/hashlib/hmac).

use keyhold_fingerprint::{
    canonicalize, hmac_fingerprint, parse, sha256_fingerprint, Pointer, Selection, Spec, Value,
};

const ORDER_BODY: &str = r#"{
  "client_order_id": "co-1001", "cart_id": "cart-7", "amount": 1999, "currency": "EUR",
  "items": [{"sku": "SKU-1", "quantity": 2}, {"sku": "SKU-9", "quantity": 1}],
  "shipping_address_id": null, "metadata": {"note": "gift"}
}"#;

/// `json.dumps(preimage, sort_keys=True, separators=(',', ':'), ensure_ascii=False)`,
/// which equals JCS for this ASCII, integer-only preimage.
const ORDER_CANONICAL: &str = r#"{"fields":{"/amount":1999,"/cart_id":"cart-7","/client_order_id":"co-1001","/currency":"EUR","/items":[{"quantity":2,"sku":"SKU-1"},{"quantity":1,"sku":"SKU-9"}],"/shipping_address_id":null},"op":"POST:/v1/orders","v":1}"#;

/// `"sha256:" + hashlib.sha256(ORDER_CANONICAL.encode()).hexdigest()`.
const ORDER_SHA256: &str =
    "sha256:ed11216d87c707010c1d341f6c4df3c1b4b91ec1c77fa8bfda404048eab8b90f";

/// `hmac.new(b"s3cret", ORDER_CANONICAL.encode(), hashlib.sha256).hexdigest()`.
const ORDER_HMAC: &str =
    "hmac-sha256:e181b08b457abbb7d8210c4efe3fad5ae748d59a2d9dfc221babe8b1cbe093f5";

fn body(text: &str) -> Value {
    parse(text.as_bytes()).unwrap()
}

fn spec_err(text: &str) -> (String, String) {
    let e = Spec::from_json(text.as_bytes()).unwrap_err();
    assert_eq!(e.rule(), "spec", "{e}");
    match e {
        keyhold_fingerprint::Error::Spec { at, reason } => (at, reason),
        other => panic!("not a spec error: {other:?}"),
    }
}

#[test]
fn orders_spec_matches_independent_digest() {
    let spec = Spec::orders();
    let body = body(ORDER_BODY);
    assert_eq!(spec.canonical_preimage(&body), ORDER_CANONICAL);
    assert_eq!(canonicalize(&spec.preimage(&body)), ORDER_CANONICAL);
    assert_eq!(spec.fingerprint(&body).as_str(), ORDER_SHA256);
    assert_eq!(spec.fingerprint_hmac(b"s3cret", &body).as_str(), ORDER_HMAC);
    assert_eq!(
        sha256_fingerprint(ORDER_CANONICAL.as_bytes()).to_string(),
        ORDER_SHA256
    );
    assert_eq!(
        hmac_fingerprint(b"s3cret", ORDER_CANONICAL.as_bytes()).to_string(),
        ORDER_HMAC
    );
}

#[test]
fn orders_spec_shape_and_json_form() {
    let spec = Spec::orders();
    assert_eq!(spec.operation, "POST:/v1/orders");
    assert_eq!(spec.version, 1);
    assert_eq!(
        spec.to_json(),
        r#"{"include":["/client_order_id","/cart_id","/amount","/currency","/items","/shipping_address_id","/quote_id"],"operation":"POST:/v1/orders","version":1}"#
    );
    assert_eq!(Spec::from_json(spec.to_json().as_bytes()).unwrap(), spec);
}

#[test]
fn include_projection_keeps_null_and_omits_absent() {
    let spec = Spec::orders();
    let p = spec.project(&body(r#"{"amount":5,"quote_id":null,"metadata":{"a":1}}"#));
    assert_eq!(
        p,
        Value::Object(vec![
            ("/amount".into(), Value::Number(5.0)),
            ("/quote_id".into(), Value::Null),
        ])
    );
    // Metadata never matters; the absent/null difference does.
    let a = spec.fingerprint(&body(r#"{"amount":5,"metadata":{"a":1}}"#));
    let b = spec.fingerprint(&body(r#"{"metadata":{"a":2},"amount":5}"#));
    let c = spec.fingerprint(&body(r#"{"amount":5,"quote_id":null}"#));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn pointer_escapes_select_the_right_members() {
    let spec = Spec::from_json(
        br#"{"operation":"POST:/x","version":3,"include":["/a~1b","/m~0n","/arr/1","/arr/01","/deep/~01"]}"#,
    )
    .unwrap();
    let doc = body(r#"{"a/b":1,"a":{"b":2},"m~n":3,"arr":[10,20],"deep":{"~1":4,"/":5}}"#);
    assert_eq!(
        canonicalize(&spec.project(&doc)),
        r#"{"/arr/1":20,"/a~1b":1,"/deep/~01":4,"/m~0n":3}"#
    );
    assert_eq!(
        spec.canonical_preimage(&doc),
        r#"{"fields":{"/arr/1":20,"/a~1b":1,"/deep/~01":4,"/m~0n":3},"op":"POST:/x","v":3}"#
    );
    let p = Pointer::parse("/a~1b/m~0n").unwrap();
    assert_eq!(p.tokens(), ["a/b", "m~n"]);
    assert_eq!(p.to_string(), "/a~1b/m~0n");
}

#[test]
fn exclude_removes_members_including_nested_ones() {
    let spec = Spec::from_json(
        br#"{"exclude":["/metadata","/items/0/note","/items/1","/missing/x"],"operation":"POST:/v1/orders","version":2}"#,
    )
    .unwrap();
    let doc =
        body(r#"{"amount":1,"metadata":{"t":1},"items":[{"sku":"a","note":"n"},{"sku":"b"}]}"#);
    // `/items/1` addresses an array element: exclusion removes members only.
    assert_eq!(
        canonicalize(&spec.project(&doc)),
        r#"{"amount":1,"items":[{"sku":"a"},{"sku":"b"}]}"#
    );
    assert_eq!(
        spec.canonical_preimage(&doc),
        r#"{"fields":{"amount":1,"items":[{"sku":"a"},{"sku":"b"}]},"op":"POST:/v1/orders","v":2}"#
    );
    let changed =
        body(r#"{"items":[{"note":"other","sku":"a"},{"sku":"b"}],"amount":1,"metadata":{"t":2}}"#);
    assert_eq!(spec.fingerprint(&doc), spec.fingerprint(&changed));
    // Hand-built specs may hold "": it removes nothing rather than everything.
    let root = Spec {
        selection: Selection::Exclude(vec![Pointer::root()]),
        ..spec
    };
    assert_eq!(root.project(&doc), doc);
}

#[test]
fn preimage_shape() {
    let spec = Spec::orders();
    let pre = spec.preimage(&body(r#"{"currency":"EUR"}"#));
    assert_eq!(
        canonicalize(&pre),
        r#"{"fields":{"/currency":"EUR"},"op":"POST:/v1/orders","v":1}"#
    );
    assert_eq!(
        spec.canonical_preimage(&body("[]")),
        r#"{"fields":{},"op":"POST:/v1/orders","v":1}"#
    );
}

#[test]
fn repeated_include_pointers_count_once_in_hand_built_specs() {
    let spec = Spec {
        operation: "op".into(),
        version: 0,
        selection: Selection::Include(vec![
            Pointer::parse("/a").unwrap(),
            Pointer::parse("/a").unwrap(),
        ]),
    };
    assert_eq!(
        spec.canonical_preimage(&body(r#"{"a":1}"#)),
        r#"{"fields":{"/a":1},"op":"op","v":0}"#
    );
    assert_eq!(
        canonicalize(&spec.project(&body(r#"{"a":1}"#))),
        r#"{"/a":1}"#
    );
}

#[test]
fn from_json_errors_name_the_place() {
    let (at, reason) =
        spec_err(r#"{"operation":"o","version":1,"include":["/a"],"exclude":["/b"]}"#);
    assert_eq!(at, "/exclude");
    assert!(reason.contains("not both"), "{reason}");
    let (at, reason) = spec_err(r#"{"operation":"o","version":1}"#);
    assert_eq!(at, "");
    assert!(reason.contains("\"include\" or \"exclude\""), "{reason}");
    let (at, reason) = spec_err(r#"{"operation":"o","version":1,"include":["/a","amount"]}"#);
    assert_eq!(at, "/include/1");
    assert!(reason.contains("\"amount\""), "{reason}");
    let (at, _) = spec_err(r#"{"operation":"o","version":1,"include":["/a~2"]}"#);
    assert_eq!(at, "/include/0");
    let (at, reason) = spec_err(r#"{"operation":"o","version":1,"include":[],"extra":true}"#);
    assert_eq!(at, "/extra");
    assert!(reason.contains("unknown member \"extra\""), "{reason}");
    let (at, _) = spec_err(r#"{"operation":"o","version":1,"include":["/a","/a"]}"#);
    assert_eq!(at, "/include/1");
    let (at, _) = spec_err(r#"{"operation":"o","version":1,"exclude":[""]}"#);
    assert_eq!(at, "/exclude/0");
    let (at, _) = spec_err(r#"{"operation":"o","version":1,"include":[1]}"#);
    assert_eq!(at, "/include/0");
    let (at, _) = spec_err(r#"{"operation":"o","version":1,"include":"/a"}"#);
    assert_eq!(at, "/include");
    for version in ["1.5", "-1", "4294967296", "\"1\""] {
        let (at, _) = spec_err(&format!(
            r#"{{"operation":"o","version":{version},"include":[]}}"#
        ));
        assert_eq!(at, "/version", "{version}");
    }
    let (at, _) = spec_err(r#"{"operation":"","version":1,"include":[]}"#);
    assert_eq!(at, "/operation");
    let (at, reason) = spec_err(r#"{"version":1,"include":[]}"#);
    assert_eq!(
        (at.as_str(), reason.as_str()),
        ("", "missing member \"operation\"")
    );
    let (at, _) = spec_err("[]");
    assert_eq!(at, "");
    // Malformed JSON keeps its parse error (rule and offset).
    let e = Spec::from_json(br#"{"operation":"o","operation":"p"}"#).unwrap_err();
    assert_eq!((e.rule(), e.offset()), ("duplicate-name", Some(17)));
    // The message says what and where.
    let e = Spec::from_json(br#"{"operation":"o","version":1,"include":["x"]}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid fingerprint spec at \"/include/0\": invalid JSON pointer \"x\": pointer must be empty or start with '/' at byte 0"
    );
}

#[test]
fn exclude_spec_round_trips() {
    let text = r#"{"exclude":["/metadata","/a~1b"],"operation":"PUT:/v1/things/{id}","version":7}"#;
    let spec = Spec::from_json(text.as_bytes()).unwrap();
    assert_eq!(spec.to_json(), text);
    assert!(matches!(spec.selection, Selection::Exclude(ref p) if p.len() == 2));
}
