//! The node's HTTP connections: the accept loop, the connection limits, the
//! check every request head passes before hyper reads it, the timeouts hyper
//! enforces for us, and graceful shutdown.
//!
//! `axum::serve` has no knobs for any of this, so the loop is ours (built the
//! way axum's is, on hyper's HTTP/1 connection builder; the node speaks HTTP/1.1
//! only, as it did under axum's default features). What it guarantees:
//! - the loop never stops accepting: a connection from an address that already
//!   holds `connections_per_address_max` connections, or one past
//!   `connections_max` in all, or one past the address's
//!   `new_connections_per_address_per_second`, is accepted and closed at once.
//!   One client can hold at most its own share, and neither the kernel's backlog nor the
//!   node's descriptors fill up behind it (probe d44e5cf, O1);
//! - a connection must deliver a complete request head within
//!   `header_read_timeout` of opening, and again within that long of its previous
//!   answer, or it is closed: this bounds half-sent heads and idle keep-alive
//!   connections alike (hyper starts that timer whenever it waits for a head);
//! - every request head is checked before hyper sees a byte of it (below), so
//!   the node answers every refusal itself: problem+json with `Keyhold-Region`;
//! - on shutdown the loop stops accepting, every connection finishes the request
//!   it is serving and closes, bounded by `SHUTDOWN_DRAIN_MS`.
//!
//! **The head check.** [`Guarded`] sits between the socket and hyper and hands
//! hyper only bytes it has classified. It holds each request head back until
//! the head is complete and `keyhold_httphead::HeadScan` has passed it: lines
//! end at LF with or without CR, as in hyper's parser; the head is at least as
//! strict as hyper's (so hyper never refuses a head that passed, and never
//! answers with its own empty-bodied 400, 414 or 431); and its body framing is
//! unambiguous (exactly one `Content-Length`, or exactly one
//! `Transfer-Encoding: chunked`, never both). It then hands on the head and
//! follows the body (counting its length, or chunk by chunk as hyper's decoder
//! does) to where the next head begins, so pipelined requests are checked one
//! by one. A refused head never reaches hyper: in its place hyper gets a fixed
//! request (`GET /`, `Connection: close`) that the service marks with
//! [`RefusedHead`], and `routes::guard::check_message` answers it with the
//! refusal's status (400 `invalid-request`, 414 `uri-too-long` or 431
//! `headers-too-large`) and `Connection: close`. Requests before it on the
//! connection are answered first, in order (probe d44e5cf, O3); nothing after
//! it is read. When hyper then closes the connection, the wrapper reads and
//! discards what the client still sends (bounded by `DRAIN_BYTES_MAX` and
//! `DRAIN_MS`) so that closing with unread data does not reset the connection
//! before the client read the answer.

use crate::limits::{
    ACCEPT_BACKLOG, ACCEPT_ERROR_BACKOFF_MS, CONNECTION_RATE_ADDRESSES_MAX, DRAIN_BYTES_MAX,
    DRAIN_MS, HEAD_BYTES_MAX, HEAD_LINES_MAX, READ_CHUNK_BYTES, SHUTDOWN_DRAIN_MS,
};
use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use bytes::{Bytes, BytesMut};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use keyhold_httphead::{BodyFollower, HeadScan, Limits, Refusal, Scan, Step};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

/// Connection settings of one node (from its `Config`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub connections_max: usize,
    pub connections_per_address_max: usize,
    /// Also the burst: as many at once.
    pub new_connections_per_address_per_second: u32,
    pub header_read_timeout: Duration,
}

/// What hyper is configured to accept, and what the head check passes.
const HEAD_LIMITS: Limits = Limits {
    head_bytes_max: HEAD_BYTES_MAX,
    header_lines_max: HEAD_LINES_MAX,
};

/// The request hyper gets in place of a refused head: it has no body, and it
/// asks hyper to close the connection after the answer.
const REFUSED_STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n";

/// Marks the request that stands for a refused head; the router answers it
/// with the refusal (`routes::guard::check_message`).
#[derive(Debug, Clone, Copy)]
pub struct RefusedHead(pub Refusal);

/// Serves `app` on `listener` until `shutdown` resolves; see the module docs.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Linux takes a second listen() on a listening socket as a new backlog.
    if let Err(e) = socket2::SockRef::from(&listener).listen(ACCEPT_BACKLOG) {
        tracing::warn!(error = %e, "cannot deepen the accept queue");
    }
    let slots = Arc::new(Slots::new(limits));
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(HEAD_LINES_MAX)
        .max_buf_size(HEAD_BYTES_MAX);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = slots.admit(peer.ip()) else {
            // Closed at once: the client learns as fast as it can, and holds
            // nothing here.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            // Released however the connection ends.
            let _slot = slot;
            let verdicts = Arc::new(Verdicts::default());
            let io = TokioIo::new(Guarded::new(stream, verdicts.clone()));
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let mut request = request.map(Body::new);
                    if let Some(refusal) = verdicts.refusal_of_next() {
                        request.extensions_mut().insert(RefusedHead(refusal));
                    }
                    app.clone().oneshot(request)
                });
            let connection = builder.serve_connection(io, service).with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = closing.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    // Only the connections' receivers may keep the channel open below.
    drop(closing_rx);
    let _ = closing_tx.send(true);
    // Every connection task holds a receiver; they are all gone once closed.
    let drained = tokio::time::timeout(
        Duration::from_millis(SHUTDOWN_DRAIN_MS),
        closing_tx.closed(),
    )
    .await;
    if drained.is_err() {
        tracing::warn!("connections still open at shutdown; leaving them");
    }
    Ok(())
}

/// The open connections, in all and per client address.
struct Slots {
    limits: ConnectionLimits,
    open: Mutex<Open>,
    /// New connections per client address.
    rate: governor::DefaultKeyedRateLimiter<IpAddr>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl Slots {
    fn new(limits: ConnectionLimits) -> Slots {
        let per_second = NonZeroU32::new(limits.new_connections_per_address_per_second)
            .expect("validated by Config::validate: greater than zero");
        Slots {
            limits,
            open: Mutex::new(Open::default()),
            rate: governor::RateLimiter::keyed(governor::Quota::per_second(per_second)),
        }
    }

    /// Whether `address` may open one more connection now, by its rate.
    fn within_rate(&self, address: IpAddr) -> bool {
        let allowed = self.rate.check_key(&address).is_ok();
        if self.rate.len() > CONNECTION_RATE_ADDRESSES_MAX {
            self.rate.retain_recent();
        }
        allowed
    }

    /// A slot for one more connection from `address`, unless that address or
    /// the node is at its limit.
    fn admit(self: &Arc<Self>, address: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().expect("slots lock");
        // The rate is asked last: a connection refused anyway spends none of it.
        let refused = if open.total >= self.limits.connections_max {
            Some("connections_max")
        } else if open.by_address.get(&address).copied().unwrap_or(0)
            >= self.limits.connections_per_address_max
        {
            Some("connections_per_address_max")
        } else if !self.within_rate(address) {
            Some("new_connections_per_address_per_second")
        } else {
            None
        };
        if let Some(limit) = refused {
            metrics::counter!("keyhold_http_connections_refused_total", "limit" => limit)
                .increment(1);
            return None;
        }
        open.total += 1;
        *open.by_address.entry(address).or_insert(0) += 1;
        metrics::gauge!("keyhold_http_connections").increment(1.0);
        Some(Slot {
            slots: self.clone(),
            address,
        })
    }
}

/// One open connection, counted in [`Slots`] and in the
/// `keyhold_http_connections` gauge until it drops.
struct Slot {
    slots: Arc<Slots>,
    address: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().expect("slots lock");
        open.total -= 1;
        if let Some(n) = open.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                open.by_address.remove(&self.address);
            }
        }
        metrics::gauge!("keyhold_http_connections").decrement(1.0);
    }
}

/// What the connection's service learns from its [`Guarded`] stream.
#[derive(Default)]
struct Verdicts {
    /// The refused head, and how many heads hyper got before its stand-in.
    refused: OnceLock<(u64, Refusal)>,
    /// Requests the service was called for. hyper calls it once per head it
    /// read, in order, and reads nothing after the stand-in.
    served: AtomicU64,
}

impl Verdicts {
    /// Counts the request the service is called for; the refusal when it is
    /// the stand-in of a refused head.
    fn refusal_of_next(&self) -> Option<Refusal> {
        let index = self.served.fetch_add(1, Ordering::Relaxed);
        match self.refused.get() {
            Some(&(at, refusal)) if at == index => Some(refusal),
            _ => None,
        }
    }
}

/// The connection's byte stream as hyper reads it: see "The head check" in the
/// module docs.
struct Guarded {
    stream: TcpStream,
    verdicts: Arc<Verdicts>,
    /// Read from the socket, not yet classified.
    held: BytesMut,
    /// Classified: hyper may read it.
    ready: Bytes,
    phase: Phase,
    /// Heads handed to hyper.
    heads: u64,
    /// The bounded read-and-discard after a refusal, once hyper closes.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    lingered_bytes: usize,
}

enum Phase {
    /// Looking for the end of a head.
    Head(HeadScan),
    /// Handing on a body until it ends.
    Body(BodyFollower),
    /// A head was refused (its stand-in is handed on), or a chunked body broke
    /// where hyper's decoder breaks too: hyper answers and closes, and nothing
    /// more is read for it.
    Stopped,
}

impl Guarded {
    fn new(stream: TcpStream, verdicts: Arc<Verdicts>) -> Guarded {
        Guarded {
            stream,
            verdicts,
            held: BytesMut::new(),
            ready: Bytes::new(),
            phase: Phase::Head(HeadScan::new()),
            heads: 0,
            linger: None,
            lingered_bytes: 0,
        }
    }

    /// Classifies held bytes; true when it made progress.
    fn classify(&mut self) -> bool {
        if self.held.is_empty() {
            return false;
        }
        match &mut self.phase {
            Phase::Head(scan) => match scan.scan(&self.held, HEAD_LIMITS) {
                Scan::Partial => return false,
                Scan::Complete(head) => {
                    self.hand_on(head.len);
                    self.heads += 1;
                    self.phase = match BodyFollower::new(head.framing) {
                        Some(body) => Phase::Body(body),
                        None => Phase::Head(HeadScan::new()),
                    };
                }
                Scan::Refused(refusal) => {
                    metrics::counter!(
                        "keyhold_http_refused_heads_total",
                        "status" => refusal.status().to_string()
                    )
                    .increment(1);
                    let _ = self.verdicts.refused.set((self.heads, refusal));
                    self.heads += 1;
                    self.held = BytesMut::new();
                    self.ready = Bytes::from_static(REFUSED_STAND_IN);
                    self.phase = Phase::Stopped;
                }
            },
            Phase::Body(body) => match body.advance(&self.held) {
                Step::More => self.hand_on(self.held.len()),
                Step::Ended(n) => {
                    self.hand_on(n);
                    self.phase = Phase::Head(HeadScan::new());
                }
                Step::Broken(n) => {
                    self.hand_on(n);
                    self.held = BytesMut::new();
                    self.phase = Phase::Stopped;
                }
            },
            Phase::Stopped => return false,
        }
        true
    }

    /// Makes the first `n` held bytes readable by hyper.
    fn hand_on(&mut self, n: usize) {
        self.ready = self.held.split_to(n).freeze();
        if self.held.is_empty() {
            // An idle connection keeps no buffer.
            self.held = BytesMut::new();
        }
    }

    /// Reads what the socket has into `held`; `Ok(0)` at its end.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            // Only now, so an idle connection holds no buffer.
            self.held.reserve(READ_CHUNK_BYTES);
            match self.stream.try_read_buf(&mut self.held) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// After a refusal: shut the write side, then read and discard until the
    /// client closes or the bounds are reached.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.linger.is_none() {
            ready!(Pin::new(&mut self.stream).poll_shutdown(cx))?;
            self.linger = Some(Box::pin(tokio::time::sleep(Duration::from_millis(
                DRAIN_MS,
            ))));
        }
        let deadline = self.linger.as_mut().expect("set above");
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        let mut scratch = [0u8; 1024];
        while self.lingered_bytes <= DRAIN_BYTES_MAX {
            if ready!(self.stream.poll_read_ready(cx)).is_err() {
                return Poll::Ready(Ok(()));
            }
            match self.stream.try_read(&mut scratch) {
                Ok(0) => return Poll::Ready(Ok(())),
                Ok(n) => self.lingered_bytes += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                if this.ready.is_empty() {
                    this.ready = Bytes::new();
                }
                return Poll::Ready(Ok(()));
            }
            if this.classify() {
                continue;
            }
            if matches!(this.phase, Phase::Stopped) {
                // hyper answers what it has and closes; it needs no more.
                return Poll::Pending;
            }
            // The end of the stream: what is held is an unfinished head, which
            // hyper would not answer either.
            if ready!(this.fill(cx))? == 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if matches!(this.phase, Phase::Stopped) {
            return this.poll_linger(cx);
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::{serve, ConnectionLimits};
    use crate::limits::HEAD_LINES_MAX;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const LIMITS: ConnectionLimits = ConnectionLimits {
        connections_max: 64,
        connections_per_address_max: 4,
        new_connections_per_address_per_second: 1_000,
        header_read_timeout: Duration::from_secs(60),
    };

    /// A node's accept loop in front of a router with the node's message
    /// check and region header; counts the requests its handler executed.
    async fn start(limits: ConnectionLimits) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let executed = Arc::new(AtomicUsize::new(0));
        let counter = executed.clone();
        let handler = move |body: String| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                format!("got {}", body.len())
            }
        };
        let app = axum::Router::new()
            .route("/", axum::routing::get(handler.clone()).post(handler))
            .layer(axum::middleware::from_fn(
                crate::routes::guard::check_message,
            ))
            .layer(
                tower_http::set_header::SetResponseHeaderLayer::if_not_present(
                    crate::routes::KEYHOLD_REGION,
                    axum::http::HeaderValue::from_static("test"),
                ),
            );
        tokio::spawn(serve(listener, app, limits, std::future::pending()));
        (addr, executed)
    }

    /// Sends `bytes` in one write and reads until the node closes.
    async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(bytes).await.expect("send");
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out)).await;
        assert!(
            read.is_ok(),
            "the node kept the connection open: {:?}",
            String::from_utf8_lossy(&out)
        );
        String::from_utf8_lossy(&out).into_owned()
    }

    fn assert_refused(answer: &str, status: &str, slug: &str) {
        let at = answer
            .find(&format!("HTTP/1.1 {status}"))
            .unwrap_or_else(|| panic!("no {status} in {answer:?}"));
        let refusal = &answer[at..];
        for needle in [
            "content-type: application/problem+json",
            "connection: close",
            "keyhold-region: test",
            &format!("problems/{slug}\""),
        ] {
            assert!(refusal.contains(needle), "{needle:?} missing in {answer:?}");
        }
    }

    #[tokio::test]
    async fn ambiguous_framing_is_refused_with_any_line_endings_and_never_executed() {
        let (addr, executed) = start(LIMITS).await;
        let body = "5\r\nhello\r\n0\r\n\r\nPOST / HTTP/1.1\r\ncontent-length: 1\r\n\r\nx";
        for head in [
            "POST / HTTP/1.1\nHost: x\nContent-Length: 5\nTransfer-Encoding: chunked\n\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\nTransfer-Encoding: chunked\nContent-Length: 5\n\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        ] {
            let answer = exchange(addr, format!("{head}{body}").as_bytes()).await;
            assert_refused(&answer, "400", "invalid-request");
            assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer:?}");
        }
        assert_eq!(executed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn errors_hyper_would_raise_are_the_nodes_problems() {
        let (addr, executed) = start(LIMITS).await;
        for value in [&b"a\x00b"[..], b"a\x7fb", b"a\rb"] {
            let mut raw = b"GET / HTTP/1.1\r\nx-note: ".to_vec();
            raw.extend_from_slice(value);
            raw.extend_from_slice(b"\r\n\r\n");
            assert_refused(&exchange(addr, &raw).await, "400", "invalid-request");
        }
        let mut many = "GET / HTTP/1.1\r\n".to_owned();
        for i in 0..=HEAD_LINES_MAX {
            many.push_str(&format!("x-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert_refused(
            &exchange(addr, many.as_bytes()).await,
            "431",
            "headers-too-large",
        );
        let big = format!("GET / HTTP/1.1\r\nx-big: {}\r\n\r\n", "b".repeat(70 * 1024));
        assert_refused(
            &exchange(addr, big.as_bytes()).await,
            "431",
            "headers-too-large",
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "u".repeat(100 * 1024));
        assert_refused(
            &exchange(addr, long.as_bytes()).await,
            "414",
            "uri-too-long",
        );
        assert_eq!(executed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn pipelined_requests_are_checked_one_by_one() {
        let (addr, executed) = start(LIMITS).await;
        // A chunked body, a length body and a bodiless request, then a refused
        // head: the three are answered in order, then the refusal, then close.
        let raw = concat!(
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "3;x=y\r\nabc\r\n0\r\ntrailer: t\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 4\r\n\r\nwxyz",
            "\r\nGET / HTTP/1.1\n\n",
            "POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            "0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        );
        let answer = exchange(addr, raw.as_bytes()).await;
        let statuses: Vec<&str> = answer
            .match_indices("HTTP/1.1 ")
            .map(|(i, _)| &answer[i + 9..i + 12])
            .collect();
        assert_eq!(statuses, ["200", "200", "200", "400"], "{answer:?}");
        assert!(
            answer.contains("got 3") && answer.contains("got 4"),
            "{answer:?}"
        );
        assert_refused(&answer, "400", "invalid-request");
        assert_eq!(executed.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn one_address_gets_its_share_and_others_are_still_served() {
        let (addr, _) = start(LIMITS).await;
        let mut idle = Vec::new();
        for _ in 0..LIMITS.connections_per_address_max {
            idle.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // Over its share: accepted and closed at once.
        let mut over = TcpStream::connect(addr).await.expect("connect");
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "a connection over the address's limit stayed open"
        );
        // Another address is served at once.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        let mut other = socket.connect(addr).await.expect("connect from 127.0.0.2");
        other
            .write_all(b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), other.read_to_end(&mut out))
            .await
            .expect("answered in time")
            .expect("read");
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        // A closed connection gives its slot back.
        drop(idle.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut again = TcpStream::connect(addr).await.expect("connect");
        again
            .write_all(b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), again.read_to_end(&mut out)).await;
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
    }

    /// A flood of short-lived connections from one address (probe d44e5cf,
    /// O2): past its rate each is closed at once, while another address is
    /// served, and the allowance comes back with time.
    #[tokio::test]
    async fn one_address_opening_connections_too_fast_is_cut_and_others_are_served() {
        const PER_SECOND: u32 = 5;
        let limits = ConnectionLimits {
            new_connections_per_address_per_second: PER_SECOND,
            connections_per_address_max: 64,
            ..LIMITS
        };
        let (addr, _) = start(limits).await;
        let get = |mut stream: TcpStream| async move {
            let _ = stream
                .write_all(b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")
                .await;
            let mut out = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
            out.starts_with(b"HTTP/1.1 200")
        };
        let mut served = 0;
        for _ in 0..PER_SECOND * 3 {
            let stream = TcpStream::connect(addr).await.expect("connect");
            served += u32::from(get(stream).await);
        }
        // The burst, and what a second refills during the loop at most.
        assert!(
            (PER_SECOND..PER_SECOND * 2).contains(&served),
            "{served} of {} served",
            PER_SECOND * 3
        );
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        let other = socket.connect(addr).await.expect("connect from 127.0.0.2");
        assert!(get(other).await, "another address is served");
        tokio::time::sleep(Duration::from_millis(1_000 / u64::from(PER_SECOND) * 2)).await;
        let again = TcpStream::connect(addr).await.expect("connect");
        assert!(get(again).await, "the allowance comes back");
    }

    #[tokio::test]
    async fn shutdown_closes_idle_connections_and_returns_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, LIMITS, async {
            let _ = stop_rx.await;
        }));
        // One keep-alive connection that got an answer and now idles.
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("send");
        let mut buf = [0u8; 256];
        let n = conn.read(&mut buf).await.expect("answer");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        stop_tx.send(()).expect("stop");
        let stopped = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(stopped.is_ok(), "serve() kept waiting after shutdown");
    }
}
