//! Logging and tracing setup for the binary: human logs on stderr (stdout is
//! reserved for output and protocols), and an optional Chrome trace file that
//! Perfetto opens, built from the same tracing spans.

use std::path::Path;

use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, fmt};

/// Keeps the trace writer alive; the file is complete when this is dropped.
pub struct TelemetryGuard {
    _chrome: Option<tracing_chrome::FlushGuard>,
}

/// Installs the subscriber. `RUST_LOG` filters the stderr logs (default
/// `warn`); with `trace_file`, every span (expert reads and waits, attention,
/// router, lm_head, pilot) is recorded.
pub fn init(trace_file: Option<&Path>) -> TelemetryGuard {
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(filter);
    match trace_file {
        Some(path) => {
            let (chrome, guard) = tracing_chrome::ChromeLayerBuilder::new()
                .file(path)
                .include_args(true)
                .build();
            let chrome = chrome.with_filter(tracing_subscriber::filter::LevelFilter::TRACE);
            let _ = tracing_subscriber::registry()
                .with(stderr)
                .with(chrome)
                .try_init();
            TelemetryGuard { _chrome: Some(guard) }
        }
        None => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            TelemetryGuard { _chrome: None }
        }
    }
}
