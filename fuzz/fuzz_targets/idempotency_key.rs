//! The `Idempotency-Key` header parser on arbitrary text: no panic; every key it
//! accepts is 1-255 visible ASCII characters and parses back to itself.
#![no_main]

use keyhold_core::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(key) = IdempotencyKey::from_header(text) else {
        return;
    };
    let s = key.as_str();
    assert!((1..=255).contains(&s.len()), "key of {} bytes", s.len());
    assert!(s.bytes().all(|b| (0x21..=0x7e).contains(&b)), "key {s:?}");
    assert!(matches!(IdempotencyKey::parse(s), Ok(k) if k == key));
});
