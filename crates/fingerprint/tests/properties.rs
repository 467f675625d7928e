//! Property tests: canonical form is a fixed point and survives a parse round
//! trip; reformatting a document (whitespace, member order, escapes, number
//! spelling) never changes its canonical form or fingerprint; included fields
//! always count and excluded ones never do. Ends with a bounded fuzz loop that
//! feeds arbitrary and mutated bytes to every entry point.

use proptest::prelude::*;
use proptest::test_runner::Config;

use keyhold_fingerprint::{
    canonicalize, canonicalize_bytes, cmp_utf16, parse, Pointer, Spec, Value,
};

// ---- generators -------------------------------------------------------------

/// Characters that stress escaping and UTF-16 ordering, mixed with any char.
fn arb_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => proptest::char::range('a', 'e'),
        2 => any::<char>(),
        1 => prop::sample::select(vec![
            '"', '\\', '/', '\u{0}', '\u{8}', '\n', '\u{1f}', '\u{7f}', 'é', '\u{2028}',
            '\u{d7ff}', '\u{e000}', '\u{fb33}', '\u{ffff}', '\u{10000}', '\u{1f602}',
            '\u{10ffff}', '~',
        ]),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop::collection::vec(arb_char(), 0..8).prop_map(|cs| cs.into_iter().collect())
}

fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |n| n.is_finite()),
        (-1_000_000i64..1_000_000).prop_map(|n| n as f64),
        (-100_000i64..100_000).prop_map(|n| n as f64 / 100.0),
        prop::sample::select(vec![
            0.0,
            -0.0,
            1e21,
            1e-7,
            9007199254740993.0,
            5e-324,
            f64::MAX,
            -f64::MIN_POSITIVE,
        ]),
        any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |n| n.is_finite()),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_f64().prop_map(Value::Number),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_string(), inner), 0..6).prop_map(|members| {
                let mut unique: Vec<(String, Value)> = Vec::new();
                for (k, v) in members {
                    if !unique.iter().any(|(u, _)| *u == k) {
                        unique.push((k, v));
                    }
                }
                Value::Object(unique)
            }),
        ]
    })
}

/// An orders body: any subset of the fingerprinted fields with any values,
/// plus metadata.
fn arb_order() -> impl Strategy<Value = Value> {
    let field = |name: &'static str| {
        prop::option::of(arb_value()).prop_map(move |v| v.map(|v| (name.to_owned(), v)))
    };
    (
        (
            field("client_order_id"),
            field("cart_id"),
            field("amount"),
            field("currency"),
        ),
        (
            field("items"),
            field("shipping_address_id"),
            field("quote_id"),
            field("metadata"),
        ),
    )
        .prop_map(|((a, b, c, d), (e, f, g, h))| {
            Value::Object([a, b, c, d, e, f, g, h].into_iter().flatten().collect())
        })
}

// ---- a deliberately non-canonical writer ------------------------------------

/// Small deterministic generator so one proptest `u64` drives every
/// formatting choice (shrinks less well than strategies, but keeps the writer
/// independent of the value generator).
struct Choices(u64);

impl Choices {
    fn next(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }
}

fn ws(out: &mut String, c: &mut Choices) {
    for _ in 0..c.next(3) {
        out.push([' ', '\t', '\n', '\r'][c.next(4) as usize]);
    }
}

fn write_messy(v: &Value, out: &mut String, c: &mut Choices) {
    ws(out, c);
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let text = match c.next(3) {
                0 => format!("{n}"),
                1 => format!("{n:?}"),
                _ => format!("{n:e}").replace('e', ["e", "E"][c.next(2) as usize]),
            };
            out.push_str(&text);
        }
        Value::String(s) => write_messy_string(s, out, c),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_messy(item, out, c);
            }
            ws(out, c);
            out.push(']');
        }
        Value::Object(members) => {
            let mut order: Vec<&(String, Value)> = members.iter().collect();
            // Fisher-Yates shuffle of member order.
            for i in (1..order.len()).rev() {
                order.swap(i, c.next(i as u64 + 1) as usize);
            }
            out.push('{');
            for (i, (k, v)) in order.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(out, c);
                write_messy_string(k, out, c);
                ws(out, c);
                out.push(':');
                write_messy(v, out, c);
            }
            ws(out, c);
            out.push('}');
        }
    }
    ws(out, c);
}

fn write_messy_string(s: &str, out: &mut String, c: &mut Choices) {
    out.push('"');
    for ch in s.chars() {
        let must = ch == '"' || ch == '\\' || ch < ' ';
        if must || c.next(4) == 0 {
            let short = match ch {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\n' => Some("\\n"),
                '\u{8}' => Some("\\b"),
                _ => None,
            };
            match short {
                Some(esc) if c.next(2) == 0 => out.push_str(esc),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in ch.encode_utf16(&mut units) {
                        if c.next(2) == 0 {
                            out.push_str(&format!("\\u{unit:04x}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                }
            }
        } else {
            out.push(ch);
        }
    }
    out.push('"');
}

fn messy(v: &Value, seed: u64) -> String {
    let mut out = String::new();
    write_messy(v, &mut out, &mut Choices(seed | 1));
    out
}

/// `v` with every object's members in canonical order, for comparing a value
/// with what its canonical text parses back to.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        Value::Object(members) => {
            let mut members: Vec<(String, Value)> = members
                .iter()
                .map(|(k, v)| (k.clone(), sorted(v)))
                .collect();
            members.sort_by(|a, b| cmp_utf16(&a.0, &b.0));
            Value::Object(members)
        }
        other => other.clone(),
    }
}

fn exclude_spec() -> Spec {
    Spec::from_json(
        br#"{"operation":"POST:/v1/orders","version":1,"exclude":["/metadata","/items/0/note"]}"#,
    )
    .unwrap()
}

// ---- properties ---------------------------------------------------------------

proptest! {
    #[test]
    fn canonical_form_is_a_fixed_point(v in arb_value()) {
        let c = canonicalize(&v);
        prop_assert_eq!(canonicalize_bytes(c.as_bytes()).unwrap(), c.as_bytes());
        let back = parse(c.as_bytes()).unwrap();
        prop_assert_eq!(canonicalize(&back), c.clone());
        // Nothing is lost on the way: same value up to member order.
        prop_assert_eq!(back, sorted(&v));
    }

    #[test]
    fn reformatting_never_changes_canonical_form_or_fingerprint(
        v in arb_order(),
        seed in any::<u64>(),
    ) {
        let text = messy(&v, seed);
        let reparsed = parse(text.as_bytes())
            .map_err(|e| TestCaseError::fail(format!("{e} in {text:?}")))?;
        prop_assert_eq!(canonicalize(&reparsed), canonicalize(&v));
        prop_assert_eq!(Spec::orders().fingerprint(&reparsed), Spec::orders().fingerprint(&v));
        prop_assert_eq!(exclude_spec().fingerprint(&reparsed), exclude_spec().fingerprint(&v));
    }

    #[test]
    fn included_fields_always_count(
        v in arb_order(),
        index in 0usize..7,
        replacement in arb_value(),
    ) {
        let spec = Spec::orders();
        let name = ["client_order_id", "cart_id", "amount", "currency", "items",
                    "shipping_address_id", "quote_id"][index];
        let Value::Object(members) = &v else { unreachable!() };
        let old = v.get(name).cloned();
        prop_assume!(old.as_ref().map(canonicalize) != Some(canonicalize(&replacement)));
        let mut changed: Vec<(String, Value)> =
            members.iter().filter(|(k, _)| k != name).cloned().collect();
        changed.push((name.to_owned(), replacement));
        let changed = Value::Object(changed);
        prop_assert_ne!(spec.fingerprint(&v), spec.fingerprint(&changed));
        // Removing a present field counts too (absent differs from null).
        if old.is_some() {
            let removed = Value::Object(
                members.iter().filter(|(k, _)| k != name).cloned().collect(),
            );
            prop_assert_ne!(spec.fingerprint(&v), spec.fingerprint(&removed));
        }
    }

    #[test]
    fn excluded_and_unlisted_fields_never_count(
        v in arb_order(),
        metadata in arb_value(),
        note in arb_value(),
    ) {
        let Value::Object(members) = &v else { unreachable!() };
        let mut changed: Vec<(String, Value)> = members
            .iter()
            .filter(|(k, _)| k != "metadata")
            .cloned()
            .collect();
        changed.insert(0, ("metadata".to_owned(), metadata));
        let metadata_changed = Value::Object(changed.clone());
        // Metadata is not in the orders spec's include list.
        prop_assert_eq!(
            Spec::orders().fingerprint(&v),
            Spec::orders().fingerprint(&metadata_changed)
        );
        // The exclude spec also drops the first item's "note" member.
        for (k, value) in &mut changed {
            if let (true, Value::Array(items)) = (k == "items", value) {
                if let Some(Value::Object(first)) = items.first_mut() {
                    first.retain(|(name, _)| name != "note");
                    first.push(("note".to_owned(), note.clone()));
                }
            }
        }
        let changed = Value::Object(changed);
        prop_assert_eq!(exclude_spec().fingerprint(&v), exclude_spec().fingerprint(&changed));
        prop_assert_eq!(
            exclude_spec().fingerprint_hmac(b"k", &v),
            exclude_spec().fingerprint_hmac(b"k", &changed)
        );
    }

    #[test]
    fn pointers_round_trip_through_tokens(tokens in prop::collection::vec(arb_string(), 0..4)) {
        let p = Pointer::from_tokens(tokens.clone());
        let back = Pointer::parse(p.as_str()).unwrap();
        prop_assert_eq!(back.tokens(), tokens.as_slice());
        prop_assert_eq!(back, p);
    }
}

// ---- fuzz loop ------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Duplicate(usize, usize),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    let interesting =
        prop::sample::select(b"{}[]\",:\\u0-1eE.+ \ntfn\xff\xed\xa0\x80\xc0".to_vec());
    let byte = prop_oneof![any::<u8>(), interesting];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), 1usize..8).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    match *m {
        Mutation::Flip(i, b) if len > 0 => bytes[i % len] = b,
        Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
        Mutation::Delete(i) if len > 0 => {
            bytes.remove(i % len);
        }
        Mutation::Duplicate(i, n) if len > 0 => {
            let start = i % len;
            let end = (start + n).min(len);
            let chunk = bytes[start..end].to_vec();
            bytes.splice(start..start, chunk);
        }
        _ => {}
    }
}

/// Whatever the input, no entry point panics, and anything accepted has a
/// canonical form that is a fixed point.
fn never_panics(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(c) = canonicalize_bytes(bytes) {
        prop_assert_eq!(canonicalize_bytes(&c).unwrap(), c.clone());
        let v = parse(bytes).unwrap();
        let _ = Spec::orders().fingerprint(&v);
        let _ = exclude_spec().canonical_preimage(&v);
    }
    let _ = Spec::from_json(bytes);
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(p) = Pointer::parse(text) {
            prop_assert_eq!(p.to_string(), text);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 2000, ..Config::default() })]

    #[test]
    fn fuzz_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        never_panics(&bytes)?;
    }

    #[test]
    fn fuzz_mutated_documents(
        v in arb_value(),
        seed in any::<u64>(),
        mutations in prop::collection::vec(arb_mutation(), 1..6),
    ) {
        let mut bytes = messy(&v, seed).into_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        never_panics(&bytes)?;
    }

    #[test]
    fn fuzz_mutated_specs(
        seed in any::<u64>(),
        mutations in prop::collection::vec(arb_mutation(), 1..4),
    ) {
        let spec = Spec::from_json(br#"{"operation":"o","version":1,"exclude":["/a~1b"]}"#).unwrap();
        let text = spec.to_json();
        let v = parse(text.as_bytes()).unwrap();
        let mut bytes = messy(&v, seed).into_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if let Ok(parsed) = Spec::from_json(&bytes) {
            // Whatever was accepted writes back as a spec that reads the same.
            prop_assert_eq!(Spec::from_json(parsed.to_json().as_bytes()).unwrap(), parsed);
        }
    }
}
