//! Connections whose answer can be lost: a listener that wraps every accepted
//! TCP stream with a "lose the answer" switch the request handler can flip.
//!
//! Once flipped, every write on the connection fails, so hyper gives up on it
//! and closes it without having sent a single byte of the response. To the
//! client this is a provider that committed the charge and then vanished: the
//! request was sent, the connection closed, no status line arrived.

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A `TcpListener` whose connections carry a [`LoseAnswer`] switch.
#[derive(Debug)]
pub struct LossyListener {
    inner: TcpListener,
}

impl LossyListener {
    pub fn new(inner: TcpListener) -> LossyListener {
        LossyListener { inner }
    }
}

impl Listener for LossyListener {
    type Io = LossyStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = Listener::accept(&mut self.inner).await;
        let stream = LossyStream {
            inner: stream,
            lose: LoseAnswer(Arc::new(AtomicBool::new(false))),
        };
        (stream, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The switch of one connection; handlers get it as `ConnectInfo<LoseAnswer>`.
#[derive(Debug, Clone)]
pub struct LoseAnswer(Arc<AtomicBool>);

impl LoseAnswer {
    /// From now on the connection writes nothing and is closed.
    pub fn lose(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_lost(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl Connected<IncomingStream<'_, LossyListener>> for LoseAnswer {
    fn connect_info(stream: IncomingStream<'_, LossyListener>) -> LoseAnswer {
        stream.io().lose.clone()
    }
}

/// A TCP stream that fails every write once its answer is lost.
#[derive(Debug)]
pub struct LossyStream {
    inner: TcpStream,
    lose: LoseAnswer,
}

fn lost() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "answer dropped on purpose",
    )
}

impl AsyncRead for LossyStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for LossyStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.lose.is_lost() {
            return Poll::Ready(Err(lost()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.lose.is_lost() {
            return Poll::Ready(Err(lost()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.lose.is_lost() {
            return Poll::Ready(Err(lost()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
