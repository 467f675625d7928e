//! Addresses a test keeps while nothing listens on them: a server that stops
//! and starts again where it was (a node, a Raft replica), a payment provider
//! that is down for a while and then comes up.
//!
//! A port that is merely free between a stop and a restart can be handed by
//! the kernel to any outgoing connection in the meantime (listeners on port 0
//! and outgoing connections share the ephemeral range), and the restart then
//! fails with `AddrInUse` (CI saw exactly that). A socket that is bound but not
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_parked_address_refuses_until_it_listens_and_parks_again_after() {
        let parked = Parked::any();
        let addr = parked.addr();
        let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

        let listener = parked.listen();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // The server stops with a connection still open: its address parks
        // again, and refuses new connections.
        drop(listener);
        let parked = Parked::at(addr.to_string()).await;
        assert_eq!(parked.addr(), addr);
        let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        drop((client, server));
    }
}
