//! Logging and tracing setup for the binary: human logs on stderr (stdout is
//! reserved for output and protocols), and an optional Chrome trace file that
//! Perfetto opens, built from the same tracing spans.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, fmt};

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The `--trace` file could not be created (missing directory, no
    /// permission, ...); checked here so the trace library never has to panic.
    #[error("--trace {path}: cannot create the trace file: {source}")]
    TraceFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Keeps the trace writer alive; the file is complete when this is dropped.
pub struct TelemetryGuard {
    _chrome: Option<tracing_chrome::FlushGuard>,
}

/// Installs the subscriber. `RUST_LOG` filters the stderr logs (default
/// `warn`); with `trace_file`, every span (expert reads and waits, attention,
/// router, lm_head, pilot) is recorded. Colours only when stderr is a
/// terminal, so logs redirected to a file or a pipe stay plain text.
pub fn init(trace_file: Option<&Path>) -> Result<TelemetryGuard, TelemetryError> {
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter);
    match trace_file {
        Some(path) => {
            // Created here, not by tracing-chrome's `file()`, which panics on failure.
            let file = std::fs::File::create(path).map_err(|source| TelemetryError::TraceFile {
                path: path.to_path_buf(),
                source,
            })?;
            let (chrome, guard) = tracing_chrome::ChromeLayerBuilder::new()
                .writer(file)
                .include_args(true)
                .build();
            let chrome = chrome.with_filter(tracing_subscriber::filter::LevelFilter::TRACE);
            let _ = tracing_subscriber::registry()
                .with(stderr)
                .with(chrome)
                .try_init();
            Ok(TelemetryGuard { _chrome: Some(guard) })
        }
        None => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            Ok(TelemetryGuard { _chrome: None })
        }
    }
}
