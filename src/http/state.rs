//! What every handler shares: the decode loop's handle, the defaults, the
//! API key, the counter behind response ids, the body limits, the
//! preparation threads and the HTTP counters. One per server, passed
//! through the router (no global state).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::body::BodyLimits;
use super::counters::Counters;
use super::pool::Pool;
use super::request::Defaults;
use crate::runtime::LoopHandle;

pub struct AppState {
    pub handle: LoopHandle,
    pub defaults: Defaults,
    /// When set, every endpoint but `/health` and the chat page wants it.
    pub api_key: Option<String>,
    /// Unix seconds at start (the model's `created`, part of ids).
    pub started: u64,
    ids: AtomicU64,
    pub body: BodyLimits,
    pub pool: Pool,
    pub counters: Arc<Counters>,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(
        handle: LoopHandle,
        defaults: Defaults,
        api_key: Option<String>,
        body: BodyLimits,
        pool: Pool,
    ) -> Self {
        Self {
            handle,
            defaults,
            api_key,
            started: unix_now(),
            ids: AtomicU64::new(0),
            body,
            pool,
            counters: Arc::default(),
        }
    }

    /// A response id unique to this server's life: `PREFIX<start><n>` in hex.
    pub fn next_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{:x}{n:08x}", self.started)
    }

    /// The served model's name.
    pub fn model(&self) -> &str {
        &self.handle.info().name
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
