//! Writes the parity corpus: seeded, deterministic JSON bodies (Unicode keys and
//! values with astral characters, the ES6 number vectors written in several
//! spellings, nesting, random whitespace and escapes) with include/exclude
//! specs, and for each one the native Rust answers: canonical form, preimage,
//! fingerprint (and HMAC fingerprint for some), or the error's rule, offset and
//! message. The Node and Chromium suites of `wasm/tests/` check the WASM
//! module and a pure-JS reference against every line.
//!
//! `cargo run -p keyhold-wasm --release --example parity_corpus -- OUT.jsonl
//! [COUNT] [SEED] [ES6NUMBERS]`

use keyhold_fingerprint::{self as fp, Spec};
use serde_json::json;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;

/// SplitMix64: small, seeded and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Characters that stress escaping, UTF-16 ordering and UTF-8 widths.
const SPECIAL: &[char] = &[
    '"',
    '\\',
    '/',
    '\u{0}',
    '\u{1}',
    '\u{8}',
    '\t',
    '\n',
    '\u{c}',
    '\r',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    '\u{e9}',
    '\u{df}',
    '\u{3b1}',
    '\u{5d0}',
    '\u{627}',
    '\u{ac00}',
    '\u{d55c}',
    '\u{4e2d}',
    '\u{2028}',
    '\u{2029}',
    '\u{feff}',
    '\u{fffd}',
    '\u{ffff}',
    '\u{fb33}',
    '\u{e000}',
    '\u{10000}',
    '\u{1d11e}',
    '\u{1f600}',
    '\u{1f4a9}',
    '\u{1f1ef}',
    '\u{10ffff}',
    '~',
    '0',
];

fn gen_char(rng: &mut Rng) -> char {
    match rng.below(10) {
        0..=4 => char::from(b' ' + rng.below(95) as u8),
        5..=7 => *rng.pick(SPECIAL),
        8 => char::from_u32(0xa0 + rng.below(0xd7ff - 0xa0) as u32).unwrap_or('x'),
        _ => char::from_u32(0x10000 + rng.below(0x10ffff - 0x10000) as u32).unwrap_or('y'),
    }
}

fn gen_string(rng: &mut Rng, max: usize) -> String {
    let len = rng.below(max + 1);
    (0..len).map(|_| gen_char(rng)).collect()
}

/// Member names: short, often colliding in prefix, with astral and BMP-private
/// characters whose UTF-16 order differs from their code point order.
fn gen_key(rng: &mut Rng) -> String {
    const KEYS: &[&str] = &[
        "",
        "a",
        "A",
        "b",
        "aa",
        "a\u{0}",
        "\u{e9}",
        "\u{1f600}",
        "\u{fb33}",
        "\u{10000}",
        "\u{ffff}",
        "10",
        "2",
        "-",
        "~",
        "/",
        "a/b",
        "m~n",
        "__proto__",
        "constructor",
        "amount",
        "items",
        "sku",
        "\u{d55c}\u{ae00}",
    ];
    if rng.chance(40) {
        (*rng.pick(KEYS)).to_owned()
    } else {
        gen_string(rng, 6)
    }
}

#[derive(Clone)]
enum Gen {
    Null,
    Bool(bool),
    /// The text as written in the body.
    Number(String),
    String(String),
    Array(Vec<Gen>),
    Object(Vec<(String, Gen)>),
}

struct Numbers(Vec<(f64, String)>);

impl Numbers {
    fn load(path: &str) -> Numbers {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let list = text
            .lines()
            .filter_map(|line| {
                let (hex, expected) = line.split_once(',')?;
                let bits = u64::from_str_radix(hex, 16).ok()?;
                let f = f64::from_bits(bits);
                f.is_finite().then(|| (f, expected.to_owned()))
            })
            .collect();
        Numbers(list)
    }

    /// One of the vectors, in one of several spellings that all parse to the
    /// same double.
    fn gen(&self, rng: &mut Rng) -> String {
        let (f, es) = rng.pick(&self.0).clone();
        match rng.below(6) {
            0 | 1 => es,
            2 => format!("{f:e}"),
            3 => format!("{f:.20e}"),
            4 => es.replace('e', "E"),
            _ => {
                if f.fract() == 0.0 && f.abs() < 1e15 {
                    format!("{}.000", f as i64)
                } else {
                    format!("{f:E}")
                }
            }
        }
    }
}

fn gen_value(rng: &mut Rng, numbers: &Numbers, depth: usize) -> Gen {
    let containers = if depth >= 5 { 0 } else { 2 };
    match rng.below(6 + containers) {
        0 => Gen::Null,
        1 => Gen::Bool(rng.chance(50)),
        2 | 3 => Gen::Number(numbers.gen(rng)),
        4 | 5 => Gen::String(gen_string(rng, 12)),
        6 => Gen::Array(
            (0..rng.below(5))
                .map(|_| gen_value(rng, numbers, depth + 1))
                .collect(),
        ),
        _ => {
            let size = rng.below(6);
            gen_object(rng, numbers, depth + 1, size)
        }
    }
}

fn gen_object(rng: &mut Rng, numbers: &Numbers, depth: usize, size: usize) -> Gen {
    let mut names = BTreeSet::new();
    let mut members = Vec::new();
    while members.len() < size {
        let name = gen_key(rng);
        if names.insert(name.clone()) {
            members.push((name, gen_value(rng, numbers, depth)));
        }
    }
    Gen::Object(members)
}

/// An order-like body: the orders spec's fields, some missing or null, plus
/// metadata and random extra members, in random order.
fn gen_order(rng: &mut Rng, numbers: &Numbers) -> Gen {
    let mut members: Vec<(String, Gen)> = Vec::new();
    let s = |t: String| Gen::String(t);
    let fields: [(&str, Gen); 7] = [
        ("client_order_id", s(format!("c-{}", rng.next() % 100_000))),
        ("cart_id", s(gen_string(rng, 10))),
        ("amount", Gen::Number(numbers.gen(rng))),
        (
            "currency",
            s((*rng.pick(&["EUR", "USD", "KRW", "JPY"])).to_owned()),
        ),
        ("shipping_address_id", s(gen_string(rng, 8))),
        ("quote_id", Gen::Null),
        (
            "items",
            Gen::Array(
                (0..rng.below(4))
                    .map(|i| {
                        Gen::Object(vec![
                            (
                                "sku".to_owned(),
                                s(format!("sku-{i}-{}", gen_string(rng, 3))),
                            ),
                            (
                                "quantity".to_owned(),
                                Gen::Number(format!("{}", 1 + rng.below(9))),
                            ),
                            ("note".to_owned(), s(gen_string(rng, 5))),
                        ])
                    })
                    .collect(),
            ),
        ),
    ];
    for (name, value) in fields {
        if rng.chance(85) {
            members.push((name.to_owned(), value));
        }
    }
    let size = rng.below(4);
    members.push(("metadata".to_owned(), gen_object(rng, numbers, 2, size)));
    let size = rng.below(4);
    let Gen::Object(extra) = gen_object(rng, numbers, 1, size) else {
        unreachable!("gen_object makes objects")
    };
    for (name, value) in extra {
        if !members.iter().any(|(n, _)| *n == name) {
            members.push((name, value));
        }
    }
    Gen::Object(members)
}

fn ws(rng: &mut Rng, out: &mut String) {
    if rng.chance(25) {
        for _ in 0..=rng.below(3) {
            out.push(*rng.pick(&[' ', '\t', '\n', '\r']));
        }
    }
}

fn write_str(rng: &mut Rng, out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        let must = c == '"' || c == '\\' || (c as u32) < 0x20;
        if must || rng.chance(8) {
            match (c, rng.below(2)) {
                ('"', _) => out.push_str("\\\""),
                ('\\', _) => out.push_str("\\\\"),
                ('\n', 0) => out.push_str("\\n"),
                ('\t', 0) => out.push_str("\\t"),
                ('\r', 0) => out.push_str("\\r"),
                ('\u{8}', 0) => out.push_str("\\b"),
                ('\u{c}', 0) => out.push_str("\\f"),
                ('/', 0) => out.push_str("\\/"),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if rng.chance(50) {
                            let _ = write!(out, "\\u{unit:04X}");
                        } else {
                            let _ = write!(out, "\\u{unit:04x}");
                        }
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

fn write_gen(rng: &mut Rng, out: &mut String, value: &Gen) {
    ws(rng, out);
    match value {
        Gen::Null => out.push_str("null"),
        Gen::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Gen::Number(text) => out.push_str(text),
        Gen::String(s) => write_str(rng, out, s),
        Gen::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_gen(rng, out, item);
            }
            ws(rng, out);
            out.push(']');
        }
        Gen::Object(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            out.push('{');
            for (k, &i) in order.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                ws(rng, out);
                write_str(rng, out, &members[i].0);
                ws(rng, out);
                out.push(':');
                write_gen(rng, out, &members[i].1);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// RFC 6901 paths present in `value` (limited), for include/exclude specs.
fn paths(value: &Gen, prefix: &str, out: &mut Vec<String>) {
    if out.len() > 40 {
        return;
    }
    match value {
        Gen::Object(members) => {
            for (name, v) in members {
                let p = format!("{prefix}/{}", name.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                paths(v, &p, out);
            }
        }
        Gen::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = format!("{prefix}/{i}");
                out.push(p.clone());
                paths(v, &p, out);
            }
        }
        _ => {}
    }
}

fn gen_spec(rng: &mut Rng, body: &Gen) -> Option<String> {
    match rng.below(10) {
        0..=2 => None,
        3 => Some("orders".to_owned()),
        _ => {
            let mut present = Vec::new();
            paths(body, "", &mut present);
            let exclude = rng.chance(40);
            let mut chosen = BTreeSet::new();
            let mut list = Vec::new();
            for _ in 0..rng.below(6) {
                let p = match rng.below(5) {
                    0 => format!("/{}", gen_key(rng).replace('~', "~0").replace('/', "~1")),
                    1 => (*rng.pick(&[
                        "/items/0/sku",
                        "/items/01",
                        "/items/-",
                        "/amount",
                        "/metadata",
                    ]))
                    .to_owned(),
                    2 if !exclude => String::new(),
                    _ if present.is_empty() => "/none".to_owned(),
                    _ => rng.pick(&present).clone(),
                };
                if chosen.insert(p.clone()) {
                    list.push(p);
                }
            }
            let operation = format!("POST:/v1/{}", gen_string(rng, 6));
            let spec = if exclude {
                json!({"operation": operation, "version": rng.below(5), "exclude": list})
            } else {
                json!({"include": list, "version": rng.below(5), "operation": operation})
            };
            Some(spec.to_string())
        }
    }
}

/// A body that breaks one I-JSON rule.
fn gen_invalid(rng: &mut Rng, numbers: &Numbers) -> String {
    let mut base = String::new();
    let size = 1 + rng.below(3);
    let value = gen_object(rng, numbers, 1, size);
    write_gen(rng, &mut base, &value);
    let inner = base
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .to_owned();
    match rng.below(6) {
        0 => format!("{{{inner},\"dup\":1,\"dup\":2}}"),
        1 => format!("{{{inner},\"s\":\"x\\uD83D y\"}}"),
        2 => format!("{{{inner},\"n\":1e400}}"),
        3 => format!("{{{inner},}}"),
        4 => format!("{}{}", "[".repeat(70), "]".repeat(70)),
        _ => format!("{{{inner},\"k\":\"\\udc00\"}}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out_path = args
        .first()
        .expect("usage: parity_corpus OUT [COUNT] [SEED] [ES6NUMBERS]");
    let count: usize = args.get(1).map_or(10_000, |s| s.parse().expect("COUNT"));
    let seed: u64 = args.get(2).map_or(2024, |s| s.parse().expect("SEED"));
    let numbers_path = args.get(3).map_or_else(
        || {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/vectors/es6numbers.txt"
            )
            .to_owned()
        },
        Clone::clone,
    );
    let numbers = Numbers::load(&numbers_path);
    assert!(!numbers.0.is_empty(), "no numbers in {numbers_path}");
    let mut rng = Rng(seed);
    let mut out = std::io::BufWriter::new(std::fs::File::create(out_path).expect("create OUT"));
    let (mut valid, mut invalid) = (0usize, 0usize);
    for i in 0..count {
        let (body, spec) = if rng.chance(3) {
            (gen_invalid(&mut rng, &numbers), None)
        } else {
            let value = match rng.below(10) {
                0 => gen_value(&mut rng, &numbers, 0),
                1 | 2 => {
                    let size = rng.below(8);
                    gen_object(&mut rng, &numbers, 0, size)
                }
                _ => gen_order(&mut rng, &numbers),
            };
            let mut text = String::new();
            write_gen(&mut rng, &mut text, &value);
            let spec = gen_spec(&mut rng, &value);
            (text, spec)
        };
        let secret = rng.chance(10).then(|| gen_string(&mut rng, 8));
        let line = match fp::parse(body.as_bytes()) {
            Err(e) => {
                invalid += 1;
                json!({"i": i, "body": body, "spec": spec, "error": {
                    "rule": e.rule(), "offset": e.offset(), "message": format!("{}: {e}", e.rule()),
                }})
            }
            Ok(value) => {
                valid += 1;
                let spec_obj = match spec.as_deref() {
                    None | Some("orders") => Spec::orders(),
                    Some(text) => {
                        Spec::from_json(text.as_bytes()).expect("generated specs are valid")
                    }
                };
                let preimage = spec_obj.canonical_preimage(&value);
                let mut line = json!({
                    "i": i, "body": body, "spec": spec,
                    "canonical": fp::canonicalize(&value),
                    "preimage": preimage,
                    "fingerprint": spec_obj.fingerprint(&value).into_string(),
                });
                if let Some(secret) = secret {
                    line["hmac"] = json!(spec_obj
                        .fingerprint_hmac(secret.as_bytes(), &value)
                        .into_string());
                    line["secret"] = json!(secret);
                }
                line
            }
        };
        writeln!(out, "{line}").expect("write OUT");
    }
    out.flush().expect("flush OUT");
    eprintln!("parity corpus: {count} cases ({valid} valid, {invalid} invalid) -> {out_path}");
}
