//! Accepting and serving connections: at most `--max-connections` at once,
//! HTTP/1.1 through hyper with a deadline for every request head
//! (`--header-timeout-s`, idle keep-alive connections included), and what
//! hyper would answer by itself in plain text (a head that does not parse,
//! is too large, or did not arrive in time) answered in the JSON error
//! shape instead.
//!
//! hyper has no hook for the body of its own error responses: on a head it
//! cannot parse it writes a bodiless `400`/`414`/`431` and closes, and on a
//! head timeout it closes without a word. So the connection's IO is wrapped
//! ([`Watched`]): a write that is exactly such a bodiless error head is held
//! back, and once hyper has let go of the connection the same status goes
//! out with a JSON body; after a head timeout, a client that had sent part
//! of a head gets `408`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use super::counters::Counters;
use super::error::ApiError;

/// How connections are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// A request head must be complete this long after the server starts
    /// waiting for it.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

/// How long an answer of our own (after hyper let go) may take to send,
/// and how long the rest of a bad request is read and dropped afterwards,
/// so that closing with unread bytes does not reset the connection before
/// the client has read the answer.
const LINGER: Duration = Duration::from_secs(2);

/// Accepts until `stopping` turns true, then waits up to `grace` for the
/// open connections to end (each is told to close once idle).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    counters: Arc<Counters>,
    limits: ConnLimits,
    mut stopping: watch::Receiver<bool>,
    grace: Duration,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut stopping) => break,
        };
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    if !is_connection_error(&e) {
                        tracing::warn!("accepting a connection: {e}");
                        // Out of file descriptors or the like: let some close.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            _ = stopped(&mut stopping) => break,
        };
        let _ = stream.set_nodelay(true);
        counters.connections.inc();
        counters.open.inc();
        let task = Connection {
            app: app.clone(),
            http: http.clone(),
            counters: counters.clone(),
            stopping: stopping.clone(),
        };
        tokio::spawn(async move {
            task.run(stream).await;
            task.counters.open.dec();
            drop(permit);
        });
    }
    drop(listener);
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(grace, slots.acquire_many(all)).await;
}

/// Resolves once `stopping` is true (or its sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    while !*stopping.borrow_and_update() {
        if stopping.changed().await.is_err() {
            return;
        }
    }
}

/// Errors of one incoming connection (not of the listener).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

struct Connection {
    app: Router,
    http: http1::Builder,
    counters: Arc<Counters>,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    async fn run(&self, stream: TcpStream) {
        let app = self.app.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let mut app = app.clone();
            // A Router is always ready: calling it without poll_ready is fine.
            Box::pin(async move { tower::Service::call(&mut app, req).await })
        });
        let mut conn = self
            .http
            .serve_connection(TokioIo::new(Watched::new(stream)), service);
        let mut stopping = self.stopping.clone();
        let mut told = false;
        let served = loop {
            let step = tokio::select! {
                r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => Some(r),
                _ = stopped(&mut stopping), if !told => None,
            };
            match step {
                Some(r) => break r,
                // Finish the request in flight, then close.
                None => {
                    told = true;
                    Pin::new(&mut conn).graceful_shutdown();
                }
            }
        };
        let mut io = conn.into_parts().io.into_inner();
        let timed_out = served.as_ref().is_err_and(hyper::Error::is_timeout);
        if timed_out {
            self.counters.header_timeouts.inc();
        }
        let answer = match io.held_back {
            Some(status) => Some(status),
            None if timed_out && io.partial_head => Some(StatusCode::REQUEST_TIMEOUT),
            None => None,
        };
        if let Some(status) = answer {
            let _ = tokio::time::timeout(LINGER, io.answer(status)).await;
            let _ = tokio::time::timeout(LINGER, io.drain()).await;
        }
        let _ = tokio::time::timeout(LINGER, io.stream.shutdown()).await;
    }
}

/// A connection's socket, as hyper reads and writes it.
struct Watched {
    stream: TcpStream,
    /// Bytes came in since the last write: a request head was begun.
    partial_head: bool,
    /// The status of a bodiless error response hyper wrote by itself, not
    /// sent.
    held_back: Option<StatusCode>,
}

impl Watched {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            partial_head: false,
            held_back: None,
        }
    }

    /// Writes `status` with its JSON error body and closes the connection.
    async fn answer(&mut self, status: StatusCode) -> io::Result<()> {
        let bytes = framing_response(status);
        self.stream.write_all(&bytes).await?;
        self.stream.flush().await
    }

    /// Reads and drops what the client still sends (up to its end, a
    /// megabyte, or [`LINGER`], whichever comes first).
    async fn drain(&mut self) {
        let _ = self.stream.shutdown().await;
        let mut buf = [0u8; 8192];
        let mut left = 1usize << 20;
        while left > 0 {
            match self.stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.partial_head = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.held_back.is_none()
            && let Some(status) = bodiless_error(buf)
        {
            self.held_back = Some(status);
            return Poll::Ready(Ok(buf.len()));
        }
        let n = ready!(Pin::new(&mut self.stream).poll_write(cx, buf))?;
        self.partial_head = false;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The status of `buf` when it is a whole response head of one of hyper's
/// own error answers: status 400, 414 or 431, and no header but
/// `content-length: 0`, `date` and `connection`. Every response of the
/// router has a content type, so none looks like this. (Writes are not
/// vectored, so hyper hands a head over in one piece.)
fn bodiless_error(buf: &[u8]) -> Option<StatusCode> {
    let head = buf.strip_suffix(b"\r\n\r\n")?;
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let code: u16 = lines.next()?.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    if !matches!(code, 400 | 414 | 431) {
        return None;
    }
    let mut empty = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" if value.trim() == "0" => empty = true,
            "date" | "connection" => {}
            _ => return None,
        }
    }
    empty.then(|| StatusCode::from_u16(code).ok()).flatten()
}

/// A whole response: `status`, a JSON error body, and `connection: close`.
fn framing_response(status: StatusCode) -> Vec<u8> {
    let body = ApiError::framing(status).openai_body().to_string();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::io::{Read, Write};

    #[test]
    fn only_bodiless_error_heads_are_held_back() {
        let date = "date: Thu, 01 Jan 2026 00:00:00 GMT";
        let head = |s: &str| format!("{s}\r\n\r\n").into_bytes();
        assert_eq!(
            bodiless_error(&head(&format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}"
            ))),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            bodiless_error(&head(&format!(
                "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n{date}"
            ))),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        for other in [
            format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n{date}"
            ),
            format!("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n{date}"),
            format!("HTTP/1.1 400 Bad Request\r\n{date}"),
            format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n{date}"),
        ] {
            assert_eq!(bodiless_error(&head(&other)), None, "{other}");
        }
        let with_body = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n\r\n{{}}");
        assert_eq!(bodiless_error(with_body.as_bytes()), None);
    }

    /// A server of one route on a thread of its own; its address.
    fn server(limits: ConnLimits) -> (std::net::SocketAddr, Arc<Counters>) {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                let app = Router::new().route("/", get(|| async { "hi" }));
                let (_tx, rx) = watch::channel(false);
                serve(listener, app, c, limits, rx, Duration::from_secs(1)).await;
            });
        });
        (addr, counters)
    }

    const LIMITS: ConnLimits = ConnLimits {
        header_timeout: Duration::from_secs(1),
        max_connections: 8,
    };

    /// Everything the server sends until it closes (bounded wait).
    fn exchange(addr: std::net::SocketAddr, send: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(send).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn unparsable_heads_get_json() {
        let (addr, _) = server(LIMITS);
        for bad in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            let reply = exchange(addr, bad);
            assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
            assert!(reply.contains("content-type: application/json"), "{reply}");
            assert!(reply.contains("\"code\":\"malformed_request\""), "{reply}");
        }
        let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "a".repeat(1 << 20));
        let reply = exchange(addr, big.as_bytes());
        assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");
        assert!(reply.contains("request_header_fields_too_large"), "{reply}");
    }

    #[test]
    fn a_half_head_gets_408_and_an_idle_connection_is_closed() {
        let (addr, counters) = server(LIMITS);
        let reply = exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\nX-Half: ");
        assert!(reply.starts_with("HTTP/1.1 408 "), "{reply}");
        assert!(reply.contains("\"code\":\"request_timeout\""), "{reply}");
        assert_eq!(exchange(addr, b""), "");
        assert!(counters.header_timeouts.get() >= 2);
        // A whole request is served as usual, and the connection is kept.
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            first.starts_with("HTTP/1.1 200 ") && first.ends_with("hi"),
            "{first}"
        );
        // Then idle past the timeout: closed without a word.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }

    #[test]
    fn connections_beyond_the_limit_wait_for_a_free_one() {
        let (addr, counters) = server(ConnLimits {
            header_timeout: Duration::from_secs(60),
            max_connections: 1,
        });
        let mut first = std::net::TcpStream::connect(addr).unwrap();
        first.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        first.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        assert!(first.read(&mut buf).unwrap() > 0);
        let mut second = std::net::TcpStream::connect(addr).unwrap();
        second.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        second.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        // Only one connection is taken while the first stays open.
        assert_eq!(counters.connections.get(), 1);
        drop(first);
        let n = second.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200 "));
        assert_eq!(counters.connections.get(), 2);
    }
}
