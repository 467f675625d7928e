//! The request-head check of a keyhold node's HTTP edge, as pure functions over
//! bytes: where a request head ends, whether it is well formed, how its body is
//! framed, and where that body ends so the next pipelined head can be found. The
//! server's connection wrapper (`crates/server/src/http.rs`) holds every head
//! back until [`HeadScan`] has passed it; only then does hyper see it.
//!
//! Why a check of our own in front of hyper: hyper reads a head leniently where
//! the framing is ambiguous (it drops `Content-Length` in favour of
//! `Transfer-Encoding`, accepts `Transfer-Encoding: chunked` twice and equal
//! `Content-Length`s twice), which is what request smuggling through a front
//! proxy needs; and the errors hyper raises itself go out with an empty body and
//! without the node's headers. So this check refuses every ambiguous framing on
//! purpose, and refuses everything hyper would refuse, with hyper's status, so
//! that the node answers those too.
//!
//! It reads lines exactly as httparse (hyper's parser) does: a line ends at LF,
//! with or without a CR before it; empty lines before the request line are
//! skipped; the head ends at the first empty line after it. A scanner that
//! ended lines only at CRLF missed a `Transfer-Encoding` after a bare LF
//! (probe d44e5cf, M1).
//!
//! **Architecture Invariant:** every head [`HeadScan`] passes, httparse parses
//! completely and hyper accepts (its method, request target and framing checks
//! are made here too); every head httparse parses completely and hyper accepts,
//! [`HeadScan`] passes, unless its framing is one this crate refuses on
//! purpose. Both directions are checked against httparse by the proptest in
//! `tests/differential.rs` and by the fuzz target `http_head`.
//!
//! **Architecture Invariant:** no I/O, no clock, no allocation per byte: the
//! caller holds the bytes; the scanner keeps a few counters and offsets.

mod body;
mod head;
pub mod oracle;

pub use body::{BodyFollower, Step};
pub use head::{Framing, Head, HeadScan, Limits, Scan};

/// Why a head is refused; the status is the one hyper itself would have used
/// for the malformed cases, 400 for the ambiguous ones it would have let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the head does not parse, or its body framing could be read two ways.
    Invalid(&'static str),
    /// 431: more header lines than allowed, or a head longer than allowed.
    HeadersTooLarge(&'static str),
    /// 414: the request line alone is longer than a whole head may be.
    UriTooLong,
}

impl Refusal {
    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Invalid(_) => 400,
            Refusal::HeadersTooLarge(_) => 431,
            Refusal::UriTooLong => 414,
        }
    }

    /// A sentence for the problem document's `detail`.
    pub fn detail(&self) -> &'static str {
        match self {
            Refusal::Invalid(detail) | Refusal::HeadersTooLarge(detail) => detail,
            Refusal::UriTooLong => "the request line is longer than a whole request head may be",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status(), self.detail())
    }
}

impl std::error::Error for Refusal {}
