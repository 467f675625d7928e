//! Following a request body to its end, so that the next head on a connection
//! is found where hyper will look for it: a `Content-Length` body by counting,
//! a chunked body by the same state machine as hyper's decoder
//! (`hyper::proto::h1::decode`: CRLF after every size line and chunk, optional
//! extensions, optional trailers). Where hyper's decoder fails, hyper fails the
//! request and closes the connection, so the follower only has to agree with
//! it on bodies hyper accepts; it reports where the framing broke.

use crate::Framing;

/// What one [`BodyFollower::advance`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every byte given belongs to the body, and the body goes on.
    More,
    /// The body ends after this many of the bytes given; the rest is the next
    /// head.
    Ended(usize),
    /// The chunked framing breaks at the byte before this offset: hyper's
    /// decoder fails there too.
    Broken(usize),
}

/// Where in a body the bytes seen so far end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyFollower(State);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes left of a `Content-Length` body (never 0).
    Length(u64),
    /// The first hex digit of a chunk size.
    Start,
    /// More hex digits of the size so far.
    Size(u64),
    /// Blanks after the size.
    SizeLws(u64),
    /// A chunk extension, up to CR.
    Extension(u64),
    /// The LF of a size line.
    SizeLf(u64),
    /// Bytes left of a chunk's data (never 0).
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk's size line: CR (the end) or a trailer line.
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

impl BodyFollower {
    /// The follower of a body with this framing; `None` when there is no body.
    pub fn new(framing: Framing) -> Option<BodyFollower> {
        match framing {
            Framing::Empty | Framing::Length(0) => None,
            Framing::Length(n) => Some(BodyFollower(State::Length(n))),
            Framing::Chunked => Some(BodyFollower(State::Start)),
        }
    }

    /// Takes the next bytes of the connection, which all follow the bytes
    /// given before.
    pub fn advance(&mut self, bytes: &[u8]) -> Step {
        let mut i = 0;
        while i < bytes.len() {
            match self.0 {
                State::Length(left) => {
                    let available = (bytes.len() - i) as u64;
                    if available < left {
                        self.0 = State::Length(left - available);
                        return Step::More;
                    }
                    return Step::Ended(i + left as usize);
                }
                State::Data(left) => {
                    let available = (bytes.len() - i) as u64;
                    if available < left {
                        self.0 = State::Data(left - available);
                        return Step::More;
                    }
                    i += left as usize;
                    self.0 = State::DataCr;
                    continue;
                }
                _ => {}
            }
            let b = bytes[i];
            i += 1;
            let next = match (self.0, b) {
                (State::Start, _) => hex(b).map(|d| State::Size(u64::from(d))),
                (State::Size(size), _) => match (hex(b), b) {
                    (Some(d), _) => size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(u64::from(d)))
                        .map(State::Size),
                    (None, b'\t' | b' ') => Some(State::SizeLws(size)),
                    (None, b';') => Some(State::Extension(size)),
                    (None, b'\r') => Some(State::SizeLf(size)),
                    (None, _) => None,
                },
                (State::SizeLws(size), b'\t' | b' ') => Some(State::SizeLws(size)),
                (State::SizeLws(size), b';') => Some(State::Extension(size)),
                (State::SizeLws(size), b'\r') => Some(State::SizeLf(size)),
                (State::Extension(size), b'\r') => Some(State::SizeLf(size)),
                (State::Extension(_), b'\n') => None,
                (State::Extension(size), _) => Some(State::Extension(size)),
                (State::SizeLf(0), b'\n') => Some(State::EndCr),
                (State::SizeLf(size), b'\n') => Some(State::Data(size)),
                (State::DataCr, b'\r') => Some(State::DataLf),
                (State::DataLf, b'\n') => Some(State::Start),
                (State::EndCr, b'\r') => Some(State::EndLf),
                (State::EndCr, _) => Some(State::Trailer),
                (State::Trailer, b'\r') => Some(State::TrailerLf),
                (State::Trailer, _) => Some(State::Trailer),
                (State::TrailerLf, b'\n') => Some(State::EndCr),
                (State::EndLf, b'\n') => return Step::Ended(i),
                _ => None,
            };
            match next {
                Some(state) => self.0 = state,
                None => return Step::Broken(i),
            }
        }
        Step::More
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(framing: Framing, bytes: &[u8]) -> Step {
        BodyFollower::new(framing).expect("a body").advance(bytes)
    }

    #[test]
    fn a_length_body_ends_after_its_length_in_any_split() {
        let wire = b"hello world|GET / HTTP/1.1\r\n\r\n";
        assert_eq!(follow(Framing::Length(11), wire), Step::Ended(11));
        for cut in 0..=11 {
            let mut f = BodyFollower::new(Framing::Length(11)).expect("body");
            let first = f.advance(&wire[..cut]);
            if cut < 11 {
                assert_eq!(first, Step::More);
                assert_eq!(f.advance(&wire[cut..]), Step::Ended(11 - cut));
            }
        }
        assert_eq!(BodyFollower::new(Framing::Length(0)), None);
        assert_eq!(BodyFollower::new(Framing::Empty), None);
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_and_trailers_in_any_split() {
        for (body, rest) in [
            (
                &b"5\r\nhello\r\n0\r\n\r\n"[..],
                &b"GET / HTTP/1.1\r\n\r\n"[..],
            ),
            (b"A;ext=1\r\n0123456789\r\n0\r\n\r\n", b"x"),
            (b"3 \t;x\r\nabc\r\n00\r\nX-T: 1\r\nY: \n\r\n\r\n", b""),
            (b"0\r\n\r\n", b"\r\n"),
        ] {
            let wire = [body, rest].concat();
            assert_eq!(follow(Framing::Chunked, &wire), Step::Ended(body.len()));
            for cut in 1..body.len() {
                let mut f = BodyFollower::new(Framing::Chunked).expect("body");
                assert_eq!(f.advance(&wire[..cut]), Step::More, "cut at {cut}");
                assert_eq!(
                    f.advance(&wire[cut..]),
                    Step::Ended(body.len() - cut),
                    "cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn broken_chunked_framing_is_reported_where_hyper_fails() {
        for (wire, at) in [
            (&b"x\r\n"[..], 1),
            (b"5\nhello", 2),
            (b"5\r\nhelloX", 9),
            (b"5\r\nhello\r\r", 10),
            (b"1;a\nb", 4),
            (b"0\r\n\rX", 5),
            (b"11111111111111111\r\n", 17),
        ] {
            assert_eq!(follow(Framing::Chunked, wire), Step::Broken(at), "{wire:?}");
        }
    }
}
