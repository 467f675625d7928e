//! The fingerprint spec parser on arbitrary bytes: no panic; a spec that parses
//! writes itself out as a spec that parses to the same thing, and fingerprints a
//! fixed body without panicking.
#![no_main]

use keyhold_fingerprint::{parse, Spec};
use libfuzzer_sys::fuzz_target;

const BODY: &[u8] = br#"{"client_order_id":"c-1","cart_id":"k","amount":1999,"currency":"EUR",
  "items":[{"sku":"a","quantity":1,"note":{"x":[1,2]}}],"metadata":{"m":null},"": {"~":1}}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = Spec::from_json(data) else {
        return;
    };
    let written = spec.to_json();
    let again = Spec::from_json(written.as_bytes()).expect("a spec's own JSON parses");
    assert_eq!(again.to_json(), written, "spec JSON is not a fixed point");
    let body = parse(BODY).expect("fixed body parses");
    assert_eq!(spec.fingerprint(&body), again.fingerprint(&body));
    let _ = spec.canonical_preimage(&body);
});
