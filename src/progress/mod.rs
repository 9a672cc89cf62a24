//! Progress of the jobs that take long on a large model: reading (and
//! quantizing) its dense weights at load, `coli convert`, `coli synth`.
//!
//! The library never prints on its own: a caller that wants to show
//! progress hands a [`Progress`] to the job. The command line hands the
//! [`ProgressPrinter`], which decides what to show and how often; nothing
//! in the library makes one itself. Jobs report as often as is natural to
//! them (once per tensor), so an implementation must be cheap per call and
//! do its own throttling.

mod printer;

pub use printer::{LOAD_MIN_BYTES, MAX_LINES_PER_JOB, ProgressPrinter, load_progress};

/// Hears one job's progress, in bytes. Calls come from the thread doing the
/// work, in order: `start`, then `advance` any number of times, then
/// `finish` when the job completed; a job that fails stops without
/// `finish`.
pub trait Progress: Send + Sync {
    /// The job named `phase` starts; about `total` bytes of work lie ahead.
    fn start(&self, phase: &str, total: u64);

    /// `done` bytes of the total are done so far (never decreasing; may
    /// stop short of the total, or pass it when the total was an estimate).
    fn advance(&self, done: u64);

    /// The job completed.
    fn finish(&self);
}
