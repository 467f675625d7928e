//! The body path of `POST /v1/orders` after the HTTP checks, on arbitrary bytes:
//! strict I-JSON parsing, the order field rules and the fingerprint. No panic;
//! a body that passes the rules satisfies them, and its fingerprint does not
//! depend on member order or on the fields the spec leaves out.
#![no_main]

use keyhold_core::OrderRequest;
use keyhold_fingerprint::{parse, Spec, Value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = parse(data) else {
        return;
    };
    let spec = Spec::orders();
    let fingerprint = spec.fingerprint(&value);
    let Ok(order) = OrderRequest::from_value(&value) else {
        return;
    };
    assert!((1..=1_000_000_000_000_000).contains(&order.amount));
    assert!(order.currency.len() == 3 && order.currency.bytes().all(|b| b.is_ascii_uppercase()));
    assert!((1..=64).contains(&order.client_order_id.len()));
    assert!(order.items.len() <= 100);
    // Members reversed and `metadata` changed: the same fingerprint.
    let Value::Object(mut members) = value else {
        panic!("an order body that passed the rules is an object");
    };
    members.reverse();
    members.retain(|(name, _)| name != "metadata");
    members.push(("metadata".into(), Value::Object(vec![("x".into(), Value::Null)])));
    assert_eq!(spec.fingerprint(&Value::Object(members)), fingerprint);
});
