//! Addresses the end-to-end tests keep while nothing listens on them: a node
//! that stops and starts again where it was, a payment provider that is down
//! for a while and then comes up.
//!
//! A port that is merely free between a stop and a restart can be handed by
//! the kernel to any outgoing connection in the meantime (listeners on port 0
//! and outgoing connections share the ephemeral range), and the restart then
//! fails with `AddrInUse`: CI saw exactly that. A socket that is bound but not
//! listening keeps the port out of that range and still refuses connections,
//! as a stopped server does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpSocket};

/// How long [`Parked::at`] waits for a stopping server's listener to close.
const PARK_WAIT_MS: u64 = 10_000;
/// Connections a test server queues before it accepts them.
const LISTEN_BACKLOG: u32 = 1024;

/// A loopback address bound with nothing listening on it.
pub struct Parked(TcpSocket);

impl Parked {
    /// A fresh loopback port.
    pub fn any() -> Self {
        Self::bind("127.0.0.1:0".parse().unwrap()).expect("a free loopback port")
    }

    /// The address a server just stopped on, once its listener is closed.
    pub async fn at(addr: impl AsRef<str>) -> Self {
        let addr: SocketAddr = addr.as_ref().parse().expect("a socket address");
        let deadline = Instant::now() + Duration::from_millis(PARK_WAIT_MS);
        loop {
            match Self::bind(addr) {
                Ok(parked) => return parked,
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{addr} is still in use: {e}"),
            }
        }
    }

    fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        // A restarted server's port still has connections in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok(Self(socket))
    }

    pub fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }

    /// Starts listening: connections are accepted from now on.
    pub fn listen(self) -> TcpListener {
        self.0.listen(LISTEN_BACKLOG).unwrap()
    }
}
