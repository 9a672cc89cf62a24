//! Settings of the actor pipeline (the engine's `--io-workers`, `--cache-cap`,
//! `--ram-gb`, `--pilot`, `--direct`, `--disk-sim` flags end up here).

use crate::storage::{SimSpec, StorageOptions};

/// See the field docs; [`Default`] is the normal decode configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    /// I/O worker threads (at least 1).
    pub io_workers: usize,
    /// Experts kept per layer, pinned ones included; `None` = limited only
    /// by the byte budget; `Some(0)` = keep nothing (but pins).
    pub cache_cap: Option<usize>,
    /// Bytes the expert cache may hold (see `cache::default_ram_budget`);
    /// `None` = unlimited.
    pub ram_budget_bytes: Option<u64>,
    /// Run the pilot prefetcher (needs a predictor).
    pub pilot: bool,
    /// Experts the pilot predicts per layer (usually the model's top-k).
    pub pilot_k: usize,
    /// Predict on the pilot thread instead of on the thread offering the
    /// residual. Inline (the default) costs the caller one router product
    /// per offer but is never late; the thread keeps that work off the
    /// compute path, and is late whenever a layer computes faster than the
    /// thread is scheduled.
    pub pilot_thread: bool,
    /// O_DIRECT reads.
    pub direct: bool,
    /// Copy out of an mmap instead of reading.
    pub mmap: bool,
    /// Drop read pages from the page cache after buffered reads.
    pub drop_cache: bool,
    /// Put a simulated disk in front of the storage.
    pub disk_sim: Option<SimSpec>,
    /// `false`: strict no-overlap baseline for benchmarks -- no prefetch, and
    /// each miss is read and fully delivered before the next read starts.
    pub overlap: bool,
    /// Extra attempts for a failed demand read before the error surfaces.
    pub read_retries: u32,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            io_workers: 4,
            cache_cap: None,
            ram_budget_bytes: None,
            pilot: true,
            pilot_k: 8,
            pilot_thread: false,
            direct: false,
            mmap: false,
            drop_cache: false,
            disk_sim: None,
            overlap: true,
            read_retries: 3,
        }
    }
}

impl PipelineConfig {
    pub fn storage_options(&self) -> StorageOptions {
        StorageOptions {
            direct: self.direct,
            mmap: self.mmap,
            drop_cache: self.drop_cache,
            disk_sim: self.disk_sim.clone(),
        }
    }
}
