//! The I-JSON parser and the RFC 8785 canonicalizer on arbitrary bytes: no panic;
//! the canonical form is a fixed point (parsing and canonicalizing it again gives
//! the same bytes); and where serde_json also accepts the input, both read the
//! same value. Inputs serde_json accepts and keyhold refuses must be refused for
//! an I-JSON rule (duplicate names) or a keyhold limit; the reverse only for
//! serde_json's recursion limit.
#![no_main]

use keyhold_fingerprint::{canonicalize, parse, Value};
use libfuzzer_sys::fuzz_target;

/// serde_json refuses nesting deeper than this.
const SERDE_DEPTH_MAX: usize = 127;

fn same(ours: &Value, theirs: &serde_json::Value) -> bool {
    match (ours, theirs) {
        (Value::Null, serde_json::Value::Null) => true,
        (Value::Bool(a), serde_json::Value::Bool(b)) => a == b,
        (Value::Number(a), serde_json::Value::Number(b)) => {
            let b = b.as_f64().expect("serde_json numbers are finite");
            a == &b || (a.is_nan() && b.is_nan())
        }
        (Value::String(a), serde_json::Value::String(b)) => a == b,
        (Value::Array(a), serde_json::Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), serde_json::Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(name, x)| b.get(name).is_some_and(|y| same(x, y)))
        }
        _ => false,
    }
}

fn depth(bytes: &[u8]) -> usize {
    // Brackets inside strings count too: an over-estimate is fine, the check
    // only excuses serde_json's refusals.
    let (mut now, mut max) = (0usize, 0usize);
    for b in bytes {
        match b {
            b'[' | b'{' => {
                now += 1;
                max = max.max(now);
            }
            b']' | b'}' => now = now.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fuzz_target!(|data: &[u8]| {
    let ours = parse(data);
    let theirs = serde_json::from_slice::<serde_json::Value>(data);
    match (&ours, &theirs) {
        (Ok(value), Ok(expected)) => {
            assert!(same(value, expected), "keyhold and serde_json disagree");
        }
        (Ok(_), Err(e)) => assert!(
            depth(data) > SERDE_DEPTH_MAX,
            "keyhold accepts what serde_json refuses: {e}"
        ),
        (Err(e), Ok(_)) => assert!(
            matches!(e.rule(), "duplicate-name" | "too-deep" | "too-large"),
            "serde_json accepts what keyhold refuses: {e}"
        ),
        (Err(_), Err(_)) => {}
    }
    if let Ok(value) = ours {
        let canonical = canonicalize(&value);
        let again = parse(canonical.as_bytes()).expect("canonical output parses");
        assert_eq!(again, value, "canonical output reads back as another value");
        assert_eq!(canonicalize(&again), canonical, "canonical form is not a fixed point");
    }
});
