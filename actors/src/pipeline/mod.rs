//! [`PipelineSource`]: the actor pipeline behind the [`ExpertSource`] seam.
//!
//! Threads: one coordinator (cache, in-flight table, recall), `io_workers`
//! I/O workers, and the pilot when enabled. The caller's thread only sends
//! messages and waits on its own reply channel, calling the sink for each
//! expert as it arrives: resident experts first, misses in order of arrival.

mod config;
mod coordinator;
mod msg;
mod profile;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Sender, bounded};

pub use config::PipelineConfig;
pub use profile::PipelineProfile;

use self::coordinator::{CoordFlags, Coordinator};
use self::msg::{CoordMsg, Delivery, FetchMode};
use self::profile::Counters;
use crate::buffer::{BufPool, PrefaultConfig, Prefaulter};
use crate::cache::{CacheLimits, ExpertCache};
use crate::error::SourceError;
use crate::expert::{ExpertKey, ExpertMap};
use crate::io::{IoPool, IoPoolConfig};
use crate::pilot::{self, PilotMsg, Prediction, Predictor};
use crate::source::{ExpertBatchSink, ExpertDecoder, ExpertSource, SourceStats};
use crate::storage::{Storage, open_storage};
use crate::tag::{Tag, TagClock};

/// Bound of the coordinator's inbox.
const INBOX_CAP: usize = 1024;
/// Bound of the pilot's inbox; a pilot that falls this far behind drops
/// residuals rather than slowing compute.
const PILOT_CAP: usize = 64;

/// Idle read buffers the pool keeps for reuse: enough for every worker's
/// read in flight plus the evictions between two of them.
pub fn idle_buffer_slots(io_workers: usize) -> usize {
    2 * io_workers.max(1) + 8
}

/// Expert buffers a streamed pipeline may hold beyond its cache's byte
/// budget: the pool's idle ones, one read in flight per worker, the
/// experts compute still holds after the cache evicted them (at most a
/// layer's routed `top_k`), and the prefaulter's reserve. A memory plan reserves this many of the
/// largest expert outside the cache, so peak RSS stays within it even
/// when one expert is tens of MB (GLM-5's are 21 MB).
pub fn transient_expert_buffers(io_workers: usize, top_k: usize) -> usize {
    idle_buffer_slots(io_workers) + io_workers.max(1) + top_k + prefault_reserve(io_workers)
}

/// Faulted-in buffers the prefaulter keeps ready while the cache fills:
/// a read ahead for each worker and one more, so a worker that finishes a
/// read finds the next buffer touched. Counted in
/// [`transient_expert_buffers`]: the reserve may sit unused once the cache
/// is full.
pub fn prefault_reserve(io_workers: usize) -> usize {
    io_workers.max(1) + 1
}

/// The streaming expert source; see the module docs.
pub struct PipelineSource<T> {
    config: PipelineConfig,
    map: Arc<ExpertMap>,
    coord: Sender<CoordMsg<T>>,
    pilot_tx: Option<Sender<PilotMsg>>,
    /// The predictor when the pilot runs inline (on the offering thread).
    inline_pilot: Option<Arc<dyn Predictor>>,
    counters: Arc<Counters>,
    next_fetch: AtomicU64,
    coordinator: Option<JoinHandle<()>>,
    pilot_thread: Option<JoinHandle<()>>,
    started: Instant,
    storage_kind: &'static str,
    /// The read buffers' pool (its counts go into the profile).
    buffers: BufPool,
    /// Faults the pool's buffers in ahead of the reads while the cache
    /// fills; stopped and joined when the source drops.
    _prefaulter: Prefaulter,
}

fn shutdown_err() -> SourceError {
    SourceError::Shutdown("the pipeline coordinator has stopped".into())
}

impl<T: Send + Sync + 'static> PipelineSource<T> {
    /// Opens the expert files with the backend `config` selects and starts
    /// the actors. The pilot runs when `config.pilot` and a predictor is
    /// given.
    pub fn open(
        map: ExpertMap,
        decoder: Box<dyn ExpertDecoder<T>>,
        predictor: Option<Arc<dyn Predictor>>,
        config: PipelineConfig,
    ) -> Result<Self, SourceError> {
        let storage = open_storage(&map.files, &config.storage_options())?;
        Self::with_storage(map, storage, decoder, predictor, config)
    }

    /// Like [`Self::open`] over a storage the caller built (tests inject
    /// faulty ones; `config`'s storage fields are then ignored).
    pub fn with_storage(
        map: ExpertMap,
        storage: Arc<dyn Storage>,
        decoder: Box<dyn ExpertDecoder<T>>,
        predictor: Option<Arc<dyn Predictor>>,
        config: PipelineConfig,
    ) -> Result<Self, SourceError> {
        let map = Arc::new(map);
        // Advanced by the coordinator alone; the I/O workers and the pilot
        // read it to drop stale work.
        let clock = TagClock::new();
        let counters = Arc::new(Counters::new(map.layers));
        let storage_kind = storage.kind();
        let experts = map.layers * map.experts_per_layer;
        // The prefaulter stops at the cache's budget: from then on the reads
        // land in buffers of evicted experts.
        let (buffers, prefaulter) = BufPool::with_prefault(
            idle_buffer_slots(config.io_workers),
            PrefaultConfig {
                reserve: prefault_reserve(config.io_workers),
                limit_bytes: config.ram_budget_bytes.unwrap_or(u64::MAX),
            },
        )
        .map_err(|e| SourceError::Shutdown(format!("cannot start the prefaulter: {e}")))?;
        let pool = IoPool::spawn(
            &IoPoolConfig {
                workers: config.io_workers.max(1),
                retries: config.read_retries,
                queue_cap: (2 * experts).clamp(64, 16_384),
            },
            storage,
            map.clone(),
            Arc::from(decoder),
            clock.reader(),
            buffers.clone(),
        )?;
        let (io_tx, io_rx) = bounded(1024);
        let (coord_tx, coord_rx) = bounded(INBOX_CAP);
        let limits = CacheLimits {
            per_layer: config.cache_cap,
            bytes: config.ram_budget_bytes,
        };
        let pilot_on = config.pilot && predictor.is_some();
        let pilot_clock = clock.reader();
        let coordinator = Coordinator::new(
            map.clone(),
            ExpertCache::new(map.layers, limits),
            pool,
            io_tx,
            clock,
            counters.clone(),
            CoordFlags {
                prefetch: pilot_on && config.overlap,
                pilot: pilot_on,
            },
        );
        let coordinator = std::thread::Builder::new()
            .name("coli-coordinator".into())
            .spawn(move || coordinator.run(coord_rx, io_rx))
            .map_err(|e| SourceError::Shutdown(format!("cannot start the coordinator: {e}")))?;
        let mut me = Self {
            config,
            map,
            coord: coord_tx,
            pilot_tx: None,
            inline_pilot: None,
            counters,
            next_fetch: AtomicU64::new(0),
            coordinator: Some(coordinator),
            pilot_thread: None,
            started: Instant::now(),
            storage_kind,
            buffers,
            _prefaulter: prefaulter,
        };
        if let Some(pred) = predictor.clone().filter(|_| pilot_on && !me.config.pilot_thread) {
            me.inline_pilot = Some(pred);
        } else if let Some(pred) = predictor.filter(|_| pilot_on) {
            let (tx, rx) = bounded(PILOT_CAP);
            let to_coord = me.coord.clone();
            let out = Box::new(move |p| to_coord.send(CoordMsg::Predicted(p)).is_ok());
            me.pilot_thread = Some(pilot::spawn(pred, me.config.pilot_k, pilot_clock, rx, out)?);
            me.pilot_tx = Some(tx);
        }
        Ok(me)
    }

    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    pub fn map(&self) -> &ExpertMap {
        &self.map
    }

    /// A snapshot of every counter (cache, I/O, pilot, wait times).
    pub fn profile(&self) -> PipelineProfile {
        let mut p = self.counters.snapshot();
        p.elapsed_ns = self.started.elapsed().as_nanos() as u64;
        p.cache_budget = self.config.ram_budget_bytes;
        p.storage = self.storage_kind;
        p.placement = "streamed";
        let pool = self.buffers.counts();
        (p.buffers_allocated, p.buffers_reused, p.buffers_prefaulted) =
            (pool.allocated, pool.reused, pool.prefaulted);
        p
    }

    /// Keeps `keys` resident for good (loading them in the background);
    /// pinned experts are never evicted but count toward the byte budget
    /// and toward their layer's `cache_cap`.
    pub fn pin(&self, keys: &[ExpertKey]) {
        let _ = self.coord.send(CoordMsg::Pin {
            keys: keys.to_vec(),
            pin: true,
        });
    }

    /// Returns pinned experts to the LRU.
    pub fn unpin(&self, keys: &[ExpertKey]) {
        let _ = self.coord.send(CoordMsg::Pin {
            keys: keys.to_vec(),
            pin: false,
        });
    }

    /// Sends one fetch to the coordinator and feeds the sink until every
    /// item is answered, each call with everything that has arrived by then.
    /// Returns the indices answered `Missing`.
    fn run_fetch(
        &self,
        tag: Tag,
        items: Vec<(usize, ExpertKey)>,
        mode: FetchMode,
        sink: &mut ExpertBatchSink<'_, T>,
        seen: &mut [bool],
    ) -> Result<Vec<usize>, SourceError> {
        let id = self.next_fetch.fetch_add(1, Ordering::Relaxed);
        let mut remaining = items.len();
        let (tx, rx) = bounded(items.len() + 2);
        self.coord
            .send(CoordMsg::Fetch {
                id,
                tag,
                items,
                mode,
                reply: tx,
            })
            .map_err(|_| shutdown_err())?;
        let mut missing = Vec::new();
        let mut group: Vec<(usize, Arc<T>)> = Vec::new();
        let c = &self.counters;
        while remaining > 0 {
            let t0 = Instant::now();
            let first = {
                let _span = tracing::debug_span!("expert_wait", layer = tag.layer).entered();
                rx.recv()
            };
            Counters::add(&c.wait_ns, t0.elapsed().as_nanos() as u64);
            // Whatever else has arrived meanwhile joins the same group.
            let mut next = Some(first.map_err(|_| shutdown_err())?);
            while let Some(d) = next.take() {
                match d {
                    Delivery::Experts(v) => group.extend(v),
                    Delivery::Expert(idx, v) => group.push((idx, v)),
                    Delivery::Missing(idx) => {
                        if seen.get(idx).copied() == Some(false) {
                            seen[idx] = true;
                            missing.push(idx);
                            remaining -= 1;
                        }
                    }
                    Delivery::Failed(e) => {
                        let _ = self.coord.try_send(CoordMsg::Abandon { id });
                        return Err(e);
                    }
                    Delivery::Cancelled => return Err(SourceError::Cancelled),
                }
                next = rx.try_recv().ok();
            }
            group.retain(|(idx, _)| {
                let fresh = seen.get(*idx).copied() == Some(false);
                if fresh {
                    seen[*idx] = true;
                }
                fresh
            });
            if group.is_empty() {
                continue;
            }
            remaining -= group.len();
            let t1 = Instant::now();
            let r = sink(&group);
            Counters::add(&c.sink_ns, t1.elapsed().as_nanos() as u64);
            group.clear();
            if let Err(e) = r {
                let _ = self.coord.try_send(CoordMsg::Abandon { id });
                return Err(e);
            }
        }
        Ok(missing)
    }

    fn fetch_inner(
        &self,
        tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        let items: Vec<(usize, ExpertKey)> = keys.iter().copied().enumerate().collect();
        let mut seen = vec![false; keys.len()];
        if self.config.overlap {
            self.run_fetch(tag, items, FetchMode::Full, sink, &mut seen)?;
            return Ok(());
        }
        let missing = self.run_fetch(tag, items, FetchMode::HitsOnly, sink, &mut seen)?;
        for idx in missing {
            // `Missing` marked it seen; the load below delivers it.
            seen[idx] = false;
            self.run_fetch(tag, vec![(idx, keys[idx])], FetchMode::LoadOnly, sink, &mut seen)?;
        }
        Ok(())
    }
}

impl<T: Send + Sync + 'static> ExpertSource<T> for PipelineSource<T> {
    fn fetch_batch(
        &self,
        tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        if keys.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = self.fetch_inner(tag, keys, sink);
        Counters::add(&self.counters.fetches, 1);
        Counters::add(&self.counters.fetch_ns, t0.elapsed().as_nanos() as u64);
        r
    }

    fn pilot(&self, tag: Tag, residual: &[f32]) {
        if let Some(pred) = &self.inline_pilot {
            let experts = {
                let _span = tracing::debug_span!("pilot", layer = tag.layer, step = tag.step).entered();
                pred.predict(tag.layer, residual, self.config.pilot_k)
            };
            // Never blocks compute: a full coordinator inbox drops the
            // prediction (counted like a dropped residual).
            if self
                .coord
                .try_send(CoordMsg::Predicted(Prediction { tag, experts }))
                .is_err()
            {
                Counters::add(&self.counters.pilot_dropped, 1);
            }
            return;
        }
        let Some(tx) = &self.pilot_tx else { return };
        let msg = PilotMsg {
            tag,
            residual: residual.to_vec(),
        };
        if tx.try_send(msg).is_err() {
            Counters::add(&self.counters.pilot_dropped, 1);
        }
    }

    /// Synchronous: when it returns, work of older steps is stale everywhere.
    fn advance(&self, tag: Tag) {
        let (ack_tx, ack_rx) = bounded(1);
        if self.coord.send(CoordMsg::Advance { tag, ack: ack_tx }).is_ok() {
            let _ = ack_rx.recv();
        }
    }

    fn pin(&self, keys: &[ExpertKey]) {
        PipelineSource::pin(self, keys);
    }

    fn unpin(&self, keys: &[ExpertKey]) {
        PipelineSource::unpin(self, keys);
    }

    fn profile(&self) -> Option<PipelineProfile> {
        Some(PipelineSource::profile(self))
    }

    fn stats(&self) -> SourceStats {
        self.counters.snapshot().source_stats()
    }
}

impl<T> Drop for PipelineSource<T> {
    fn drop(&mut self) {
        let _ = self.coord.send(CoordMsg::Shutdown);
        if let Some(h) = self.coordinator.take() {
            let _ = h.join();
        }
        self.pilot_tx = None;
        if let Some(h) = self.pilot_thread.take() {
            let _ = h.join();
        }
    }
}
