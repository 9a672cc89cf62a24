//! Reading a request body: JSON only, at most `--max-body` bytes, all of it
//! within `--body-timeout-s` of the head. Every failure is an [`ApiError`]
//! (the handler answers it in its API's shape), never axum's plain-text
//! rejections.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use futures_util::StreamExt;

use super::error::ApiError;
use super::state::Shared;

/// Bodies from this size on are large: read into a mapping of their own,
/// prepared in the large lane ([`super::pool`]), and followed by handing
/// freed memory back ([`super::memory`]).
pub const LARGE_BODY: usize = 256 << 10;

/// How a body must arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body in bytes (`--max-body`).
    pub max: usize,
    /// The whole body must arrive within this (`--body-timeout-s`).
    pub timeout: Duration,
}

/// A request's body, or why it could not be read.
pub struct JsonBody(pub Result<Bytes, ApiError>);

impl FromRequest<Shared> for JsonBody {
    type Rejection = Infallible;

    async fn from_request(req: Request, st: &Shared) -> Result<Self, Infallible> {
        let read = read(req, st.body).await;
        if read.as_ref().is_err_and(|e| e.status.as_u16() == 408) {
            st.counters.body_timeouts.inc();
        }
        Ok(Self(read))
    }
}

async fn read(req: Request, limits: BodyLimits) -> Result<Bytes, ApiError> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let text = ct.to_str().unwrap_or("(not text)");
        if !is_json(text) {
            return Err(ApiError::media_type(text));
        }
    }
    let declared = match req.headers().get(header::CONTENT_LENGTH) {
        // The HTTP layer has checked that it is a number.
        Some(v) => v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()),
        None => None,
    };
    if declared.is_some_and(|n| n > limits.max as u64) {
        return Err(ApiError::too_large());
    }
    let declared = declared.map(|n| n as usize);
    let collect = collect(req.into_body().into_data_stream(), declared, limits.max);
    match tokio::time::timeout(limits.timeout, collect).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::body_timeout(limits.timeout.as_secs())),
    }
}

/// The body's bytes in one buffer: sized from the declared length when
/// there is one (so an 8 MB body is not copied while a buffer doubles),
/// and for a large body an anonymous mapping of its own, whose pages go
/// back to the system the moment it is dropped ([`super::memory`]).
async fn collect(
    mut frames: axum::body::BodyDataStream,
    declared: Option<usize>,
    max: usize,
) -> Result<Bytes, ApiError> {
    let mut buf = Buffer::new(declared, max)?;
    while let Some(frame) = frames.next().await {
        let data = frame.map_err(|e| ApiError::unreadable_body(chain(&e)))?;
        if buf.len().saturating_add(data.len()) > max {
            return Err(ApiError::too_large());
        }
        buf.push(&data, max)?;
    }
    Ok(buf.into_bytes())
}

/// Bytes being collected.
enum Buffer {
    Heap(Vec<u8>),
    Mapped { map: memmap2::MmapMut, len: usize },
}

/// A filled mapping, as the owner of a [`Bytes`].
struct Filled {
    map: memmap2::MmapMut,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

fn mapping(len: usize) -> Result<memmap2::MmapMut, ApiError> {
    memmap2::MmapMut::map_anon(len)
        .map_err(|e| ApiError::internal(format!("cannot map {len} bytes for the request body: {e}")))
}

impl Buffer {
    fn new(declared: Option<usize>, max: usize) -> Result<Self, ApiError> {
        Ok(match declared {
            Some(n) if n >= LARGE_BODY => Buffer::Mapped {
                map: mapping(n.min(max))?,
                len: 0,
            },
            Some(n) => Buffer::Heap(Vec::with_capacity(n)),
            None => Buffer::Heap(Vec::new()),
        })
    }

    fn len(&self) -> usize {
        match self {
            Buffer::Heap(v) => v.len(),
            Buffer::Mapped { len, .. } => *len,
        }
    }

    /// Appends `data` (the caller has checked the total against `max`); a
    /// body without a declared length moves to a mapping of `max` bytes
    /// once it is large.
    fn push(&mut self, data: &[u8], max: usize) -> Result<(), ApiError> {
        if let Buffer::Heap(v) = self
            && v.len() + data.len() >= LARGE_BODY
        {
            let mut map = mapping(max)?;
            map[..v.len()].copy_from_slice(v);
            *self = Buffer::Mapped { map, len: v.len() };
        }
        match self {
            Buffer::Heap(v) => v.extend_from_slice(data),
            Buffer::Mapped { map, len } => {
                let end = *len + data.len();
                // The HTTP layer holds a body to its declared length.
                let room = map
                    .get_mut(*len..end)
                    .ok_or_else(|| ApiError::unreadable_body("more bytes than its content-length"))?;
                room.copy_from_slice(data);
                *len = end;
            }
        }
        Ok(())
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Buffer::Heap(v) => Bytes::from(v),
            Buffer::Mapped { map, len } => Bytes::from_owner(Filled { map, len }),
        }
    }
}

/// An error and its causes, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !s.contains(&c_text) {
            s.push_str(": ");
            s.push_str(&c_text);
        }
        cause = c.source();
    }
    s
}

/// `application/json`, or any `+json` type, with any parameters.
fn is_json(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn request(body: axum::body::Body, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().method("POST").uri("/v1/completions");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(body).unwrap()
    }

    const LIMITS: BodyLimits = BodyLimits {
        max: 16,
        timeout: Duration::from_secs(5),
    };

    #[test]
    fn reads_whole_bodies_and_refuses_large_or_non_json_ones() {
        let rt = runtime();
        let ok = rt.block_on(read(request("{\"a\":1}".into(), &[]), LIMITS));
        assert_eq!(ok.ok().as_deref(), Some(&b"{\"a\":1}"[..]));
        let big = rt.block_on(read(request("x".repeat(17).into(), &[]), LIMITS));
        assert_eq!(big.err().map(|e| e.status.as_u16()), Some(413));
        let declared = rt.block_on(read(request("{}".into(), &[("content-length", "99")]), LIMITS));
        assert_eq!(declared.err().map(|e| e.status.as_u16()), Some(413));
        let text = rt.block_on(read(
            request("{}".into(), &[("content-type", "text/plain")]),
            LIMITS,
        ));
        assert_eq!(text.err().and_then(|e| e.code), Some("unsupported_media_type"));
    }

    #[test]
    fn pieces_are_joined_in_order() {
        let rt = runtime();
        let pieces =
            futures_util::stream::iter(["{\"a\"", ":", "12}"].map(|s| Ok::<_, Infallible>(Bytes::from(s))));
        let body = axum::body::Body::from_stream(pieces);
        let r = rt.block_on(read(request(body, &[]), LIMITS));
        assert_eq!(r.ok().as_deref(), Some(&b"{\"a\":12}"[..]));
    }

    /// Large bodies, declared or not, land in a mapping whole.
    #[test]
    fn large_bodies_are_read_whole() {
        let rt = runtime();
        let limits = BodyLimits {
            max: 4 * LARGE_BODY,
            ..LIMITS
        };
        let piece = Bytes::from((0..LARGE_BODY / 3).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let want: Vec<u8> = piece.iter().copied().cycle().take(piece.len() * 7).collect();
        for declared in [true, false] {
            let pieces: Vec<_> = (0..7).map(|_| Ok::<_, Infallible>(piece.clone())).collect();
            let body = axum::body::Body::from_stream(futures_util::stream::iter(pieces));
            let len = want.len().to_string();
            let headers: &[(&str, &str)] = if declared {
                &[("content-length", &len)]
            } else {
                &[]
            };
            let got = rt.block_on(read(request(body, headers), limits));
            assert_eq!(got.ok().as_deref(), Some(&want[..]), "declared: {declared}");
        }
        let pieces: Vec<_> = (0..13).map(|_| Ok::<_, Infallible>(piece.clone())).collect();
        let body = axum::body::Body::from_stream(futures_util::stream::iter(pieces));
        let got = rt.block_on(read(request(body, &[]), limits));
        assert_eq!(got.err().map(|e| e.status.as_u16()), Some(413));
    }

    #[test]
    fn a_body_that_stalls_times_out() {
        let rt = runtime();
        let stalled = futures_util::stream::pending::<Result<Bytes, Infallible>>();
        let limits = BodyLimits {
            timeout: Duration::from_millis(50),
            ..LIMITS
        };
        let r = rt.block_on(read(request(axum::body::Body::from_stream(stalled), &[]), limits));
        assert_eq!(r.err().and_then(|e| e.code), Some("request_timeout"));
    }
}
