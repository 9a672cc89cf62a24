//! The API key: when the server has one, every endpoint but `/health` and
//! the chat page's files wants `Authorization: Bearer KEY` (`/v1/messages` also takes Anthropic's
//! `x-api-key: KEY`); otherwise 401 in the endpoint's error shape.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::Shared;
use super::web;

/// The path of the Anthropic endpoint (its own key header and error shape).
pub const MESSAGES_PATH: &str = "/v1/messages";

/// The middleware.
pub async fn require_key(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let Some(key) = st.api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health" || web::is_page(req.method(), path) {
        return next.run(req).await;
    }
    let anthropic = path == MESSAGES_PATH;
    let given = presented_key(req.headers(), anthropic);
    if given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
        return next.run(req).await;
    }
    let e = ApiError::unauthorized(given.is_some());
    if anthropic {
        e.anthropic().into_response()
    } else {
        e.into_response()
    }
}

/// The key a request carries, if any.
fn presented_key(h: &HeaderMap, anthropic: bool) -> Option<&str> {
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let x_api_key = || h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    bearer.or_else(|| if anthropic { x_api_key() } else { None })
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_and_x_api_key() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer  k1 "));
        assert_eq!(presented_key(&h, false), Some("k1"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        assert_eq!(presented_key(&h, false), None);
        assert_eq!(presented_key(&h, true), Some("k2"));
        h.insert("authorization", HeaderValue::from_static("Basic abc"));
        assert_eq!(presented_key(&h, true), Some("k2"));
    }

    #[test]
    fn comparison() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
        assert!(same(b"", b""));
    }
}
