//! The differential check of `oracle::agree` (the scan against httparse and
//! hyper's checks) on generated heads, so that every `cargo test` runs what
//! the fuzz target `http_head` runs for hours: heads built from the pieces
//! that matter (framing headers, line endings, bad bytes, odd request lines)
//! and arbitrary bytes from a small alphabet.

use keyhold_httphead::oracle::agree;
use keyhold_httphead::Limits;
use proptest::prelude::*;

/// Small enough that generated heads reach both limits.
const LIMITS: Limits = Limits {
    head_bytes_max: 512,
    header_lines_max: 6,
};

fn eol() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["\r\n", "\r\n", "\n", "\r", "\r\r\n", "\n\r"])
}

fn request_line() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["GET", "POST", "post", "P@ST", "", "M-SEARCH"]),
        prop::sample::select(vec![" ", " ", "  ", "\t"]),
        prop::sample::select(vec![
            "/",
            "/v1/orders?client_order_id=%ZZ",
            "*",
            "http://a/b",
            "a:80",
            "/\u{e9}",
            "/a{b}",
            "/a\"b",
            "/a b",
            "",
        ]),
        prop::sample::select(vec![
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/1.2",
            "http/1.1",
            "HTTP/1.1 ",
        ]),
    )
        .prop_map(|(m, sp, t, v)| format!("{m}{sp}{t} {v}"))
}

fn header_line() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![
            "Content-Length",
            "content-length",
            "Transfer-Encoding",
            "TRANSFER-encoding",
            "Host",
            "x-a",
            "x a",
            "",
            " Transfer-Encoding",
            "Transfer-Encoding ",
        ]),
        prop::sample::select(vec![
            &b"5"[..],
            b"0",
            b" 5 ",
            b"5, 5",
            b"+5",
            b"18446744073709551614",
            b"18446744073709551615",
            b"chunked",
            b"Chunked",
            b"gzip",
            b"gzip, chunked",
            b"chunked, chunked",
            b"a\x00b",
            b"a\x7fb",
            b"a\rb",
            b"\xc3\xa9",
            b"\t",
            b"",
        ]),
        prop::sample::select(vec![":", ":", ": ", " :", ""]),
    )
        .prop_map(|(n, v, colon)| [n.as_bytes(), colon.as_bytes(), v].concat())
}

fn head() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(eol(), 0..2),
        request_line(),
        eol(),
        prop::collection::vec((header_line(), eol()), 0..9),
        eol(),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(leading, line, end, headers, blank, tail)| {
            let mut out = leading.concat().into_bytes();
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(end.as_bytes());
            for (h, e) in headers {
                out.extend_from_slice(&h);
                out.extend_from_slice(e.as_bytes());
            }
            out.extend_from_slice(blank.as_bytes());
            out.extend_from_slice(&tail);
            out
        })
}

/// Bytes from the characters that decide how heads parse.
fn noise() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(b"GET / HTTP/1.01\r\n:\t ,;cCtT-%\x00\x7f\x80\xffe".to_vec()),
        0..96,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    #[test]
    fn generated_heads_agree_with_hyper(head in head()) {
        if let Err(e) = agree(&head, LIMITS) {
            prop_assert!(false, "{e}: {:?}", String::from_utf8_lossy(&head));
        }
    }

    #[test]
    fn arbitrary_bytes_agree_with_hyper(bytes in noise()) {
        if let Err(e) = agree(&bytes, LIMITS) {
            prop_assert!(false, "{e}: {:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
