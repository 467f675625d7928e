//! The bad-input catalogue: a data-driven end-to-end test of more than 80 bad
//! requests against a real `keyhold up` cluster of two regions, each sent over a
//! raw TCP connection (so headers go out exactly as written: twice, with control
//! characters, lying about the body's length, with bare LF line endings). Every
//! case names the contract's status and slug. Every answer must be problem+json,
//! must name the region, and must either keep the connection usable or say
//! `Connection: close` and close — never close silently. Afterwards the test
//! proves nothing was stored: no order exists for any case's client_order_id,
//! every case's key (when it was a valid key) is still fresh, and no tenant a
//! refused admin request named exists.

mod common;

use common::raw::{chunked, request, RawConn, RawResp, ReadError};
use common::{order_body, Cluster};
use std::time::Duration;

/// An answer must arrive within this; slow-body cases wait for the node's body
/// read limit (10 s) first.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

type Headers = Vec<(String, Vec<u8>)>;

/// What a case must get back.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// A problem+json body with this status and slug.
    Problem(u16, &'static str),
}

struct Case {
    name: String,
    /// `host:port` of the node it is sent to.
    addr: String,
    raw: Vec<u8>,
    expect: Expect,
    /// Send only the first `n` bytes and then wait: a slow or unfinished body.
    stall_after: Option<usize>,
    /// For order creations: the client_order_id of the body, and the key when it
    /// is a valid one, to prove afterwards that nothing was stored.
    probe: Option<(Option<String>, String)>,
    /// For tenant creations: the tenant id, which must not exist afterwards.
    tenant_probe: Option<String>,
    /// The answer must say `Connection: close` and the node close: refused
    /// framing and heads, after which nothing on the connection can be trusted.
    closes: bool,
}

impl Case {
    fn new(name: &str, addr: String, raw: Vec<u8>, expect: Expect) -> Case {
        Case {
            name: name.to_owned(),
            addr,
            raw,
            expect,
            stall_after: None,
            probe: None,
            tenant_probe: None,
            closes: false,
        }
    }
}

struct Catalogue {
    run: String,
    a: String,
    b: String,
    token: String,
    other_token: String,
    admin: String,
    cases: Vec<Case>,
}

fn h(name: &str, value: impl AsRef<[u8]>) -> (String, Vec<u8>) {
    (name.to_owned(), value.as_ref().to_vec())
}

fn without(headers: &mut Headers, name: &str) {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
}

fn set(headers: &mut Headers, name: &str, value: impl AsRef<[u8]>) {
    without(headers, name);
    headers.push(h(name, value));
}

fn refs(headers: &Headers) -> Vec<(&str, &[u8])> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect()
}

fn order_json(coid: &str, extra: &str) -> Vec<u8> {
    format!(
        r#"{{"client_order_id":"{coid}","cart_id":"cart-1","amount":10,"currency":"EUR"{extra}}}"#
    )
    .into_bytes()
}

impl Catalogue {
    fn names(&mut self) -> (String, String) {
        let n = self.cases.len();
        (
            format!("bad-{}-{n}", self.run),
            format!("co-{}-{n}", self.run),
        )
    }

    fn std_headers(&self, key: &str) -> Headers {
        vec![
            h("authorization", format!("Bearer {}", self.token)),
            h("idempotency-key", key),
            h("content-type", "application/json"),
        ]
    }

    /// A `POST /v1/orders` to region `a`: the standard headers and a valid body
    /// for a fresh key and client_order_id, changed by `edit`.
    fn order(
        &mut self,
        name: &str,
        expect: Expect,
        edit: impl FnOnce(&mut Headers, &mut Vec<u8>, &str, &str),
    ) {
        let addr = self.a.clone();
        self.order_at(name, addr, expect, edit);
    }

    fn order_at(
        &mut self,
        name: &str,
        addr: String,
        expect: Expect,
        edit: impl FnOnce(&mut Headers, &mut Vec<u8>, &str, &str),
    ) {
        let (key, coid) = self.names();
        let mut headers = self.std_headers(&key);
        let mut body = order_json(&coid, "");
        edit(&mut headers, &mut body, &key, &coid);
        let keys: Vec<&Vec<u8>> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("idempotency-key"))
            .map(|(_, v)| v)
            .collect();
        let valid_key = (keys.len() == 1 && keys[0] == key.as_bytes()).then(|| key.clone());
        let raw = request("POST", "/v1/orders", &refs(&headers), &body);
        self.cases.push(Case {
            probe: Some((valid_key, coid)),
            ..Case::new(name, addr, raw, expect)
        });
    }

    /// An order whose body is `fields` (with the case's client_order_id spliced
    /// in for `{coid}`) and the standard headers.
    fn order_body(&mut self, name: &str, expect: Expect, fields: &str) {
        let fields = fields.to_owned();
        self.order(name, expect, move |_, body, _, coid| {
            *body = fields.replace("{coid}", coid).into_bytes();
        });
    }

    /// Any request, sent as given to region `a`.
    fn raw(&mut self, name: &str, expect: Expect, raw: Vec<u8>) {
        let addr = self.a.clone();
        self.cases.push(Case::new(name, addr, raw, expect));
    }

    /// A JSON POST to region `a` with `token` as the bearer token.
    fn json_post(&mut self, name: &str, token: &str, path: &str, body: &str, expect: Expect) {
        let headers = vec![
            h("authorization", format!("Bearer {token}")),
            h("content-type", "application/json"),
        ];
        let raw = request("POST", path, &refs(&headers), body.as_bytes());
        self.raw(name, expect, raw);
    }

    fn tenant_json(&mut self, name: &str, path: &str, body: &str, expect: Expect) {
        let token = self.token.clone();
        self.json_post(name, &token, path, body, expect);
    }

    fn admin_json(&mut self, name: &str, path: &str, body: &str, expect: Expect) {
        let admin = self.admin.clone();
        self.json_post(name, &admin, path, body, expect);
    }
}

use Expect::Problem;

const INVALID: Expect = Problem(400, "invalid-request");
const UNAUTH: Expect = Problem(401, "unauthenticated");
const KEY_INVALID: Expect = Problem(400, "idempotency-key-invalid");
const MEDIA: Expect = Problem(415, "unsupported-media-type");
const TOO_LARGE: Expect = Problem(413, "payload-too-large");
const HEADERS_TOO_LARGE: Expect = Problem(431, "headers-too-large");

fn auth_cases(c: &mut Catalogue) {
    c.order("no Authorization", UNAUTH, |hs, _, _, _| {
        without(hs, "authorization")
    });
    for (name, value) in [
        ("scheme only", "Bearer".to_owned()),
        ("scheme and space", "Bearer ".to_owned()),
        ("Basic scheme", "Basic dXNlcjpwYXNz".to_owned()),
        ("token without scheme", c.token.clone()),
        (
            "unknown keyhold token",
            format!("Bearer kh_{}", "A".repeat(43)),
        ),
        ("token with a suffix", format!("Bearer {}x", c.token)),
        ("admin token as tenant token", format!("Bearer {}", c.admin)),
        (
            "two tokens in one header",
            format!("Bearer {}, Bearer {}", c.token, c.other_token),
        ),
    ] {
        c.order(name, UNAUTH, |hs, _, _, _| set(hs, "authorization", value));
    }
    let bad = format!("Bearer kh_{}", "B".repeat(43));
    c.order(
        "Authorization twice: valid then invalid",
        UNAUTH,
        |hs, _, _, _| hs.push(h("authorization", bad)),
    );
    let (token, other) = (c.token.clone(), c.other_token.clone());
    c.order(
        "Authorization twice: invalid then valid",
        UNAUTH,
        |hs, _, _, _| {
            set(hs, "authorization", "Bearer kh_nope");
            hs.push(h("authorization", format!("Bearer {token}")))
        },
    );
    c.order("Authorization twice: two tenants", UNAUTH, |hs, _, _, _| {
        hs.push(h("authorization", format!("Bearer {other}")))
    });
    let token = c.token.clone();
    c.order(
        "Authorization twice: the same token",
        UNAUTH,
        |hs, _, _, _| hs.push(h("authorization", format!("Bearer {token}"))),
    );
}

fn key_cases(c: &mut Catalogue) {
    c.order(
        "no Idempotency-Key",
        Problem(400, "idempotency-key-missing"),
        |hs, _, _, _| without(hs, "idempotency-key"),
    );
    for (name, value) in [
        ("empty key", b"".to_vec()),
        ("empty sf-string", b"\"\"".to_vec()),
        ("key of 256 characters", "k".repeat(256).into_bytes()),
        (
            "sf-string of 256 characters",
            format!("\"{}\"", "k".repeat(256)).into_bytes(),
        ),
        ("key with a space", b"a b".to_vec()),
        ("key with non-ASCII bytes", "cl\u{e9}".as_bytes().to_vec()),
        ("unterminated sf-string", b"\"abc".to_vec()),
        ("sf-string with trailing text", b"\"abc\"x".to_vec()),
        ("key list", b"a, b".to_vec()),
        ("key with a tab", b"a\tb".to_vec()),
    ] {
        c.order(name, KEY_INVALID, |hs, _, _, _| {
            set(hs, "idempotency-key", value)
        });
    }
    c.order("Idempotency-Key twice", KEY_INVALID, |hs, _, key, _| {
        hs.push(h("idempotency-key", format!("{key}-2")))
    });
    c.order(
        "Idempotency-Key twice, same value",
        KEY_INVALID,
        |hs, _, key, _| hs.push(h("idempotency-key", key)),
    );
}

fn media_cases(c: &mut Catalogue) {
    c.order("no Content-Type", MEDIA, |hs, _, _, _| {
        without(hs, "content-type")
    });
    for (name, value) in [
        ("text/plain", "text/plain"),
        ("form encoded", "application/x-www-form-urlencoded"),
        ("application/jsonx", "application/jsonx"),
        ("bare json", "json"),
        ("multipart", "multipart/form-data; boundary=x"),
        ("empty Content-Type", ""),
    ] {
        c.order(name, MEDIA, |hs, _, _, _| set(hs, "content-type", value));
    }
    c.order(
        "Content-Type twice: json then text",
        INVALID,
        |hs, _, _, _| hs.push(h("content-type", "text/plain")),
    );
    c.order(
        "Content-Type twice: text then json",
        INVALID,
        |hs, _, _, _| {
            set(hs, "content-type", "text/plain");
            hs.push(h("content-type", "application/json"))
        },
    );
    c.order("Content-Type twice: json twice", INVALID, |hs, _, _, _| {
        hs.push(h("content-type", "application/json"))
    });
}

fn json_cases(c: &mut Catalogue) {
    for (name, body) in [
        ("empty body", ""),
        ("unclosed object", "{"),
        ("array", "[]"),
        ("null", "null"),
        ("string", "\"order\""),
        (
            "duplicate member",
            r#"{"client_order_id":"{coid}","client_order_id":"x","cart_id":"c","amount":1,"currency":"EUR"}"#,
        ),
        (
            "lone surrogate",
            r#"{"client_order_id":"{coid}","cart_id":"\ud800","amount":1,"currency":"EUR"}"#,
        ),
        (
            "trailing text",
            r#"{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR"} x"#,
        ),
        (
            "NaN",
            r#"{"client_order_id":"{coid}","cart_id":"c","amount":NaN,"currency":"EUR"}"#,
        ),
        (
            "number overflowing to infinity",
            r#"{"client_order_id":"{coid}","cart_id":"c","amount":1e400,"currency":"EUR"}"#,
        ),
        (
            "comment",
            r#"{"client_order_id":"{coid}",/* */"cart_id":"c","amount":1,"currency":"EUR"}"#,
        ),
        (
            "single quotes",
            r#"{'client_order_id':'{coid}','cart_id':'c','amount':1,'currency':'EUR'}"#,
        ),
        (
            "trailing comma",
            r#"{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR",}"#,
        ),
    ] {
        c.order_body(&format!("JSON: {name}"), INVALID, body);
    }
    c.order("JSON: 10,000 nested arrays", INVALID, |_, body, _, coid| {
        *body = format!(
            r#"{{"client_order_id":"{coid}","cart_id":"c","amount":1,"currency":"EUR","metadata":{{"x":{}{}}}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        )
        .into_bytes();
    });
    c.order("JSON: invalid UTF-8", INVALID, |_, body, _, coid| {
        *body = format!(r#"{{"client_order_id":"{coid}","cart_id":"c"#).into_bytes();
        body.extend_from_slice(b"\xff\xfe");
        body.extend_from_slice(br#"","amount":1,"currency":"EUR"}"#);
    });
    c.order("JSON: byte order mark", INVALID, |_, body, _, _| {
        body.splice(0..0, *b"\xef\xbb\xbf");
    });
}

fn field_cases(c: &mut Catalogue) {
    let base = |fields: &str| -> String {
        // Every field is valid except those the case overrides.
        let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"client_order_id":"{coid}","cart_id":"cart-1","amount":10,"currency":"EUR"}"#,
        )
        .expect("base");
        let over: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(fields).expect("override");
        for (k, val) in over {
            if val == serde_json::Value::String("<absent>".into()) {
                v.remove(&k);
            } else {
                v.insert(k, val);
            }
        }
        serde_json::Value::Object(v).to_string()
    };
    let long = "x".repeat(65);
    let items: Vec<serde_json::Value> = (0..101)
        .map(|i| serde_json::json!({"sku": format!("s{i}"), "quantity": 1}))
        .collect();
    let cases: Vec<(&str, String)> = vec![
        (
            "client_order_id absent",
            r#"{"client_order_id":"<absent>"}"#.into(),
        ),
        ("client_order_id empty", r#"{"client_order_id":""}"#.into()),
        (
            "client_order_id with a space",
            r#"{"client_order_id":"a b {coid}"}"#.into(),
        ),
        (
            "client_order_id a number",
            r#"{"client_order_id":5}"#.into(),
        ),
        (
            "client_order_id too long",
            format!(r#"{{"client_order_id":"{long}"}}"#),
        ),
        ("cart_id absent", r#"{"cart_id":"<absent>"}"#.into()),
        ("cart_id empty", r#"{"cart_id":""}"#.into()),
        ("cart_id too long", format!(r#"{{"cart_id":"{long}"}}"#)),
        ("cart_id a number", r#"{"cart_id":7}"#.into()),
        ("amount zero", r#"{"amount":0}"#.into()),
        ("amount negative", r#"{"amount":-1}"#.into()),
        (
            "amount above 10^15",
            r#"{"amount":1000000000000001}"#.into(),
        ),
        ("amount a fraction", r#"{"amount":1.5}"#.into()),
        ("amount a string", r#"{"amount":"10"}"#.into()),
        ("amount null", r#"{"amount":null}"#.into()),
        ("amount absent", r#"{"amount":"<absent>"}"#.into()),
        ("currency lower case", r#"{"currency":"eur"}"#.into()),
        ("currency of four letters", r#"{"currency":"EURO"}"#.into()),
        ("currency absent", r#"{"currency":"<absent>"}"#.into()),
        (
            "shipping_address_id too long",
            format!(r#"{{"shipping_address_id":"{long}"}}"#),
        ),
        ("quote_id a number", r#"{"quote_id":1}"#.into()),
        (
            "items not an array",
            r#"{"items":{"sku":"a","quantity":1}}"#.into(),
        ),
        (
            "items: 101 lines",
            serde_json::json!({ "items": items }).to_string(),
        ),
        (
            "item quantity zero",
            r#"{"items":[{"sku":"a","quantity":0}]}"#.into(),
        ),
        (
            "item quantity above 10^6",
            r#"{"items":[{"sku":"a","quantity":1000001}]}"#.into(),
        ),
        (
            "item sku too long",
            format!(r#"{{"items":[{{"sku":"{long}","quantity":1}}]}}"#),
        ),
        ("item without sku", r#"{"items":[{"quantity":1}]}"#.into()),
        ("metadata not an object", r#"{"metadata":[1]}"#.into()),
        (
            "metadata above 4 KiB",
            serde_json::json!({"metadata": {"x": "m".repeat(5000)}}).to_string(),
        ),
    ];
    for (name, fields) in cases {
        let body = base(&fields);
        c.order_body(&format!("field: {name}"), INVALID, &body);
    }
}

fn size_cases(c: &mut Catalogue) {
    let pad = format!(r#","metadata":{{"pad":"{}"}}"#, "p".repeat(70 * 1024));
    let p = pad.clone();
    c.order(
        "70 KB with Content-Length",
        TOO_LARGE,
        move |_, body, _, coid| *body = order_json(coid, &p),
    );
    let p = pad.clone();
    c.order("70 KB chunked", TOO_LARGE, move |hs, body, _, coid| {
        hs.push(h("transfer-encoding", "chunked"));
        *body = chunked(&order_json(coid, &p));
    });
    // One order of checks everywhere: the key is checked before the size, at
    // the home and through a forwarding node alike.
    for via in ["home", "forwarding node"] {
        let addr = if via == "home" {
            c.a.clone()
        } else {
            c.b.clone()
        };
        let p = pad.clone();
        c.order_at(
            &format!("70 KB without a key, through the {via}"),
            addr,
            Problem(400, "idempotency-key-missing"),
            move |hs, body, _, coid| {
                without(hs, "idempotency-key");
                *body = order_json(coid, &p);
            },
        );
        let p = pad.clone();
        c.order_at(
            &format!("70 KB as text/plain, through the {via}"),
            if via == "home" {
                c.a.clone()
            } else {
                c.b.clone()
            },
            MEDIA,
            move |hs, body, _, coid| {
                set(hs, "content-type", "text/plain");
                *body = order_json(coid, &p);
            },
        );
    }
    c.order(
        "Content-Length and Transfer-Encoding",
        INVALID,
        |hs, body, _, _| {
            hs.push(h("content-length", body.len().to_string()));
            hs.push(h("transfer-encoding", "chunked"));
            *body = chunked(body);
        },
    );
    c.order(
        "Transfer-Encoding, then Content-Length",
        INVALID,
        |hs, body, _, _| {
            hs.push(h("transfer-encoding", "chunked"));
            hs.push(h("content-length", body.len().to_string()));
            *body = chunked(body);
        },
    );
    for (name, value) in [
        ("Content-Length not a number", "abc"),
        ("Content-Length negative", "-1"),
        ("Content-Length list of two values", "5, 6"),
    ] {
        c.order(name, INVALID, |hs, _, _, _| {
            hs.push(h("content-length", value))
        });
    }
    c.order(
        "two different Content-Lengths",
        INVALID,
        |hs, body, _, _| {
            hs.push(h("content-length", body.len().to_string()));
            hs.push(h("content-length", (body.len() + 1).to_string()));
        },
    );
    c.order("Transfer-Encoding gzip", INVALID, |hs, _, _, _| {
        hs.push(h("transfer-encoding", "gzip"))
    });
}

/// How a case's head ends its lines.
#[derive(Clone, Copy)]
enum Endings {
    Crlf,
    /// Every line of the head ends with a bare LF.
    Lf,
    /// CRLF, except a bare LF before the `Transfer-Encoding` line.
    LfBeforeTe,
}

impl Endings {
    fn name(self) -> &'static str {
        match self {
            Endings::Crlf => "CRLF head",
            Endings::Lf => "LF-only head",
            Endings::LfBeforeTe => "bare LF before the TE line only",
        }
    }

    /// `raw` (a request with a CRLF head) with its head's line endings changed;
    /// a chunked body keeps its CRLFs.
    fn apply(self, raw: Vec<u8>) -> Vec<u8> {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a head")
            + 4;
        let (head, body) = raw.split_at(end);
        let head = String::from_utf8(head.to_vec()).expect("ASCII head");
        let head = match self {
            Endings::Crlf => head,
            Endings::Lf => head.replace("\r\n", "\n"),
            Endings::LfBeforeTe => head.replace("\r\ntransfer-encoding", "\ntransfer-encoding"),
        };
        [head.as_bytes(), body].concat()
    }
}

/// A framing a front proxy and the node could read two ways, to be refused
/// before anything runs: the headers to add to a request, and whether the body
/// goes out chunked.
struct Ambiguous {
    name: &'static str,
    headers: Headers,
    chunked: bool,
}

/// Every [`Ambiguous`] framing, for a body of `body_len` bytes (unchunked).
fn ambiguous_framings(body_len: usize) -> Vec<Ambiguous> {
    let n = body_len.to_string();
    let framings: Vec<(&'static str, Headers, bool)> = vec![
        (
            "Content-Length, then Transfer-Encoding",
            vec![h("content-length", &n), h("transfer-encoding", "chunked")],
            true,
        ),
        (
            "Transfer-Encoding, then Content-Length",
            vec![h("transfer-encoding", "chunked"), h("content-length", &n)],
            true,
        ),
        (
            "Content-Length twice, equal",
            vec![h("content-length", &n), h("content-length", &n)],
            false,
        ),
        (
            "Content-Length list of equal values",
            vec![h("content-length", format!("{n}, {n}"))],
            false,
        ),
        (
            "Transfer-Encoding twice",
            vec![
                h("transfer-encoding", "chunked"),
                h("transfer-encoding", "chunked"),
            ],
            true,
        ),
        (
            "Transfer-Encoding gzip, chunked",
            vec![h("transfer-encoding", "gzip, chunked")],
            true,
        ),
    ];
    framings
        .into_iter()
        .map(|(name, headers, chunked)| Ambiguous {
            name,
            headers,
            chunked,
        })
        .collect()
}

/// The headers of the framing called `name` for a body of `body_len` bytes.
fn framing_headers(name: &str, body_len: usize) -> Headers {
    ambiguous_framings(body_len)
        .into_iter()
        .find(|f| f.name == name)
        .expect("a known framing")
        .headers
}

/// Every ambiguous framing with every kind of line ending, sent directly, through
/// a forwarding node, and as an admin write: 400 `invalid-request`, the
/// connection closed, nothing executed (probe d44e5cf: with bare LF endings the
/// order was stored and the tenant created).
fn framing_cases(c: &mut Catalogue) {
    for endings in [Endings::Crlf, Endings::Lf, Endings::LfBeforeTe] {
        for framing in ambiguous_framings(0) {
            let (name, chunk) = (framing.name, framing.chunked);
            if matches!(endings, Endings::LfBeforeTe) && !name.contains("Transfer-Encoding") {
                continue;
            }
            for (via, addr) in [("home", c.a.clone()), ("forwarding node", c.b.clone())] {
                c.order_at(
                    &format!("{name}, {}, through the {via}", endings.name()),
                    addr,
                    INVALID,
                    |hs, body, _, _| {
                        hs.extend(framing_headers(name, body.len()));
                        if chunk {
                            *body = chunked(body);
                        }
                    },
                );
                let last = c.cases.last_mut().expect("pushed");
                last.raw = endings.apply(std::mem::take(&mut last.raw));
            }
            for (via, addr) in [("region a", c.a.clone()), ("region b", c.b.clone())] {
                let tenant = format!("t-{}-{}", c.run, c.cases.len());
                let body = format!(r#"{{"tenant_id":"{tenant}","home_region":"a"}}"#);
                let mut headers = vec![
                    h("authorization", format!("Bearer {}", c.admin)),
                    h("content-type", "application/json"),
                ];
                headers.extend(framing_headers(name, body.len()));
                let sent = if chunk {
                    chunked(body.as_bytes())
                } else {
                    body.into_bytes()
                };
                let raw = request("POST", "/admin/v1/tenants", &refs(&headers), &sent);
                c.cases.push(Case {
                    tenant_probe: Some(tenant),
                    ..Case::new(
                        &format!("create tenant: {name}, {}, at {via}", endings.name()),
                        addr,
                        endings.apply(raw),
                        INVALID,
                    )
                });
            }
        }
    }
    // The classic smuggle: an LF-only head read by Content-Length in front, by
    // chunks here, with a second order hidden after the last chunk. Neither runs.
    c.order(
        "CL.TE smuggle with an LF-only head",
        INVALID,
        |hs, body, _, _| {
            let hidden = request("POST", "/v1/orders", &refs(hs), body);
            let mut sent = chunked(body);
            sent.extend_from_slice(&hidden);
            hs.push(h("content-length", "5"));
            hs.push(h("transfer-encoding", "chunked"));
            *body = sent;
        },
    );
    let last = c.cases.last_mut().expect("pushed");
    last.raw = Endings::Lf.apply(std::mem::take(&mut last.raw));
}

fn fingerprint_cases(c: &mut Catalogue) {
    let wrong = format!("sha256:{}", "0".repeat(64));
    let w = wrong.clone();
    c.order(
        "wrong Idempotency-Fingerprint",
        Problem(400, "fingerprint-mismatch"),
        |hs, _, _, _| hs.push(h("idempotency-fingerprint", w)),
    );
    c.order(
        "Idempotency-Fingerprint not a digest",
        Problem(400, "fingerprint-mismatch"),
        |hs, _, _, _| hs.push(h("idempotency-fingerprint", "md5:abc")),
    );
    let w = wrong.clone();
    c.order("Idempotency-Fingerprint twice", INVALID, |hs, _, _, _| {
        hs.push(h("idempotency-fingerprint", w.clone()));
        hs.push(h("idempotency-fingerprint", w));
    });
    let right = right_fingerprint(c);
    for (order, first, second) in [
        ("right then wrong", right.clone(), wrong.clone()),
        ("wrong then right", wrong, right),
    ] {
        c.order(
            &format!("Idempotency-Fingerprint twice: {order}"),
            INVALID,
            move |hs, body, _, _| {
                *body = FIXED_BODY.as_bytes().to_vec();
                hs.push(h("idempotency-fingerprint", first));
                hs.push(h("idempotency-fingerprint", second));
            },
        );
    }
}

/// A body whose fingerprint the test computes (the client_order_id is fixed, so
/// these two cases share it; the proof afterwards checks it too).
const FIXED_BODY: &str =
    r#"{"client_order_id":"fixed-fp-body","cart_id":"cart-1","amount":10,"currency":"EUR"}"#;

fn right_fingerprint(_c: &Catalogue) -> String {
    let out = std::process::Command::new(common::KEYHOLD)
        .args(["fingerprint", "--spec", "orders"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(FIXED_BODY.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run keyhold fingerprint");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        common::is_sha256_fingerprint(&text),
        "keyhold fingerprint printed {text:?}"
    );
    text
}

fn header_abuse_cases(c: &mut Catalogue) {
    // What hyper's parser refuses is refused by the node's head check first,
    // with hyper's status, as a problem document with Keyhold-Region.
    for (name, value) in [
        ("control character in a header value", &b"a\x01b"[..]),
        ("NUL in a header value", b"a\x00b"),
        ("DEL in a header value", b"a\x7fb"),
        ("bare CR in a header value", b"a\rb"),
    ] {
        c.order(name, INVALID, |hs, _, _, _| hs.push(h("x-note", value)));
    }
    c.order("header line without a colon", INVALID, |hs, _, _, _| {
        hs.push(h("x-note", b"").clone());
        let last = hs.last_mut().expect("pushed");
        // Sent as "x-note-without-colon: " minus the colon by the raw writer.
        last.0 = "x-note-without-colon\r\nbroken".to_owned();
    });
    c.order("space before the colon", INVALID, |hs, _, _, _| {
        hs.push(h("idempotency-key ", "k"))
    });
    c.order("folded header line", INVALID, |hs, _, _, _| {
        hs.push(h("x-note", b"a\r\n folded"))
    });
    c.order("150 headers", HEADERS_TOO_LARGE, |hs, _, _, _| {
        for i in 0..150 {
            hs.push(h(&format!("x-h{i}"), "v"));
        }
    });
    c.order("20 KB header", HEADERS_TOO_LARGE, |hs, _, _, _| {
        hs.push(h("x-big", "b".repeat(20 * 1024)))
    });
    for lines in [201, 1000] {
        c.order(
            &format!("{lines} headers"),
            HEADERS_TOO_LARGE,
            |hs, _, _, _| {
                for i in 0..lines {
                    hs.push(h(&format!("x-h{i}"), "v"));
                }
            },
        );
    }
    c.order("500 KB header", HEADERS_TOO_LARGE, |hs, _, _, _| {
        hs.push(h("x-big", "b".repeat(500 * 1024)))
    });
    let long = format!("/v1/orders?client_order_id={}", "x".repeat(100 * 1024));
    c.raw(
        "100 KB request line",
        Problem(414, "uri-too-long"),
        request("GET", &long, &[], b""),
    );
    c.raw(
        "garbage request line",
        INVALID,
        b"HELLO THERE\r\n\r\n".to_vec(),
    );
}

fn query_and_route_cases(c: &mut Catalogue) {
    let token = c.token.clone();
    let get = |path: &str, token: &str| {
        request(
            "GET",
            path,
            &[("authorization", format!("Bearer {token}").as_bytes())],
            b"",
        )
    };
    let admin = c.admin.clone();
    // A query value must percent-decode to UTF-8: 400, never a lookup of
    // whatever a lenient decoder made of it.
    for (name, path, who, expect) in [
        (
            "client_order_id twice in the query",
            "/v1/orders?client_order_id=x&client_order_id=y",
            &token,
            INVALID,
        ),
        ("no client_order_id", "/v1/orders", &token, INVALID),
        (
            "empty client_order_id",
            "/v1/orders?client_order_id=",
            &token,
            INVALID,
        ),
        (
            "query not UTF-8 once decoded",
            "/v1/orders?client_order_id=%FF%FE",
            &token,
            INVALID,
        ),
        (
            "query with an invalid escape",
            "/v1/orders?client_order_id=%ZZ",
            &token,
            INVALID,
        ),
        (
            "reservations query with an invalid escape",
            "/admin/v1/inventory/reservations?order_id=%ZZ",
            &admin,
            INVALID,
        ),
        (
            "reservations query not UTF-8 once decoded",
            "/admin/v1/inventory/reservations?order_id=%FF",
            &admin,
            INVALID,
        ),
        ("order id not UTF-8", "/v1/orders/%FF%FE", &token, INVALID),
        (
            "unknown order",
            "/v1/orders/ord_nope",
            &token,
            Problem(404, "not-found"),
        ),
        (
            "unknown route",
            "/v2/orders",
            &token,
            Problem(404, "not-found"),
        ),
        (
            "order_id twice in the reservations query",
            "/admin/v1/inventory/reservations?order_id=a&order_id=b",
            &admin,
            INVALID,
        ),
        (
            "reservations without order_id",
            "/admin/v1/inventory/reservations",
            &admin,
            INVALID,
        ),
    ] {
        c.raw(name, expect, get(path, who));
    }
    let through_b = get("/v1/orders?client_order_id=%ZZ", &token);
    let b = c.b.clone();
    c.cases.push(Case::new(
        "query with an invalid escape, through the forwarding node",
        b,
        through_b,
        INVALID,
    ));
    c.raw(
        "DELETE an order",
        Problem(405, "method-not-allowed"),
        request("DELETE", "/v1/orders/ord_x", &[], b""),
    );
}

fn claim_cases(c: &mut Catalogue) {
    let claim = |fields: &str| {
        format!(
            r#"{{"operation":"POST:/v1/payments","key":"pay-{}",{fields}}}"#,
            common::random_u64()
        )
    };
    let ok = r#""fingerprint":"sha256:abc","lease_ms":1000"#;
    for (name, body) in [
        ("lease_ms 99", claim(r#""fingerprint":"f","lease_ms":99"#)),
        (
            "lease_ms 3,600,001",
            claim(r#""fingerprint":"f","lease_ms":3600001"#),
        ),
        (
            "lease_ms a string",
            claim(r#""fingerprint":"f","lease_ms":"1000""#),
        ),
        (
            "lease_ms negative",
            claim(r#""fingerprint":"f","lease_ms":-5"#),
        ),
        (
            "lease_ms a fraction",
            claim(r#""fingerprint":"f","lease_ms":100.5"#),
        ),
        ("fingerprint absent", claim(r#""lease_ms":1000"#)),
        (
            "fingerprint empty",
            claim(r#""fingerprint":"","lease_ms":1000"#),
        ),
        ("unknown member", claim(&format!("{ok},\"extra\":1"))),
        (
            "key of 256 characters",
            format!(
                r#"{{"operation":"POST:/v1/payments","key":"{}",{ok}}}"#,
                "k".repeat(256)
            ),
        ),
        (
            "operation without a method",
            format!(r#"{{"operation":"/v1/payments","key":"k",{ok}}}"#),
        ),
        (
            "duplicate member",
            format!(r#"{{"operation":"POST:/v1/a","operation":"POST:/v1/b","key":"k",{ok}}}"#),
        ),
    ] {
        c.tenant_json(&format!("claim: {name}"), "/v1/claims", &body, INVALID);
    }
    let complete = |token: &str, outcome: &str, extra: &str| {
        format!(
            r#"{{"operation":"POST:/v1/payments","key":"k","owner_token":"{token}","outcome":"{outcome}"{extra}}}"#
        )
    };
    let resp = r#","response":{"status":200,"body":{}}"#;
    for (name, body) in [
        (
            "owner token in upper-case hex",
            complete("3.9F86D081884C7D65", "SUCCEEDED", resp),
        ),
        (
            "owner token with a plus sign",
            complete("+3.9f86d081884c7d65", "SUCCEEDED", resp),
        ),
        (
            "owner token without a dot",
            complete("39f86d081884c7d65", "SUCCEEDED", resp),
        ),
        (
            "unknown outcome",
            complete("3.9f86d081884c7d65", "DONE", resp),
        ),
        (
            "response status 600",
            complete(
                "3.9f86d081884c7d65",
                "SUCCEEDED",
                r#","response":{"status":600,"body":{}}"#,
            ),
        ),
        (
            "SUCCEEDED without a response",
            complete("3.9f86d081884c7d65", "SUCCEEDED", ""),
        ),
    ] {
        c.tenant_json(
            &format!("complete: {name}"),
            "/v1/claims/complete",
            &body,
            INVALID,
        );
    }
    c.tenant_json(
        "heartbeat: lease_ms 0",
        "/v1/claims/heartbeat",
        r#"{"operation":"POST:/v1/payments","key":"k","owner_token":"3.9f86d081884c7d65","lease_ms":0}"#,
        INVALID,
    );
    let raw = request(
        "POST",
        "/v1/claims",
        &[("content-type", b"application/json")],
        claim(ok).as_bytes(),
    );
    c.raw("claim without Authorization", UNAUTH, raw);
}

fn admin_cases(c: &mut Catalogue) {
    let body = r#"{"tenant_id":"fine-tenant","home_region":"a"}"#;
    let (token, admin) = (format!("Bearer {}", c.token), format!("Bearer {}", c.admin));
    for (name, auth) in [
        ("create tenant without a token", vec![]),
        ("create tenant with a tenant token", vec![token.as_str()]),
        ("admin token twice", vec![admin.as_str(), admin.as_str()]),
    ] {
        let mut headers: Vec<(&str, &[u8])> = auth
            .iter()
            .map(|a| ("authorization", a.as_bytes()))
            .collect();
        headers.push(("content-type", b"application/json"));
        let raw = request("POST", "/admin/v1/tenants", &headers, body.as_bytes());
        c.raw(name, UNAUTH, raw);
    }
    // The admin token is checked before the query is: a caller without it learns
    // nothing from validation (this one answered 400 when handlers checked it).
    let raw = request(
        "GET",
        "/admin/v1/inventory/reservations?order_id=a&order_id=b",
        &[],
        b"",
    );
    c.raw("bad reservations query without a token", UNAUTH, raw);
    for (name, body) in [
        (
            "tenant id with a slash",
            r#"{"tenant_id":"a/b","home_region":"a"}"#,
        ),
        (
            "unknown home region",
            r#"{"tenant_id":"t-unknown-region","home_region":"zz"}"#,
        ),
        (
            "requests_per_second zero",
            r#"{"tenant_id":"t-zero-rate","home_region":"a","requests_per_second":0}"#,
        ),
        (
            "unknown member",
            r#"{"tenant_id":"t-x","home_region":"a","x":1}"#,
        ),
        ("tenant_id a number", r#"{"tenant_id":5,"home_region":"a"}"#),
    ] {
        c.admin_json(
            &format!("create tenant: {name}"),
            "/admin/v1/tenants",
            body,
            INVALID,
        );
    }
    c.admin_json(
        "outbox replay: since not a time",
        "/admin/v1/outbox/replay",
        r#"{"since":"yesterday"}"#,
        INVALID,
    );
    c.admin_json(
        "outbox replay: unknown member",
        "/admin/v1/outbox/replay",
        r#"{"until":"2025-01-01T00:00:00Z"}"#,
        INVALID,
    );
    c.admin_json(
        "move to an unknown region",
        "/admin/v1/tenants/nobody/move",
        r#"{"to":"zz"}"#,
        Problem(404, "not-found"),
    );
}

fn slow_cases(c: &mut Catalogue) {
    // Headers and part of the body, then silence: the node's body read limit
    // answers 408 instead of holding the connection.
    let (key, coid) = c.names();
    let headers = c.std_headers(&key);
    let body = order_json(&coid, "");
    let raw = request("POST", "/v1/orders", &refs(&headers), &body);
    let head_len = raw.len() - body.len();
    c.cases.push(Case {
        name: "slow body: half sent, then silence".into(),
        addr: c.a.clone(),
        raw,
        expect: Problem(408, "request-timeout"),
        stall_after: Some(head_len + body.len() / 2),
        probe: Some((Some(key), coid)),
        tenant_probe: None,
        closes: false,
    });
    let (key, coid) = c.names();
    let mut headers = c.std_headers(&key);
    headers.push(h("transfer-encoding", "chunked"));
    let body = chunked(&order_json(&coid, ""));
    let raw = request("POST", "/v1/orders", &refs(&headers), &body);
    let full = raw.len();
    c.cases.push(Case {
        name: "slow body: chunked, never finished".into(),
        addr: c.a.clone(),
        raw,
        expect: Problem(408, "request-timeout"),
        // Everything except the last chunk.
        stall_after: Some(full - 5),
        probe: Some((Some(key), coid)),
        tenant_probe: None,
        closes: false,
    });
}

/// Sends one case and checks its answer and what happens to the connection.
fn run_case(case: &Case) -> Result<(), String> {
    let mut conn = RawConn::connect(&case.addr, ANSWER_WITHIN);
    let to_send = &case.raw[..case.stall_after.unwrap_or(case.raw.len())];
    // A node may answer and close before it read everything; that is fine as
    // long as the answer arrives.
    let _ = conn.send(to_send);
    let resp = conn
        .read_response(ANSWER_WITHIN)
        .map_err(|e| format!("no answer: {e:?}"))?;
    check_answer(case, &resp)?;
    if case.closes && !resp.says_close() {
        return Err("a refused head or framing did not say Connection: close".into());
    }
    if resp.says_close() {
        if !conn.closed_within(Duration::from_secs(5)) {
            return Err("said Connection: close but kept the connection open".into());
        }
        return Ok(());
    }
    // Keep-alive: the connection must serve the next request.
    let next = request("GET", "/healthz", &[], b"");
    if conn.send(&next).is_err() {
        return Err("closed a keep-alive connection without Connection: close".into());
    }
    match conn.read_response(Duration::from_secs(10)) {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => Err(format!(
            "the next request on the connection got {}",
            r.status
        )),
        Err(ReadError::Closed) => {
            Err("closed a keep-alive connection without Connection: close".into())
        }
        Err(e) => Err(format!("the next request on the connection: {e:?}")),
    }
}

fn check_answer(case: &Case, resp: &RawResp) -> Result<(), String> {
    let got = format!(
        "{} {:?} {}",
        resp.status,
        resp.header("content-type"),
        resp.text().chars().take(200).collect::<String>()
    );
    match case.expect {
        Problem(status, slug) => {
            if resp.status != status || resp.slug().as_deref() != Some(slug) {
                return Err(format!("expected {status} {slug}, got {got}"));
            }
            let j: serde_json::Value =
                serde_json::from_slice(&resp.body).map_err(|e| format!("problem body: {e}"))?;
            if j["status"].as_u64() != Some(status as u64) || !j["title"].is_string() {
                return Err(format!("problem document incomplete: {got}"));
            }
            if resp.header("keyhold-region").is_none() {
                return Err(format!("no Keyhold-Region: {got}"));
            }
            if status == 503 && resp.header("retry-after").is_none() {
                return Err(format!("503 without Retry-After: {got}"));
            }
        }
    }
    Ok(())
}

#[test]
fn the_bad_input_catalogue() {
    let cluster = Cluster::start("a,b", &[]);
    let addr = |r: &str| {
        cluster
            .region(r)
            .api_url
            .trim_start_matches("http://")
            .to_owned()
    };
    let mut c = Catalogue {
        run: format!("{:08x}", common::random_u64() & 0xffff_ffff),
        a: addr("a"),
        b: addr("b"),
        token: cluster.tenant("a").token,
        other_token: cluster.tenant("b").token,
        admin: cluster.info.admin_token.clone(),
        cases: Vec::new(),
    };
    auth_cases(&mut c);
    key_cases(&mut c);
    media_cases(&mut c);
    json_cases(&mut c);
    field_cases(&mut c);
    size_cases(&mut c);
    fingerprint_cases(&mut c);
    let refused_heads = c.cases.len();
    framing_cases(&mut c);
    header_abuse_cases(&mut c);
    for case in &mut c.cases[refused_heads..] {
        // Past the node's own header limits (150 lines, 20 KB) the head check
        // refuses, and closes.
        case.closes = !matches!(case.name.as_str(), "150 headers" | "20 KB header");
    }
    query_and_route_cases(&mut c);
    claim_cases(&mut c);
    admin_cases(&mut c);
    slow_cases(&mut c);
    assert!(c.cases.len() >= 80, "only {} cases", c.cases.len());

    // Cases run on a few threads: slow-body cases wait for the node's limit.
    let threads = 4;
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let cases = &c.cases;
                s.spawn(move || {
                    cases
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .filter_map(|case| {
                            run_case(case).err().map(|e| format!("{}: {e}", case.name))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("case thread"))
            .collect()
    });

    // Nothing was stored: no order for any case's client_order_id (under either
    // tenant), and every valid key is still fresh.
    let api = cluster.api("a");
    let api_b = cluster.api("b");
    let mut leaks = Vec::new();
    let mut probes: Vec<(Option<String>, String, &str)> = c
        .cases
        .iter()
        .filter_map(|case| {
            case.probe
                .clone()
                .map(|(k, co)| (k, co, case.name.as_str()))
        })
        .collect();
    probes.push((None, "fixed-fp-body".to_owned(), "fixed fingerprint body"));
    for (key, coid, name) in &probes {
        for (api, token) in [(&api, &c.token), (&api_b, &c.other_token)] {
            let found = api.find_order(token, coid);
            if found.status != 404 {
                leaks.push(format!(
                    "{name}: an order exists for {coid}: {}",
                    found.text()
                ));
            }
        }
        if let Some(key) = key {
            let r = api.create_order(&c.token, key, &order_body(coid, 10));
            if r.status != 201 {
                leaks.push(format!(
                    "{name}: key {key} is not fresh: {} {}",
                    r.status,
                    r.text()
                ));
            }
        }
    }
    for case in &c.cases {
        if let Some(tenant) = &case.tenant_probe {
            let found = api.get(&format!("/admin/v1/tenants/{tenant}"), Some(&c.admin));
            if found.status != 404 {
                leaks.push(format!(
                    "{}: tenant {tenant} exists: {} {}",
                    case.name,
                    found.status,
                    found.text()
                ));
            }
        }
    }
    assert!(
        failures.is_empty() && leaks.is_empty(),
        "{} of {} cases failed:\n{}\nstored by bad requests:\n{}",
        failures.len(),
        c.cases.len(),
        failures.join("\n"),
        leaks.join("\n")
    );
}

/// The node's connection limits, on one `keyhold serve` node with small ones:
/// a connection that sends half a head, or stays idle after an answer, is
/// closed after `header_read_timeout`; past `connections_max` a new connection
/// is accepted and closed at once (the loop never stops accepting), and once
/// a slot is free again new connections are served.
#[test]
fn slow_and_idle_connections_are_bounded() {
    let node = common::ServeNode::start("a", "connections_max = 4\nheader_read_timeout = \"2s\"\n");
    let addr = node.api.base.trim_start_matches("http://").to_owned();
    let long = Duration::from_secs(15);
    // Half a request head, then silence: closed.
    let mut half = RawConn::connect(&addr, long);
    half.send(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .expect("send");
    assert!(
        half.closed_within(Duration::from_secs(5)),
        "a half-sent head keeps its connection open"
    );
    // Idle after an answer: closed.
    let mut idle = RawConn::connect(&addr, long);
    idle.send(&request("GET", "/healthz", &[], b""))
        .expect("send");
    let first = idle.read_response(long).expect("answer");
    assert_eq!(first.status, 200);
    assert!(!first.says_close());
    assert!(
        idle.closed_within(Duration::from_secs(5)),
        "an idle keep-alive connection stays open"
    );
    // Four silent connections hold every slot; a fifth is closed at once, not
    // left waiting in the backlog.
    let holders: Vec<RawConn> = (0..4).map(|_| RawConn::connect(&addr, long)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = RawConn::connect(&addr, long);
    assert!(
        fifth.closed_within(Duration::from_secs(1)),
        "a fifth connection was kept while four held every slot"
    );
    // The header timeout closes the silent ones; then a new one is served.
    for mut holder in holders {
        assert!(holder.closed_within(Duration::from_secs(5)));
    }
    let mut sixth = RawConn::connect(&addr, long);
    sixth
        .send(&request("GET", "/healthz", &[], b""))
        .expect("send");
    assert_eq!(sixth.read_response(long).expect("served").status, 200);
}

/// Rules docs/api.md states, each checked: the first fencing token of a scope
/// is the acquisition time in milliseconds; an owner token in another form is
/// 400 while the issued one still completes; outbox replay and reservations
/// answered by any node cover every region; a 401 for a missing or malformed
/// token does not wait for the registry.
#[test]
fn documented_rules_hold() {
    let cluster = Cluster::start("a,b", &[]);
    let a = cluster.api("a");
    let b = cluster.api("b");
    let token = cluster.tenant("a").token;
    let admin = cluster.info.admin_token.clone();

    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let key = common::unique("pay");
    let claim = serde_json::json!({
        "operation": "POST:/v1/payments", "key": key,
        "fingerprint": "sha256:abc", "lease_ms": 60_000,
    });
    let r = a.post_json("/v1/claims", Some(&token), &claim.to_string());
    let j = r.assert_status(201).json();
    let fencing = j["fencing_token"].as_u64().expect("fencing_token");
    let owner = j["owner_token"].as_str().expect("owner_token").to_owned();
    assert!(
        fencing >= before_ms && fencing < before_ms + 600_000,
        "the first fencing token is the acquisition time in ms: {fencing} vs {before_ms}"
    );
    assert_eq!(owner.split('.').next(), Some(fencing.to_string().as_str()));
    let complete = |owner_token: &str| {
        serde_json::json!({
            "operation": "POST:/v1/payments", "key": key, "owner_token": owner_token,
            "outcome": "SUCCEEDED", "response": {"status": 201, "body": {"ok": true}},
        })
        .to_string()
    };
    a.post_json(
        "/v1/claims/complete",
        Some(&token),
        &complete(&owner.to_uppercase()),
    )
    .assert_problem(400, "invalid-request");
    a.post_json("/v1/claims/complete", Some(&token), &complete(&owner))
        .assert_status(200);

    // An order with items in region a; its reservations and its outbox event
    // are visible through region b.
    let coid = common::unique("co");
    let body = serde_json::json!({
        "client_order_id": coid, "cart_id": "c", "amount": 10, "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 2}],
    });
    let created = a.create_order(&token, &common::unique("k"), &body.to_string());
    let order_id = created.assert_status(201).json()["order_id"]
        .as_str()
        .expect("order_id")
        .to_owned();
    let path = format!("/admin/v1/inventory/reservations?order_id={order_id}");
    let reserved = common::poll(Duration::from_secs(20), "reservations", || {
        let r = b.get(&path, Some(&admin));
        let data = r.assert_status(200).json()["data"].clone();
        data.as_array().filter(|d| !d.is_empty()).cloned()
    });
    assert_eq!(reserved.len(), 1, "{reserved:?}");
    let replayed = b.post_json("/admin/v1/outbox/replay", Some(&admin), "{}");
    let n = replayed.assert_status(202).json()["replayed"]
        .as_u64()
        .expect("replayed");
    assert!(n >= 1, "replay through b covers region a's outbox: {n}");

    // 401 without a registry wait for a missing or malformed token.
    for auth in [
        None,
        Some("Bearer"),
        Some("Basic abc"),
        Some("Bearer not-a-kh-token"),
    ] {
        let mut rb = a.get_rb("/v1/orders/ord_x");
        if let Some(v) = auth {
            rb = rb.header("authorization", v);
        }
        let started = std::time::Instant::now();
        a.send(rb).assert_problem(401, "unauthenticated");
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "401 for {auth:?} took {:?}: it waited for the registry",
            started.elapsed()
        );
    }
}

/// `/readyz` is 503 on a node whose registry replica knows no leader.
#[test]
fn readyz_is_503_without_a_registry_leader() {
    let mut sc = common::ServeCluster::start(&["a", "b", "c"], "");
    let survivor = sc.index("a");
    assert_eq!(sc.api(survivor).get("/readyz", None).status, 200);
    sc.kill9(sc.index("b"));
    sc.kill9(sc.index("c"));
    common::poll(Duration::from_secs(20), "readyz 503", || {
        let r = sc.api(survivor).get("/readyz", None);
        (r.status == 503).then(|| r.assert_problem(503, "store-unavailable"))
    });
}
