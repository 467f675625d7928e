//! The node's HTTP connections: the accept loop, the connection limit, the
//! timeouts hyper enforces for us, and graceful shutdown.
//!
//! `axum::serve` has no knobs for any of this, so the loop is ours (built the
//! way axum's is, on hyper's HTTP/1 connection builder; the node speaks HTTP/1.1
//! only, as it did under axum's default features). What it guarantees:
//! - at most `connections_max` connections are open; past that the loop stops
//!   accepting until one closes, so a flood of idle connections queues in the
//!   kernel's backlog instead of exhausting file descriptors;
//! - a connection must deliver a complete request head within
//!   `header_read_timeout` of opening, and again within that long of its previous
//!   answer, or it is closed: this bounds half-sent heads and idle keep-alive
//!   connections alike (hyper starts that timer whenever it waits for a head);
//! - header blocks above `HEAD_BYTES_MAX` or with more than `HEAD_LINES_MAX`
//!   lines are refused by hyper itself (431, empty body); the router refuses the
//!   smaller application limits with a problem document;
//! - a request carrying both `Content-Length` and `Transfer-Encoding` is marked
//!   ([`Framing::Ambiguous`]) so the router can refuse it: hyper silently drops
//!   the `Content-Length`, which would hide a request-smuggling attempt;
//! - on shutdown the loop stops accepting, every connection finishes the request
//!   it is serving and closes, bounded by `SHUTDOWN_DRAIN_MS`.

use crate::limits::{ACCEPT_ERROR_BACKOFF_MS, HEAD_BYTES_MAX, HEAD_LINES_MAX, SHUTDOWN_DRAIN_MS};
use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Connection settings of one node (from its `Config`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub connections_max: usize,
    pub header_read_timeout: Duration,
}

/// How a request's body length was declared, as seen on the wire.
#[derive(Debug, Clone)]
pub struct Framing(Arc<AtomicBool>);

impl Framing {
    /// True when a request head on this connection carried both
    /// `Content-Length` and `Transfer-Encoding`.
    pub fn is_ambiguous(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves; see the module docs.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(HEAD_LINES_MAX)
        .max_buf_size(HEAD_BYTES_MAX);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let open = OpenConnection::open();
        let app = app.clone();
        let builder = builder.clone();
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            // Both released however the connection ends.
            let _held = (permit, open);
            let framing = Framing(Arc::new(AtomicBool::new(false)));
            let io = TokioIo::new(Sniffed::new(stream, framing.clone()));
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let mut request = request.map(Body::new);
                    request.extensions_mut().insert(framing.clone());
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

/// One open connection in the `keyhold_http_connections` gauge.
struct OpenConnection;

impl OpenConnection {
    fn open() -> OpenConnection {
        metrics::gauge!("keyhold_http_connections").increment(1.0);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!("keyhold_http_connections").decrement(1.0);
    }
}

/// The connection's byte stream, watched for request heads that declare their
/// body length twice. It looks at line starts only: a header line begins after
/// CRLF, and a blank line ends a head. Bodies are JSON, whose lines never begin
/// with a bare header name, so they cannot raise the flag by accident.
struct Sniffed {
    stream: TcpStream,
    framing: Framing,
    scan: HeadScan,
}

impl Sniffed {
    fn new(stream: TcpStream, framing: Framing) -> Sniffed {
        Sniffed {
            stream,
            framing,
            scan: HeadScan::default(),
        }
    }
}

/// The state of the scan between reads.
#[derive(Default)]
struct HeadScan {
    /// The current line's first bytes, lower-cased, up to the longest name.
    line: Vec<u8>,
    /// The previous byte was CR.
    after_cr: bool,
    content_length: bool,
    transfer_encoding: bool,
}

const CONTENT_LENGTH: &[u8] = b"content-length:";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";

impl HeadScan {
    /// Feeds bytes; returns true once a head declared both lengths.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut ambiguous = false;
        for &b in bytes {
            if b == b'\n' && self.after_cr {
                if self.line.is_empty() {
                    // A blank line: the head (if this was one) ended.
                    ambiguous |= self.content_length && self.transfer_encoding;
                    self.content_length = false;
                    self.transfer_encoding = false;
                } else {
                    self.content_length |= self.line.starts_with(CONTENT_LENGTH);
                    self.transfer_encoding |= self.line.starts_with(TRANSFER_ENCODING);
                }
                self.line.clear();
                self.after_cr = false;
                continue;
            }
            self.after_cr = b == b'\r';
            if !self.after_cr && self.line.len() < TRANSFER_ENCODING.len() {
                self.line.push(b.to_ascii_lowercase());
            }
        }
        ambiguous
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if this.scan.feed(&buf.filled()[before..]) {
                this.framing.0.store(true, Ordering::Relaxed);
            }
        }
        polled
    }
}

impl AsyncWrite for Sniffed {
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
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
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
    use super::{serve, ConnectionLimits, HeadScan};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn shutdown_closes_idle_connections_and_returns_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = ConnectionLimits {
            connections_max: 8,
            header_read_timeout: Duration::from_secs(60),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = stop_rx.await;
        }));
        // One keep-alive connection that got an answer and now idles.
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
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

    #[test]
    fn a_head_with_both_lengths_is_ambiguous_in_any_order_and_split() {
        let head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(HeadScan::default().feed(head));
        let reversed =
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\nCONTENT-LENGTH: 5\r\n\r\n";
        assert!(HeadScan::default().feed(reversed));
        // Split anywhere, even inside CRLF.
        for cut in 1..head.len() {
            let mut scan = HeadScan::default();
            let first = scan.feed(&head[..cut]);
            assert!(first || scan.feed(&head[cut..]), "cut at {cut}");
        }
    }

    #[test]
    fn one_length_per_head_is_not_ambiguous_across_requests() {
        let mut scan = HeadScan::default();
        let a = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let b = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert!(!scan.feed(a));
        assert!(!scan.feed(b));
        // A JSON body with CRLF lines does not look like a header.
        assert!(!scan.feed(b"{\r\n\"content-length:\": 1\r\n}\r\n\r\n"));
    }
}
