//! Conformance against the shared vectors: the six RFC 8785 files from
//! cyberphone/json-canonicalization and the 20,012 ECMAScript number strings.

mod common;

use std::fs;

use keyhold_fingerprint::{canonicalize, canonicalize_bytes, parse, try_canonicalize, Value};

const JCS_FILES: [&str; 6] = [
    "arrays.json",
    "french.json",
    "structures.json",
    "unicode.json",
    "values.json",
    "weird.json",
];

#[test]
fn jcs_files_canonicalize_byte_exactly() {
    let dir = common::vectors_dir().join("jcs");
    for name in JCS_FILES {
        let input = fs::read(dir.join("input").join(name))
            .unwrap_or_else(|e| panic!("reading input/{name}: {e}"));
        let expected = fs::read(dir.join("output").join(name))
            .unwrap_or_else(|e| panic!("reading output/{name}: {e}"));
        let got = canonicalize_bytes(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected),
            "{name}"
        );
        // The canonical form is a fixed point.
        assert_eq!(canonicalize_bytes(&got).unwrap(), got, "{name} twice");
    }
}

#[test]
fn jcs_outhex_matches_output() {
    // Guards against a vector checkout that mangled bytes (line endings, BOMs).
    let dir = common::vectors_dir().join("jcs");
    for name in JCS_FILES {
        let expected = fs::read(dir.join("output").join(name)).unwrap();
        let hex_name = name.replace(".json", ".txt");
        let hex: String = fs::read_to_string(dir.join("outhex").join(&hex_name))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(hex::decode(hex).unwrap(), expected, "{hex_name}");
    }
}

#[test]
fn every_es6_number_line() {
    let path = common::vectors_dir().join("es6numbers.txt");
    let text = fs::read_to_string(&path).unwrap();
    let mut checked = 0;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let (bits, expected) = line
            .split_once(',')
            .unwrap_or_else(|| panic!("line {line_no}: no comma in {line:?}"));
        let bits = u64::from_str_radix(bits, 16)
            .unwrap_or_else(|e| panic!("line {line_no}: bad hex {bits:?}: {e}"));
        let n = f64::from_bits(bits);
        if !n.is_finite() {
            // JSON cannot express these: canonicalization must refuse, never
            // print `null` or `NaN`.
            assert_eq!(
                try_canonicalize(&Value::Number(n)).unwrap_err().rule(),
                "non-finite-number",
                "line {line_no}"
            );
            assert!(parse(expected.as_bytes()).is_err(), "line {line_no}");
            continue;
        }
        assert_eq!(
            canonicalize(&Value::Number(n)),
            expected,
            "line {line_no}: bits {bits:016x}"
        );
        // Reading the expected text back gives the same double (-0 reads as
        // "0", i.e. +0, which is equal) and the same text.
        let back = parse(expected.as_bytes())
            .unwrap_or_else(|e| panic!("line {line_no}: {expected}: {e}"));
        assert_eq!(back, Value::Number(n), "line {line_no}");
        assert_eq!(
            canonicalize_bytes(expected.as_bytes()).unwrap(),
            expected.as_bytes(),
            "line {line_no}"
        );
        checked += 1;
    }
    assert_eq!(checked, 20_012, "unexpected number of vector lines");
}
