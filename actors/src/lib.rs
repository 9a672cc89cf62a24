//! The colibri runtime.
//!
//! It knows routed experts only as byte ranges in files and compute only as
//! traits the model implements; it never knows what an OLMoE or GLM layer is.
//! That keeps every placement decision (cache, prefetch, I/O) in one crate whose
//! tests can run with mock compute and simulated disks.

pub mod buffer;
pub mod error;
pub mod expert;
pub mod kv;
pub mod source;
pub mod tag;

pub use buffer::AlignedBuf;
pub use error::SourceError;
pub use expert::{ExpertExtent, ExpertKey, ExpertMap, FileId, Piece};
pub use source::{BlockingSource, ExpertDecoder, ExpertSink, ExpertSource, SourceStats};
pub use tag::Tag;
