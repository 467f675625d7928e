//! I-JSON (RFC 7493) acceptance rules of contract section 3 step 1: each
//! rejection asserts the rule slug and the byte offset it reports.

use std::time::{Duration, Instant};

use keyhold_fingerprint::{canonicalize_bytes, limits, parse, Error, Value};

#[track_caller]
fn rejects(input: impl AsRef<[u8]>, rule: &str, offset: usize) -> Error {
    let input = input.as_ref();
    let e = parse(input).expect_err("input must be rejected");
    assert_eq!(
        (e.rule(), e.offset()),
        (rule, Some(offset)),
        "{e} for {:?}",
        String::from_utf8_lossy(input)
    );
    // The combined entry point reports exactly the same error.
    assert_eq!(canonicalize_bytes(input).unwrap_err(), e);
    e
}

#[test]
fn duplicate_names() {
    let e = rejects(r#"{"a":1,"b":2,"a":3}"#, "duplicate-name", 13);
    assert_eq!(e.to_string(), "duplicate member name \"a\" at byte 13");
    rejects(r#"{"x":{"y":[{"k":1,"k":1}]}}"#, "duplicate-name", 18);
    // Escapes are decoded before comparing: "\u0061" is "a".
    rejects(r#"{"a":1,"\u0061":2}"#, "duplicate-name", 7);
    // The same name in sibling objects is fine.
    assert!(parse(br#"[{"a":1},{"a":2}]"#).is_ok());
}

#[test]
fn lone_surrogates() {
    let e = rejects(r#"["\ud800"]"#, "lone-surrogate", 2);
    assert_eq!(e.to_string(), "lone surrogate \\ud800 at byte 2");
    rejects(r#""ab\udc00""#, "lone-surrogate", 3);
    // A high surrogate followed by a non-surrogate escape or by text.
    rejects(r#""\ud83d\u0041""#, "lone-surrogate", 1);
    rejects(r#""\ud83dx""#, "lone-surrogate", 1);
    // Two high surrogates.
    rejects(r#""\ud83d\ud83d""#, "lone-surrogate", 1);
    // In member names too.
    rejects(r#"{"\udfff":1}"#, "lone-surrogate", 2);
}

#[test]
fn surrogate_pairs_are_accepted() {
    assert_eq!(
        parse(br#""\ud83d\ude02""#).unwrap(),
        Value::String("\u{1f602}".into())
    );
    assert_eq!(
        canonicalize_bytes(br#"{"\uD83D\uDE02":"\u00e9"}"#).unwrap(),
        "{\"\u{1f602}\":\"é\"}".as_bytes()
    );
}

#[test]
fn non_finite_numbers() {
    let e = rejects("[1, 1e400]", "non-finite-number", 4);
    assert_eq!(
        e.to_string(),
        "number out of range of a finite double at byte 4"
    );
    rejects("-1e400", "non-finite-number", 0);
    rejects(format!("1{}", "0".repeat(400)), "non-finite-number", 0);
    // The largest double is fine; underflow to zero is fine.
    assert!(parse(b"1.7976931348623157e308").is_ok());
    assert_eq!(parse(b"1e-400").unwrap(), Value::Number(0.0));
    // NaN and Infinity are not JSON at all.
    rejects("NaN", "syntax", 0);
    rejects("[Infinity]", "syntax", 1);
    rejects("-Infinity", "syntax", 1);
}

#[test]
fn hundred_thousand_deep_nesting_is_too_deep_quickly() {
    let started = Instant::now();
    for open in ["[", "{\"a\":"] {
        let doc = open.repeat(100_000);
        let e = parse(doc.as_bytes()).unwrap_err();
        assert_eq!(e.rule(), "too-deep");
        assert_eq!(e.offset(), Some(limits::DEPTH_MAX * open.len()));
        assert_eq!(
            e.to_string(),
            format!(
                "nesting deeper than {} levels at byte {}",
                limits::DEPTH_MAX,
                limits::DEPTH_MAX * open.len()
            )
        );
    }
    let balanced = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    rejects(&balanced, "too-deep", limits::DEPTH_MAX);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn invalid_utf8() {
    rejects(b"\"ab\xff\"", "invalid-utf8", 3);
    // Overlong encoding of '/' and an encoded surrogate (CESU-8 style).
    rejects(b"[\"\xc0\xaf\"]", "invalid-utf8", 2);
    rejects(b"\"\xed\xa0\x80\"", "invalid-utf8", 1);
    // Truncated multi-byte sequence at the end.
    rejects(b"\"\xe2\x82", "invalid-utf8", 1);
}

#[test]
fn trailing_garbage() {
    rejects("{} {}", "syntax", 3);
    rejects("1 2", "syntax", 2);
    rejects("[1]x", "syntax", 3);
    rejects("\"a\"\"b\"", "syntax", 3);
    rejects("true\u{0}", "syntax", 4);
    // Whitespace around the document is allowed (JSON whitespace only).
    assert!(parse(b" \r\n\t{}\n ").is_ok());
    rejects("\u{a0}{}", "syntax", 0);
    rejects("{}\u{c}", "syntax", 2);
}

#[test]
fn control_characters_in_strings() {
    rejects("\"a\nb\"", "syntax", 2);
    rejects("\"\t\"", "syntax", 1);
    rejects("{\"k\u{1f}\":1}", "syntax", 3);
    // Escaped they are fine, and U+007F needs no escape.
    assert_eq!(
        parse(b"\"\\n\\u001f\x7f\"").unwrap(),
        Value::String("\n\u{1f}\u{7f}".into())
    );
}

#[test]
fn number_grammar() {
    rejects("01", "syntax", 0);
    rejects("[-012]", "syntax", 1);
    rejects("+1", "syntax", 0);
    rejects(".5", "syntax", 0);
    rejects("1.", "syntax", 2);
    rejects("1.e5", "syntax", 2);
    rejects("1e", "syntax", 2);
    rejects("0x10", "syntax", 1);
    rejects("- 1", "syntax", 1);
    assert_eq!(parse(b"-0.0e-0").unwrap(), Value::Number(0.0));
    assert_eq!(parse(b"1E+2").unwrap(), Value::Number(100.0));
}

#[test]
fn other_syntax_errors() {
    rejects("", "syntax", 0);
    rejects("   ", "syntax", 3);
    rejects("[1,2", "syntax", 4);
    rejects("{\"a\":1", "syntax", 6);
    rejects("{'a':1}", "syntax", 1);
    rejects("{a:1}", "syntax", 1);
    rejects("[1 2]", "syntax", 3);
    rejects("\"abc", "syntax", 4);
    rejects("\"\\q\"", "syntax", 1);
    rejects("\"\\u00G0\"", "syntax", 1);
    rejects("nul", "syntax", 0);
    rejects("\u{feff}{}", "syntax", 0);
}

#[test]
fn size_limit() {
    let mut big = vec![b' '; limits::INPUT_BYTES_MAX];
    big[0] = b'1';
    assert!(parse(&big).is_ok());
    big.push(b' ');
    let e = rejects(&big, "too-large", limits::INPUT_BYTES_MAX);
    assert_eq!(
        e.to_string(),
        format!(
            "input exceeds the limit of {} bytes",
            limits::INPUT_BYTES_MAX
        )
    );
}

#[test]
fn noncharacters_and_nul_are_accepted() {
    // The contract rejects only duplicates, lone surrogates and non-finite
    // numbers; see the parser module docs.
    assert_eq!(
        parse(b"\"\\uffff\\u0000\xef\xbf\xbe\"").unwrap(),
        Value::String("\u{ffff}\u{0}\u{fffe}".into())
    );
}
