//! Finding and checking one request head: its lines (LF-terminated, CR
//! optional), the request line and each header line by httparse's character
//! classes plus hyper's own checks, the limits, and the framing of the body.

use crate::Refusal;

/// What a head may hold; the server passes its `HEAD_BYTES_MAX` and
/// `HEAD_LINES_MAX`, the values hyper is configured with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of the whole head, empty lines before the request line and the
    /// final empty line included.
    pub head_bytes_max: usize,
    /// Header lines (the request line not counted).
    pub header_lines_max: usize,
}

/// How the body of a passed head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Neither `Content-Length` nor `Transfer-Encoding`: no body.
    Empty,
    /// Exactly one `Content-Length`.
    Length(u64),
    /// Exactly one `Transfer-Encoding: chunked`.
    Chunked,
}

/// A passed head: its length in the buffer (from the first byte held to just
/// after the empty line that ends it) and its body's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub framing: Framing,
}

/// The state of a scan after a call of [`HeadScan::scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Every line so far is fine; the head has not ended yet.
    Partial,
    Complete(Head),
    Refused(Refusal),
}

/// hyper refuses a `Content-Length` above this (`DecodedLength::MAX_LEN`).
const CONTENT_LENGTH_MAX: u64 = u64::MAX - 2;

const VERSION_1_0: &[u8] = b"HTTP/1.0";
const VERSION_1_1: &[u8] = b"HTTP/1.1";

/// An incremental scan of one head. The caller keeps the head's bytes in one
/// buffer and calls [`HeadScan::scan`] with all of them each time more arrive;
/// every byte is looked at once.
#[derive(Debug, Default)]
pub struct HeadScan {
    /// Bytes of the buffer already looked at.
    seen: usize,
    /// Where the line being read began.
    line_start: usize,
    /// The request line was read; header lines follow.
    in_headers: bool,
    http_1_0: bool,
    /// Why hyper would refuse the request line's method or target. hyper
    /// checks them only once the whole head parsed, after the header lines
    /// (whose own errors, 431 among them, come first), so the refusal waits.
    target_refused: Option<Refusal>,
    header_lines: usize,
    content_lengths: usize,
    /// The value of the first `Content-Length`, when it is a number hyper takes.
    content_length: Option<u64>,
    transfer_encodings: usize,
    /// The first `Transfer-Encoding` is exactly `chunked` (any letter case).
    chunked: bool,
}

impl HeadScan {
    pub fn new() -> HeadScan {
        HeadScan::default()
    }

    /// Looks at the bytes of `buf` not seen before. `buf` must begin where the
    /// head begins and extend what earlier calls got.
    pub fn scan(&mut self, buf: &[u8], limits: Limits) -> Scan {
        debug_assert!(self.seen <= buf.len(), "the buffer shrank during a scan");
        loop {
            let Some(offset) = buf[self.seen..].iter().position(|&b| b == b'\n') else {
                self.seen = buf.len();
                if buf.len() > limits.head_bytes_max {
                    return Scan::Refused(self.too_long());
                }
                return Scan::Partial;
            };
            let end = self.seen + offset + 1;
            if end > limits.head_bytes_max {
                return Scan::Refused(self.too_long());
            }
            let line = &buf[self.line_start..end - 1];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            self.seen = end;
            self.line_start = end;
            if !self.in_headers {
                // httparse skips empty lines before the request line.
                if line.is_empty() {
                    continue;
                }
                match request_line(line) {
                    Ok((http_1_0, target_refused)) => {
                        self.http_1_0 = http_1_0;
                        self.target_refused = target_refused;
                        self.in_headers = true;
                    }
                    Err(refusal) => return Scan::Refused(refusal),
                }
                continue;
            }
            if line.is_empty() {
                return match self.framing() {
                    Ok(framing) => Scan::Complete(Head { len: end, framing }),
                    Err(refusal) => Scan::Refused(refusal),
                };
            }
            if let Err(refusal) = self.header_line(line, limits) {
                return Scan::Refused(refusal);
            }
        }
    }

    /// The whole of `buf` as one head, from a fresh scan (tests and fuzzing).
    pub fn check(buf: &[u8], limits: Limits) -> Scan {
        HeadScan::new().scan(buf, limits)
    }

    fn too_long(&self) -> Refusal {
        if self.in_headers {
            Refusal::HeadersTooLarge("the request head is larger than the node accepts")
        } else {
            Refusal::UriTooLong
        }
    }

    fn header_line(&mut self, line: &[u8], limits: Limits) -> Result<(), Refusal> {
        let (name, value) = header_line(line)?;
        self.header_lines += 1;
        if self.header_lines > limits.header_lines_max {
            return Err(Refusal::HeadersTooLarge(
                "the request has more header lines than the node accepts",
            ));
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            self.content_lengths += 1;
            if self.content_lengths == 1 {
                self.content_length = decimal(value);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.transfer_encodings += 1;
            if self.transfer_encodings == 1 {
                self.chunked = value.eq_ignore_ascii_case(b"chunked");
            }
        }
        Ok(())
    }

    /// The body's framing, refusing every declaration that could be read two
    /// ways (RFC 9112 6.3: a server may, and a proxy in front of it might read
    /// the other one) and everything hyper refuses.
    fn framing(&self) -> Result<Framing, Refusal> {
        if let Some(refusal) = self.target_refused {
            return Err(refusal);
        }
        if self.content_lengths > 0 && self.transfer_encodings > 0 {
            return Err(Refusal::Invalid(
                "Content-Length and Transfer-Encoding must not both be sent",
            ));
        }
        if self.transfer_encodings > 1 {
            return Err(Refusal::Invalid(
                "Transfer-Encoding must not be sent more than once",
            ));
        }
        if self.content_lengths > 1 {
            return Err(Refusal::Invalid(
                "Content-Length must not be sent more than once",
            ));
        }
        if self.transfer_encodings == 1 {
            if !self.chunked {
                return Err(Refusal::Invalid(
                    "Transfer-Encoding must be exactly chunked",
                ));
            }
            if self.http_1_0 {
                return Err(Refusal::Invalid(
                    "an HTTP/1.0 request cannot use Transfer-Encoding",
                ));
            }
            return Ok(Framing::Chunked);
        }
        if self.content_lengths == 1 {
            return match self.content_length {
                Some(n) => Ok(Framing::Length(n)),
                None => Err(Refusal::Invalid(
                    "Content-Length must be one decimal number",
                )),
            };
        }
        Ok(Framing::Empty)
    }
}

/// `method SP request-target SP HTTP/1.x` (the line ending removed), by
/// httparse's rules; returns whether the version is HTTP/1.0, and hyper's
/// refusal when the method or the request target does not convert to
/// `http::Method` and `http::Uri`.
fn request_line(line: &[u8]) -> Result<(bool, Option<Refusal>), Refusal> {
    const BAD: Refusal = Refusal::Invalid("the request line does not parse");
    let method_len = line
        .iter()
        .position(|&b| !is_token(b))
        .unwrap_or(line.len());
    if method_len == 0 || line.get(method_len) != Some(&b' ') {
        return Err(BAD);
    }
    let rest = &line[method_len + 1..];
    let target_len = rest.iter().position(|&b| !is_uri(b)).unwrap_or(rest.len());
    if target_len == 0 || rest.get(target_len) != Some(&b' ') {
        return Err(BAD);
    }
    let version = &rest[target_len + 1..];
    let http_1_0 = match version {
        VERSION_1_0 => true,
        VERSION_1_1 => false,
        _ => return Err(BAD),
    };
    let Ok(target) = std::str::from_utf8(&rest[..target_len]) else {
        return Err(BAD);
    };
    let refused = if http::Method::from_bytes(&line[..method_len]).is_err() {
        Some(BAD)
    } else if http::Uri::try_from(target).is_err() {
        Some(Refusal::Invalid("the request target does not parse"))
    } else {
        None
    };
    Ok((http_1_0, refused))
}

/// `name ":" OWS value OWS` (the line ending removed), by httparse's rules
/// (no space before the colon, no folded lines, no control characters but
/// tab in the value); returns the name and the trimmed value.
fn header_line(line: &[u8]) -> Result<(&[u8], &[u8]), Refusal> {
    let name_len = line
        .iter()
        .position(|&b| !is_token(b))
        .unwrap_or(line.len());
    if name_len == 0 || line.get(name_len) != Some(&b':') {
        return Err(Refusal::Invalid("a header line does not parse"));
    }
    let value = &line[name_len + 1..];
    if !value.iter().all(|&b| is_value(b)) {
        return Err(Refusal::Invalid("a header value holds a control character"));
    }
    let start = value
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    Ok((&line[..name_len], &value[start..end]))
}

/// hyper's `Content-Length` number: ASCII digits only (no sign, no list, no
/// inner spaces), no overflow.
fn decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (n <= CONTENT_LENGTH_MAX).then_some(n)
}

/// RFC 9110 `tchar`: httparse's method and header name characters.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// httparse's request-target bytes: visible ASCII and any byte from 0x80
/// (the whole target must then be UTF-8).
fn is_uri(b: u8) -> bool {
    (b'!'..=0x7e).contains(&b) || b >= 0x80
}

/// httparse's header value bytes: tab, space, visible ASCII, obs-text.
fn is_value(b: u8) -> bool {
    b == b'\t' || (b' '..=0x7e).contains(&b) || b >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        head_bytes_max: 1024,
        header_lines_max: 8,
    };

    /// The scan's answer, which must also agree with hyper's (`oracle`).
    fn check(head: &[u8]) -> Scan {
        assert_eq!(crate::oracle::agree(head, LIMITS), Ok(()));
        HeadScan::check(head, LIMITS)
    }

    fn refused(head: &[u8]) -> u16 {
        match check(head) {
            Scan::Refused(r) => r.status(),
            other => panic!(
                "{:?} was not refused: {other:?}",
                String::from_utf8_lossy(head)
            ),
        }
    }

    #[test]
    fn crlf_lf_and_mixed_heads_end_where_httparse_ends_them() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest"[..],
            b"GET / HTTP/1.1\nHost: x\n\nrest",
            b"GET / HTTP/1.1\r\nHost: x\n\r\nrest",
            b"\r\n\nGET / HTTP/1.1\nHost: x\r\n\nrest",
        ] {
            let len = head.len() - 4;
            assert_eq!(
                check(head),
                Scan::Complete(Head {
                    len,
                    framing: Framing::Empty
                }),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn both_lengths_are_refused_whatever_the_line_endings() {
        let lines = ["Content-Length: 5", "Transfer-Encoding: chunked"];
        for first in [0, 1] {
            for (a, b, c) in [
                ("\r\n", "\r\n", "\r\n"),
                ("\n", "\n", "\n"),
                ("\r\n", "\n", "\r\n"),
                ("\n", "\r\n", "\n"),
            ] {
                let head = format!(
                    "POST / HTTP/1.1{a}{}{b}{}{c}{c}",
                    lines[first],
                    lines[1 - first]
                );
                assert_eq!(refused(head.as_bytes()), 400, "{head:?}");
            }
        }
    }

    #[test]
    fn every_ambiguous_or_unsupported_framing_is_refused() {
        for headers in [
            "Content-Length: 5\r\nContent-Length: 5",
            "Content-Length: 5\r\nContent-Length: 6",
            "Content-Length: 5, 5",
            "Content-Length: +5",
            "Content-Length: 5 5",
            "Content-Length:",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: gzip",
            "Transfer-Encoding: gzip, chunked",
            "Transfer-Encoding: chunked, chunked",
            "transfer-encoding: chunked\r\ncontent-length: 0",
        ] {
            let head = format!("POST / HTTP/1.1\r\n{headers}\r\n\r\n");
            assert_eq!(refused(head.as_bytes()), 400, "{head:?}");
        }
        assert_eq!(
            refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
    }

    #[test]
    fn one_declaration_gives_the_framing() {
        let framing = |head: &[u8]| match check(head) {
            Scan::Complete(h) => h.framing,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nContent-Length:  12 \r\n\r\n"),
            Framing::Length(12)
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: Chunked\r\n\r\n"),
            Framing::Chunked
        );
    }

    #[test]
    fn bad_bytes_are_refused_as_hyper_refuses_them() {
        for head in [
            &b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX : a\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET / HTTP/1.1\r\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.2\r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(refused(head), 400, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn limits_give_hypers_statuses() {
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=LIMITS.header_lines_max {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(refused(&many), 431);
        let long_value = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "v".repeat(2000));
        assert_eq!(refused(long_value.as_bytes()), 431);
        // Refused as soon as the limit is passed, before the head ends.
        let long_line = format!("GET /{}", "u".repeat(2000));
        assert_eq!(refused(long_line.as_bytes()), 414);
        let at_limit = format!("GET /{} HTTP/1.1\r\n\r\n", "u".repeat(1024 - 18));
        assert_eq!(at_limit.len(), 1024);
        assert!(matches!(check(at_limit.as_bytes()), Scan::Complete(_)));
    }

    /// hyper checks the method and target only after the header lines, so
    /// too many lines after a bad target is 431, not 400 (fuzz finding 1 of
    /// `http_head`, docs/reliability.md).
    #[test]
    fn a_bad_target_is_refused_after_the_header_lines() {
        let mut head = b"PUT S/ HTTP/1.1\r\n".to_vec();
        assert_eq!(refused(&[&head[..], b"\r\n"].concat()), 400);
        for i in 0..=LIMITS.header_lines_max {
            head.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert_eq!(refused(&head), 431);
    }

    #[test]
    fn a_head_split_anywhere_gives_the_same_answer() {
        let head = b"\r\nPOST /v1/orders?x=1 HTTP/1.1\nHost: x\r\nContent-Length: 2\n\r\n{}";
        let whole = check(head);
        assert!(matches!(whole, Scan::Complete(_)));
        for cut in 0..head.len() {
            let mut scan = HeadScan::new();
            let first = scan.scan(&head[..cut], LIMITS);
            let answer = if first == Scan::Partial {
                scan.scan(head, LIMITS)
            } else {
                first
            };
            assert_eq!(answer, whole, "cut at {cut}");
        }
    }
}
