//! `coli serve --batch`: the multiplexed stdin/stdout protocol
//! (docs/serve-batch-protocol.md). Several requests, each named by a client
//! id and pinned to a KV slot, run at once on the decode loop; their replies
//! are interleaved on stdout, in order within each request.
//!
//! - [`codec`]: bytes in -> frames, never losing sync on bad input;
//! - [`reply`]: the exact bytes out;
//! - the session (`run_session`): a reader (the calling thread) that decodes
//!   and submits, one forwarder thread per request turning its events into
//!   frames, and one writer thread for stdout.

pub mod codec;
pub mod reply;
mod session;
mod writer;

use std::io::Write;

pub use session::{BatchConfig, BatchError, run_session};

use crate::runtime::DecodeLoop;

/// Serves the protocol on this process's stdin, replying on `output` (the
/// process's stdout) with reasons and logs on `diag` (its stderr), until
/// stdin ends; lets every request in flight finish, then shuts the loop
/// down. A failed `output` ends the session the same way (the slots are
/// saved) and is then the error returned.
pub fn serve_stdio(
    decode: DecodeLoop,
    cfg: &BatchConfig,
    output: impl Write + Send + 'static,
    mut diag: Box<dyn Write + Send>,
) -> Result<(), BatchError> {
    let handle = decode.handle();
    let info = handle.info();
    // Diagnostics are best effort: a closed stderr must not stop serving.
    let _ = writeln!(
        diag,
        "coli serve --batch: {} ready ({} slot(s), context {}, saving {})",
        info.dir.display(),
        info.slots,
        info.max_ctx,
        if info.saving { "on" } else { "off" }
    );
    let served = run_session(&handle, std::io::stdin().lock(), output, &mut *diag, cfg);
    drop(handle);
    let stopped = decode.shutdown().map_err(BatchError::Shutdown);
    served.and(stopped)
}
