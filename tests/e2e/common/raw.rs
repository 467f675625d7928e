//! A raw HTTP/1.1 client over one TCP connection, for requests a normal client
//! would refuse or normalize: a header given twice, control characters, bodies
//! that lie about their length, slow or unfinished bodies. It reads one response
//! at a time (Content-Length or chunked) and tells whether the server closed the
//! connection, so tests can check that a keep-alive connection is never closed
//! without `Connection: close`.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One parsed response.
#[derive(Debug, Clone)]
pub struct RawResp {
    pub status: u16,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The slug of a problem+json body, if the body is one.
    pub fn slug(&self) -> Option<String> {
        let ct = self.header("content-type")?;
        if !ct.starts_with("application/problem+json") {
            return None;
        }
        let j: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        Some(j["type"].as_str()?.rsplit('/').next()?.to_owned())
    }

    /// True when the server said it closes the connection after this answer.
    pub fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    }
}

/// One client connection with a read buffer.
pub struct RawConn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

/// Why no response could be read.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The server closed the connection before a whole response arrived.
    Closed,
    /// Nothing (or not enough) arrived in time.
    Timeout,
    Io(String),
}

impl RawConn {
    /// Connects to `addr` (`host:port`) with a read timeout.
    pub fn connect(addr: &str, read_timeout: Duration) -> RawConn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(read_timeout))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    fn fill(&mut self, deadline: Instant) -> Result<(), ReadError> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if Instant::now() > deadline {
                return Err(ReadError::Timeout);
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(ReadError::Timeout)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(ReadError::Closed),
                Err(e) => return Err(ReadError::Io(e.to_string())),
            }
        }
    }

    fn take_line(&mut self, deadline: Instant) -> Result<String, ReadError> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            self.fill(deadline)?;
        }
    }

    fn take_exact(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            self.fill(deadline)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads one whole response (within `limit`).
    pub fn read_response(&mut self, limit: Duration) -> Result<RawResp, ReadError> {
        let deadline = Instant::now() + limit;
        let status_line = self.take_line(deadline)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ReadError::Io(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let line = self.take_line(deadline)?;
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap_or((&line, ""));
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut resp = RawResp {
            status,
            headers,
            body: Vec::new(),
        };
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"));
        if chunked {
            loop {
                let size_line = self.take_line(deadline)?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| ReadError::Io(format!("bad chunk size {size_line:?}")))?;
                if size == 0 {
                    // Trailers, then the blank line.
                    while !self.take_line(deadline)?.is_empty() {}
                    break;
                }
                let data = self.take_exact(size, deadline)?;
                resp.body.extend_from_slice(&data);
                self.take_line(deadline)?;
            }
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| ReadError::Io(format!("bad content-length {len:?}")))?;
            resp.body = self.take_exact(len, deadline)?;
        }
        Ok(resp)
    }

    /// True when the server closes the connection within `limit` (EOF or reset).
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            match self.fill(deadline) {
                Err(ReadError::Closed) => return true,
                Err(ReadError::Timeout) if Instant::now() > deadline => return false,
                Err(ReadError::Timeout) => continue,
                Err(ReadError::Io(_)) => return true,
                Ok(()) => continue,
            }
        }
    }
}

/// A request's bytes: request line, `headers` in order (each `name: value`, sent
/// exactly as given), then `body`. `Content-Length` is added unless a header
/// sets `content-length` or `transfer-encoding` itself.
pub fn request(method: &str, target: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nhost: keyhold\r\n").into_bytes();
    let sets_length = headers.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !sets_length && (!body.is_empty() || method == "POST") {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// `body` as one chunk and the last chunk.
pub fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}
