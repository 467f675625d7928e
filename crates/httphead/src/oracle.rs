//! The differential check of [`HeadScan`] against what hyper does with the same
//! bytes: httparse (configured as hyper configures it) and then hyper's own
//! checks of the parsed head. Shared by the proptest of this crate and the fuzz
//! target `http_head`, so both hold the check to one definition. Not used by
//! the node.

use crate::{Framing, HeadScan, Limits, Refusal, Scan};

/// What hyper makes of a buffer that begins with a request head.
#[derive(Debug)]
enum Hyper {
    /// httparse needs more bytes.
    Partial,
    /// httparse or hyper refuses the head with this status.
    Refuses(u16),
    /// hyper reads a head of `len` bytes with these framing headers.
    Accepts {
        len: usize,
        content_lengths: Vec<Vec<u8>>,
        transfer_encodings: Vec<Vec<u8>>,
    },
}

fn hyper(buf: &[u8], limits: Limits) -> Hyper {
    let mut headers = vec![httparse::EMPTY_HEADER; limits.header_lines_max];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Partial) => return Hyper::Partial,
        Err(httparse::Error::TooManyHeaders) => return Hyper::Refuses(431),
        Err(_) => return Hyper::Refuses(400),
        Ok(httparse::Status::Complete(len)) => len,
    };
    let method = request.method.expect("complete");
    let target = request.path.expect("complete");
    if http::Method::from_bytes(method.as_bytes()).is_err() || http::Uri::try_from(target).is_err()
    {
        return Hyper::Refuses(400);
    }
    let mut content_lengths = Vec::new();
    let mut transfer_encodings = Vec::new();
    for header in request.headers.iter() {
        assert!(
            http::HeaderName::from_bytes(header.name.as_bytes()).is_ok(),
            "httparse passed a header name hyper cannot take: {:?}",
            header.name
        );
        if header.name.eq_ignore_ascii_case("content-length") {
            content_lengths.push(header.value.to_vec());
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encodings.push(header.value.to_vec());
        }
    }
    Hyper::Accepts {
        len,
        content_lengths,
        transfer_encodings,
    }
}

/// hyper's reading of the framing headers (`proto::h1::role::Server::parse`):
/// a `Transfer-Encoding` whose last coding is `chunked` wins over any
/// `Content-Length`; several `Content-Length`s must be equal numbers.
fn hyper_framing(
    content_lengths: &[Vec<u8>],
    transfer_encodings: &[Vec<u8>],
    http_1_0: bool,
) -> Option<Framing> {
    if let Some(last) = transfer_encodings.last() {
        let chunked = last
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        return (chunked && !http_1_0).then_some(Framing::Chunked);
    }
    let mut length = None;
    for value in content_lengths {
        let n = std::str::from_utf8(value)
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n <= u64::MAX - 2)?;
        if length.is_some_and(|l| l != n) {
            return None;
        }
        length = Some(n);
    }
    Some(length.map_or(Framing::Empty, Framing::Length))
}

/// A framing this crate refuses although hyper would read it one way.
fn refused_on_purpose(content_lengths: &[Vec<u8>], transfer_encodings: &[Vec<u8>]) -> bool {
    content_lengths.len() > 1
        || transfer_encodings.len() > 1
        || (!content_lengths.is_empty() && !transfer_encodings.is_empty())
        || transfer_encodings
            .first()
            .is_some_and(|te| !te.eq_ignore_ascii_case(b"chunked"))
}

/// Checks [`HeadScan`] against hyper on `buf`: where hyper reads a head
/// completely, the scan passes it with the same length and framing or refuses
/// it on purpose; where the scan passes a head, hyper reads it completely; the
/// scan never waits for more where hyper has a whole head; and where both
/// refuse, they give the same status. Heads over the byte limit are left
/// out: hyper's own limit depends on how its reads were split.
pub fn agree(buf: &[u8], limits: Limits) -> Result<(), String> {
    let mine = HeadScan::check(buf, limits);
    if let Scan::Refused(Refusal::UriTooLong | Refusal::HeadersTooLarge(_)) = mine {
        if buf.len() > limits.head_bytes_max {
            return Ok(());
        }
    }
    let theirs = hyper(buf, limits);
    let http_1_0 = buf
        .split(|&b| b == b'\n')
        .find(|line| !line.is_empty() && *line != b"\r")
        .is_some_and(|line| line.trim_ascii_end().ends_with(b"HTTP/1.0"));
    match (&mine, &theirs) {
        (
            Scan::Complete(head),
            Hyper::Accepts {
                len,
                content_lengths,
                transfer_encodings,
            },
        ) => {
            if head.len != *len {
                return Err(format!(
                    "head ends at {} here, at {len} for httparse",
                    head.len
                ));
            }
            let framing = hyper_framing(content_lengths, transfer_encodings, http_1_0);
            if framing != Some(head.framing) {
                return Err(format!(
                    "framing {:?} here, {framing:?} for hyper",
                    head.framing
                ));
            }
            Ok(())
        }
        (Scan::Complete(_), other) => Err(format!("passed a head hyper does not: {other:?}")),
        (
            Scan::Refused(refusal),
            Hyper::Accepts {
                content_lengths,
                transfer_encodings,
                ..
            },
        ) => {
            let hyper_reads_it =
                hyper_framing(content_lengths, transfer_encodings, http_1_0).is_some();
            if hyper_reads_it && !refused_on_purpose(content_lengths, transfer_encodings) {
                return Err(format!("refused a head hyper reads: {refusal:?}"));
            }
            if !hyper_reads_it && refusal.status() != 400 {
                return Err(format!(
                    "hyper refuses the framing with 400, here {refusal:?}"
                ));
            }
            Ok(())
        }
        (Scan::Refused(refusal), Hyper::Refuses(status)) if refusal.status() != *status => {
            Err(format!("refused with {refusal:?}, hyper with {status}"))
        }
        (Scan::Partial, Hyper::Accepts { len, .. }) => Err(format!(
            "waits for more where httparse has a head of {len} bytes"
        )),
        // The scan refuses only once a line is whole; httparse may stop earlier
        // or later on the same line, and hyper's checks of the request target
        // come only once the whole head is there.
        (Scan::Refused(_) | Scan::Partial, Hyper::Partial | Hyper::Refuses(_)) => Ok(()),
    }
}
