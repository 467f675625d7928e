//! A TCP proxy for tests and benchmarks: every byte is delivered a fixed delay
//! after it arrived (in each direction, order preserved), and the link can be
//! black-holed, which drops everything in flight and stalls every connection
//! until it is healed, the way a partitioned network looks to both ends. The
//! kernel here has no netem, so inter-region latency and partitions between
//! nodes on one machine go through this.
//!
//! A routed proxy ([`Proxy::routed`]) asks a [`Route`] what to do with each
//! connection from where it comes from (its peer address): deliver it with a
//! delay, or cut it. [`Proxy::reroute`] asks again for every open connection and
//! closes those now cut, so a partition drops existing connections too.
//!
//! [`Parked`] holds the address of a server that is down: connections to it
//! are refused, and it stays free for the server's restart.

mod parked;

pub use parked::Parked;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Bytes read per chunk; each chunk is delayed as a unit.
const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// Chunks in flight per direction; a slow reader back-pressures the writer.
const CHUNKS_IN_FLIGHT_MAX: usize = 1024;
/// How far ahead of a chunk's due time the timer is asked to wake the writer.
const TIMER_SLACK: Duration = Duration::from_micros(1_500);

#[derive(Debug, Default)]
struct Settings {
    delay_us: AtomicU64,
    blackhole: AtomicBool,
}

/// What a routed proxy does with one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Deliver every byte this long after it arrived, each way.
    Open { delay: Duration },
    /// Close the connection (at once, and any open one at the next reroute).
    Cut,
}

/// Decides a routed proxy's links from the connecting peer's address.
pub trait Route: Send + Sync + 'static {
    fn link(&self, peer: IpAddr) -> Link;
}

/// How a proxy treats its connections: all alike (delay and black hole set on
/// the proxy), or each as its route says.
#[derive(Clone)]
enum Mode {
    Shared(Arc<Settings>),
    Routed(Arc<dyn Route>),
}

/// A running proxy. Dropping it stops accepting; open connections end when
/// either side closes.
#[derive(Debug, Clone)]
pub struct Proxy {
    addr: SocketAddr,
    settings: Arc<Settings>,
    /// Bumped by `reroute`: every routed connection asks its route again.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    accept: Arc<tokio::task::JoinHandle<()>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if Arc::strong_count(&self.accept) == 1 {
            self.accept.abort();
        }
    }
}

impl Proxy {
    /// Serves on `listener`, forwarding every connection to `upstream` with a
    /// one-way `delay`.
    pub fn start(
        listener: TcpListener,
        upstream: SocketAddr,
        delay: Duration,
    ) -> std::io::Result<Proxy> {
        let settings = Arc::new(Settings::default());
        settings
            .delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        Proxy::serve(listener, upstream, settings.clone(), Mode::Shared(settings))
    }

    /// Serves on `listener`, forwarding each connection to `upstream` as
    /// `route` says for its peer address.
    pub fn routed(
        listener: TcpListener,
        upstream: SocketAddr,
        route: Arc<dyn Route>,
    ) -> std::io::Result<Proxy> {
        Proxy::serve(
            listener,
            upstream,
            Arc::new(Settings::default()),
            Mode::Routed(route),
        )
    }

    fn serve(
        listener: TcpListener,
        upstream: SocketAddr,
        settings: Arc<Settings>,
        mode: Mode,
    ) -> std::io::Result<Proxy> {
        let addr = listener.local_addr()?;
        let generation = Arc::new(tokio::sync::watch::channel(0u64).0);
        let changes = generation.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, peer)) = listener.accept().await else {
                    continue;
                };
                let settings = match &mode {
                    Mode::Shared(settings) => settings.clone(),
                    Mode::Routed(route) => match route.link(peer.ip()) {
                        Link::Cut => continue,
                        Link::Open { delay } => {
                            let own = Settings::default();
                            own.delay_us
                                .store(delay.as_micros() as u64, Ordering::Relaxed);
                            Arc::new(own)
                        }
                    },
                };
                let mode = mode.clone();
                let mut changed = changes.subscribe();
                tokio::spawn(async move {
                    if settings.blackhole.load(Ordering::Relaxed) {
                        // A partitioned peer never answers: hold the socket open.
                        hold(client, settings).await;
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let cut = async move {
                        let Mode::Routed(route) = mode else {
                            return std::future::pending::<()>().await;
                        };
                        while changed.changed().await.is_ok() {
                            if route.link(peer.ip()) == Link::Cut {
                                return;
                            }
                        }
                        std::future::pending::<()>().await
                    };
                    // Returning drops both sockets: each end sees the connection close.
                    tokio::select! {
                        _ = splice(client, server, settings) => {}
                        _ = cut => {}
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            settings,
            generation,
            accept: Arc::new(accept),
        })
    }

    /// Asks the route again for every open connection and closes those now
    /// cut (a routed proxy; no effect on one made by `start`).
    pub fn reroute(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_delay(&self, delay: Duration) {
        self.settings
            .delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    /// Cuts (true) or heals (false) the link.
    pub fn set_blackhole(&self, on: bool) {
        self.settings.blackhole.store(on, Ordering::Relaxed);
    }
}

async fn hold(client: TcpStream, settings: Arc<Settings>) {
    while settings.blackhole.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(client);
}

/// Both directions in this one task, so that dropping it closes both sockets.
async fn splice(client: TcpStream, server: TcpStream, settings: Arc<Settings>) {
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::join!(
        direction(cr, sw, settings.clone()),
        direction(sr, cw, settings)
    );
}

/// One direction: a reader stamps each chunk with its due time, a writer sends
/// it then. While black-holed, chunks are dropped and nothing is written.
async fn direction(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    settings: Arc<Settings>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT_MAX);
    let reader_settings = settings.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK_BYTES_MAX];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if reader_settings.blackhole.load(Ordering::Relaxed) {
                continue;
            }
            let delay = Duration::from_micros(reader_settings.delay_us.load(Ordering::Relaxed));
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .await
                .is_err()
            {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            // tokio's timer ticks in whole milliseconds and rounds up, which would add
            // up to a millisecond per chunk; sleep to just short of the due time, then
            // yield until it passes.
            let coarse = due.checked_sub(TIMER_SLACK).unwrap_or(due);
            tokio::time::sleep_until(coarse).await;
            while Instant::now() < due {
                tokio::task::yield_now().await;
            }
            if settings.blackhole.load(Ordering::Relaxed) {
                continue;
            }
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::pin!(reader, writer);
    tokio::select! {
        // The reader saw the end: the writer delivers what is queued, then ends.
        _ = &mut reader => (&mut writer).await,
        // The writer failed: nothing more can be delivered this way.
        _ = &mut writer => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn adds_the_delay_both_ways_and_blackholes() {
        let upstream = echo_server().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy::start(listener, upstream, Duration::from_millis(30)).unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let started = std::time::Instant::now();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        let rtt = started.elapsed();
        assert!(rtt >= Duration::from_millis(60), "round trip {rtt:?}");

        proxy.set_blackhole(true);
        s.write_all(b"lost").await.unwrap();
        let got = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
        assert!(got.is_err(), "a black-holed link delivers nothing");
        proxy.set_blackhole(false);
        proxy.set_delay(Duration::ZERO);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"back").await.unwrap();
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
    }

    /// Cuts connections from one peer address, the way `keyhold up` isolates a
    /// region: the route decides per peer, and a reroute closes open ones.
    struct Gate(AtomicBool);
    impl Route for Gate {
        fn link(&self, peer: IpAddr) -> Link {
            let cut = self.0.load(Ordering::Relaxed) && peer == IpAddr::from([127, 0, 0, 1]);
            if cut {
                Link::Cut
            } else {
                Link::Open {
                    delay: Duration::ZERO,
                }
            }
        }
    }

    #[tokio::test]
    async fn a_routed_proxy_cuts_new_and_open_connections_and_heals() {
        let upstream = echo_server().await;
        let gate = Arc::new(Gate(AtomicBool::new(false)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy::routed(listener, upstream, gate.clone()).unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 4];
        open.write_all(b"ping").await.unwrap();
        open.read_exact(&mut buf).await.unwrap();

        gate.0.store(true, Ordering::Relaxed);
        proxy.reroute();
        let read = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "an open connection is closed by the cut: {read:?}"
        );
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(5), fresh.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a new connection is closed at once: {read:?}"
        );

        gate.0.store(false, Ordering::Relaxed);
        proxy.reroute();
        let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
        healed.write_all(b"back").await.unwrap();
        healed.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
    }
}
