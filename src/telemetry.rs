//! Logging and tracing setup for the binary: human logs on stderr (stdout is
//! reserved for output and protocols), and an optional Chrome trace file that
//! Perfetto opens, built from the same tracing spans.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
    /// Writing the trace failed part-way (disk full, ...): the file is incomplete.
    #[error("--trace {path}: writing the trace failed: {source}")]
    TraceWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The trace file as tracing-chrome sees it: write errors are kept for
/// [`TelemetryGuard::finish`] instead of returned, because tracing-chrome's
/// writer thread panics on any error (a full disk would crash it).
struct TraceFile {
    file: std::io::BufWriter<std::fs::File>,
    error: Arc<Mutex<Option<std::io::Error>>>,
}

impl TraceFile {
    fn keep(&self, e: std::io::Error) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
    }
    fn failed(&self) -> bool {
        self.error.lock().map(|s| s.is_some()).unwrap_or(true)
    }
}

impl Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.failed()
            && let Err(e) = self.file.write_all(buf)
        {
            self.keep(e);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.failed()
            && let Err(e) = self.file.flush()
        {
            self.keep(e);
        }
        Ok(())
    }
}

/// Keeps the trace writer alive; the file is complete when this is dropped
/// or [`TelemetryGuard::finish`]ed.
pub struct TelemetryGuard {
    chrome: Option<tracing_chrome::FlushGuard>,
    /// The trace path and the first write error, for `finish`.
    trace: Option<(PathBuf, Arc<Mutex<Option<std::io::Error>>>)>,
}

impl TelemetryGuard {
    /// Completes the trace file and reports whether every write reached it.
    pub fn finish(mut self) -> Result<(), TelemetryError> {
        // Dropping the flush guard joins the writer thread, which flushes.
        drop(self.chrome.take());
        let Some((path, error)) = self.trace.take() else {
            return Ok(());
        };
        let taken = error.lock().ok().and_then(|mut e| e.take());
        match taken {
            Some(source) => Err(TelemetryError::TraceWrite { path, source }),
            None => Ok(()),
        }
    }
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
        // A log line stderr cannot take is dropped: tracing-subscriber's
        // report of it would go to the same stderr through `eprintln!`,
        // which panics when the reader is gone (`2>&1 | head`).
        .log_internal_errors(false)
        .with_filter(filter);
    match trace_file {
        Some(path) => {
            // Created here, not by tracing-chrome's `file()`, which panics on failure.
            let file = std::fs::File::create(path).map_err(|source| TelemetryError::TraceFile {
                path: path.to_path_buf(),
                source,
            })?;
            let error = Arc::new(Mutex::new(None));
            let writer = TraceFile {
                file: std::io::BufWriter::new(file),
                error: error.clone(),
            };
            let (chrome, guard) = tracing_chrome::ChromeLayerBuilder::new()
                .writer(writer)
                .include_args(true)
                .build();
            let chrome = chrome.with_filter(tracing_subscriber::filter::LevelFilter::TRACE);
            let _ = tracing_subscriber::registry()
                .with(stderr)
                .with(chrome)
                .try_init();
            Ok(TelemetryGuard {
                chrome: Some(guard),
                trace: Some((path.to_path_buf(), error)),
            })
        }
        None => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            Ok(TelemetryGuard {
                chrome: None,
                trace: None,
            })
        }
    }
}
