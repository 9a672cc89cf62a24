//! Run counters: written by the actors with relaxed atomic adds (never read
//! back by them), read as a snapshot by `profile()` / `stats()`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::source::SourceStats;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub $name: AtomicU64,)*
            pub layer_hits: Vec<AtomicU64>,
            pub layer_misses: Vec<AtomicU64>,
        }

        /// A snapshot of the pipeline's counters. Times are nanoseconds of
        /// wall time summed over calls.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct PipelineProfile {
            $(pub $name: u64,)*
            /// Per-layer cache hits and misses.
            pub layer_hits: Vec<u64>,
            pub layer_misses: Vec<u64>,
            /// Time since the pipeline started.
            pub elapsed_ns: u64,
            /// The cache's byte budget, if any.
            pub cache_budget: Option<u64>,
            /// Backend name ("pread", "direct", "mmap", "sim", "mapped").
            pub storage: &'static str,
            /// How experts are placed: "streamed" (private cache fed by
            /// the I/O workers) or "mapped" (served in place from the
            /// container's mapping).
            pub placement: &'static str,
        }

        impl Counters {
            pub fn new(layers: usize) -> Self {
                Self {
                    layer_hits: (0..layers).map(|_| AtomicU64::new(0)).collect(),
                    layer_misses: (0..layers).map(|_| AtomicU64::new(0)).collect(),
                    ..Self::default()
                }
            }

            /// Counters accumulated since `earlier` (a snapshot of the same
            /// pipeline), e.g. to leave a warm-up out of a benchmark. Gauges
            /// (cache bytes and entries) keep their current values.
            pub fn since_inner(now: &PipelineProfile, earlier: &PipelineProfile) -> PipelineProfile {
                let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
                    a.iter().enumerate().map(|(i, x)| x.saturating_sub(b.get(i).copied().unwrap_or(0))).collect()
                };
                let mut p = PipelineProfile {
                    $($name: now.$name.saturating_sub(earlier.$name),)*
                    layer_hits: sub(&now.layer_hits, &earlier.layer_hits),
                    layer_misses: sub(&now.layer_misses, &earlier.layer_misses),
                    elapsed_ns: now.elapsed_ns.saturating_sub(earlier.elapsed_ns),
                    cache_budget: now.cache_budget,
                    storage: now.storage,
                    placement: now.placement,
                };
                p.cache_bytes = now.cache_bytes;
                p.cache_entries = now.cache_entries;
                p
            }

            pub fn snapshot(&self) -> PipelineProfile {
                PipelineProfile {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    layer_hits: self.layer_hits.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
                    layer_misses: self.layer_misses.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
                    ..PipelineProfile::default()
                }
            }
        }
    };
}

counters!(
    // Cache lookups by compute.
    hits,
    misses,
    // Demand misses that found the expert already loading (usually a pilot
    // prefetch): part of the read was hidden.
    inflight_joins,
    // Storage.
    bytes_read,
    // Bytes read by demand loads (compute was waiting or about to) and by
    // prefetches; prefetched bytes later delivered to compute, and those
    // evicted or discarded unused (wasted).
    demand_bytes,
    prefetch_bytes,
    prefetch_used_bytes,
    prefetch_wasted_bytes,
    reads,
    read_ns,
    failed_attempts,
    // Loads completed, by priority that did the read.
    demand_loads,
    prefetch_loads,
    // Prefetches dropped unread because their step had passed.
    prefetch_skipped,
    // Prefetches not queued because the queue was full.
    prefetch_rejected,
    // Loads finished after their step passed (or their load was cancelled
    // mid-read), with nobody waiting: discarded.
    stale_discarded,
    // Queued loads cancelled unread by `advance` (nobody waited for them).
    loads_cancelled,
    // Queued prefetches cancelled unread when their layer's routing came
    // and did not pick them (a wrong guess the disk had not reached yet).
    prefetch_dropped_unread,
    // Demand loads that failed after all retries.
    read_failures,
    // Pilot.
    predictions,
    pilot_stale,
    pilot_dropped,
    pilot_hits,
    pilot_routed,
    // Experts in predictions matched to a routing (precision denominator),
    // routings no prediction had reached, predictions after their routing.
    pilot_predicted,
    pilot_unpredicted,
    pilot_unpredicted_routed,
    pilot_late,
    // What late predictions would have caught, of how many routed experts.
    pilot_late_hits,
    pilot_late_routed,
    // Cache state (gauges).
    cache_bytes,
    cache_entries,
    // Fetch calls and where their time went.
    fetches,
    // Demand reads handed to the I/O workers' queue.
    demand_queued,
    cancelled,
    fetch_ns,
    wait_ns,
    sink_ns,
    // Read buffers newly allocated on the reading thread, reused from
    // evicted experts, and taken already faulted in from the prefaulter.
    buffers_allocated,
    buffers_reused,
    buffers_prefaulted,
    // Mapped placement: how long reading ahead and mapping the experts
    // took (0 while it runs).
    readahead_ns,
);

impl Counters {
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }

    pub fn set(c: &AtomicU64, v: u64) {
        c.store(v, Ordering::Relaxed);
    }
}

impl PipelineProfile {
    pub fn source_stats(&self) -> SourceStats {
        SourceStats {
            hits: self.hits,
            misses: self.misses,
            bytes_read: self.bytes_read,
            pilot_hits: self.pilot_hits,
            pilot_routed: self.pilot_routed,
        }
    }

    /// What happened between `earlier` and `self` (both snapshots of one
    /// pipeline); gauges keep `self`'s values.
    pub fn since(&self, earlier: &PipelineProfile) -> PipelineProfile {
        Counters::since_inner(self, earlier)
    }

    /// Bytes read for experts compute used: demand reads plus prefetches
    /// that were then delivered. What a perfect pilot would still read.
    pub fn needed_bytes(&self) -> u64 {
        self.demand_bytes + self.prefetch_used_bytes
    }

    /// Of the routed experts on predicted layers, the share predicted in
    /// time (dropped, stale and late predictions count as misses).
    pub fn pilot_recall(&self) -> Option<f64> {
        (self.pilot_routed > 0).then(|| self.pilot_hits as f64 / self.pilot_routed as f64)
    }

    /// Recall of the predictions that arrived at all, in time or late:
    /// the pilot's accuracy with timing left out.
    pub fn pilot_recall_untimed(&self) -> Option<f64> {
        let routed =
            (self.pilot_routed + self.pilot_late_routed).saturating_sub(self.pilot_unpredicted_routed);
        (routed > 0).then(|| (self.pilot_hits + self.pilot_late_hits) as f64 / routed as f64)
    }

    /// Of the experts predicted in time, the share that was routed.
    pub fn pilot_precision(&self) -> Option<f64> {
        (self.pilot_predicted > 0).then(|| self.pilot_hits as f64 / self.pilot_predicted as f64)
    }

    /// Share of time inside `fetch` spent blocked on expert arrival.
    pub fn wait_fraction(&self) -> f64 {
        if self.fetch_ns == 0 {
            0.0
        } else {
            self.wait_ns as f64 / self.fetch_ns as f64
        }
    }
}
