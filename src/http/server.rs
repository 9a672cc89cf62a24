//! Binding, routing and the server's life: it runs until SIGINT or
//! SIGTERM, then stops accepting, ends in-flight streams by shutting the
//! decode loop down, and returns once connections are closed (serving
//! each connection is [`super::conn`]'s job).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};

use super::body::BodyLimits;
use super::conn::{self, ConnLimits};
use super::error::ApiError;
use super::pool::Pool;
use super::request::Defaults;
use super::state::{AppState, Shared};
use super::{anthropic, auth, info, metrics, openai, web};
use crate::runtime::{DecodeLoop, RequestError};

/// Largest request body by default (`--max-body`).
pub const DEFAULT_MAX_BODY: usize = 8 << 20;

/// Seconds a request head may take by default (`--header-timeout-s`).
pub const DEFAULT_HEADER_TIMEOUT_S: u64 = 10;

/// Seconds a request body may take by default (`--body-timeout-s`).
pub const DEFAULT_BODY_TIMEOUT_S: u64 = 30;

/// Connections served at once by default (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How long connections get to finish after the decode loop has ended
/// every request (a client that reads nothing must not hold the exit).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Threads answering HTTP (generation runs on the loop's own threads).
const HTTP_THREADS: usize = 2;

/// Threads preparing small requests (large ones run on the caller's).
const SMALL_PREPARE_THREADS: usize = 2;

/// How the HTTP server runs.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    pub api_key: Option<String>,
    pub max_body: usize,
    /// A request head must arrive within this (`--header-timeout-s`).
    pub header_timeout: Duration,
    /// A request body must arrive within this (`--body-timeout-s`).
    pub body_timeout: Duration,
    /// Connections served at once (`--max-connections`).
    pub max_connections: usize,
    pub defaults: Defaults,
    /// Serve the chat page at `/` (off with `--no-web`).
    pub web: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("running the HTTP threads: {0}")]
    Runtime(std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("stopping the decode loop: {0}")]
    Loop(#[from] RequestError),
}

/// `--http ADDR`: `HOST:PORT`, `[V6]:PORT`, `localhost:PORT`, or a bare
/// port (loopback). Port 0 picks a free port.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(port) = t.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = t.strip_prefix("localhost:") {
        return port
            .parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .map_err(|_| format!("expected a port after localhost:, got {port:?}"));
    }
    t.parse::<SocketAddr>()
        .map_err(|_| format!("expected PORT or HOST:PORT (e.g. 8080 or 127.0.0.1:8080), got {s:?}"))
}

/// Every route, with the key check; the chat page's when `web`. (Bodies
/// are read, and limited, by [`super::body`].)
pub fn router(state: Shared, web: bool) -> Router {
    let page = if web { web::routes() } else { Router::new() };
    page.route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route(auth::MESSAGES_PATH, post(anthropic::messages))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/health", get(info::health))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_key))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("No route for {}.", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(format!("{method} is not allowed on {}.", uri.path()))
}

/// Serves `decode` on `cfg.addr` until SIGINT or SIGTERM; `on_ready` gets
/// the bound address (the real port when 0 was asked) before the first
/// request is accepted. The loop is shut down before this returns.
///
/// The calling thread (coli's main thread) runs the preparation of large
/// requests meanwhile: its allocations come from glibc's main arena, the
/// one arena whose free memory `malloc_trim` can hand back whole (see
/// [`super::memory`]).
pub fn serve(
    decode: DecodeLoop,
    cfg: HttpConfig,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), HttpError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(HTTP_THREADS)
        .thread_name("coli-http")
        .enable_all()
        .build()
        .map_err(HttpError::Runtime)?;
    let handle = decode.handle();
    let bind = |source| HttpError::Bind {
        addr: cfg.addr,
        source,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(cfg.addr))
        .map_err(bind)?;
    let addr = listener.local_addr().map_err(bind)?;
    let (pool, large_lane) = Pool::new(SMALL_PREPARE_THREADS).map_err(HttpError::Runtime)?;
    let body = BodyLimits {
        max: cfg.max_body,
        timeout: cfg.body_timeout,
    };
    let state = Arc::new(AppState::new(
        handle.clone(),
        cfg.defaults,
        cfg.api_key.clone(),
        body,
        pool,
    ));
    let counters = state.counters.clone();
    let app = router(state, cfg.web);
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    rt.spawn(async move {
        shutdown_signal().await;
        let _ = stopping_tx.send(true);
        // Ends every request (streams close with their last events);
        // blocking, so off the async threads.
        let h = handle.clone();
        tokio::task::spawn_blocking(move || h.shutdown());
    });
    on_ready(addr);
    let limits = ConnLimits {
        header_timeout: cfg.header_timeout,
        max_connections: cfg.max_connections,
    };
    let (over_tx, over) = crossbeam_channel::bounded::<()>(1);
    let server = rt.spawn(async move {
        conn::serve(listener, app, counters, limits, stopping, SHUTDOWN_GRACE).await;
        let _ = over_tx.send(());
    });
    large_lane.run_until(&over);
    // The server task has ended (or panicked, which its join reports).
    let served = rt.block_on(server);
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    let stopped = decode.shutdown();
    served.map_err(|e| HttpError::Runtime(std::io::Error::other(e)))?;
    stopped?;
    Ok(())
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let lo = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
        assert_eq!(parse_addr("8080"), Ok(lo(8080)));
        assert_eq!(parse_addr("0"), Ok(lo(0)));
        assert_eq!(parse_addr("localhost:9"), Ok(lo(9)));
        assert_eq!(parse_addr("127.0.0.1:80"), Ok(lo(80)));
        assert_eq!(
            parse_addr("0.0.0.0:80").map(|a| a.ip().is_unspecified()),
            Ok(true)
        );
        assert_eq!(parse_addr("[::1]:7").map(|a| a.ip().is_loopback()), Ok(true));
        assert!(parse_addr("nope").is_err());
        assert!(parse_addr("70000").is_err());
        assert!(parse_addr("localhost:x").is_err());
    }
}
