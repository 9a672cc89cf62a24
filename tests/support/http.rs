//! What the HTTP tests share: the longest any request may take before the
//! test calls it a hang, and a client bounded by it.

use std::time::Duration;

/// Longest wait for a server or a reply (a debug build on a busy machine).
pub const HANG_GUARD: Duration = Duration::from_secs(180);

/// A client that ignores proxy settings (the server is on loopback) and
/// gives up after [`HANG_GUARD`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(HANG_GUARD)
        .build()
        .expect("http client")
}
