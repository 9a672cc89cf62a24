//! The colibri runtime.
//!
//! It knows routed experts only as byte ranges in files and compute only as
//! traits the model implements; it never knows what an OLMoE or GLM layer is.
//! That keeps every placement decision (cache, prefetch, I/O) in one crate whose
//! tests can run with mock compute and simulated disks.
//!
//! Actors (each a module with its messages beside it): [`io`] (the I/O worker
//! pool), [`pilot`] (the prefetcher), the [`pipeline`] coordinator that
//! owns the [`cache`], and [`kv`] persistence; [`storage`] holds the disk backends.

pub mod buffer;
pub mod cache;
pub mod error;
pub mod expert;
pub mod io;
pub mod kv;
pub mod mapped;
pub mod pilot;
pub mod pipeline;
pub mod source;
pub mod storage;
pub mod tag;

pub use buffer::{AlignedBuf, SharedBytes};
pub use error::SourceError;
pub use expert::{ExpertExtent, ExpertKey, ExpertMap, FileId, Piece};
pub use mapped::MappedSource;
pub use pilot::Predictor;
pub use pipeline::{PipelineConfig, PipelineProfile, PipelineSource};
pub use source::{BlockingSource, ExpertBatchSink, ExpertDecoder, ExpertSink, ExpertSource, SourceStats};
pub use storage::{SimSpec, SimSpecError, Storage, StorageOptions};
pub use tag::{Tag, TagClock, TagClockReader};
