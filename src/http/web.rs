//! The chat page at `/`: three static files compiled into the binary (the
//! page works offline, with nothing fetched from elsewhere), served with a
//! policy that lets them load only from this server. The page talks to the
//! server's own `/v1/chat/completions`; it holds no secrets, so its files
//! need no API key (`auth` lets [`is_page`] paths through).

use axum::Router;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::state::Shared;

const INDEX_HTML: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const APP_CSS: &str = include_str!("web/app.css");

/// The page's own files, and nothing else, may load; no plugin, frame,
/// form target or `<base>` can point elsewhere. The page's script reads
/// only `fetch` answers from this origin (`connect-src` via `default-src`).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const PATHS: [&str; 3] = ["/", "/app.js", "/app.css"];

/// Whether a request is for one of the page's files (GET or HEAD).
pub fn is_page(method: &Method, path: &str) -> bool {
    (method == Method::GET || method == Method::HEAD) && PATHS.contains(&path)
}

/// The page's routes, to merge into the API's router.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route(
            PATHS[0],
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            PATHS[1],
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            PATHS[2],
            get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Revalidated each time, so a new binary's page is never mixed with an
    // old cached script.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_paths_need_get_or_head() {
        for p in PATHS {
            assert!(is_page(&Method::GET, p));
            assert!(is_page(&Method::HEAD, p));
            assert!(!is_page(&Method::POST, p));
        }
        assert!(!is_page(&Method::GET, "/v1/models"));
        assert!(!is_page(&Method::GET, "/app.js/x"));
    }

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX_HTML.contains("src=\"/app.js\""));
        assert!(INDEX_HTML.contains("href=\"/app.css\""));
        // No inline script or style: the policy does not allow them.
        assert!(!INDEX_HTML.contains("<script>"));
        assert!(!INDEX_HTML.contains("<style"));
        assert!(!INDEX_HTML.contains(" style="));
        for text in [INDEX_HTML, APP_JS, APP_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
    }
}
